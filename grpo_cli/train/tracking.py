"""Experiment tracking with SwanLab, through swanlab's own transformers callback.

TRL's logged metrics (reward and per-reward means, reward std, completion lengths, KL, learning rate, loss) reach
SwanLab through the callback's `on_log`; we add the recipe as the run's config, a few sample completions as text, and
each finding of the run's diagnosis as text when it first holds.
"""

from __future__ import annotations

import os
from dataclasses import fields
from functools import cache
from pathlib import Path
from typing import Any

from grpo_cli.arguments import TrackingArguments
from grpo_cli.console import console
from grpo_cli.errors import UserError
from grpo_cli.recipe.check import tracking_problems
from grpo_cli.train.progress import SampleSchedule, pick_samples
from grpo_cli.trl_private import logs_of

# Our recipe says "cloud"; swanlab says "online".
SWANLAB_MODES = {"cloud": "online", "local": "local", "offline": "offline"}

DEFAULT_PROJECT = next(f.default for f in fields(TrackingArguments) if f.name == "swanlab_project")


def swanlab_project(tracking: TrackingArguments) -> str:
    """The project name; takes SWANLAB_PROJECT out of the environment, where it crashes swanlab's settings.

    The variable's value is used only when the recipe left `swanlab_project` at its default.
    """
    from_env = os.environ.pop("SWANLAB_PROJECT", None)
    if from_env and tracking.swanlab_project == DEFAULT_PROJECT:
        return from_env
    return tracking.swanlab_project


def swanlab_callback(
    tracking: TrackingArguments, output_dir: str, run_name: str | None, config: dict, findings=None
):
    """SwanLab's transformers callback for this run, or None when tracking is off; `findings`, the console's
    FindingWatch, whose findings it logs as text.

    Raises UserError (cloud without API key, local without dashboard) before training starts, so that
    swanlab never prompts. Once the trainer binds itself (`bind`), it also logs sample completions.
    """
    if not tracking.swanlab or tracking.swanlab_mode == "disabled":
        return None
    project = swanlab_project(tracking)  # before swanlab reads its settings
    if problems := tracking_problems(tracking):
        raise UserError(*problems)
    mode = SWANLAB_MODES[tracking.swanlab_mode]
    logdir = os.path.abspath(tracking.swanlab_logdir or os.path.join(output_dir, "swanlog"))
    experiment = tracking.swanlab_experiment or run_name or Path(os.path.abspath(output_dir)).name
    return _callback_class()(
        project=project,
        workspace=tracking.swanlab_workspace,
        experiment_name=experiment,
        mode=mode,
        log_dir=logdir,
        recipe=config,
        sample_every=tracking.sample_every,
        sample_count=tracking.sample_count,
        findings=findings,
    )


def sample_texts(rollout_logs: dict[str, Any], count: int) -> list:
    """swanlab.Text items for a few completions of GRPOTrainer's latest rollout (`trl_private.logs_of`)."""
    import swanlab

    texts = []
    for sample in pick_samples(rollout_logs, count):
        scores = ", ".join(f"{n} {v:.3f}" for n, v in sample.rewards.items())
        body = f"PROMPT (end):\n{sample.prompt[-500:]}\n\nCOMPLETION:\n{sample.completion}"
        texts.append(swanlab.Text(body, caption=f"{scores} | advantage {sample.advantage:+.3f}"))
    return texts


@cache
def _callback_class() -> type:
    # swanlab's callback subclasses transformers' TrainerCallback: import it only when tracking is on.
    import swanlab
    from swanlab.integration.transformers import SwanLabCallback

    class RunTracker(SwanLabCallback):
        """SwanLabCallback plus the recipe as config, sample completions and findings as text, and the run closed at
        train end; with `findings` (the console's FindingWatch: it says each finding once), what it said as text."""

        def __init__(self, *, recipe: dict, sample_every: int, sample_count: int, findings=None, **kwargs: Any):
            super().__init__(**kwargs)
            self.recipe = dict(recipe)
            self.samples = SampleSchedule(sample_every)
            self.sample_count = sample_count
            self.trainer = None  # the trainer, once it binds itself
            self.findings = findings
            self._findings_logged = 0
            self.logdir = kwargs["log_dir"]
            self.mode = kwargs["mode"]

        def bind(self, trainer) -> None:
            self.trainer = trainer

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            super().on_train_begin(args, state, control, model=model, **kwargs)
            if not self._is_world_process_zero(state):
                return
            # After the callback's own config (TrainingArguments, model config): the recipe keys win.
            self.update_config(self.recipe)
            if self.mode != "online":
                console.print(
                    f"swanlab ({self.mode}): logging to {self.logdir}", soft_wrap=True, markup=False
                )

        def on_log(self, args, state, control, model=None, logs=None, **kwargs):
            super().on_log(args, state, control, model=model, logs=logs, **kwargs)
            if self.findings is not None and self._can_log(state):
                new = self.findings.said[self._findings_logged :]
                self._findings_logged = len(self.findings.said)
                if new:
                    texts = [swanlab.Text(f.line, caption=f.name) for f in new]
                    self._log({"diagnosis/findings": texts}, self._get_step(state))
            rollout = logs_of(self.trainer)
            if not logs or not rollout or not self._can_log(state) or "train_runtime" in logs:
                return
            if self.samples.due(state.global_step) and (texts := sample_texts(rollout, self.sample_count)):
                self._log({"samples/completions": texts}, self._get_step(state))

        def on_train_end(self, args, state, control, **kwargs):
            super().on_train_end(args, state, control, **kwargs)
            if self._can_log(state):
                swanlab.finish()

    return RunTracker
