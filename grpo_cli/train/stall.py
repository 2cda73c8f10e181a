"""A run that stops making progress says where it is stuck.

When no optimizer step ends for `stall_timeout` seconds, every thread's Python stack goes to
`OUTPUT_DIR/stall-stacks.txt` (one file per process under several) and the console says where it is, again each time
that much more time passes. The run itself goes on waiting: a stall may end (a slow disk, a busy shared GPU), and
Ctrl-C, SIGTERM or a kill still stop it as before.

A Python thread writes the stacks, holding the interpreter's lock, so no other thread changes its frames while they
are read. faulthandler's C thread, which reads them without that lock (and can crash the process when another thread
starts or ends meanwhile), is only the last resort: it writes them when this thread itself could not run for a while,
which happens when a stuck thread holds the interpreter's lock and so no other thread runs Python either.
"""

from __future__ import annotations

import contextlib
import faulthandler
import sys
import threading
import time
import traceback
from pathlib import Path

from rich.markup import escape
from transformers import TrainerCallback

from grpo_cli.console import console

CHECK_EVERY_S = 10.0
FROZEN_AFTER_CHECKS = 5  # the watch missed this many checks in a row: the interpreter is held, faulthandler writes


def stacks_file(output_dir: str | Path, rank: int, processes: int) -> Path:
    name = "stall-stacks.txt" if processes <= 1 else f"stall-stacks-rank{rank}.txt"
    return Path(output_dir) / name


class StallWatch(TrainerCallback):
    """Writes the stacks when `seconds` pass without a step ending (0: never)."""

    def __init__(self, output_dir: str | Path, seconds: float, rank: int = 0, processes: int = 1):
        self.path = stacks_file(output_dir, rank, processes)
        self.seconds = seconds
        self._check = min(CHECK_EVERY_S, seconds) if seconds else CHECK_EVERY_S
        self._out = None
        self._thread: threading.Thread | None = None
        self._said = 0  # bytes of the file already announced
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._step = 0
        self._due = 0.0  # time.monotonic() at which the stacks are written unless a step ends first

    def on_train_begin(self, args, state, control, **kwargs):
        if not self.seconds or self._out is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._out = open(self.path, "a")  # noqa: SIM115 - written into until the run ends
        self._said = self.path.stat().st_size
        self._step = state.global_step
        self._due = time.monotonic() + self.seconds
        self._thread = threading.Thread(target=self._watch, name="grpo-stall-watch", daemon=True)
        self._thread.start()

    def on_step_end(self, args, state, control, **kwargs):
        if self._out is not None:
            with self._lock:
                self._step = state.global_step
                self._due = time.monotonic() + self.seconds

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        """Stop watching; remove the file when nothing was written to it."""
        if self._out is None:
            return
        self._done.set()
        self._thread.join()
        faulthandler.cancel_dump_traceback_later()
        self._say_if_written()  # what the last resort wrote just before the end is said too
        self._out.close()
        self._out = None
        self.remove_if_empty()

    def remove_if_empty(self) -> None:
        """No stacks were written: no file is left behind (also called by a process about to quit without closing)."""
        with contextlib.suppress(OSError):
            if self.path.stat().st_size == 0:
                self.path.unlink()

    def _watch(self) -> None:
        while True:
            # The last resort fires when this thread misses its next checks, never before the stacks are due.
            frozen_after = max(self._due - time.monotonic(), FROZEN_AFTER_CHECKS * self._check)
            faulthandler.dump_traceback_later(frozen_after, file=self._out)
            if self._done.wait(self._check):
                return
            with self._lock:
                now = time.monotonic()
                if self._size() > self._said:  # the last resort wrote them while this thread could not run
                    self._due = now + self.seconds
                elif now >= self._due:
                    self._write_stacks()
                    self._due = now + self.seconds
            self._say_if_written()

    def _write_stacks(self) -> None:
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        here = threading.get_ident()
        header = (f"{time.strftime('%Y-%m-%d %H:%M:%S')}: no step has ended for {self._waited()} since step "
                  f"{self._step}; every thread's stack, most recent call last:\n")
        parts = [header]
        for ident, frame in sys._current_frames().items():
            if ident != here:
                parts.append(f"\nThread {ident:#x} ({names.get(ident, 'not started from Python')}):\n")
                parts.extend(traceback.format_stack(frame))
        self._out.write("".join(parts) + "\n")
        self._out.flush()

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def _waited(self) -> str:
        return f"{self.seconds:g} s" if self.seconds < 120 else f"{self.seconds / 60:g} minutes"

    def _say_if_written(self) -> None:
        with self._lock:
            size = self._size()
            if size > self._said:
                self._said = size
                console.print(
                    f"[yellow]no step has ended for {self._waited()} since step {self._step}: every thread's stack is "
                    f"in {escape(str(self.path))} - the run goes on waiting; Ctrl-C saves a checkpoint once the step "
                    "ends, a kill leaves the last checkpoint to resume from[/]",
                    soft_wrap=True,
                )
