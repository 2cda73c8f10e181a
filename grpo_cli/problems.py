"""What a check found wrong, as data: the recipe key it is about and the message, so the recipe check can say where
that key was set (file:line, the command line) without reading it back out of the text."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One problem: `key` is the recipe key it is about (None: no one key), `message` what is wrong and how to fix
    it, without where the key was set (the recipe check adds that)."""

    key: str | None
    message: str


def messages(problems: list[Problem]) -> list[str]:
    """The problems' messages as they are, for a UserError where no recipe says where keys were set."""
    return [problem.message for problem in problems]
