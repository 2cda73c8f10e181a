"""Length shaping for any task: DAPO's soft overlong punishment."""

from __future__ import annotations

from grpo_cli.rewards.registry import reward

BUFFER_SHARE = 5  # unset `overlong_buffer`: the last fifth of `max_completion_length` (DAPO: 4096 of 20480 tokens)


@reward(
    name="overlong_penalty",
    low=-1.0,
    high=0.0,
    doc="0, falling to -1 over the last overlong_buffer tokens before max_completion_length (DAPO; needs token "
    "counts: None on texts alone)",
    params=("max_completion_length", "overlong_buffer"),
)
def overlong_penalty(
    prompts=None,
    completions=None,
    completion_ids=None,
    completion_lengths=None,
    max_completion_length=None,
    overlong_buffer=None,
    **kwargs,
) -> list[float | None]:
    """A completion of n tokens scores 0 while n <= L - B, then (L - B - n) / B down to -1 at the limit L
    (`max_completion_length`), B being `overlong_buffer`. The counts are TRL's `completion_ids` in training and
    `completion_lengths` in `grpo eval`; without either (scoring texts alone) or a limit, every value is None
    (skipped)."""
    n = len(completions or [])
    if completion_lengths is not None:
        lengths = list(completion_lengths)
    elif completion_ids is not None:
        lengths = [len(ids) for ids in completion_ids]
    else:
        return [None] * n
    if not max_completion_length:
        return [None] * n
    buffer = overlong_buffer or max(1, max_completion_length // BUFFER_SHARE)
    start = max_completion_length - buffer
    return [0.0 if length <= start else max(-1.0, (start - length) / buffer) for length in lengths]
