"""What a person sees during `grpo rl` / `grpo sft`: one progress bar, one metrics line per log, sample completions.

The libraries' own noise is grpo_cli/quiet.py's.
"""

from __future__ import annotations

import atexit
import math
import os
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text
from transformers import TrainerCallback

from grpo_cli.arguments import TrackingArguments
from grpo_cli.console import console as shared_console
from grpo_cli.diagnosis import FindingWatch, is_training_log
from grpo_cli.diagnosis import finite_number as _get
from grpo_cli.trl_private import logs_of

# ------------------------------------------------------------------------------------------- trainer printers

def remove_default_printers(trainer) -> None:
    """Drop transformers' PrinterCallback (a dict per log) and progress bars so that only RunConsole prints."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for callback in (PrinterCallback, ProgressCallback):
        while trainer.pop_callback(callback) is not None:
            pass


# ------------------------------------------------------------------------------------------------ metrics lines


def _num(value: float, digits: int = 3) -> str:
    """Short number: fixed-point when readable, scientific for tiny or huge values."""
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return str(value)
    if 1e-3 <= abs(value) < 1e5:
        return f"{value:.{digits}g}" if abs(value) >= 1 else f"{value:.{digits}f}".rstrip("0").rstrip(".")
    return f"{value:.1e}"


def _duration(seconds: float) -> str:
    """h:mm:ss or m:ss."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def short_reward_names(names: list[str]) -> dict[str, str]:
    """Short names that tell rewards apart: `pkg.mod:format_reward` -> `format`; a shared prefix goes
    (`countdown_format`, `countdown_equation` -> `format`, `equation`); at most 10 characters when still distinct."""
    stems = [re.sub(r"(^reward_|_reward$|_rewards$)", "", re.split(r"[:.]", n)[-1]) or n for n in names]
    if len(stems) > 1:
        shared = os.path.commonprefix(stems)
        shared = shared[: shared.rfind("_") + 1]  # cut at a word boundary
        if shared and all(len(stem) > len(shared) for stem in stems):
            stems = [stem[len(shared) :] for stem in stems]
    short = [stem[:10] for stem in stems]
    if len(set(short)) < len(short):  # cutting made two the same: keep them whole
        short = stems
    return dict(zip(names, short))


def logged_reward_names(logs: dict[str, Any]) -> list[str]:
    """Reward function names found in a TRL log dict (`rewards/<name>/mean`), in logging order."""
    return [
        key[len("rewards/") : -len("/mean")]
        for key in logs
        if key.startswith("rewards/") and key.endswith("/mean")
    ]


def metrics_line(
    step: int, max_steps: int, logs: dict[str, Any], seconds_per_step: float | None = None
) -> str:
    """One compact line for a log of GRPO (has `reward`) or SFT metrics; absent metrics are left out."""
    width = len(str(max_steps)) if max_steps > 0 else 1
    parts = [f"step {step:>{width}}/{max_steps}" if max_steps > 0 else f"step {step}"]
    if _get(logs, "reward") is not None:
        reward = f"reward {_get(logs, 'reward'):.2f}"
        names = logged_reward_names(logs)
        short = short_reward_names(names)
        means = [(short[n], _get(logs, f"rewards/{n}/mean")) for n in names]
        means = [f"{n} {v:.2f}" for n, v in means if v is not None]
        if len(names) > 1 and means:
            reward += f" ({' '.join(means)})"
        parts.append(reward)
        for label, key, fmt in (
            ("std", "reward_std", "{:.2f}"),
            ("len", "completions/mean_length", "{:>3.0f}"),
            ("clip", "completions/clipped_ratio", "{:.2f}"),
            ("dropped", "dynamic_sampling/dropped_share", "{:.2f}"),
            ("skipped", "frac_rows_skipped", "{:.2f}"),
        ):
            if (value := _get(logs, key)) is not None:
                parts.append(f"{label} {fmt.format(value)}")
        if (kl := _get(logs, "kl")) is not None:
            parts.append(f"kl {_num(kl)}")
    if (loss := _get(logs, "loss")) is not None:
        parts.append(f"loss {_num(loss, 4)}")
    if (accuracy := _get(logs, "mean_token_accuracy")) is not None:
        parts.append(f"acc {accuracy:.3f}")
    if (lr := _get(logs, "learning_rate")) is not None:
        parts.append(f"lr {lr:.1e}")
    if _get(logs, "reward") is None and (grad_norm := _get(logs, "grad_norm")) is not None:
        parts.append(f"gnorm {_num(grad_norm)}")
    if seconds_per_step is not None:
        parts.append(
            f"{seconds_per_step:.1f} s/step" if seconds_per_step >= 1 else f"{seconds_per_step:.2f} s/step"
        )
    return " | ".join(parts)


# ------------------------------------------------------------------------------------------------ sample completions


