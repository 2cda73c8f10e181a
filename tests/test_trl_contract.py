"""TRL's private names that grpo relies on (all of them in grpo_cli/trl_private.py) exist in the installed TRL, with
the parameters grpo calls them with. A TRL upgrade that renames or reshapes one fails here, naming it, before a run
fails somewhere inside a step. What the chunked LM head's kernels compute is tests/test_lm_head.py's to check."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import trl
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from trl import GRPOTrainer
from trl.kernels import chunked_logprob
from trl.trainer import utils as trl_utils

from grpo_cli import trl_private

ROOT = Path(__file__).resolve().parent.parent
TESTED = (
    f"grpo is tested with trl{trl_private.TESTED_TRL}, and trl {trl.__version__} is installed: on another TRL, "
    "update grpo_cli/trl_private.py (the one module that uses TRL's private names), then TESTED_TRL there and the "
    "pin in pyproject.toml"
)

# GRPOTrainer's (and the transformers Trainer's) private methods: the parameters after `self` that grpo passes, in
# order (any others must have defaults).
METHODS = {
    "_tokenize_prompts": ["prompts"],
    "_generate_single_turn": ["prompt_ids", "images", "multimodal_fields", "num_generations"],
    "_remove_unused_columns": ["dataset", "description"],
    "_prepare_inputs": ["generation_batch"],
    "_generate_and_score_completions": ["inputs"],
    "_calculate_rewards": ["inputs", "prompts", "completions", "completion_ids_list"],
    "_generate": ["prompts"],  # a name on tracebacks only
}
TRAINER_METHODS = {"_clip_grad_norm": ["model"], "_get_grad_norm": ["model", "grad_norm"]}  # the transformers Trainer's, which BeforeClipping overrides
# Attributes GRPOTrainer sets in __init__, and what grpo reads in them.
ATTRIBUTES = ("_logs", "_metrics", "_step", "_buffered_inputs", "_tokenizer", "_is_vlm")
LOG_KEYS = ("prompt", "completion", "rewards", "advantages")
# trl.kernels.chunked_logprob's private functions and constants, with their parameters.
TILE = ["vocab_start", "n_cols", "logit_scale", "softcap", "inv_t", "HAS_SOFTCAP", "HAS_LOGPROB_GRAD",
        "HAS_ENTROPY_GRAD", "BLOCK_SIZE"]  # fmt: skip
TENSORS = ["targets", "log_z", "entropy", "grad_logprobs", "grad_entropy"]
KERNELS = {
    "_use_triton": ["device"],
    "_addmm_fp32": ["acc", "a", "b"],
    "_backward_tile": ["tile", "tile_stride", *TENSORS, *TILE],
    "_backward_kernel": ["mm_ptr", "mm_stride", *(f"{name}_ptr" for name in TENSORS), *TILE],  # Triton: pointers
    "_BLOCK_SIZE": None,
}
UTILS = ("_ChunkedLogProbFunction",)  # trl.trainer.utils: the autograd function its fused LM head runs


def parameters(function) -> list[inspect.Parameter]:
    function = getattr(function, "fn", function)  # a Triton kernel: the Python function it compiles
    return [p for p in inspect.signature(function).parameters.values() if p.name != "self"]


def takes(owner: str, name: str, function, expected: list[str]) -> None:
    """`function` takes `expected` first, in that order, and needs nothing more."""
    found = parameters(function)
    rest = found[len(expected) :]
    fits = [p.name for p in found[: len(expected)]] == expected and all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in rest
    )
    assert fits, (
        f"{owner}.{name} changed: grpo calls it with ({', '.join(expected)}), it now takes "
        f"({', '.join(str(p) for p in found)}); {TESTED}"
    )


def test_the_installed_trl_is_a_tested_release():
    assert Version(trl.__version__) in SpecifierSet(trl_private.TESTED_TRL), TESTED


def test_pyproject_pins_the_tested_releases():
    assert f'"trl{trl_private.TESTED_TRL}"' in (ROOT / "pyproject.toml").read_text(), (
        f"pyproject.toml's trl pin is not trl{trl_private.TESTED_TRL}, the releases grpo_cli/trl_private.py is "
        "tested with: change both together"
    )


def test_grpo_trainer_has_the_private_methods_grpo_calls():
    for name, expected in METHODS.items():
        method = getattr(GRPOTrainer, name, None)
        assert callable(method), f"GRPOTrainer.{name} is gone; {TESTED}"
        takes("GRPOTrainer", name, method, expected)


def test_batch_steps_overrides_exactly_the_listed_methods_with_their_parameters():
    own = {name for name in vars(trl_private.BatchSteps) if name.startswith("_") and not name.startswith("__")}
    assert own == set(trl_private.OVERRIDDEN_METHODS)
    for name in trl_private.OVERRIDDEN_METHODS:
        ours = [p.name for p in parameters(getattr(trl_private.BatchSteps, name))]
        assert ours == METHODS[name]  # TRL calls the override as it calls its own method
        takes("GRPOTrainer", name, getattr(GRPOTrainer, name), ours)


def test_before_clipping_overrides_the_trainers_clipping_with_its_parameters():
    from transformers import Trainer

    own = {name for name in vars(trl_private.BeforeClipping) if name.startswith("_") and not name.startswith("__")}
    assert own == set(TRAINER_METHODS)
    for name, expected in TRAINER_METHODS.items():
        method = getattr(Trainer, name, None)
        assert callable(method), f"transformers' Trainer.{name} is gone; {TESTED}"
        takes("Trainer", name, method, expected)
        assert [p.name for p in parameters(getattr(trl_private.BeforeClipping, name))] == expected


def test_the_traceback_frames_name_grpo_trainer_methods():
    for name in trl_private.GENERATION_FRAMES + trl_private.SCORING_FRAMES:
        assert name in METHODS and callable(getattr(GRPOTrainer, name, None)), f"GRPOTrainer.{name} is gone; {TESTED}"


def test_a_grpo_trainer_holds_the_private_attributes_grpo_reads(tmp_path, tiny_grpo_trainer):
    trainer = tiny_grpo_trainer(tmp_path, [lambda completions, **kw: [0.0] * len(completions)])
    for name in ATTRIBUTES:
        assert hasattr(trainer, name), f"GRPOTrainer no longer sets {name}; {TESTED}"
    logs = trl_private.logs_of(trainer)
    assert all(key in logs for key in LOG_KEYS), f"GRPOTrainer._logs holds {sorted(logs)}, not {LOG_KEYS}; {TESTED}"
    metrics = trl_private.metrics_of(trainer)
    metrics["contract/probe"].append(1.0)  # grpo appends to a metric's list, created on first use
    assert trl_private.prepared_micro_batches(trainer) == 0
    assert trl_private.text_tokenizer(trainer).pad_token_id is not None
    assert trl_private.is_vision_language(trainer) is False


def test_the_chunked_lm_head_has_the_kernels_the_lean_backward_runs():
    for name, expected in KERNELS.items():
        found = getattr(chunked_logprob, name, None)
        assert found is not None, f"trl.kernels.chunked_logprob.{name} is gone; {TESTED}"
        if expected is None:
            assert isinstance(found, int), f"trl.kernels.chunked_logprob.{name} is no longer a number; {TESTED}"
        else:
            takes("trl.kernels.chunked_logprob", name, found, expected)
    for name in UTILS:
        function = getattr(trl_utils, name, None)
        assert isinstance(function, type) and issubclass(function, chunked_logprob.ChunkedLogProbFunction), (
            f"trl.trainer.utils.{name} is no longer the ChunkedLogProbFunction its fused LM head runs; {TESTED}"
        )


def private_names_used(path: Path) -> set[str]:
    """The `_` names a module reaches on other objects or names in strings (its own functions left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            found.add(node.value)
        elif isinstance(node, ast.FunctionDef):
            found.add(node.name)
    return {name for name in found - own if name.startswith("_") and not name.startswith("__")}


def test_every_private_name_the_adapter_uses_is_checked_here():
    checked = set(METHODS) | set(TRAINER_METHODS) | set(ATTRIBUTES) | set(KERNELS) | set(UTILS)
    unchecked = private_names_used(ROOT / "grpo_cli" / "trl_private.py") - checked
    assert not unchecked, f"grpo_cli/trl_private.py uses {sorted(unchecked)}: add them to this test's tables"
