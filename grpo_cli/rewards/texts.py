"""The texts rewards score: the assistant turn's prefill + the completion."""

from __future__ import annotations

from typing import Any

from grpo_cli.tasks.task import completion_text


def texts(completions: list[Any], prefill: list[str] | None = None) -> list[str]:
    """One text per completion: its `prefill` (the keyword every reward gets from its guard: the text its prompt's
    assistant turn starts with; none when not given) + the completion."""
    if prefill is None:
        prefill = [""] * len(completions)
    return [start + completion_text(completion) for start, completion in zip(prefill, completions, strict=True)]
