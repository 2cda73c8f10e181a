"""A nestable wall-clock limit for pure-Python work on the main thread, through SIGALRM.

A thread can't stop CPU-bound Python code, a signal can: the handler raises `TimeLimitExpired` (a BaseException, so
`except Exception` in library code doesn't swallow it) between two bytecodes. The timer repeats every 50 ms after it
first fires, in case a bare `except:` did swallow it. Off the main thread (or without setitimer) the limit does
nothing, so the work must also be bounded by construction. Long single C calls (a huge integer power) are not
interrupted at all: callers cap their inputs for that.
"""

from __future__ import annotations

import signal
import threading
import time

_REPEAT_S = 0.05


class TimeLimitExpired(BaseException):
    """Raised inside the limited block when its time is up."""


class time_limit:
    """`with time_limit(seconds) as limit: ...`; afterwards `limit.expired` says whether the time ran out.

    The block's own expiry is swallowed (the block just stops); an enclosing limit that expires first is not.
    """

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.expired = False
        self._armed = False

    def __enter__(self) -> time_limit:  # noqa: PYI034 - typing.Self needs Python 3.11
        self.expired = False
        usable = (
            self.seconds is not None
            and self.seconds > 0
            and hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread()
        )
        if not usable:
            return self
        outer_delay, outer_interval = signal.getitimer(signal.ITIMER_REAL)
        self._outer_handler = signal.getsignal(signal.SIGALRM)
        self._outer_interval = outer_interval
        self._outer_deadline = time.monotonic() + outer_delay if outer_delay > 0 else None
        # When an enclosing limit ends first, fire then and hand over to its handler.
        self._for_outer = outer_delay > 0 and outer_delay <= self.seconds
        self._token = TimeLimitExpired(f"took longer than {self.seconds:g} s")
        self._armed = True
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.setitimer(signal.ITIMER_REAL, outer_delay if self._for_outer else self.seconds, _REPEAT_S)
        return self

    def _on_alarm(self, signum, frame) -> None:
        if not self._armed:
            return
        if self._for_outer and callable(self._outer_handler):
            self._outer_handler(signum, frame)
            return
        raise self._token

    def __exit__(self, exc_type, exc, tb) -> bool:
        if not self._armed:
            return False
        self._armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._outer_handler)
        if self._outer_deadline is not None:
            left = self._outer_deadline - time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-4), self._outer_interval)
        if exc is self._token:
            self.expired = True
            return True
        return False