@dataclass
class Sample:
    """One completion of the latest rollout with what the rewards made of it."""

    prompt: str
    completion: str
    rewards: dict[str, float] = field(default_factory=dict)
    advantage: float = 0.0

    @property
    def reward(self) -> float:
        """Unweighted sum of the rewards that scored it (NaN rewards skipped)."""
        return sum(v for v in self.rewards.values() if not math.isnan(v))


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _plain(message: Any) -> str:
    """Text of a prompt or completion: a string, or chat messages whose content is a string or text parts."""
    if isinstance(message, str):
        text = message
    elif isinstance(message, dict):
        content = message.get("content", "")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        text = str(content)
    elif isinstance(message, (list, tuple)):
        text = "\n".join(_plain(m) for m in message)
    else:
        text = str(message)
    # Random or broken models emit control bytes that would move the cursor: show them as escapes.
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def pick_samples(rollout_logs: dict[str, Any], count: int) -> list[Sample]:
    """The best, the worst and evenly spaced ones between, by advantage, from GRPOTrainer's latest batch
    (`trl_private.logs_of`)."""
    completions = list(rollout_logs.get("completion") or [])
    prompts = list(rollout_logs.get("prompt") or [])
    advantages = list(rollout_logs.get("advantages") or [])
    rewards = {name: list(values) for name, values in (rollout_logs.get("rewards") or {}).items()}
    n = min(len(completions), len(prompts))
    if n == 0 or count <= 0:
        return []
    advantage = [float(advantages[i]) if i < len(advantages) else 0.0 for i in range(n)]
    order = sorted(range(n), key=lambda i: -advantage[i] if not math.isnan(advantage[i]) else math.inf)
    if count >= n:
        chosen = order
    elif count == 1:
        chosen = order[:1]
    else:
        chosen = [order[round(k * (n - 1) / (count - 1))] for k in range(count)]
    samples = []
    for i in chosen:
        prompt = prompts[i]
        if isinstance(prompt, (list, tuple)) and prompt:
            prompt = prompt[-1]  # the last turn is the one the completion answers
        samples.append(
            Sample(
                prompt=_plain(prompt),
                completion=_plain(completions[i]),
                rewards={name: float(values[i]) for name, values in rewards.items() if i < len(values)},
                advantage=advantage[i],
            )
        )
    return samples


def sample_panel(sample: Sample, title: str, prompt_chars: int = 160, completion_chars: int = 1200) -> Panel:
    """A Rich panel: rewards and advantage in the title, the end of the prompt dimmed, then the completion."""
    prompt = sample.prompt.strip()
    if len(prompt) > prompt_chars:
        prompt = "…" + prompt[-prompt_chars:]
    completion = sample.completion
    if len(completion) > completion_chars:
        completion = completion[:completion_chars] + f"… ({len(sample.completion)} chars)"
    short = short_reward_names(list(sample.rewards))
    scores = " ".join(f"{short[n]} {'-' if math.isnan(v) else f'{v:.2f}'}" for n, v in sample.rewards.items())
    header = f"{title} | {scores} | adv {sample.advantage:+.2f}"
    body = Group(Text(prompt, style="dim"), Text(completion or "(empty)"))
    return Panel(body, title=Text(header), title_align="left", border_style="cyan")


# ------------------------------------------------------------------------------------------------ the callback


