"""Messages said once: a run repeats its steps, and a fallback or a limit is news only the first time."""

from __future__ import annotations

import logging


class SayOnce:
    """The keys of the messages an owner (a trainer, a rollout function, a worker pool) has said: each is said once.

    `said = SayOnce()`, then `said.warning(logger, "no-gather", "...")` logs the first time only; `said.first(key)` is
    True the first time, for messages printed another way.
    """

    def __init__(self) -> None:
        self._keys: set[str] = set()

    def first(self, key: str) -> bool:
        """True the first time `key` is asked for, False after."""
        if key in self._keys:
            return False
        self._keys.add(key)
        return True

    def warning(self, logger: logging.Logger, key: str, message: str, *args) -> None:
        """`logger.warning(message, *args)` the first time `key` is said."""
        if self.first(key):
            logger.warning(message, *args)
