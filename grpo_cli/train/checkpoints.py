"""A run's checkpoints as training uses them: which one a rerun resumes from (grpo_cli/run_folder.py finds them),
stopping cleanly on Ctrl-C or SIGTERM, and what a full disk means for the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

from transformers import TrainerCallback

from grpo_cli.atomic import readable_tree
from grpo_cli.console import console, escape
from grpo_cli.errors import RunStopped, UserError
from grpo_cli.run_folder import (
    ADAPTER_FILES,
    MODEL_FILES,
    checkpoints,
    foreign_contents,
    is_complete,
    latest_checkpoint,
    missing_training_state,
)
from grpo_cli.weights import damaged_weights


def run_command(output_dir: str | Path) -> str | None:
    """`rl` or `sft`: which command's run an output folder holds (its rollouts file, else its recipe.yaml's keys);
    None where it cannot tell."""
    import yaml

    from grpo_cli.recipe.load import command_of

    root = Path(output_dir)
    if (root / "rollouts.jsonl").exists():
        return "rl"
    try:
        keys = yaml.safe_load((root / "recipe.yaml").read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return command_of(keys) if isinstance(keys, dict) else None



def resume_point(
    output_dir: str | Path,
    resume: bool,
    overwrite: bool,
    main: bool = True,
    max_steps: int | None = None,
    command: str | None = None,
) -> Path | None:
    """Decide where training starts: the latest complete checkpoint, or fresh (after clearing old ones if asked).
    A folder that is not a run's is refused unless `overwrite`; a run that reached `max_steps` is not trained again;
    a `command` run (`rl`, `sft`) does not resume the other command's checkpoints.

    Every process decides the same; only the main one (`main`) deletes and prints.
    """
    foreign = foreign_contents(output_dir)
    if foreign and not overwrite:
        raise UserError(
            f"the output folder {output_dir} already holds {foreign}, not a grpo run: the run would write its "
            "checkpoints and model among them - set another `--output_dir`, or add --overwrite to write into it"
        )
    found = checkpoints(output_dir)
    for partial in [p for p in found if not is_complete(p)]:
        if main:
            console.print(f"[yellow]removing {escape(str(partial))}: it was cut short while saving and cannot be resumed[/]")
            shutil.rmtree(partial, ignore_errors=True)
    found = [p for p in found if is_complete(p)]
    if not found:
        root = Path(output_dir)
        finished = (root / "train_summary.json").is_file() and any(
            (root / name).is_file() for name in (*MODEL_FILES, *ADAPTER_FILES)
        )
        if finished and not overwrite:
            raise UserError(
                f"{output_dir} is a finished run with no checkpoint to resume (`save_strategy: no`, or its "
                "checkpoints deleted): training again would start from the first step and replace its model - add "
                "--no-resume --overwrite to do that, or give this run another `--output_dir`"
            )
        return None
    if resume:
        latest = found[-1]
        previous = run_command(output_dir) if command else None
        if previous and previous != command:
            raise UserError(
                f"{output_dir} holds a `grpo {previous}` run: `grpo {command}` would resume its {latest.name} as "
                f"its own - give this run another `--output_dir` (to start from that model: --model_name_or_path "
                f"{output_dir}), or add --no-resume --overwrite to replace it"
            )
        damaged = damaged_weights(latest)
        if damaged:
            raise UserError(
                f"the latest checkpoint cannot be resumed: {damaged} - delete {latest} to resume from the one "
                "before it, or start over with --no-resume --overwrite"
            )
        step = int(json.loads((latest / "trainer_state.json").read_text()).get("global_step") or 0)
        if max_steps and max_steps > 0 and step >= max_steps:
            raise UserError(
                f"{output_dir} is a finished run: it trained {step} steps (`max_steps` {max_steps}) and saved "
                f"{latest.name}. To train further from there, raise `--max_steps` (e.g. --max_steps "
                f"{step + max(step // 2, 1)}); to start over, add --no-resume --overwrite"
            )
        if main:
            console.print(f"[bold]resuming[/] from {escape(str(latest))} (use --no-resume to start over)")
            missing = missing_training_state(latest)
            if missing:
                console.print(f"[yellow]warning:[/] {escape(missing)}", soft_wrap=True)
        return latest
    if not overwrite:
        raise UserError(
            f"{output_dir} already holds {len(found)} checkpoint(s) (latest {found[-1].name}) - rerun without "
            "--no-resume to continue from it, add --overwrite to delete them and start over, or set another "
            "`--output_dir`"
        )
    if main:
        for path in found:
            shutil.rmtree(path)
        console.print(f"[yellow]deleted {len(found)} old checkpoint(s) in {escape(str(output_dir))}[/]")
    return None


class StoppedBySignal(RunStopped):
    """The run stopped on a signal after saving a checkpoint (and saying so); the exit code is the signal's: 130 for
    SIGINT, 143 for SIGTERM."""

    def __init__(self, signum: int):
        super().__init__(code=128 + signum)
        self.signal = signal.Signals(signum).name


class ResumedSchedule(TrainerCallback):
    """A resumed run trains its first step at the learning rate its schedule gives that step.

    The checkpoint's optimizer holds the rate of the step it saved: 0 at the end of a decaying schedule. The schedule
    (a LambdaLR: linear, cosine, constant, with or without warm-up) sets the next rate only after the next step, so
    a run resumed with a raised `max_steps` would train that step at 0. The checkpoint's scheduler also brings back
    the learning rate it was made with; the run's own `learning_rate` is the one asked for."""

    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        if not state.global_step or optimizer is None or not hasattr(lr_scheduler, "lr_lambdas"):
            return
        if len(set(lr_scheduler.base_lrs)) == 1:  # one learning rate for every group: the run's
            lr_scheduler.base_lrs = [args.learning_rate] * len(lr_scheduler.base_lrs)
        step = lr_scheduler.last_epoch
        rates = [base * scale(step) for base, scale in zip(lr_scheduler.base_lrs, lr_scheduler.lr_lambdas)]
        for group, rate in zip(optimizer.param_groups, rates):
            group["lr"] = rate
        lr_scheduler._last_lr = rates