class SampleSchedule:
    """When to show sample completions: at the first log, then once every `every` steps (0: never)."""

    def __init__(self, every: int):
        self.every = every
        self.next_step = 0

    def due(self, step: int) -> bool:
        """Whether samples are due at this step; if so, the next are due `every` steps on."""
        if self.every <= 0 or step < self.next_step:
            return False
        self.next_step = (step // self.every + 1) * self.every
        return True


class RunConsole(TrainerCallback):
    """Console of a training run: a progress bar with ETA (a plain line per log when stderr is not a terminal),
    one metrics line per log, every `sample_every` steps `sample_count` GRPO completions with their rewards, and each
    finding of `grpo_cli.diagnosis` once, when it first holds.

    Sample completions come from the trainer's latest batch once it binds itself (`bind`). Only the main process
    prints.
    """

    def __init__(
        self,
        tracking: TrackingArguments | None = None,
        console: Console | None = None,
        live: bool | None = None,
        values: dict | None = None,
        guard=None,
    ):
        """Samples as `tracking` says; print on `console` (the shared stderr one), live bar when it is a terminal;
        `values` (the recipe's) fill the findings' suggestions; `guard`, the run's StepGuard if any: a run it stopped
        does not end with "done"."""
        tracking = tracking or TrackingArguments()
        self.console = console or shared_console
        self.live = (self.console.is_terminal and not self.console.is_dumb_terminal) if live is None else live
        self.sample_count = tracking.sample_count
        self.samples = SampleSchedule(tracking.sample_every)
        self.trainer = None  # the trainer, once it binds itself
        self.progress: Progress | None = None
        self._task = None
        self._max_steps = 0
        self._start_step = 0
        self._started = 0.0
        self._last_step_end = 0.0
        self._step_seconds: deque[float] = deque(maxlen=50)
        self._since_log: list[float] = []
        self._last_logs: dict[str, Any] = {}
        self._best: tuple[float, int] | None = None
        self._runtime: float | None = None
        self.findings = FindingWatch(dict(values or {}))
        self.guard = guard

    def bind(self, trainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self._max_steps = int(state.max_steps or 0)
        self._start_step = int(state.global_step or 0)
        self._started = self._last_step_end = time.monotonic()
        # A resumed run's earlier logs, so that a finding names the step it began even before the resume.
        self.findings.history = [dict(e) for e in state.log_history or [] if "step" in e and is_training_log(e)]

    def on_step_begin(self, args, state, control, **kwargs):
        # Start the bar here, not at train begin, so that what other callbacks print then (SwanLab) comes first.
        if state.is_world_process_zero and self.live and self.progress is None:
            self.progress = Progress(
                TextColumn("[bold]training"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("steps"),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=self.console,
                # Leave sys.stdout/stderr alone: SwanLab wraps their write() to capture the console.
                redirect_stdout=False,
                redirect_stderr=False,
                speed_estimate_period=600,
                refresh_per_second=2,
            )
            self._task = self.progress.add_task(
                "train", total=self._max_steps or None, completed=state.global_step
            )
            self.progress.start()
            atexit.register(self.close)  # a crash skips on_train_end: still give the terminal its cursor back

    def on_step_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        now = time.monotonic()
        self._step_seconds.append(now - self._last_step_end)
        self._since_log.append(now - self._last_step_end)
        self._last_step_end = now
        if self.progress is not None:
            self.progress.update(self._task, completed=state.global_step, refresh=True)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        logs = dict(logs)
        if "train_runtime" in logs:  # the trainer's closing log: it goes into the summary
            self._runtime = _get(logs, "train_runtime")
            return
        step = int(state.global_step)
        if any(key.startswith("eval_") for key in logs):
            metrics = {k[len("eval_") :]: v for k, v in logs.items() if k.startswith("eval_")}
            line = "eval " + metrics_line(step, self._max_steps, metrics)
            self.console.print(Text(line, style="magenta"), soft_wrap=True)
            return
        self._last_logs = logs
        if (reward := _get(logs, "reward")) is not None and (self._best is None or reward > self._best[0]):
            self._best = (reward, step)
        per_step = sum(self._since_log) / len(self._since_log) if self._since_log else _get(logs, "step_time")
        self._since_log = []
        line = metrics_line(step, self._max_steps, logs, per_step)
        if not self.live and self._max_steps:
            line += (
                f" | {_duration(time.monotonic() - self._started)} elapsed, eta {_duration(self.eta(step))}"
            )
        self.console.print(Text(line), soft_wrap=True)
        for finding in self.findings.update(step, logs):
            self.console.print(Text(finding.line, style="bold yellow"), soft_wrap=True)
        if self.trainer is not None and logs_of(self.trainer) and self.samples.due(step):
            self.show_samples(step)

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self.close()
        steps = int(state.global_step) - self._start_step
        seconds = self._runtime if self._runtime is not None else time.monotonic() - self._started
        if self.guard is not None and self.guard.stopped:
            self.console.print(Text(f"stopped after {steps} steps in {_duration(seconds)}", style="bold red"))
            return
        summary = f"done: {steps} steps in {_duration(seconds)}"
        if steps > 0:
            summary += f" ({seconds / steps:.1f} s/step)"
        if (reward := _get(self._last_logs, "reward")) is not None:
            summary += f" | final reward {reward:.3f}"
            if self._best is not None:
                summary += f" (best {self._best[0]:.3f} at step {self._best[1]})"
        elif (loss := _get(self._last_logs, "loss")) is not None:
            summary += f" | final loss {_num(loss, 4)}"
        self.console.print(Text(summary, style="bold green"), soft_wrap=True)

    def eta(self, step: int) -> float:
        """Seconds left, from the recent seconds per step."""
        if not self._step_seconds or not self._max_steps:
            return 0.0
        return max(0, self._max_steps - step) * sum(self._step_seconds) / len(self._step_seconds)

    def show_samples(self, step: int) -> None:
        """Print a few completions of the latest rollout with their rewards and advantages."""
        samples = pick_samples(logs_of(self.trainer), self.sample_count)
        for k, sample in enumerate(samples, 1):
            self.console.print(sample_panel(sample, f"sample {k}/{len(samples)} at step {step}"))

    def close(self) -> None:
        """Stop the live bar (idempotent); on_train_end calls it, call it too when training fails."""
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
            atexit.unregister(self.close)
