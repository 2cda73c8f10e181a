"""Comparing a batch of answers at once: each distinct pair through math-verify once, spread over worker processes.

A GRPO batch is groups of completions per prompt: gold answers repeat, and so do many answers. `match_many` takes a
batch's (answer, gold) pairs and keeps the distinct ones that need math-verify (answers_match settles equal strings
and plain numbers itself) and whose verdict is not remembered yet. When there are at least MIN_POOL_PAIRS of them,
a pool of worker processes compares them and the verdicts go into answers_match's memory, which the scoring then
reads: scores are those of comparing one pair at a time.

Workers (worker.py) are fresh interpreters importing with this process's sys.path: they inherit nothing of the
training process, and none outlives it. Pairs and verdicts travel as JSON: a worker parses model output, so its
replies are read as data, never unpickled. Each runs answers.warm_up before it says it is ready, and compares a pair
in its main thread under the same time limits as in-process scoring (a second, longer try when the first runs out).
A worker still busy `hang_seconds` after it got a pair is killed and that pair is undecided, as when both tries run
out; a worker that dies on a pair makes it an error, raised where the pair is scored, so the reward guard gives that
completion the failure value, as for any reward that raises. The pool starts on the main thread with the first batch
that needs it, and the main process compares pairs itself until a worker is ready. GRPO_MATH_WORKERS sets the number
of workers (0: none); by default it is the CPU cores of this process shared among the ranks on this machine
(LOCAL_WORLD_SIZE), at most MAX_WORKERS, and no pool below 2.
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from grpo_cli.once import SayOnce
from grpo_cli.rewards.worker import START_SECONDS, Worker, parent_channel
from grpo_cli.tasks import answers
from grpo_cli.tasks.answers import MAX_GOLD_CHARS, Outcome, Pair

logger = logging.getLogger("grpo_cli.rewards")

WORKERS_ENV = "GRPO_MATH_WORKERS"
MIN_POOL_PAIRS = 16  # fewer new pairs than this are compared in-process: workers would cost more
MAX_WORKERS = 32  # past this, more workers stopped paying off (docs/performance.md, "Reward scoring")
HANG_SECONDS = 3.0  # at least; a pair takes at most answers.longest_comparison_seconds() in a healthy worker
MAX_START_FAILURES = 3  # workers that die before they are ready; then this process compares answers itself
REAP_SECONDS = 1.0  # to reap a killed worker: they are stopped mid-batch, and up to MAX_WORKERS at once

_said = SayOnce()  # the process's messages about its comparisons: once per process


def _warn_once(kind: str, message: str) -> None:
    _said.warning(logger, kind, message)


@dataclass
class _Task:
    """A pair sent to a worker, under the number its reply carries."""

    ident: int
    key: Pair
    sent: float


class _Worker(Worker):
    """A math-verify worker, and the pair it is comparing."""

    def __init__(self):
        super().__init__(serve, env={WORKERS_ENV: "0"}, reap_seconds=REAP_SECONDS)
        self.ready = False
        self.started = time.monotonic()
        self.task: _Task | None = None
        self.gold: str | None = None  # of the last pair sent: the worker has it parsed


class MathPool:
    """Worker processes comparing answer pairs with math-verify; see the module's docstring."""

    def __init__(self, size: int, hang_seconds: float | None = None, start_seconds: float | None = None):
        self.size = size
        if hang_seconds is None:
            hang_seconds = max(HANG_SECONDS, 2 * answers.longest_comparison_seconds())
        self.hang_seconds = hang_seconds
        self.start_seconds = START_SECONDS if start_seconds is None else start_seconds
        self.pid = os.getpid()
        self.workers: list[_Worker] = []
        self.disabled = False
        self.start_failures = 0
        self.hangs = 0  # workers killed for taking too long on a pair
        self.crashes = 0  # workers that died on a pair
        self._ident = 0
        self._done: dict[Pair, Outcome] = {}
        self._pending: dict[str, deque[Pair]] = {}  # by gold answer

    def __repr__(self) -> str:
        ready = sum(w.ready for w in self.workers)
        return f"MathPool(size={self.size}, ready={ready}, hangs={self.hangs}, crashes={self.crashes})"

    # -------------------------------------------------------------------------------------------- workers

    def _spawn(self) -> None:
        """Start one worker (it says it is ready once math-verify is loaded)."""
        try:
            worker = _Worker()
        except OSError as err:
            self._start_failed(f"could not start a math-verify worker: {err}")
            return
        self.workers.append(worker)

    def _fill(self) -> None:
        """Start workers up to `size`."""
        while not self.disabled and len(self.workers) < self.size:
            self._spawn()

    def _start_failed(self, message: str) -> None:
        self.start_failures += 1
        if self.start_failures >= MAX_START_FAILURES:
            self.disabled = True
            _warn_once("start", f"{message}; answers are compared in the training process instead")

    def _drop(self, worker: _Worker) -> None:
        """Stop a worker and forget it."""
        if worker in self.workers:
            self.workers.remove(worker)
        worker.stop()

    def _lost(self, worker: _Worker, why: str) -> None:
        """A worker died or broke the protocol: the pair it was comparing fails, and it is replaced."""
        self._drop(worker)
        if not worker.ready:
            self._start_failed(f"a math-verify worker {why} before it was ready")
        elif worker.task is not None:
            self.crashes += 1
            _warn_once("crash", f"a math-verify worker {why} while comparing answers; that completion fails")
            self._finish(worker.task.key, f"math-verify worker {why}")
        worker.task = None

    def wait_ready(self, seconds: float) -> bool:
        """Start the workers and wait up to `seconds` until all are ready; whether they are."""
        self._fill()
        deadline = time.monotonic() + seconds
        while not all(w.ready for w in self.workers) or not self.workers:
            left = deadline - time.monotonic()
            if left <= 0 or self.disabled:
                return False
            self._poll(min(left, 0.5))
            self._stop_late()
            self._fill()
        return True

    def close(self) -> None:
        """Stop every worker."""
        workers, self.workers = self.workers, []
        for worker in workers:
            worker.stop()

    # ----------------------------------------------------------------------------------------- comparing

    def compare(self, pairs: Iterable[Pair]) -> dict[Pair, Outcome]:
        """The outcome of each stripped (guess, gold) pair, remembered by answers_match: computed by the workers, or
        by this process while none is ready (starting, or given up)."""
        wanted = list(dict.fromkeys(pairs))
        self._done = {}
        self._pending = {}
        for key in wanted:
            self._queue(key)
        mine = set(wanted)
        while True:
            self._fill()
            self._dispatch()
            busy = any(w.task is not None and w.task.key in mine for w in self.workers)
            if not self._pending and not busy:
                break
            if self._pending and not any(w.ready for w in self.workers):
                key = self._take(None)
                self._finish(key, answers.symbolic_outcome(*key))
                self._poll(0)
                continue
            self._poll(self._wait_seconds())
            self._stop_late()
        done, self._done = self._done, {}
        return {key: done[key] for key in wanted if key in done}

    def _finish(self, key: Pair, outcome: Outcome) -> None:
        answers.remember({key: outcome})
        self._done[key] = outcome

    def _queue(self, key: Pair, first: bool = False) -> None:
        """Add a pair to those still to send, grouped by gold answer."""
        queue = self._pending.setdefault(key[1], deque())
        if first:
            queue.appendleft(key)
        else:
            queue.append(key)

    def _take(self, worker: _Worker | None) -> Pair:
        """The next pair for a worker (None: for this process): one with the gold answer it parsed last, else one
        whose gold no busy worker is on, so that each gold is parsed in as few workers as can be."""
        gold = worker.gold if worker is not None else None
        if gold not in self._pending:
            taken = {w.gold for w in self.workers if w.task is not None}
            free = [g for g in self._pending if g not in taken]
            gold = (free or list(self._pending))[-1 if worker is None else 0]
        queue = self._pending[gold]
        key = queue.popleft()
        if not queue:
            del self._pending[gold]
        return key

    def _dispatch(self) -> None:
        """Send a pending pair to each ready, idle worker."""
        for worker in list(self.workers):
            if not self._pending:
                return
            if worker.ready and worker.task is None:
                self._send(worker, self._take(worker))

    def _send(self, worker: _Worker, key: Pair) -> None:
        self._ident += 1
        guess, gold = key
        message = json.dumps([self._ident, guess, gold[:MAX_GOLD_CHARS]]).encode()
        try:
            worker.channel.send(message)
        except OSError:
            self._queue(key, first=True)
            self._lost(worker, "closed its input")
            return
        except BaseException:
            self._drop(worker)  # part of a message may have gone out: that worker can't be trusted
            raise
        worker.task = _Task(self._ident, key, time.monotonic())
        worker.gold = gold

    def _wait_seconds(self) -> float:
        """How long the next poll may block: until the nearest deadline, at most 1 s."""
        now = time.monotonic()
        deadlines = [w.task.sent + self.hang_seconds for w in self.workers if w.task is not None]
        deadlines += [w.started + self.start_seconds for w in self.workers if not w.ready]
        return max(0.0, min([now + 1.0, *deadlines]) - now)

    def _poll(self, seconds: float) -> None:
        """Read whatever the workers have written within `seconds`."""
        by_fd = {w.channel.from_fd: w for w in self.workers}
        if not by_fd:
            return
        poller = select.poll()
        for fd in by_fd:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        for fd, _ in poller.poll(math.ceil(seconds * 1000)):
            worker = by_fd[fd]
            if worker in self.workers:
                self._read(worker)

    def _read(self, worker: _Worker) -> None:
        try:
            messages = worker.channel.read()
        except (OSError, EOFError):
            code = worker.proc.poll()
            self._lost(worker, "exited" if code is None else f"exited with code {code}")
            return
        for message in messages:
            if worker not in self.workers:
                return
            self._handle(worker, message)

    def _handle(self, worker: _Worker, payload: bytes) -> None:
        """Act on one reply: `["ready"]`, `[ident, verdict]` (null: undecided) or `[ident, null, error]`."""
        try:
            message = json.loads(payload)
        except ValueError:
            message = None
        if message == ["ready"]:
            worker.ready = True
            return
        task = worker.task
        if not _is_reply(message):
            if task is not None and task.key not in self._done:
                self._queue(task.key, first=True)
            worker.task = None
            self._lost(worker, "wrote something unreadable")
            return
        if task is None or message[0] != task.ident:
            return  # the reply to a pair sent before this process was interrupted
        worker.task = None
        self._finish(task.key, message[1] if len(message) == 2 else str(message[2]))

    def _stop_late(self) -> None:
        """Kill workers past their deadline: a pair taking too long is undecided."""
        now = time.monotonic()
        for worker in list(self.workers):
            if worker.task is not None and now - worker.task.sent > self.hang_seconds:
                task, worker.task = worker.task, None
                self.hangs += 1
                self._drop(worker)
                _warn_once(
                    "hang",
                    f"math-verify took longer than {self.hang_seconds:g} s on one answer; its worker was stopped "
                    "and that answer is undecided",
                )
                self._finish(task.key, None)
            elif not worker.ready and now - worker.started > self.start_seconds:
                self._drop(worker)
                self._start_failed(f"a math-verify worker was not ready after {self.start_seconds:g} s")


