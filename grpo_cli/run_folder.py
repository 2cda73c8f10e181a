"""What a run's output folder holds and how to find it: its `checkpoint-N` folders (the latest complete one), a
trained model or adapter in it, the files that make it a grpo run's, and the lock of the run writing it.

transformers writes `trainer_state.json` last when it saves a checkpoint, so a checkpoint folder without a readable
one was cut short (the process was killed while saving) and is never resumed from.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import time
from pathlib import Path

from grpo_cli.errors import UserError

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")  # what the trainer names the checkpoint of step N


def checkpoint_folders(folder: str | os.PathLike, marker: str | None = None) -> list[tuple[int, Path]]:
    """The `checkpoint-N` folders in `folder` as (N, path), oldest first; with `marker`, only those holding that
    file (a checkpoint being written may not hold it yet)."""
    folder = Path(folder)
    found = []
    for child in folder.iterdir() if folder.is_dir() else ():
        match = CHECKPOINT_NAME.match(child.name)
        if match and child.is_dir() and (marker is None or (child / marker).is_file()):
            found.append((int(match.group(1)), child))
    return sorted(found)


def _is_full_model(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (
        any((folder / f).is_file() for f in WEIGHT_FILES) or any(folder.glob("model-*.safetensors"))
    )


def find_full_model(path: str | os.PathLike) -> tuple[Path, str] | None:
    """A full fine-tuning run's model: the folder itself when it holds one, else its latest checkpoint-N; or None."""
    folder = Path(path).expanduser()
    if not folder.is_dir() or (folder / "adapter_config.json").is_file():
        return None
    if _is_full_model(folder):
        return folder, str(path)
    checkpoints = [(step, c) for step, c in checkpoint_folders(folder, "config.json") if _is_full_model(c)]
    if checkpoints:
        step, latest = checkpoints[-1]
        return latest, f"{folder.name}/{latest.name} (latest checkpoint, step {step})"
    return None


def find_adapter(path: str | os.PathLike) -> tuple[Path, str]:
    """Adapter folder and a label for it from an adapter, checkpoint or run output folder."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise UserError(
            f"adapter folder {path} does not exist - give a run's output folder or a checkpoint folder"
        )
    if (folder / "adapter_config.json").is_file():
        if CHECKPOINT_NAME.match(folder.name):
            return folder, f"{folder.parent.name}/{folder.name}"
        return folder, folder.name
    checkpoints = checkpoint_folders(folder, "adapter_config.json")
    if checkpoints:
        step, latest = checkpoints[-1]
        return latest, f"{folder.name}/{latest.name} (latest checkpoint, step {step})"
    if _is_full_model(folder) or checkpoint_folders(folder, "config.json"):
        raise UserError(
            f"nothing to merge: {path} holds a full fine-tuned model (config.json and weights, no "
            "adapter_config.json) - it is already a complete model; use it directly, e.g. grpo eval --model "
            f"{path}"
        )
    raise UserError(
        f"no adapter in {path}: expected adapter_config.json there, or checkpoint-N folders holding one - "
        "give the output_dir of a LoRA run (use_peft: true) or one of its checkpoints"
    )


def checkpoints(output_dir: str | Path) -> list[Path]:
    """All `checkpoint-N` folders, oldest first."""
    return [path for _, path in checkpoint_folders(output_dir)]


def is_complete(checkpoint: Path) -> bool:
    try:
        json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return True


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint, or None. (transformers' `get_last_checkpoint` takes the highest number, also
    a checkpoint cut short while saving; this skips one without a readable trainer_state.json.)"""
    complete = [p for p in checkpoints(output_dir) if is_complete(p)]
    return complete[-1] if complete else None


# What a grpo run leaves in its output folder besides checkpoints: a folder holding one of these is a run's.
RUN_FILES = ("recipe.yaml", "train_summary.json", "rollouts.jsonl")
LOCK_FILE = ".grpo-run.lock"  # held by the run writing the folder (`RunLock`)
MODEL_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def foreign_contents(output_dir: str | Path) -> str | None:
    """What an existing output folder holds when it is not a grpo run's folder (None: absent, empty, or a run's)."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    names = sorted(p.name for p in root.iterdir() if p.name != LOCK_FILE)
    if not names or any(name in RUN_FILES for name in names) or checkpoints(root):
        return None
    if any(name in ADAPTER_FILES for name in names):
        return "a LoRA adapter"
    if any(name in MODEL_FILES for name in names):
        return "a model"
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"{len(names)} file(s) of something else ({shown})"


_HELD_LOCKS: dict[Path, RunLock] = {}


class RunLock:
    """One run at a time per output folder: the main process holds an exclusive lock on a file in it for the run's
    life (released by the system however the process ends); a second run is refused with the first's pid and start."""

    def __init__(self, output_dir: str | Path):
        import fcntl
        import socket

        self.path = Path(output_dir) / LOCK_FILE
        self._made_folder = not self.path.parent.exists()  # removed again on release if the run left it empty
        self.path.parent.mkdir(parents=True, exist_ok=True)
        held = _HELD_LOCKS.pop(self.path.resolve(), None)
        if held is not None:  # this process's own earlier run of the folder (one that ended early): superseded
            held.release()
        self._file = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held open until `release`
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            raise UserError(
                f"the output folder {output_dir} is in use by another grpo run ({holder}) - wait for it to end, "
                "stop it, or give this run another `--output_dir`"
            ) from None
        self._file.seek(0)
        self._file.truncate()
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        self._file.write(f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n")
        self._file.flush()
        _HELD_LOCKS[self.path.resolve()] = self
        atexit.register(self.release)

    def release(self) -> None:
        """Free the folder: the lock file goes, and the folder too where the lock made it and nothing else is in it
        (a run refused before it wrote anything leaves the disk as it found it)."""
        if self._file.closed:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        self._file.close()
        if self._made_folder:
            with contextlib.suppress(OSError):
                self.path.parent.rmdir()  # only when empty



def missing_training_state(checkpoint: Path) -> str | None:
    """What a checkpoint lacks of the training state transformers resumes (None: nothing): without optimizer.pt the
    optimizer starts afresh (Adam's moments at zero), without scheduler.pt the learning-rate schedule from step 0.
    DeepSpeed keeps both in its own `global_step*` folder."""
    if any(checkpoint.glob("global_step*")):
        return None
    lacks = [name for name in ("optimizer.pt", "scheduler.pt") if not (checkpoint / name).is_file()]
    if not lacks:
        return None
    effects = {"optimizer.pt": "a fresh optimizer (its moment estimates at zero)", "scheduler.pt": "the learning-rate "
               "schedule from its first step (warm-up again)"}  # fmt: skip
    return (
        f"{checkpoint.name} holds no {' and no '.join(lacks)}: the run resumes its weights with "
        + " and ".join(effects[name] for name in lacks)
    )
