"""Checkpoints: which one a rerun resumes from, and stopping cleanly on Ctrl-C.

transformers writes `trainer_state.json` last when it saves a checkpoint, so a checkpoint folder without a readable
one was cut short (the process was killed while saving) and is never resumed from.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

from transformers import TrainerCallback

from grpo_cli.console import console
from grpo_cli.errors import UserError

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def checkpoints(output_dir: str | Path) -> list[Path]:
    """All `checkpoint-N` folders, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and CHECKPOINT.match(p.name)]
    return sorted(found, key=lambda p: int(CHECKPOINT.match(p.name).group(1)))


def is_complete(checkpoint: Path) -> bool:
    try:
        json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return True


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    complete = [p for p in checkpoints(output_dir) if is_complete(p)]
    return complete[-1] if complete else None


def resume_point(output_dir: str | Path, resume: bool, overwrite: bool, main: bool = True) -> Path | None:
    """Decide where training starts: the latest complete checkpoint, or fresh (after clearing old ones if asked).

    Every process decides the same; only the main one (`main`) deletes and prints.
    """
    found = checkpoints(output_dir)
    for partial in [p for p in found if not is_complete(p)]:
        if main:
            console.print(f"[yellow]removing {partial}: it was cut short while saving and cannot be resumed[/]")
            shutil.rmtree(partial, ignore_errors=True)
    found = [p for p in found if is_complete(p)]
    if not found:
        return None
    if resume:
        latest = found[-1]
        if main:
            console.print(f"[bold]resuming[/] from {latest} (use --no-resume to start over)")
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
        console.print(f"[yellow]deleted {len(found)} old checkpoint(s) in {output_dir}[/]")
    return None


class GracefulStop(TrainerCallback):
    """First Ctrl-C: finish the current step, save a checkpoint, stop. Second Ctrl-C: quit at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def install(self) -> None:
        self._previous = signal.signal(signal.SIGINT, self._on_signal)

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _on_signal(self, signum, frame) -> None:
        if self.requested:
            console.print("\n[red]second Ctrl-C: quitting now without saving[/]")
            os._exit(130)
        self.requested = True
        console.print("\n[yellow]Ctrl-C: saving a checkpoint after this step, then stopping (Ctrl-C again to quit now)[/]")

    def on_step_end(self, args, state, control, **kwargs):
        if self.requested:
            control.should_save = True
            control.should_training_stop = True
        return control
