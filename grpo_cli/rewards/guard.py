"""The guard around every reward: an exception, a hang or a bad return value never stops training.

It is also where a reward's keywords are completed: `prefill`, the text each prompt's assistant turn starts with
(its last message, for a chat prompt), so that rewards score prefill + completion without reading the chat.

A failing completion scores the reward's failure value; on a timeout the whole batch does. Failures are counted
(`guard.failures`), logged to TRL as `rewards/NAME/failed_frac` (and the share of those that ran past the
timeout as `rewards/NAME/timed_out_frac`) when it passes `log_metric`, and the first of each
kind is shown once with the offending completion.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import signal
import time
from collections.abc import Callable
from typing import Any

from grpo_cli.once import SayOnce
from grpo_cli.rewards.isolated import RewardLost, RewardProcess, RewardRaised
from grpo_cli.rewards.registry import RewardSpec
from grpo_cli.tasks.task import as_chats, completion_text, prefill_of
from grpo_cli.tasks.time_limit import TimeLimitExpired, time_limit

logger = logging.getLogger("grpo_cli.rewards")

PREVIEW_CHARS = 300
# A batch always gets at least this long: a reward's first call may import its libraries, and math-verify's first
# call also warms up its process and may retry a slow comparison with a larger budget.
MIN_BATCH_SECONDS = 10.0


def _preview(prompt: Any, completion: Any) -> str:
    try:
        text = prefill_of(prompt) + completion_text(completion)
    except Exception:  # noqa: BLE001 - a completion of an unexpected type: show what it is
        text = repr(completion)
    if len(text) > PREVIEW_CHARS:
        text = text[:PREVIEW_CHARS] + f"... ({len(text)} characters)"
    return repr(text)


def settle(result: Any) -> Any:
    """The value of an async reward's result. TRL gathers async rewards itself, but it sees the guard, a plain
    function: the guard keeps an async reward inside its time limit and its error handling too."""
    if inspect.isawaitable(result):

        async def wait() -> Any:
            return await result

        return asyncio.run(wait())
    return result


def _slice(value: Any, index: int, n: int) -> Any:
    if isinstance(value, (list, tuple)) and len(value) == n:
        return value[index : index + 1]
    return value


def _raised_by_user(err: BaseException) -> bool:
    """A KeyboardInterrupt that is a person's Ctrl-C (SIGINT still raises it here), not the reward's own doing."""
    return isinstance(err, KeyboardInterrupt) and signal.getsignal(signal.SIGINT) is signal.default_int_handler


class RewardGuard:
    """A TRL reward callable wrapping one reward: same `__name__`, never raises, bounded by `timeout` seconds per
    completion (a batch of n completions gets n times that, and at least MIN_BATCH_SECONDS).

    Built-in rewards run in this process under a SIGALRM limit (they are bounded by construction); a reward of the
    user's own runs in a process of its own (`isolated.RewardProcess`), which is stopped when it overruns.
    """

    def __init__(
        self, spec: RewardSpec, timeout: float | None, reference: str | None = None, params: dict | None = None
    ):
        self.spec = spec
        self.timeout = timeout
        self.__name__ = spec.name
        self.params = {key: (params or {}).get(key) for key in spec.params}  # the recipe values it reads
        # `reference`: how a process of its own finds the reward (None: it runs here)
        self.process = RewardProcess(reference, spec.name) if reference else None
        self.failures = 0  # completions that got the failure value
        self.exceptions = 0
        self.timeouts = 0  # batches cut short
        self.bad_values = 0
        self.calls = 0
        self.scored = 0  # completions seen
        self._said = SayOnce()

    def __repr__(self) -> str:
        return f"RewardGuard({self.spec.name!r}, failures={self.failures})"

    def _show_once(self, kind: str, message: str) -> None:
        self._said.warning(logger, kind, "%s (further cases are counted, not shown)", message)

    def _check_values(self, values: Any, n: int, prompts: list, completions: list) -> list[float | None]:
        """Validated values; a wrong length or non-numeric value becomes the failure value (shown once)."""
        failure = self.spec.failure
        if not isinstance(values, (list, tuple)) or len(values) != n:
            got = f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__
            self._show_once(
                "length",
                f"reward {self.spec.name} returned {got} for {n} completions - it must return one value per "
                f"completion; the whole batch scores the failure value {failure:g}",
            )
            self.bad_values += n
            self.failures += n
            return [failure] * n
        checked: list[float | None] = []
        for i, value in enumerate(values):
            if value is None:
                checked.append(None)
                continue
            try:
                if isinstance(value, (str, bytes)):
                    raise TypeError
                number = float(value)
                problem = None if math.isfinite(number) else f"{number} (return None where it does not apply)"
            except (TypeError, ValueError):
                problem = f"{value!r:.60} (not a number or None)"
            if problem:
                preview = _preview(prompts[i] if i < len(prompts) else None, completions[i])
                self._show_once(
                    "value",
                    f"reward {self.spec.name} returned {problem}; it scores {failure:g} there. Completion: {preview}",
                )
                self.bad_values += 1
                self.failures += 1
                checked.append(failure)
                continue
            checked.append(number)
        return checked

    def _run(self, prompts: list, completions: list, kwargs: dict, deadline: float | None) -> Any:
        """The reward's result for these completions, here or in its process."""
        kwargs = {**kwargs, **self.params}
        if self.process is None:
            return settle(self.spec.func(prompts=prompts, completions=completions, **kwargs))
        return self.process.call(prompts, completions, kwargs, deadline)

    def _raised(self, err: BaseException, prompt: Any, completion: Any) -> None:
        self.exceptions += 1
        self.failures += 1
        what = str(err) if isinstance(err, RewardRaised) else f"{type(err).__name__}: {err}"
        self._show_once(
            "exception",
            f"reward {self.spec.name} raised {what[:200]}; that completion scores {self.spec.failure:g} and the run "
            f"goes on. Completion: {_preview(prompt, completion)}",
        )

    def _score(self, prompts: list, completions: list, kwargs: dict, deadline: float | None) -> list[float | None]:
        """The batch's checked values; when the reward raises on it, each completion alone, so only those that
        raise get the failure value. RewardLost (its process ended or overran) is left to the caller."""
        n = len(completions)
        try:
            result = self._run(prompts, completions, kwargs, deadline)
        except (TimeLimitExpired, RewardLost):
            raise
        except BaseException as err:  # SystemExit and the like are the reward's failure too
            if _raised_by_user(err):
                raise
        else:
            return self._check_values(result, n, prompts, completions)
        values: list[float | None] = []
        for i in range(n):
            one = {key: _slice(value, i, n) for key, value in kwargs.items()}
            try:
                result = self._run(_slice(prompts, i, n), completions[i : i + 1], one, deadline)
            except (TimeLimitExpired, RewardLost):
                raise
            except BaseException as err:  # any error in a reward scores the failure value
                if _raised_by_user(err):
                    raise
                self._raised(err, prompts[i] if i < len(prompts) else None, completions[i])
                values.append(self.spec.failure)
                continue
            values.extend(self._check_values(result, 1, prompts[i : i + 1], completions[i : i + 1]))
        return values

    def __call__(self, prompts: list | None = None, completions: list | None = None, **kwargs: Any) -> list:
        completions = list(completions or [])
        prompts = list(prompts) if prompts is not None else [None] * len(completions)
        kwargs = {**kwargs, "prefill": [prefill_of(prompt) for prompt in prompts]}
        n = len(completions)
        failures_before = self.failures
        self.calls += 1
        self.scored += n
        seconds = max(MIN_BATCH_SECONDS, self.timeout * n) if self.timeout else None
        values: list[float | None] | None = None
        lost = None
        timed_out = 0  # completions of this batch that scored the failure value for running past the timeout
        if self.process is not None:
            try:
                values = self._score(prompts, completions, kwargs, time.monotonic() + seconds if seconds else None)
            except RewardLost as err:
                lost = err
        else:
            try:
                with time_limit(seconds) as limit:
                    values = self._score(prompts, completions, kwargs, None)
            except TimeLimitExpired:  # expired just as the block ended
                limit.expired = True
            if limit.expired:
                values = None
        if values is None and (lost is None or lost.timed_out):
            self.timeouts += 1
            self.failures = failures_before + n
            timed_out = n
            longest = max(range(n), key=lambda i: len(str(completions[i])), default=None)
            self._show_once(
                "timeout",
                f"reward {self.spec.name} took longer than {self.timeout:g} s per completion on a batch of {n}; "
                f"they all score {self.spec.failure:g} and the run goes on. Longest completion: "
                + (_preview(prompts[longest], completions[longest]) if longest is not None else "none"),
            )
            values = [self.spec.failure] * n
        elif values is None:
            self.exceptions += 1
            self.failures = failures_before + n
            self._show_once(
                "lost",
                f"reward {self.spec.name} failed on a batch of {n}: {lost}; they all score {self.spec.failure:g}, "
                "the next batch starts it again, and the run goes on",
            )
            values = [self.spec.failure] * n
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and n:
            try:
                log_metric(f"rewards/{self.spec.name}/failed_frac", (self.failures - failures_before) / n)
                log_metric(f"rewards/{self.spec.name}/timed_out_frac", timed_out / n)  # a share of failed_frac
            except Exception as err:  # noqa: BLE001 - metrics are best effort; scoring must go on
                self._show_once("metric", f"could not log the failure rate of {self.spec.name}: {err}")
        return values

    def close(self) -> None:
        """Stop the reward's process, if it has one."""
        if self.process is not None:
            self.process.close()


def build_reward_funcs(
    names: list[str], timeout: float | None, base_dir: str | None = None, params: dict | None = None
) -> list[RewardGuard]:
    """TRL-ready reward callables for the names (registered or user functions), each behind a RewardGuard;
    `params`: the recipe's values, of which each reward gets the keys its spec names."""
    from grpo_cli.rewards.registry import resolve_reward

    specs = [resolve_reward(name, base_dir) for name in names]
    return [RewardGuard(spec, timeout, spec.reference, params) for spec in specs]


def conversational(reward_func):
    """Give a reward the task's conversational view of a rendered text prompt (prefill included): the training
    rows carry the prompt as text for TRL and its messages in `prompt_messages`."""

    def scored(prompts, completions, prompt_messages, **columns):
        return reward_func(prompts=prompt_messages, completions=as_chats(completions), **columns)

    scored.__name__ = reward_func.__name__
    return scored


def failure_counts(funcs: list[Callable]) -> dict[str, int]:
    """Failures so far per reward name, for guards among `funcs`."""
    return {f.__name__: f.failures for f in funcs if isinstance(f, RewardGuard)}
