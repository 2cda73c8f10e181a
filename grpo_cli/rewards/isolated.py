"""A reward of the user's own (`my_rewards.py:fn`, `package.module:fn`) in a process of its own.

Nothing a reward does there can end or stall a run: one that outlasts its time limit (by catching the limit, or in a
long C call), exits (`sys.exit`, `os._exit`) or crashes its interpreter loses its process, its batch scores the
reward's failure value, and the next batch starts a new process. The process is a worker (worker.py): a fresh
interpreter importing the reward with this process's sys.path, so it inherits nothing of the training process, and
stopped with its whole process group, at the latest when this process exits: nothing the reward starts (a
subprocess, a multiprocessing.Process) outlives the command.
Prompts, completions and the dataset's columns travel pickled; TRL's `log_metric` and `log_extra` reach the reward as
functions that record their calls, which are replayed here with its result.
"""

from __future__ import annotations

import contextlib
import pickle
import time
from types import SimpleNamespace
from typing import Any

from grpo_cli.rewards.worker import START_SECONDS, Channel, Worker, parent_channel

RECORDED = ("log_metric", "log_extra")  # TRL's callbacks, recorded in the process and replayed here


class RewardRaised(Exception):
    """The reward raised (any BaseException) in its process; the message names the type."""


class RewardLost(Exception):
    """The reward's process ended, or could not start, or was stopped for taking too long (`timed_out`)."""

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


def _send(channel: Channel, message: Any) -> None:
    channel.send(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _receive(channel: Channel, deadline: float | None) -> Any:
    """One message, or TimeoutError at `deadline` (monotonic), or EOFError when the other end closed."""
    return pickle.loads(channel.receive(deadline))


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
            numbers = {k: v for k, v in vars(value).items() if isinstance(v, (bool, int, float, str))}
            value = SimpleNamespace(**numbers)
        try:
            pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001, S112 - whatever fails to pickle stays behind
            continue
        kept[key] = value
    return kept


class RewardProcess:
    """The process running one reward; `call` sends it a batch and waits for the values."""

    def __init__(self, reference: str, label: str):
        # what the process resolves: an absolute file path or a module, then :function
        self.reference = reference
        self.label = label
        self.worker: Worker | None = None
        self.starts = 0

    def _start(self) -> None:
        self.starts += 1
        self.worker = Worker(serve, self.reference)
        try:
            reply = _receive(self.worker.channel, time.monotonic() + START_SECONDS)
        except (TimeoutError, EOFError, pickle.UnpicklingError):
            code = self._stop()
            raise RewardLost(f"its process could not start (exit code {code})") from None
        if reply[0] != "ready":
            self._stop()
            raise RewardLost(f"its process could not load it: {reply[1]}")

    def _stop(self) -> int | None:
        worker, self.worker = self.worker, None
        return None if worker is None else worker.stop()

    def close(self) -> None:
        self._stop()

    def call(self, prompts: list, completions: list, kwargs: dict, deadline: float | None) -> Any:
        """The reward's result for one batch; RewardRaised when it raised, RewardLost when its process ended or ran
        past `deadline` (monotonic seconds) and was stopped."""
        if self.worker is None or self.worker.proc.poll() is not None:
            self._stop()
            started = time.monotonic()
            self._start()
            if deadline is not None:  # starting is not the batch's time
                deadline += time.monotonic() - started
        try:
            _send(self.worker.channel, (prompts, completions, sendable(kwargs)))
            kind, payload, recorded = _receive(self.worker.channel, deadline)
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


def serve(reference: str) -> None:
    """The process's loop: a pickled `(prompts, completions, kwargs)` in, `(kind, value, recorded calls)` out."""
    channel = parent_channel()
    from grpo_cli.rewards.guard import settle
    from grpo_cli.rewards.registry import load_reward

    try:
        func = load_reward(reference)
    except BaseException as err:  # noqa: BLE001 - reported to the training process, which decides
        _send(channel, ("error", f"{type(err).__name__}: {err}", []))
        return
    _send(channel, ("ready", None, []))
    for request in channel.incoming():
        prompts, completions, kwargs = pickle.loads(request)
        recorded: list = []
        for name in RECORDED:
            kwargs[name] = lambda *args, _name=name, _calls=recorded: _calls.append((_name, args))
        try:
            result = settle(func(prompts=prompts, completions=completions, **kwargs))
            reply = ("ok", list(result) if isinstance(result, tuple) else result, recorded)
            pickle.dumps(reply)
        except BaseException as err:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too: a reward never ends this
            reply = ("raised", f"{type(err).__name__}: {str(err)[:300]}", recorded)
        _send(channel, reply)
