"""DAPO-Math rewards from Unsloth's Qwen3 GRPO recipe: exact and approximate format, answer, numbers.

Answers compare through math-verify (`\\frac{1}{2}`, `0.5` and `\\boxed{1/2}` agree), not as strings; a batch's
distinct pairs are compared once, in worker processes when there are many (grpo_cli.rewards.math_pool). A solution
is read as math-verify reads it: its last math expression, so text or code before the answer (`print(1) or 42`)
earns what the answer alone earns; nothing in it is ever executed.
"""

from __future__ import annotations

import contextlib
import logging

from grpo_cli.rewards.math_pool import match_many
from grpo_cli.rewards.registry import reward
from grpo_cli.rewards.texts import texts
from grpo_cli.tasks.answers import answer_verdict, first_number, longest_comparison_seconds, parse_number
from grpo_cli.tasks.dapo_math import SOLUTION_START, is_exact, solution_of, tag_score
from grpo_cli.tasks.task import MAX_TEXT_CHARS

SCORE_CHUNK = 1024  # completions whose answers are compared together (well under answers_match's memory)
UNDECIDED_METRIC = "rewards/dapo_answer/undecided_frac"

logger = logging.getLogger("grpo_cli.rewards")
_told_undecided = False


def _golds(solution, kwargs: dict) -> list:
    """The gold answers: the `solution` column, or OpenMathReasoning's `expected_answer`."""
    golds = solution if solution is not None else kwargs.get("expected_answer")
    if golds is None:
        raise TypeError("dapo rewards need the gold answers in a 'solution' (or 'expected_answer') column")
    return list(golds)


@reward(
    name="dapo_format_exact",
    task="dapo_math",
    low=0.0,
    high=3.0,
    doc="3 if '<start_working_out>...<end_working_out><SOLUTION>...</SOLUTION>', each tag once, nothing after",
)
def dapo_format_exact(prompts=None, completions=None, prefill=None, **kwargs) -> list[float]:
    """3.0 when the text (prefill + completion) follows the working-out/solution format exactly, else 0.0."""
    return [3.0 if is_exact(text) else 0.0 for text in texts(completions, prefill)]


@reward(
    name="dapo_format_approx",
    task="dapo_math",
    low=-4.0,
    high=2.0,
    doc="+0.5 for each of the 4 tags seen exactly once, -1 for each missing or repeated",
)
def dapo_format_approx(prompts=None, completions=None, prefill=None, **kwargs) -> list[float]:
    """Partial format credit: +0.5 per tag present exactly once, -1.0 per tag missing or repeated."""
    return [tag_score(text) for text in texts(completions, prefill)]


def answer_score(text: str, gold) -> float | None:
    """5 for an equivalent answer, 2 / 1.5 within 10% / 20%, -2.5 wrong, -4.5 not a number, -2 no solution; None
    when math-verify ran out of time on the answer twice (undecided: neither right nor wrong)."""
    return _guess_score(solution_of(text), gold)


def _guess_score(guess: str | None, gold) -> float | None:
    """answer_score of the answer found in a completion (None: no solution)."""
    if guess is None:
        return -2.0
    verdict = answer_verdict(guess, str(gold))
    if verdict is None:
        return None
    if verdict:
        return 5.0
    guess_number, gold_number = parse_number(guess), parse_number(gold)
    if guess_number is None or gold_number is None:
        return -4.5
    if gold_number == 0:
        return -2.5
    ratio = guess_number / gold_number
    if 0.9 <= ratio <= 1.1:
        return 2.0
    if 0.8 <= ratio <= 1.2:
        return 1.5
    return -2.5


@reward(
    name="dapo_answer",
    task="dapo_math",
    low=-4.5,
    high=5.0,
    doc="5 if the <SOLUTION> equals the gold answer (math-verify), partial credit within 10%/20%, None if undecided",
    columns=("solution",),
)
def dapo_answer(prompts=None, completions=None, prefill=None, solution=None, **kwargs) -> list[float | None]:
    """The recipe's answer check, with equivalence by math-verify instead of string equality. Undecided answers
    (None) are counted: the fraction is logged as UNDECIDED_METRIC when TRL passes `log_metric`."""
    guesses = [solution_of(text) for text in texts(completions, prefill)]
    pairs = list(zip(guesses, _golds(solution, kwargs), strict=True))
    scores: list[float | None] = []
    for start in range(0, len(pairs), SCORE_CHUNK):
        chunk = pairs[start : start + SCORE_CHUNK]
        match_many((guess, str(gold)) for guess, gold in chunk if guess is not None)
        scores.extend(_guess_score(guess, gold) for guess, gold in chunk)
    _count_undecided(scores, kwargs.get("log_metric"))
    return scores


def _count_undecided(scores: list[float | None], log_metric) -> None:
    """Log the batch's fraction of undecided answers; say once that there are some."""
    global _told_undecided
    undecided = scores.count(None)
    if callable(log_metric) and scores:
        with contextlib.suppress(Exception):  # metrics are best effort; scoring must go on
            log_metric(UNDECIDED_METRIC, undecided / len(scores))
    if undecided and not _told_undecided:
        _told_undecided = True
        logger.warning(
            "math-verify ran out of time (%g s with its second try) on %d of %d answers; they get no dapo_answer "
            "score (None), so training leaves them out of that reward (%s counts them)",
            longest_comparison_seconds(),
            undecided,
            len(scores),
            UNDECIDED_METRIC,
        )


def numbers_score(text: str, gold) -> float | None:
    """3.5 if the first number after <SOLUTION> equals the gold number, -1.5 if not, -2.5 if none; None if the
    gold answer is not a plain number."""
    gold_number = parse_number(gold)
    if gold_number is None:
        return None
    if len(text) > MAX_TEXT_CHARS:
        return -2.5
    start = text.rfind(SOLUTION_START)
    guess = first_number(text[start + len(SOLUTION_START) :]) if start >= 0 else None
    if guess is None:
        return -2.5
    return 3.5 if guess == gold_number else -1.5


@reward(
    name="dapo_numbers",
    task="dapo_math",
    low=-2.5,
    high=3.5,
    doc="3.5 if the first number after <SOLUTION> is the gold number (None when the gold is not a number)",
    columns=("solution",),
)
def dapo_numbers(prompts=None, completions=None, prefill=None, solution=None, **kwargs) -> list[float | None]:
    """The recipe's numeric check: the first number in the solution, commas removed, against the gold number."""
    all_texts = texts(completions, prefill)
    return [numbers_score(text, gold) for text, gold in zip(all_texts, _golds(solution, kwargs), strict=True)]
