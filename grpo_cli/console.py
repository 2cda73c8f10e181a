"""The shared Rich consoles: `output` (stdout) for what a command produces to read or redirect (plans, tables,
lists), `console` (stderr) for messages, warnings and progress; machine-readable data goes to files or stdout."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape  # paths and user text in markup: escape(text)

__all__ = ["console", "escape", "output", "print_problems"]

console = Console(stderr=True, highlight=False)
output = Console(highlight=False)  # `grpo check -c countdown > plan.txt`, `grpo recipes keys | grep lora`


def print_problems(problems: list[str]) -> None:
    """Print user mistakes, one per line, with no traceback."""
    if len(problems) == 1:
        console.print(f"[bold red]error:[/] {escape(problems[0])}", soft_wrap=True)
        return
    console.print(f"[bold red]error:[/] {len(problems)} problems", soft_wrap=True)
    for problem in problems:
        console.print(f"  - {escape(problem)}", soft_wrap=True)
