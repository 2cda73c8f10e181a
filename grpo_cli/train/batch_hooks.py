"""What `grpo rl` does with each scored training batch once TRL has generated and scored it.

The trainer takes these in its constructor (`RLTrainer(after_scoring=[...])`) and calls each as
`hook(trainer, output, count)` on every process, in order: `output` is the batch TRL trains on, `count` how many
completions it holds gathered from every process (the last `count` entries of TRL's logs, `grpo_cli.trl_private.logs_of`).
Batches scored for evaluation do not reach them.
"""

from __future__ import annotations

import math
from pathlib import Path

from grpo_cli.atomic import json_text
from grpo_cli.train.health import StepGuard
from grpo_cli.trl_private import logs_of, metrics_of


def solved_groups(scores, top: float, num_generations: int) -> list[bool]:
    """For each group of a gathered batch's scores of one reward: whether every completion reached `top` (a reward
    that did not apply, NaN, does not)."""
    return (scores.view(-1, num_generations) >= top - 1e-9).all(dim=1).tolist()


class SolvedGroups:
    """Logs `frac_groups_solved`: the share of the batch's groups whose completions all reach the top score of the
    task's accuracy reward (`column` among the run's rewards, `top` its score)."""

    def __init__(self, column: int, top: float):
        self.column = column
        self.top = top

    def __call__(self, trainer, output: dict, count: int) -> None:
        rewards = trainer.last_rewards  # gathered from every process, a column per reward
        if rewards is None:
            return
        solved = solved_groups(rewards[:, self.column], self.top, trainer.num_generations)
        metrics_of(trainer)["frac_groups_solved"].append(sum(solved) / len(solved))


class GuardedScores:
    """Tells the run's guard about infinite rewards (NaN is a reward that did not apply) and non-finite advantages:
    the step then applies no update."""

    def __init__(self, guard: StepGuard):
        self.guard = guard

    def __call__(self, trainer, output: dict, count: int) -> None:
        import torch

        logs = logs_of(trainer)
        start = len(logs["advantages"]) - count
        for name, values in logs["rewards"].items():
            if any(math.isinf(v) for v in list(values)[start:]):
                self.guard.note("rewards", name)
        if not bool(torch.isfinite(output["advantages"]).all()):
            self.guard.note("advantages")


class RolloutsFile:
    """Appends every scored rollout (step, prompt, completion, rewards, advantage) to a JSONL file, from the main
    process (the logs hold every process's rollouts)."""

    def __init__(self, path: Path):
        self.path = path

    def __call__(self, trainer, output: dict, count: int) -> None:
        if not trainer.accelerator.is_main_process:
            return
        logs = logs_of(trainer)
        start = len(logs["advantages"]) - count
        rewards = {name: list(values)[start:] for name, values in logs["rewards"].items()}
        with open(self.path, "a", encoding="utf-8") as out:
            for i, (prompt, completion, advantage) in enumerate(
                zip(list(logs["prompt"])[start:], list(logs["completion"])[start:], list(logs["advantages"])[start:])
            ):
                row = {
                    "step": trainer.state.global_step,
                    "prompt": prompt,
                    "completion": completion,
                    # NaN (a reward that did not apply) is written as null
                    "rewards": {name: float(values[i]) for name, values in rewards.items()},
                    "advantage": float(advantage),
                }
                out.write(json_text(row) + "\n")
