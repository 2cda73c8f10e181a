"""A reward of the user's own (`my_rewards.py:fn`, `package.module:fn`) in a process of its own.

Nothing a reward does there can end or stall a run: one that outlasts its time limit (by catching the limit, or in a
long C call), exits (`sys.exit`, `os._exit`) or crashes its interpreter loses its process, its batch scores the
reward's failure value, and the next batch starts a new process. The process is a fresh interpreter importing the
reward with this process's sys.path (as the math-verify workers do), so it inherits nothing of the training process.
It leads a process group of its own, and is stopped with the whole group, at the latest when this process exits:
nothing the reward starts (a subprocess, a multiprocessing.Process) outlives the command.
Prompts, completions and the dataset's columns travel pickled; TRL's `log_metric` and `log_extra` reach the reward as
functions that record their calls, which are replayed here with its result.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

START_SECONDS = 120.0  # for the interpreter to start and import the reward's module
_HEADER = struct.Struct("<Q")
_PR_SET_PDEATHSIG = 1
# The process imports with this process's sys.path (its arguments after the reference).
_CODE = (
    "import sys\nreference = sys.argv[1]\nsys.path[:] = sys.argv[2:]\n"
    "from grpo_cli.rewards.isolated import serve\nserve(reference)\n"
)
PARENT_ENV = "GRPO_REWARD_PARENT"
RECORDED = ("log_metric", "log_extra")  # TRL's callbacks, recorded in the process and replayed here
_RUNNING: set[RewardProcess] = set()  # started and not yet stopped: stopped at exit


class RewardRaised(Exception):
    """The reward raised (any BaseException) in its process; the message names the type."""


class RewardLost(Exception):
    """The reward's process ended, or could not start, or was stopped for taking too long (`timed_out`)."""

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


def _send(fd: int, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    data = _HEADER.pack(len(data)) + data
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _receive(fd: int, deadline: float | None) -> Any:
    """One message, or TimeoutError at `deadline` (monotonic), or EOFError when the other end closed."""
    buffer = b""
    need = _HEADER.size
    size = None
    while True:
        while len(buffer) < need:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise TimeoutError
            chunk = os.read(fd, max(need - len(buffer), 1 << 16))
            if not chunk:
                raise EOFError
            buffer += chunk
        if size is None:
            size = _HEADER.unpack(buffer[: _HEADER.size])[0]
            need = _HEADER.size + size
            continue
        return pickle.loads(buffer[_HEADER.size : need])


def sendable(kwargs: dict) -> dict:
    """The keyword arguments that can travel to the process: no callables (TRL's callbacks are recorded there), the
    trainer state's numbers without its log history, and no value that does not pickle (TRL's environments)."""
    kept = {}
    for key, value in kwargs.items():
        if callable(value):
            continue
        if isinstance(getattr(value, "log_history", None), list):
            # TRL's trainer_state: its numbers (global_step, max_steps, epoch, ...), in a type that unpickles
            # without importing transformers there
            value = SimpleNamespace(**{k: v for k, v in vars(value).items() if isinstance(v, (bool, int, float, str))})
        try:
            pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001, S112 - whatever fails to pickle stays behind
            continue
        kept[key] = value
    return kept


class RewardProcess:
    """The process running one reward; `call` sends it a batch and waits for the values."""

    def __init__(self, reference: str, label: str):
        self.reference = reference  # what the process resolves: an absolute file path or a module, then :function
        self.label = label
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def _start(self) -> None:
        self.starts += 1
        env = dict(os.environ)
        env[PARENT_ENV] = str(os.getpid())
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CODE, self.reference, *(str(p) for p in sys.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            bufsize=0,
            close_fds=True,
            start_new_session=True,  # a group of its own: stopped with whatever the reward starts
        )
        _RUNNING.add(self)
        try:
            reply = _receive(self.proc.stdout.fileno(), time.monotonic() + START_SECONDS)
        except (TimeoutError, EOFError, pickle.UnpicklingError):
            code = self._stop()
            raise RewardLost(f"its process could not start (exit code {code})") from None
        if reply[0] != "ready":
            self._stop()
            raise RewardLost(f"its process could not load it: {reply[1]}")

    def _stop(self) -> int | None:
        proc, self.proc = self.proc, None
        _RUNNING.discard(self)
        if proc is None:
            return None
        with contextlib.suppress(OSError):  # the process leads its group (start_new_session)
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)
        for pipe in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()
        return proc.returncode

    def close(self) -> None:
        self._stop()

    def call(self, prompts: list, completions: list, kwargs: dict, deadline: float | None) -> Any:
        """The reward's result for one batch; RewardRaised when it raised, RewardLost when its process ended or ran
        past `deadline` (monotonic seconds) and was stopped."""
        if self.proc is None or self.proc.poll() is not None:
            self._stop()
            started = time.monotonic()
            self._start()
            if deadline is not None:  # starting is not the batch's time
                deadline += time.monotonic() - started
        try:
            _send(self.proc.stdin.fileno(), (prompts, completions, sendable(kwargs)))
            kind, payload, recorded = _receive(self.proc.stdout.fileno(), deadline)
        except TimeoutError:
            self._stop()
            raise RewardLost("it ran past its time limit; its process was stopped", timed_out=True) from None
        except (EOFError, BrokenPipeError, OSError, pickle.UnpicklingError):
            code = self._stop()
            raise RewardLost(f"its process ended (exit code {code})") from None
        for name, args in recorded:
            if callable(kwargs.get(name)):
                with contextlib.suppress(Exception):  # logging is best effort
                    kwargs[name](*args)
        if kind == "raised":
            raise RewardRaised(payload)
        return payload


def die_with_parent(parent_env: str) -> None:
    """On Linux, have the kernel kill this worker process when the one that started it (its pid in the environment
    variable `parent_env`) ends; exit now if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    parent = os.environ.get(parent_env, "")
    if parent.isdigit() and os.getppid() != int(parent):
        os._exit(0)


def serve(reference: str) -> None:
    """The process's loop: a pickled `(prompts, completions, kwargs)` in, `(kind, value, recorded calls)` out."""
    replies = os.dup(1)
    os.dup2(2, 1)  # what the reward prints goes to stderr, not into the replies
    requests = sys.stdin.buffer.fileno()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle
    die_with_parent(PARENT_ENV)
    from grpo_cli.rewards.guard import settle
    from grpo_cli.rewards.registry import load_reward

    try:
        func = load_reward(reference)
    except BaseException as err:  # noqa: BLE001 - reported to the training process, which decides
        _send(replies, ("error", f"{type(err).__name__}: {err}", []))
        return
    _send(replies, ("ready", None, []))
    while True:
        try:
            prompts, completions, kwargs = _receive(requests, None)
        except EOFError:
            return
        recorded: list = []
        for name in RECORDED:
            kwargs[name] = lambda *args, _name=name, _calls=recorded: _calls.append((_name, args))
        try:
            result = settle(func(prompts=prompts, completions=completions, **kwargs))
            reply = ("ok", list(result) if isinstance(result, tuple) else result, recorded)
            pickle.dumps(reply)
        except BaseException as err:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too: a reward never ends this
            reply = ("raised", f"{type(err).__name__}: {str(err)[:300]}", recorded)
        _send(replies, reply)


@atexit.register
def _stop_all() -> None:
    """Stop every reward's process group when this process exits (normally, on an error or on Ctrl-C)."""
    for process in list(_RUNNING):
        process.close()
