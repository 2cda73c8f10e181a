"""Comparing final answers: plain numbers exactly (Fraction), anything else through math-verify, bounded in time.

math-verify parses LaTeX into SymPy and compares symbolically; SymPy evaluates integer powers and factorials in
single C calls no signal can interrupt (`9^{9^{9}}` never returns) and binomials while parsing. So, by
construction: answers are capped in length, answers that combine growth operators (^ ! binom prod ...) with
5+ digit numbers or with each other are not parsed, and parsed expressions whose numbers could grow past
MAX_VALUE_BITS are not compared. The SIGALRM time limit (main thread only) is the safety net.

Two answers that are each one plain numeric value (no variables, percentages, sets or relations) and lie clearly
apart are told apart by their values, before math-verify's slower comparisons: none of those could hold (its
numeric ones round to 6 decimals). Most wrong answers to a numeric problem are such pairs.

math-verify's verdict on each pair is remembered (the last MATCH_CACHE_SIZE pairs). It may be computed elsewhere:
`symbolic_pairs` lists a batch's distinct pairs still to compare, `symbolic_outcome` compares one (in a worker
process, see grpo_cli.rewards.math_pool) and `remember` stores the outcomes for answers_match to read.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from fractions import Fraction

from grpo_cli.tasks.time_limit import time_limit

MAX_ANSWER_CHARS = 400  # longer answers are not parsed (a final answer is short)
MAX_GOLD_CHARS = MAX_ANSWER_CHARS * 4  # only this much of a gold answer is parsed
MATCH_CACHE_SIZE = 8192  # remembered math-verify verdicts: a GRPO group repeats answers to the same problem
MAX_ERROR_CHARS = 300
MAX_NUMBER_CHARS = 60
MAX_VALUE_BITS = 20_000
MATH_VERIFY_SECONDS = 0.5  # per comparison; GRPO_MATH_VERIFY_SECONDS overrides it
APART = 1e-3  # relative distance past which two numeric values are different answers without math-verify
SECONDS_ENV = "GRPO_MATH_VERIFY_SECONDS"

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


Outcome = bool | str  # math-verify's verdict on a pair of answers, or the error it raised ("TypeError: ...")
Pair = tuple[str, str]


class MathVerifyError(RuntimeError):
    """Comparing a pair of answers failed earlier (in a worker process, say): raised wherever that pair is scored."""


class _Outcomes:
    """A bounded map from a (guess, gold) pair to its Outcome; the least recently used is dropped first."""

    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict[Pair, Outcome] = OrderedDict()

    def __contains__(self, key: Pair) -> bool:
        return key in self._items

    def get(self, key: Pair) -> Outcome | None:
        """The outcome remembered for the pair, or None."""
        outcome = self._items.get(key)
        if outcome is not None:
            try:
                self._items.move_to_end(key)
            except KeyError:  # dropped by another thread meanwhile
                pass
        return outcome

    def put(self, key: Pair, outcome: Outcome) -> None:
        """Remember the pair's outcome, dropping the oldest beyond `size`."""
        self._items[key] = outcome
        try:
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        except KeyError:  # changed by another thread meanwhile
            pass

    def clear(self) -> None:
        """Forget every outcome."""
        self._items.clear()


_OUTCOMES = _Outcomes(MATCH_CACHE_SIZE)


def _settled(guess: str, gold: str) -> bool | None:
    """answers_match's verdict on two stripped answers when it needs no math-verify (equal text, an empty or
    overlong answer, two plain numbers), else None."""
    if not guess or not gold or len(guess) > MAX_ANSWER_CHARS:
        return False
    if guess == gold:
        return True
    guess_number, gold_number = parse_number(guess), parse_number(gold)
    if guess_number is not None and gold_number is not None:
        return guess_number == gold_number
    return None


def answers_match(guess: str, gold: str) -> bool:
    """Whether a final answer equals the gold one: same text, same number, or equal by math-verify.

    `\\frac{1}{2}`, `0.5`, `1/2` and `\\boxed{1/2}` all match gold `\\frac{1}{2}`; `1,234` matches `1234`.
    """
    guess, gold = str(guess).strip(), str(gold).strip()
    settled = _settled(guess, gold)
    return settled if settled is not None else _symbolic_match(guess, gold)


