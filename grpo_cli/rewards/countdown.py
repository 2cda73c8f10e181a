"""Countdown rewards (TinyZero / R1-Zero): format, and an exactly evaluated equation."""

from __future__ import annotations

from grpo_cli.rewards.registry import reward
from grpo_cli.rewards.texts import texts
from grpo_cli.tasks.countdown import answer_of, is_formatted
from grpo_cli.tasks.equation import check_equation


@reward(
    name="countdown_format",
    task="countdown",
    low=0.0,
    high=1.0,
    doc="1 if '<think>...</think> <answer>...</answer>', each tag once, nothing after (prefill counted)",
)
def countdown_format(prompts=None, completions=None, prefill=None, **kwargs) -> list[float]:
    """1.0 when the text (prefill + completion) follows the think/answer format, else 0.0."""
    return [1.0 if is_formatted(text) else 0.0 for text in texts(completions, prefill)]


@reward(
    name="countdown_equation",
    task="countdown",
    low=0.0,
    high=1.0,
    doc="1 if the last <answer> equation uses every number once and equals the target (exact, no eval)",
    columns=("nums", "target"),
)
def countdown_equation(prompts=None, completions=None, prefill=None, nums=None, target=None, **kwargs) -> list[float]:
    """1.0 when the last <answer> holds an equation over all given numbers, each once, equal to the target."""
    scores = []
    for text, row_nums, row_target in zip(texts(completions, prefill), nums, target, strict=True):
        answer = answer_of(text)
        ok = answer is not None and check_equation(answer, list(row_nums), int(row_target)) is None
        scores.append(1.0 if ok else 0.0)
    return scores