def _is_reply(message: object) -> bool:
    """Whether a worker's message is `[ident, true|false|null]` or `[ident, null, "error"]`."""
    if not isinstance(message, list) or not message or not isinstance(message[0], int):
        return False
    if len(message) == 2:
        return message[1] is None or isinstance(message[1], bool)
    return len(message) == 3 and message[1] is None and isinstance(message[2], str)


# ------------------------------------------------------------------------------------------- the shared pool

_shared: MathPool | None = None


def worker_count() -> int:
    """Workers for this process: GRPO_MATH_WORKERS, else its CPU cores shared among the local ranks (<= MAX_WORKERS)."""
    configured = os.environ.get(WORKERS_ENV, "").strip()
    if configured:
        try:
            return max(0, min(int(configured), 4 * MAX_WORKERS))
        except ValueError:
            _warn_once("env", f"{WORKERS_ENV}={configured!r} is not a number of workers; using the default")
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or 1))
    except ValueError:
        ranks = 1
    count = min(cores // ranks, MAX_WORKERS)
    return count if count >= 2 else 0


def shared_pool() -> MathPool | None:
    """This process's pool (its workers start when first needed), or None: off the main thread, with fewer than
    one worker configured, where worker processes can't be used, or after they failed to start."""
    global _shared
    if threading.current_thread() is not threading.main_thread():
        return None
    if _shared is not None and _shared.pid != os.getpid():
        _shared = None
    if _shared is None:
        size = worker_count()
        if size < 1 or not sys.executable or not hasattr(select, "poll"):
            return None
        _shared = MathPool(size)
    return None if _shared.disabled else _shared


def close_shared_pool() -> None:
    """Stop this process's pool; a later batch starts a new one."""
    global _shared
    pool, _shared = _shared, None
    if pool is not None and pool.pid == os.getpid():
        pool.close()


def _forget_in_child() -> None:
    """After a fork: the child lets go of its parent's workers (it starts its own if it needs them)."""
    global _shared
    pool, _shared = _shared, None
    if pool is not None:
        pool.disabled = True
        pool.close()  # in the child, stopping a worker only lets go of it


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def match_many(pairs: Iterable[tuple[str, str]]) -> None:
    """Have answers_match know math-verify's verdict on each (guess, gold) pair: the distinct new ones are compared
    in the pool when there are at least MIN_POOL_PAIRS of them, else scoring compares them in-process as it goes."""
    pool = shared_pool()
    if pool is None:
        return
    todo = answers.symbolic_pairs(pairs)
    if len(todo) < MIN_POOL_PAIRS:
        return
    try:
        pool.compare(todo)
    except Exception as err:  # noqa: BLE001 - the pool only saves time: scoring goes on in-process
        _warn_once(
            "pool", f"math-verify workers failed ({err}); answers are compared in the training process"
        )
        pool.disabled = True
        pool.close()


# ------------------------------------------------------------------------------------------------ the worker


def serve() -> None:
    """A worker's loop: `[ident, guess, gold]` in, `[ident, verdict]` (null: undecided) or `[ident, null, error]` out.

    It ends when its input closes.
    """
    channel = parent_channel()
    answers.warm_up()  # before saying ready: the first timed comparisons don't pay SymPy's first-use costs
    channel.send(b'["ready"]')
    for request in channel.incoming():
        ident, guess, gold = json.loads(request)
        outcome = answers.symbolic_outcome(guess, gold)
        reply = [ident, None, outcome] if isinstance(outcome, str) else [ident, outcome]
        channel.send(json.dumps(reply).encode())
