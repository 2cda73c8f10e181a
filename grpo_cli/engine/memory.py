"""Out of GPU memory: whether an error is that, where in a run it happened, and what the GPU held then.

The phase is read from the traceback (TRL's and transformers' function names). What to change is each command's
to say in its own terms: the recipe keys for `grpo rl` / `grpo sft` (grpo_cli/train/memory_fixes.py), the
command-line flags for `grpo eval`.
"""

from __future__ import annotations

import re
import traceback

from grpo_cli.trl_private import GENERATION_FRAMES, SCORING_FRAMES

# Function names on the traceback that place a failure, most specific first (the optimizer: by torch/optim files).
PHASES = (
    ("generation", {*GENERATION_FRAMES, "_sample_part", "generate"}),  # grpo's Sampler, transformers'
    # the batch's log-probs without gradients (old policy, reference model)
    ("scoring", set(SCORING_FRAMES)),
    ("forward/backward", {"compute_loss", "backward", "training_step"}),
)
PHASE_TEXT = {
    "generation": "while generating completions",
    "scoring": "while computing the batch's log-probabilities (no gradients)",
    "forward/backward": "in the policy's forward/backward",
    "optimizer": "in the optimizer step",
    "loading": "while loading the model onto the GPU",
    "training": "during training",
}


def is_out_of_memory(err: BaseException) -> bool:
    """Whether `err` is torch's out-of-GPU-memory error."""
    import torch

    return isinstance(err, torch.OutOfMemoryError)


def failure_phase(err: BaseException) -> str:
    """Which part of a run raised `err`, from the function names on its traceback."""
    frames = traceback.extract_tb(err.__traceback__)
    names = {frame.name for frame in frames}
    for phase, functions in PHASES:
        if functions & names:
            return phase
    if any("/torch/optim/" in frame.filename.replace("\\", "/") for frame in frames):
        return "optimizer"
    return "training" if "train" in names else "loading"


def gpu_numbers(err: BaseException) -> str:
    """What the GPU holds and what the failed allocation asked for, as far as torch tells."""
    import torch

    parts = []
    asked = re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", str(err))
    if asked:
        parts.append(f"tried to allocate {asked.group(1)}")
    if torch.cuda.is_available():
        device = torch.cuda.current_device()
        total = torch.cuda.get_device_properties(device).total_memory / 2**30
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        parts.append(f"GPU {device}: {total:.1f} GiB, tensors peaked at {peak:.1f} GiB")
    return f" ({'; '.join(parts)})" if parts else ""


def fragmented() -> bool:
    """Whether much of the memory torch holds is reserved but free (fragmentation)."""
    import torch

    if not torch.cuda.is_available():
        return False
    reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return reserved - allocated > 0.1 * total
