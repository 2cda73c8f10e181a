"""The texts rewards read: prefill + completion, for conversational or plain prompts and completions."""

from __future__ import annotations

from typing import Any

from grpo_cli.tasks.task import completion_text


def texts(prompts: list[Any] | None, completions: list[Any]) -> list[str]:
    """One text per completion: the prompt's assistant prefill (if any) + the completion."""
    if prompts is None:
        prompts = [None] * len(completions)
    return [
        completion_text(prompt, completion) for prompt, completion in zip(prompts, completions, strict=True)
    ]
