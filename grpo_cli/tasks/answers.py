"""Comparing final answers: plain numbers exactly (Fraction), anything else through math-verify, bounded in time.

math-verify parses LaTeX into SymPy and compares symbolically; SymPy evaluates integer powers and factorials in
single C calls no signal can interrupt (`9^{9^{9}}` never returns) and binomials while parsing. So, by
construction: answers are capped in length, answers that combine growth operators (^ ! binom prod ...) with
5+ digit numbers or with each other are not parsed, and parsed expressions whose numbers could grow past
MAX_VALUE_BITS are not compared. The SIGALRM time limit (main thread only) is the safety net.
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction

from grpo_cli.tasks.time_limit import time_limit

MAX_ANSWER_CHARS = 400  # longer answers are not parsed (a final answer is short)
MAX_NUMBER_CHARS = 60
MAX_VALUE_BITS = 20_000
MATH_VERIFY_SECONDS = 0.5

# ASCII digits only: str.isdigit() and \d also accept "٣", "³" and "３", which int() or a reader may not.
_NUMBER = re.compile(r"-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?|-?\.[0-9]+", re.ASCII)
_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)
_FIRST_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?", re.ASCII)


def parse_number(text: str | float | None) -> Fraction | None:
    """The exact value of a plain number ("1,234", "-3.50", "$72", "72.", "5%"), or None if it is not one."""
    if text is None or isinstance(text, bool):
        return None
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        return Fraction(repr(text)) if math.isfinite(text) else None  # repr: 0.1 means 1/10
    s = str(text).strip()
    if len(s) > MAX_NUMBER_CHARS:
        return None
    s = s.removeprefix("$").removesuffix("%").removesuffix(".").strip()
    if not _NUMBER.fullmatch(s):
        return None
    return Fraction(s.replace(",", ""))


def is_integer_text(text: str) -> bool:
    """Whether the text is a plain integer in ASCII digits, optionally negative (no commas, no spaces)."""
    return len(text) <= MAX_NUMBER_CHARS and _INTEGER.fullmatch(text) is not None


def first_number(text: str) -> Fraction | None:
    """The first number in the text ("1,234" counts as one), or None."""
    match = _FIRST_NUMBER.search(text[:MAX_ANSWER_CHARS])
    if match is None:
        return None
    return Fraction(match.group(0).rstrip(",").replace(",", ""))


def _value_bits(expr) -> float:
    """A generous upper bound on the bits of any number SymPy may compute while evaluating `expr`."""
    import sympy

    if isinstance(expr, sympy.Integer):
        return max(int(expr).bit_length(), 1)
    if isinstance(expr, sympy.Rational):
        return max(expr.p.bit_length(), expr.q.bit_length(), 1)
    if not isinstance(expr, sympy.Basic) or not expr.args:
        return 64
    if isinstance(expr, sympy.Pow):
        base, exponent = expr.args
        if exponent.is_Number:
            return _value_bits(base) * max(abs(float(exponent)), 1.0)
        return _value_bits(base) * 2.0 ** min(_value_bits(exponent), 1000)
    if isinstance(expr, (sympy.factorial, sympy.factorial2, sympy.subfactorial, sympy.gamma, sympy.binomial)):
        n = 2.0 ** min(max(_value_bits(a) for a in expr.args), 1000)
        return n * math.log2(n + 2)
    children = [_value_bits(a) for a in expr.args]
    if isinstance(expr, sympy.Mul):
        return sum(children)
    return max(children) + len(children)


def _safe(parsed: list) -> bool:
    import sympy

    for item in parsed:
        if isinstance(item, sympy.Basic) and _value_bits(item) > MAX_VALUE_BITS:
            return False
    return True


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str):
    return _parse(gold)


_GROWTH_MARKS = ("binom", "choose", "!", "prod", "sum", "int", "lim", "^", "**")
_DIGIT_RUN = re.compile(r"[0-9]{5,}", re.ASCII)


def _costly(text: str) -> bool:
    """Whether parsing could build huge numbers: SymPy evaluates e.g. binomials while parsing, and
    factorials, products and nested powers when comparing. Such answers get no symbolic comparison."""
    if not any(mark in text for mark in _GROWTH_MARKS):
        return False
    if sum(text.count(mark) for mark in ("binom", "choose", "!", "prod")) > 1:
        return True
    return _DIGIT_RUN.search(text) is not None


def _parse(text: str) -> list:
    from math_verify import parse

    if _costly(text):
        return []
    if not any(marker in text for marker in ("$", "\\(", "\\[", "\\boxed")):
        text = f"${text}$"
    parsed = parse(text, parsing_timeout=None)
    return parsed if _safe(parsed) else []


def _quiet_math_verify() -> None:
    # We time-limit math-verify ourselves (its own signal.alarm would cancel our timer); silence its warning.
    import math_verify.grader
    import math_verify.parser

    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True


def answers_match(guess: str, gold: str) -> bool:
    """Whether a final answer equals the gold one: same text, same number, or equal by math-verify.

    `\\frac{1}{2}`, `0.5`, `1/2` and `\\boxed{1/2}` all match gold `\\frac{1}{2}`; `1,234` matches `1234`.
    """
    guess, gold = str(guess).strip(), str(gold).strip()
    if not guess or not gold or len(guess) > MAX_ANSWER_CHARS:
        return False
    if guess == gold:
        return True
    guess_number, gold_number = parse_number(guess), parse_number(gold)
    if guess_number is not None and gold_number is not None:
        return guess_number == gold_number
    return _symbolic_match(guess, gold)


@functools.lru_cache(maxsize=8192)  # a GRPO group repeats answers to the same problem
def _symbolic_match(guess: str, gold: str) -> bool:
    _quiet_math_verify()
    from math_verify import verify

    result = False
    with time_limit(MATH_VERIFY_SECONDS):
        gold_parsed = _parse_gold(gold[: MAX_ANSWER_CHARS * 4])
        guess_parsed = _parse(guess)
        if gold_parsed and guess_parsed:
            result = bool(verify(gold_parsed, guess_parsed, timeout_seconds=None))
    return result