class ReadableCheckpoints(TrainerCallback):
    """Each checkpoint as readable as the user's umask makes their own files (safetensors saves weights 0600)."""

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and folder.is_dir():
            readable_tree(folder)


SECOND_SIGNAL_AFTER_S = 1.0


class GracefulStop(TrainerCallback):
    """First Ctrl-C or SIGTERM (what Slurm, Kubernetes and container runtimes send): finish the current step, save a
    checkpoint, stop. A second one, `SECOND_SIGNAL_AFTER_S` or more after the first: quit at once.

    One request to stop often arrives twice within a moment: `timeout` signals the command and then its own process
    group, which the command is in, and a launcher that passes a signal on to a process whose group was signalled too
    does the same. Counted as two, that quit without saving; a signal that comes sooner than `SECOND_SIGNAL_AFTER_S`
    after the first is the same request.

    Python runs signal handlers on the main thread between two bytecodes, so a main thread stuck inside one long
    call (a step that never ends) would never see the second signal. The signal numbers also reach a pipe
    (`signal.set_wakeup_fd`) that a small thread reads: it quits on the second signal whatever the main thread does."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None
        self._first_at = 0.0  # time.monotonic() of the first signal, as the main thread saw it
        self.before_quit: list = []  # called (from either thread) just before quitting without saving
        self._previous: dict = {}
        self._wakeup: tuple[int, int, int] | None = None  # read end, write end, the wakeup fd it replaced

    def install(self) -> None:
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        read, write = os.pipe()
        os.set_blocking(write, False)
        try:
            replaced = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except (ValueError, OSError):  # not the main thread, or a platform that wants a socket
            os.close(read)
            os.close(write)
            return
        self._wakeup = (read, write, replaced)
        _WAKEUP_FDS.add(write)
        threading.Thread(target=self._watch, args=(read,), name="grpo-second-signal", daemon=True).start()

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        if self._wakeup is not None:
            _, write, replaced = self._wakeup
            self._wakeup = None
            signal.set_wakeup_fd(replaced)
            _WAKEUP_FDS.discard(write)
            os.close(write)  # the thread reads the end of the pipe and closes its side

    def _watch(self, read: int) -> None:
        first_at: float | None = None
        try:
            while data := os.read(read, 64):  # one byte per signal with a Python handler (SIGALRM's too)
                now = time.monotonic()
                for signum in data:
                    if signum not in self.SIGNALS:
                        continue
                    if first_at is None:
                        first_at = now
                    elif now - first_at >= SECOND_SIGNAL_AFTER_S:
                        os.write(2, b"\nsecond signal: quitting now without saving\n")
                        self._quit(signum)
        finally:
            os.close(read)

    def _on_signal(self, signum, frame) -> None:
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if self.requested:
            # The thread reading the pipe decides, from when each signal came; without it, the main thread does.
            if self._wakeup is None and time.monotonic() - self._first_at >= SECOND_SIGNAL_AFTER_S:
                console.print(f"\n[red]second {name}: quitting now without saving[/]")
                self._quit(signum)
            return
        self.requested = True
        self.signum = signum
        self._first_at = time.monotonic()
        console.print(f"\n[yellow]{name}: saving a checkpoint after this step, then stopping ({name} again to quit now)[/]")

    def _quit(self, signum: int) -> None:
        for callback in self.before_quit:
            with contextlib.suppress(Exception):
                callback()
        os._exit(128 + signum)

    def on_step_end(self, args, state, control, **kwargs):
        if self.requested:
            control.should_save = True
            control.should_training_stop = True
        return control


_WAKEUP_FDS: set[int] = set()  # the write ends GracefulStop has set as the wakeup fd


def _no_wakeup_fd_in_child() -> None:
    """A process forked without exec would write its own signals into the parent's pipe: it gets none of ours."""
    with contextlib.suppress(ValueError, OSError):
        inherited = signal.set_wakeup_fd(-1)
        if inherited not in _WAKEUP_FDS:
            signal.set_wakeup_fd(inherited)  # someone else's: left as it was


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_no_wakeup_fd_in_child)


def disk_full_problem(output_dir: str | Path) -> str:
    """The message for a run that ran out of disk space while writing into `output_dir`."""
    latest = latest_checkpoint(output_dir)
    free = shutil.disk_usage(Path(output_dir) if Path(output_dir).exists() else Path.cwd()).free / 2**30
    resume = (
        f"the last complete checkpoint, {latest}, is intact and the same command resumes from it"
        if latest is not None
        else "no complete checkpoint was saved"
    )
    return (
        f"out of disk space writing into {output_dir} ({free:.1f} GiB free now): {resume}. Free some space, keep fewer "
        "checkpoints (`save_total_limit`), save only the model (`save_only_model: true`), or set `output_dir` on a "
        "larger disk"
    )
