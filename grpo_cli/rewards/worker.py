"""Worker processes: a fresh interpreter running one function of grpo_cli, talked to over its stdin and stdout.

A user's reward (isolated.py) and the math-verify workers (math_pool.py) run in workers. A worker is `python -c`,
not multiprocessing: it imports with this process's sys.path, so it runs the same grpo_cli, and inherits nothing of
the training process (CUDA, threads, its __main__ module) however that was started: plainly, by spawn or fork, or by
`accelerate launch`.

What a worker starts cannot outlive the command: each worker leads a process group of its own and is stopped with
the whole group, at the latest when this process exits, and the kernel kills it when the process that started it
ends (`die_with_parent`). Its own group also keeps signals meant for the command (Ctrl-C in a terminal, `timeout`
signalling the command's group) away from it: the command decides when its workers stop.

Messages are length-prefixed bytes, both ways. What they hold is for each kind of worker to say: pickled Python
values for a user's reward (a dataset's columns are any Python values, and the reward is the user's own code, which
runs anyway), JSON for the math-verify workers (they parse model output, so what they reply is read as data and
never unpickled).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import math
import os
import select
import signal
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping

START_SECONDS = 120.0  # for a worker's interpreter to start and import what it serves
REAP_SECONDS = 5.0  # to wait for a killed worker to be reaped
PARENT_ENV = "GRPO_WORKER_PARENT"  # the pid of the process that started the worker
_HEADER = struct.Struct("<Q")
_READ_BYTES = 1 << 16
_PR_SET_PDEATHSIG = 1
# The function's module and name, how many arguments follow, the arguments, then this process's sys.path.
_CODE = (
    "import sys\nmodule, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])\n"
    "args, sys.path[:] = sys.argv[4 : 4 + count], sys.argv[4 + count :]\n"
    "import importlib\ngetattr(importlib.import_module(module), name)(*args)\n"
)
_RUNNING: set[Worker] = set()  # started and not yet stopped: stopped at exit


class Channel:
    """Messages over a pair of pipe ends: `send` one, `receive` the next (waiting), or `read` what is there.

    Read one way or the other: `read` hands over the messages one read completes, `receive` keeps them for its next
    calls."""

    def __init__(self, from_fd: int, to_fd: int):
        self.from_fd = from_fd
        self.to_fd = to_fd
        self._buffer = bytearray()  # read, not yet a whole message
        self._received: deque[bytes] = deque()

    def send(self, message: bytes) -> None:
        view = memoryview(_HEADER.pack(len(message)) + message)
        while view:
            view = view[os.write(self.to_fd, view) :]

    def read(self) -> list[bytes]:
        """The messages that one read of the pipe completes (none while one is still arriving); EOFError when the
        other end has closed. It blocks until there is something to read."""
        chunk = os.read(self.from_fd, _READ_BYTES)
        if not chunk:
            raise EOFError
        self._buffer += chunk
        messages = []
        while len(self._buffer) >= _HEADER.size:
            end = _HEADER.size + _HEADER.unpack_from(self._buffer)[0]
            if len(self._buffer) < end:
                break
            messages.append(bytes(self._buffer[_HEADER.size : end]))
            del self._buffer[:end]
        return messages

    def receive(self, deadline: float | None) -> bytes:
        """The next message; TimeoutError at `deadline` (monotonic seconds; None: none), EOFError when the other end
        has closed."""
        while not self._received:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not _readable(self.from_fd, left):
                    raise TimeoutError
            self._received.extend(self.read())
        return self._received.popleft()

    def incoming(self) -> Iterator[bytes]:
        """Each message until the other end closes."""
        while True:
            try:
                yield self.receive(None)
            except EOFError:
                return


def _readable(fd: int, seconds: float) -> bool:
    """Whether `fd` has something to read (or has closed) within `seconds`."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(math.ceil(seconds * 1000)))


class Worker:
    """A started worker running `serve(*args)` (a function of a module it can import), which is expected to call
    `parent_channel` first; `channel` talks to it. `env`: variables to set there on top of this process's."""

    def __init__(
        self,
        serve: Callable[..., None],
        *args: str,
        env: Mapping[str, str] | None = None,
        reap_seconds: float = REAP_SECONDS,
    ):
        self.reap_seconds = reap_seconds
        self.owner = os.getpid()
        call = [serve.__module__, serve.__name__, str(len(args)), *args]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CODE, *call, *map(str, sys.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, PARENT_ENV: str(self.owner), **(env or {})},
            bufsize=0,
            close_fds=True,
            start_new_session=True,  # a group of its own: stopped with whatever it starts
        )
        self.channel = Channel(self.proc.stdout.fileno(), self.proc.stdin.fileno())
        _RUNNING.add(self)

    def stop(self) -> int | None:
        """Kill the worker and its group, reap it and close the pipes, once; its exit code (None: not reaped in time).

        In a forked child of the process that started it, only let go: close this process's copies of the pipes and
        leave the worker to its parent."""
        if self not in _RUNNING:
            return self.proc.returncode
        _RUNNING.discard(self)
        if os.getpid() == self.owner:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                self.proc.kill()
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self.proc.wait(timeout=self.reap_seconds)
        else:
            self.proc.returncode = 0  # not this process's child: never wait for it
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()
        return self.proc.returncode


def die_with_parent() -> None:
    """On Linux, have the kernel kill this worker when the process that started it ends; exit now if it already
    has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    parent = os.environ.get(PARENT_ENV, "")
    if parent.isdigit() and os.getppid() != int(parent):
        os._exit(0)


def parent_channel() -> Channel:
    """In a worker, first: the channel to the process that started it. What the worker prints goes to stderr instead
    of into its replies, Ctrl-C is the parent's to handle, and the worker dies with its parent."""
    replies = os.dup(1)
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    return Channel(sys.stdin.buffer.fileno(), replies)


@atexit.register
def _stop_all() -> None:
    """Stop every worker and its group when this process exits (normally, on an error or on Ctrl-C)."""
    for worker in list(_RUNNING):
        worker.stop()
