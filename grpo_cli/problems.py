"""What a check found wrong, as data: the recipe key it is about, the message, and where it is, so the recipe
check can say where that key was set (file:line, the command line) and list the problems in the file's order
without reading any of it back out of the text."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One problem: `key` is the recipe key it is about (None: no one key), `message` what is wrong and how to fix
    it. `where` says where it is (`FILE:LINE`, "command line `--key`", ...; None: nowhere in particular, or not yet
    known: the recipe check adds where `key` was set), `line` its line in the recipe file."""

    key: str | None
    message: str
    where: str | None = None
    line: int | None = None


def _order(problem: Problem) -> tuple[int, int]:
    if problem.line is not None:
        return (0, problem.line)
    return (1 if (problem.where or "").startswith("command line") else 2, 0)


def listing(problems: list[Problem]) -> list[str]:
    """The problems as lines of `where: message`: the recipe file's in line order, then the command line's, then
    the rest, each group in the order found."""
    ordered = sorted(problems, key=_order)
    return [f"{p.where}: {p.message}" if p.where else p.message for p in ordered]