def symbolic_pairs(pairs: Iterable[tuple[str, str]]) -> list[Pair]:
    """The distinct pairs among (guess, gold) `pairs`, stripped, that answers_match would hand to math-verify and
    whose outcome is not remembered yet, in first-seen order."""
    todo: dict[Pair, None] = {}
    for guess, gold in pairs:
        key = (str(guess).strip(), str(gold).strip())
        if key not in todo and key not in _OUTCOMES and _settled(*key) is None:
            todo[key] = None
    return list(todo)


def remember(outcomes: Mapping[Pair, Outcome]) -> None:
    """Remember outcomes of stripped (guess, gold) pairs computed elsewhere (by symbolic_outcome)."""
    for key, outcome in outcomes.items():
        _OUTCOMES.put(key, outcome)


def forget_outcomes() -> None:
    """Forget every remembered math-verify verdict and parsed gold answer."""
    _OUTCOMES.clear()
    _parse_gold.cache_clear()


def symbolic_outcome(guess: str, gold: str) -> Outcome:
    """math-verify's verdict on two stripped answers, or the text of the error comparing them raised."""
    try:
        return _symbolic_match(guess, gold)
    except Exception as err:  # noqa: BLE001 - the error travels back as text, to be raised where it is scored
        return f"{type(err).__name__}: {err}"[:MAX_ERROR_CHARS]


def _symbolic_match(guess: str, gold: str) -> bool:
    """math-verify's verdict on two stripped answers, remembered; raises MathVerifyError for a pair whose
    comparison is known to have failed."""
    key = (guess, gold)
    outcome = _OUTCOMES.get(key)
    if outcome is None:
        outcome = _verify(guess, gold)
        _OUTCOMES.put(key, outcome)
    if isinstance(outcome, str):
        raise MathVerifyError(outcome)
    return outcome


def math_verify_seconds() -> float:
    """The time one math-verify comparison may take: GRPO_MATH_VERIFY_SECONDS, else MATH_VERIFY_SECONDS."""
    try:
        return max(0.01, float(os.environ[SECONDS_ENV]))
    except (KeyError, ValueError):
        return MATH_VERIFY_SECONDS


def _verify(guess: str, gold: str) -> bool:
    """Parse both answers and compare them with math-verify, within math_verify_seconds() (False when it runs
    out)."""
    _quiet_math_verify()
    from math_verify import verify

    result = False
    with time_limit(math_verify_seconds()):
        gold_parsed = _parse_gold(gold[:MAX_GOLD_CHARS])
        guess_parsed = _parse(guess)
        if gold_parsed and guess_parsed and not _values_apart(gold_parsed, guess_parsed):
            result = bool(verify(gold_parsed, guess_parsed, timeout_seconds=None))
    return result


def _numeric_value(parsed: list) -> complex | None:
    """The value of a parsed answer that is one plain number, or None (anything else, or not finite)."""
    import sympy

    if len(parsed) != 2 or not isinstance(parsed[1], str):  # math-verify's [expression, text]
        return None
    expr = parsed[0]
    # Percentages are UnevaluatedExpr(1/100) factors: math-verify accepts 9% for 9, so they never count as values.
    if not isinstance(expr, sympy.Expr) or expr.free_symbols or expr.atoms(sympy.UnevaluatedExpr):
        return None
    try:
        value = complex(expr.evalf(30))
    except (TypeError, ValueError, ArithmeticError):  # unevaluated functions, overflow
        return None
    return value if math.isfinite(value.real) and math.isfinite(value.imag) else None


def _values_apart(gold_parsed: list, guess_parsed: list) -> bool:
    """Whether both answers are plain numbers more than APART apart (relative): then no comparison holds."""
    gold, guess = _numeric_value(gold_parsed), _numeric_value(guess_parsed)
    if gold is None or guess is None:
        return False
    return abs(gold - guess) > APART * max(1.0, abs(gold), abs(guess))
