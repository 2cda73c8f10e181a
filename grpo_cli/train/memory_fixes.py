"""Out of GPU memory in `grpo rl` / `grpo sft`: which recipe keys buy the memory back, instead of a traceback.

Where the run ran out comes from the engine (`grpo_cli.engine.memory`); the advice uses the recipe's effective
values, so each fix is a line to paste: halve the micro-batch and double the accumulation (the same completions per
step), generate a step's completions in smaller batches, shorten completions, LoRA or 4-bit, no float32 master
weights.
"""

from __future__ import annotations

import functools

from grpo_cli.engine.memory import PHASE_TEXT, failure_phase, fragmented, gpu_numbers, is_out_of_memory
from grpo_cli.errors import UserError
from grpo_cli.launch import world_size
from grpo_cli.recipe import Recipe
from grpo_cli.recipe.hardware import generation_batch
from grpo_cli.run_folder import latest_checkpoint


def _places(recipe: Recipe, *keys: str) -> str:
    """ ", file:line" for each of `keys` the recipe or the command line sets."""
    places = dict.fromkeys(recipe.where(key) for key in keys)
    return "".join(f", {place}" for place in places if place != "default")


def _generation_batch(recipe: Recipe) -> tuple[int, int, int]:
    """(completions each process generates at once, per_device_train_batch_size, steps_per_generation)."""
    values = recipe.resolved()
    processes = world_size()
    micro = int(values["per_device_train_batch_size"])
    batch = generation_batch(values, processes) // processes
    return batch, micro, batch // micro


def memory_fixes(recipe: Recipe, phase: str) -> list[str]:
    """Recipe changes that lower the memory of `phase`, with this recipe's numbers and where they are set."""
    values = recipe.resolved()

    def at(key: str) -> str:
        place = _places(recipe, key)
        return f" ({place[2:]})" if place else ""

    micro = int(values.get("per_device_train_batch_size") or 8)
    accumulation = int(values.get("gradient_accumulation_steps") or 1)
    length_key = "max_completion_length" if recipe.command == "rl" else "max_length"
    length = values.get(length_key)
    full_model = not values.get("use_peft")
    fixes = []
    if phase == "generation":
        _, micro, per_generation = _generation_batch(recipe)
        generations = int(values.get("num_generations") or 8)
        if (
            not values.get("generation_batch_size")
            and per_generation % 2 == 0
            and (micro * per_generation // 2) % generations == 0
        ):
            fixes.append(
                f"`steps_per_generation: {per_generation // 2}` generates them in batches of "
                f"{micro * per_generation // 2} (the same completions and update per step)"
            )
    if phase in ("forward/backward", "scoring", "training") and micro > 1:
        fixes.append(
            f"`per_device_train_batch_size: {micro // 2}` with `gradient_accumulation_steps: {accumulation * 2}` "
            f"(now {micro} x {accumulation}{_places(recipe, 'per_device_train_batch_size', 'gradient_accumulation_steps')}): "
            "half the activations, the same completions per step"
        )
    if phase in ("generation", "forward/backward", "scoring", "training") and length:
        fixes.append(f"`{length_key}: {int(length) // 2}`{at(length_key)}: half the tokens per sequence")
    if phase in ("forward/backward", "training") and values.get("gradient_checkpointing") is False:
        fixes.append(
            f"`gradient_checkpointing: true`{at('gradient_checkpointing')} recomputes activations instead of "
            "keeping them"
        )
    if phase in ("forward/backward", "training") and not values.get("activation_offloading"):
        moved = "each layer's input, with gradient checkpointing; " if recipe.command == "rl" else ""
        fixes.append(
            f"`activation_offloading: true` keeps the activations the backward pass needs in CPU memory ({moved}"
            "longer steps)"
        )
    lean = recipe.command == "rl" and full_model and not values.get("lean_lm_head")  # LoRA leaves the head be
    if phase in ("forward/backward", "training") and lean:
        fixes.append("`lean_lm_head: true` sums the LM head's gradient in chunks (the same gradients, longer steps)")
    if phase == "scoring" and float(values.get("beta") or 0.0) > 0:
        fixes.append(f"`beta: 0.0`{at('beta')} drops the reference model and its forward pass")
    if phase in ("forward/backward", "optimizer", "loading", "training") and full_model:
        fixes.append(
            "`use_peft: true` trains a LoRA adapter: no gradients or optimizer state for the full model"
        )
    if phase in ("forward/backward", "optimizer", "training") and full_model and values.get("master_weights"):
        fixes.append(
            f"`master_weights: false`{at('master_weights')} drops the float32 copies of the weights (8 bytes a "
            "parameter), but bfloat16 rounding then loses most updates at small learning rates "
            "(docs/troubleshooting.md)"
        )
    if phase == "optimizer" and full_model:
        fixes.append("`optim: adamw_8bit` keeps the optimizer state in 8 bits (bitsandbytes)")
    if phase == "loading" and not values.get("load_in_4bit"):
        fixes.append("`load_in_4bit: true` with `use_peft: true` (QLoRA) loads the weights in 4 bits")
    if phase in ("forward/backward", "optimizer", "loading", "training"):
        if world_size() > 1:
            fixes.append(
                "`--accelerate-config zero3_offload` keeps optimizer state and weights in CPU memory"
            )
        else:
            fixes.append(
                "several GPUs: `--num-processes N --accelerate-config zero3` shards weights and optimizer state"
            )
    if fragmented():
        fixes.append(
            "much memory is reserved but free (fragmentation): `PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True` "
            "under the recipe's `env:`"
        )
    return fixes


def out_of_memory_problem(recipe: Recipe, err: BaseException) -> str:
    """One message: what ran out where, the fixes with this recipe's numbers, and what a rerun resumes from."""
    phase = failure_phase(err)
    head = f"out of GPU memory {PHASE_TEXT[phase]}{gpu_numbers(err)}"
    if phase == "generation":
        batch, micro, per_generation = _generation_batch(recipe)
        where = _places(
            recipe, "per_device_train_batch_size", "steps_per_generation", "gradient_accumulation_steps"
        )
        head += (
            f": each process generates {batch} completions at once (per_device_train_batch_size {micro} x "
            f"steps_per_generation {per_generation}{where}), up to "
            f"{recipe.resolved().get('max_completion_length')} tokens each"
        )
    lines = [f"{head}. To fit:"] + [f"    - {fix}" for fix in memory_fixes(recipe, phase)]
    output_dir = recipe.values.get("output_dir")
    checkpoint = latest_checkpoint(output_dir) if output_dir else None
    if checkpoint:
        lines.append(f"  The run can resume from {checkpoint} (the same command; the keys above may change).")
    else:
        lines.append("  No checkpoint was saved before it ran out.")
    return "\n".join(lines)


def explains_out_of_memory(run):
    """Decorate `run_rl`/`run_sft`: running out of GPU memory becomes one UserError with fixes (exit code 2)."""

    @functools.wraps(run)
    def wrapper(recipe: Recipe, *args, **kwargs):
        try:
            return run(recipe, *args, **kwargs)
        except Exception as err:
            if not is_out_of_memory(err):
                raise
            problem = out_of_memory_problem(recipe, err)
            raise UserError(problem) from None

    return wrapper
