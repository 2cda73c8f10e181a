"""The run's own check of `grpo check`'s prediction: after its first steps on a GPU, the measured peak memory and step
time beside the predicted ones, said once on the console and kept in train_summary.json."""

from __future__ import annotations

import statistics
import time

from transformers import TrainerCallback

from grpo_cli.console import console
from grpo_cli.engine.estimate import GIB, Estimate
from grpo_cli.errors import UserError
from grpo_cli.recipe import Recipe

COMPARE_AT_STEP = 4  # the first step warms up (CUDA graphs, allocator): the median of the next ones is compared


def predicted(recipe: Recipe, processes: int, accelerate_config: dict | None) -> PredictionCheck | None:
    """The check for a `grpo rl` run on this machine's GPU, or None (no GPU, or a model the prediction can't read)."""
    from grpo_cli.recipe.memory import card_for, memory_plan

    if recipe.command != "rl":
        return None
    try:
        card = card_for(None, None)
        if card is None:
            return None
        plan = memory_plan(recipe, processes, accelerate_config, card)
    except (UserError, OSError, ValueError, TypeError):
        return None  # nothing to compare with: the run itself is not affected
    return PredictionCheck(plan.estimate, card.name, recipe.resolved().get("max_completion_length"))


class PredictionCheck(TrainerCallback):
    """Compares the predicted peak and step time with the measured ones once, at step COMPARE_AT_STEP (or at the
    end of a shorter run)."""

    def __init__(self, estimate: Estimate, card: str, max_completion_length: int | None = None):
        self.estimate, self.card, self.max_completion_length = estimate, card, max_completion_length
        self.durations: list[float] = []
        self.started: float | None = None
        self.result: dict | None = None

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.started is not None:
            self.durations.append(time.perf_counter() - self.started)
        if self.result is None and len(self.durations) >= COMPARE_AT_STEP:
            self._compare(state)

    def on_train_end(self, args, state, control, **kwargs):
        if self.result is None and self.durations:
            self._compare(state)

    def _compare(self, state) -> None:
        import torch

        if not torch.cuda.is_available():
            return
        measured_peak = torch.cuda.max_memory_allocated() / GIB
        step = statistics.median(self.durations[1:] or self.durations)
        free, total = torch.cuda.mem_get_info()
        others = (total - free - torch.cuda.memory_reserved()) / GIB  # held outside this process's allocator
        self.result = {
            "card": self.card,
            "at_step": state.global_step,
            "predicted_peak_gib": round(self.estimate.peak / GIB, 2),
            "measured_peak_gib": round(measured_peak, 2),
            "predicted_step_s": round(self.estimate.step_s, 2),
            "measured_step_s": round(step, 2),
            "completion_length_share": completion_share(state.log_history, self.max_completion_length),
            "gpu_gib_held_elsewhere": round(max(others, 0.0), 2),
        }
        if state.is_world_process_zero:
            console.print(comparison_line(self.result), soft_wrap=True)


SHARED_GIB = 4.0  # held on the GPU beyond this allocator, the CUDA context and NCCL buffers: another process


def completion_share(log_history: list[dict], max_completion_length: int | None) -> float | None:
    """The logged completions' mean length as a share of max_completion_length, or None where not logged."""
    lengths = [e["completions/mean_length"] for e in log_history if isinstance(e.get("completions/mean_length"), (int, float))]
    if not lengths or not max_completion_length:
        return None
    return round(statistics.mean(lengths) / max_completion_length, 2)


def comparison_line(r: dict) -> str:
    """The console's line: predicted and measured, and what makes them differ where the run knows it."""
    line = (
        f"prediction: peak {r['predicted_peak_gib']} GiB, measured {r['measured_peak_gib']} GiB "
        f"({r['measured_peak_gib'] / r['predicted_peak_gib'] - 1:+.0%}); step {r['predicted_step_s']} s, measured "
        f"{r['measured_step_s']} s ({r['measured_step_s'] / max(r['predicted_step_s'], 1e-9) - 1:+.0%})"
    )
    notes = []
    share = r.get("completion_length_share")
    if share is not None and share < 0.9:
        notes.append(f"completions averaged {share:.0%} of max_completion_length; the prediction assumes all of it")
    if r.get("gpu_gib_held_elsewhere", 0.0) > SHARED_GIB:
        notes.append(
            f"{r['gpu_gib_held_elsewhere']:.1f} GiB of the GPU is held by other processes: the step time is not this "
            "run's alone"
        )
    return line + "".join(f"; {note}" for note in notes)
