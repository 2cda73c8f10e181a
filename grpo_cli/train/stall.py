"""A run that stops making progress says where it is stuck.

When no optimizer step ends for `stall_timeout` seconds, every thread's Python stack goes to
`OUTPUT_DIR/stall-stacks.txt` (one file per process under several), again each time that much more time passes.
faulthandler's own C thread writes them, so they come whatever the stuck thread holds (the interpreter's lock
included); a small Python thread then says on the console where they are, when it can run. The run itself goes on
waiting: a stall may end (a slow disk, a busy shared GPU), and Ctrl-C, SIGTERM or a kill still stop it as before.
"""

from __future__ import annotations

import contextlib
import faulthandler
import threading
from pathlib import Path

from rich.markup import escape
from transformers import TrainerCallback

from grpo_cli.console import console

CHECK_EVERY_S = 10.0


def stacks_file(output_dir: str | Path, rank: int, processes: int) -> Path:
    name = "stall-stacks.txt" if processes <= 1 else f"stall-stacks-rank{rank}.txt"
    return Path(output_dir) / name


class StallWatch(TrainerCallback):
    """Writes the stacks when `seconds` pass without a step ending (0: never)."""

    def __init__(self, output_dir: str | Path, seconds: float, rank: int = 0, processes: int = 1):
        self.path = stacks_file(output_dir, rank, processes)
        self.seconds = seconds
        self._out = None
        self._said = 0  # bytes of the file already announced
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._step = 0

    def _arm(self) -> None:
        faulthandler.cancel_dump_traceback_later()
        faulthandler.dump_traceback_later(self.seconds, repeat=True, file=self._out)

    def on_train_begin(self, args, state, control, **kwargs):
        if not self.seconds or self._out is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._out = open(self.path, "a")  # noqa: SIM115 - faulthandler writes into it until the run ends
        self._said = self.path.stat().st_size
        self._step = state.global_step
        self._arm()
        threading.Thread(target=self._announce, name="grpo-stall-watch", daemon=True).start()

    def on_step_end(self, args, state, control, **kwargs):
        if self._out is not None:
            self._step = state.global_step
            self._arm()

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        """Stop watching; remove the file when nothing was written to it."""
        if self._out is None:
            return
        faulthandler.cancel_dump_traceback_later()
        self._done.set()
        self._say_if_written()  # a stall shorter than the thread's check is said too
        self._out.close()
        self._out = None
        self.remove_if_empty()

    def remove_if_empty(self) -> None:
        """No stacks were written: no file is left behind (also called by a process about to quit without closing)."""
        with contextlib.suppress(OSError):
            if self.path.stat().st_size == 0:
                self.path.unlink()

    def _announce(self) -> None:
        while not self._done.wait(min(CHECK_EVERY_S, self.seconds)):
            self._say_if_written()

    def _say_if_written(self) -> None:
        with self._lock:
            try:
                size = self.path.stat().st_size
            except OSError:
                return
            if size > self._said:
                self._said = size
                waited = f"{self.seconds:g} s" if self.seconds < 120 else f"{self.seconds / 60:g} minutes"
                console.print(
                    f"[yellow]no step has ended for {waited} since step {self._step}: every thread's stack is in "
                    f"{escape(str(self.path))} - the run goes on waiting; Ctrl-C saves a checkpoint once the step "
                    "ends, a kill leaves the last checkpoint to resume from[/]",
                    soft_wrap=True,
                )
