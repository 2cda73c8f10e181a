"""reasoning-gym rewards: the R1-Zero format, and the last <answer> scored by the row's dataset's own scorer.

reasoning-gym's scorers give partial credit in places: 0.01 for a wrong number (gsm_symbolic), or the gold answer's
share of an answer that contains it (the default scorer: "16" gets 0.5 for gold "6"). `reasoning_gym_accuracy`
counts full marks only; `reasoning_gym_score` passes the scorer's value on, for those who want its shaping. The
scorers are another library's code, so both run in a process of their own: one that hangs is stopped there.
"""

from __future__ import annotations

from grpo_cli.rewards.registry import reward
from grpo_cli.rewards.texts import texts
from grpo_cli.tasks.countdown import is_formatted
from grpo_cli.tasks.reasoning_gym import FULL_MARKS, completion_score

COLUMNS = ("answer", "metadata", "source_dataset")
ROW_COLUMNS = ("question", *COLUMNS, "source_config")  # what the scorers read of a row


def _scores(completions, columns: dict) -> list[float]:
    present = {key: columns[key] for key in ROW_COLUMNS if columns.get(key) is not None}
    rows = [{key: values[i] for key, values in present.items()} for i in range(len(completions))]
    all_texts = texts(completions, columns.get("prefill"))
    return [completion_score(text, row) for text, row in zip(all_texts, rows, strict=True)]


@reward(
    name="reasoning_gym_format",
    task="reasoning_gym",
    low=0.0,
    high=1.0,
    doc="1 if '<think>...</think> <answer>...</answer>', each tag once, nothing after (prefill counted)",
)
def reasoning_gym_format(prompts=None, completions=None, prefill=None, **kwargs) -> list[float]:
    """1.0 when the text (prefill + completion) follows the think/answer format, else 0.0 (countdown's check)."""
    return [1.0 if is_formatted(text) else 0.0 for text in texts(completions, prefill)]


@reward(
    name="reasoning_gym_accuracy",
    task="reasoning_gym",
    low=0.0,
    high=1.0,
    doc="1 if the dataset's own scorer gives the last <answer> full marks, else 0",
    columns=COLUMNS,
    isolated=True,
)
def reasoning_gym_accuracy(prompts=None, completions=None, **kwargs) -> list[float]:
    """1.0 when reasoning-gym's scorer for the row's dataset gives the last <answer> full marks, else 0.0."""
    return [1.0 if value >= FULL_MARKS else 0.0 for value in _scores(completions, kwargs)]


@reward(
    name="reasoning_gym_score",
    task="reasoning_gym",
    low=0.0,
    high=1.0,
    doc="the dataset's own scorer's value for the last <answer>, partial credit included (0 without one)",
    columns=COLUMNS,
    isolated=True,
)
def reasoning_gym_score(prompts=None, completions=None, **kwargs) -> list[float]:
    """reasoning-gym's score of the last <answer> for the row's dataset, from 0 to 1, partial credit included."""
    return _scores(completions, kwargs)
