"""Comparing final answers: plain numbers exactly (Fraction), anything else through math-verify, bounded in time.

math-verify parses LaTeX into SymPy and compares symbolically; SymPy evaluates integer powers and factorials in
single C calls no signal can interrupt (`9^{9^{9}}` never returns) and binomials while parsing. So, by
construction: answers are capped in length, answers that combine growth operators (^ ! binom prod ...) with
5+ digit numbers or with each other are not parsed, and parsed expressions whose numbers could grow past
MAX_VALUE_BITS are not compared. The SIGALRM time limit (main thread only) is the safety net, not a verdict:
a comparison that runs out of math_verify_seconds() is tried once more with RETRY_FACTOR times as long, and one
that runs out again is undecided (None): neither equal nor different, so a reward can leave that completion out
instead of scoring a right answer as wrong when the machine is busy. Each process first compares WARM_UP_PAIRS
untimed, so that SymPy's and math-verify's first-use costs never count against a timed comparison.

Two answers that are each one plain numeric value (no variables, percentages, sets or relations) and lie clearly
apart are told apart by their values, before math-verify's slower comparisons: none of those could hold (its
numeric ones round to 6 decimals). Most wrong answers to a numeric problem are such pairs.

math-verify's verdict on each pair is remembered (the last MATCH_CACHE_SIZE pairs). It may be computed elsewhere:
`symbolic_pairs` lists a batch's distinct pairs still to compare, `symbolic_outcome` compares one (in a worker
process, see grpo_cli.rewards.math_pool) and `remember` stores the outcomes for answers_match to read.
"""

from __future__ import annotations

import contextlib
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
MATH_VERIFY_SECONDS = 0.5  # a comparison's first try; GRPO_MATH_VERIFY_SECONDS overrides it
# A comparison that runs out is tried once more with this many times as long: 0.5 s + 3 s by default, within the
# reward guard's shortest batch limit (5 s) for a completion scored alone.
RETRY_FACTOR = 6
APART = 1e-3  # relative distance past which two numeric values are different answers without math-verify
SECONDS_ENV = "GRPO_MATH_VERIFY_SECONDS"

# ASCII digits only: str.isdigit() and \d also accept "٣", "³" and "３", which int() or a reader may not.
# Thousands are grouped by one separator throughout: a comma, a space or LaTeX's thin space `\,` ("1,234",
# "1 234", "1\,234"), after a first group that is not 0 ("0,111" is not a thousands number). LaTeX's `\!` (a
# negative thin space, as in MATH's "11,\! 111") and the braces of `{,}` are dropped first.
_GROUPED = r"[1-9][0-9]{0,2}(?P<sep>,| |\\,)[0-9]{3}(?:(?P=sep)[0-9]{3})*"
_NUMBER = re.compile(rf"-?(?:{_GROUPED}|[0-9]+)(?:\.[0-9]+)?|-?\.[0-9]+", re.ASCII)
_FIRST_NUMBER = re.compile(rf"-?(?:{_GROUPED}|[0-9]+)(?:\.[0-9]+)?", re.ASCII)
_SEPARATOR = re.compile(r",| |\\,")
_SPACED_GROUPS = re.compile(r"(?<![0-9.])[1-9][0-9]{0,2}(?:(?: |\\,)[0-9]{3})+(?![0-9])", re.ASCII)
_NEGATIVE_SPACE = re.compile(r"\s*\\!\s*")
_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)


def _unspaced(text: str) -> str:
    """The text without LaTeX's `\\!` (and the spaces around it) and with `{,}` as a plain comma."""
    return _NEGATIVE_SPACE.sub("", text).replace("{,}", ",")


def _joined_groups(text: str) -> str:
    """The text with digit groups split by spaces or `\\,` joined ("1 000" -> "1000"): math-verify reads them as a
    product, where LaTeX shows one number."""
    return _SPACED_GROUPS.sub(lambda match: _SEPARATOR.sub("", match.group(0)), text)


def _number_value(text: str) -> Fraction:
    """The value of a match of _NUMBER or _FIRST_NUMBER."""
    return Fraction(_SEPARATOR.sub("", text))


def parse_number(text: str | float | None) -> Fraction | None:
    """The exact value of a plain number ("1,234", "1 234", "-3.50", "$72", "72.", "5%"), or None if it is not
    one."""
    if text is None or isinstance(text, bool):
        return None
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        return Fraction(repr(text)) if math.isfinite(text) else None  # repr: 0.1 means 1/10
    s = str(text).strip()
    if len(s) > MAX_NUMBER_CHARS:
        return None
    s = _unspaced(s.removeprefix("$").removesuffix("%").removesuffix(".").strip())
    if not _NUMBER.fullmatch(s):
        return None
    return _number_value(s)


def is_integer_text(text: str) -> bool:
    """Whether the text is a plain integer in ASCII digits, optionally negative (no commas, no spaces)."""
    return len(text) <= MAX_NUMBER_CHARS and _INTEGER.fullmatch(text) is not None


def first_number(text: str) -> Fraction | None:
    """The first number in the text ("1,234" and "1 234" count as one), or None."""
    match = _FIRST_NUMBER.search(_unspaced(text[:MAX_ANSWER_CHARS]))
    return None if match is None else _number_value(match.group(0))


def _value_bits(expr, bound: dict | None = None) -> float:
    """A generous upper bound on the bits of any number SymPy may compute while evaluating `expr`.

    A free symbol is never given a value (`2^{n+1}` computes no power), so it counts as 1 bit; the variable of a
    sum or product with finite limits counts as the larger of its limits (`bound`), and with an infinite limit as
    free: SymPy sums and multiplies those symbolically.
    """
    import sympy

    bound = bound or {}
    if isinstance(expr, sympy.Integer):
        return max(int(expr).bit_length(), 1)
    if isinstance(expr, sympy.Rational):
        return max(expr.p.bit_length(), expr.q.bit_length(), 1)
    if isinstance(expr, sympy.Symbol):
        return bound.get(expr, 1.0)
    if not isinstance(expr, sympy.Basic) or not expr.args:
        return 64
    if isinstance(expr, (sympy.Sum, sympy.Product)):
        inner = dict(bound)
        limits = 0.0
        for limit in expr.limits:
            ends = [_value_bits(end, inner) for end in limit[1:] if end.is_finite is not False]
            limits = max([limits, *ends])
            if len(ends) == len(limit) - 1:
                inner[limit[0]] = max(ends, default=1.0)
            else:
                inner.pop(limit[0], None)
        term = _value_bits(expr.function, inner)
        if isinstance(expr, sympy.Product):  # up to 2^limits factors
            return term * 2.0 ** min(limits, 1000)
        return term + limits + len(expr.limits)
    if isinstance(expr, sympy.Pow):
        base, exponent = expr.args
        if exponent.is_Number:
            return _value_bits(base, bound) * max(abs(float(exponent)), 1.0)
        return _value_bits(base, bound) * 2.0 ** min(_value_bits(exponent, bound), 1000)
    if isinstance(expr, (sympy.factorial, sympy.factorial2, sympy.subfactorial, sympy.gamma, sympy.binomial)):
        n = 2.0 ** min(max(_value_bits(a, bound) for a in expr.args), 1000)
        return n * math.log2(n + 2)
    children = [_value_bits(a, bound) for a in expr.args]
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


# LaTeX commands whose parse or comparison can grow without bound, and the operators that do; words that merely hold
# the letters (the points, assuming, a limit) are none of them.
_GROWTH_MARKS = re.compile(r"\\(?:[dt]?binom|choose|prod|sum|int|lim)(?![A-Za-z])|\bbinom|!|\^|\*\*")
_MULTIPLYING = re.compile(r"\\(?:[dt]?binom|choose|prod)(?![A-Za-z])|\bbinom|!")
_DIGIT_RUN = re.compile(r"(?<![0-9.])[0-9]{5,}", re.ASCII)  # not the decimals of 1.11111111\times 10^{10}


def _costly(text: str) -> bool:
    """Whether parsing could build huge numbers: SymPy evaluates e.g. binomials while parsing, and
    factorials, products and nested powers when comparing. Such answers get no symbolic comparison."""
    text = text.replace("\\!", "")  # a thin space, not a factorial
    if not _GROWTH_MARKS.search(text):
        return False
    if len(_MULTIPLYING.findall(text)) > 1:
        return True
    return _DIGIT_RUN.search(text) is not None


def _parse(text: str) -> list:
    from math_verify import parse

    text = _joined_groups(text).replace("\\$", "")  # an escaped dollar is a currency sign, not math mode
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


# math-verify's verdict on a pair of answers: True/False, None when it ran out of time twice (undecided), or the
# error it raised ("TypeError: ...").
Outcome = bool | str | None
Pair = tuple[str, str]

# Untimed once per process before the first timed comparison: numbers, fractions, roots, polynomials, equations,
# intervals, relations, tuples, sets, matrices, percentages, text and sums each load their own parts of SymPy.
WARM_UP_PAIRS: tuple[Pair, ...] = (
    ("0.5", "\\frac{1}{2}"),
    ("\\frac{1}{2}", "\\sqrt{2}"),
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}"),
    ("1+x^2", "x^2+1"),
    ("x^2/4+y^2/3=1", "x^2/16+y^2/12=1/4"),
    ("x\\in[-2,7]", "-2\\le x\\le 7"),
    ("(-\\infty, 3)", "x < 3"),
    ("(p,q)=(3,2)", "(3,2)"),
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}^2", "\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}"),
    ("50\\%", "0.5"),
    ("\\text{yes}", "yes"),
    ("\\sum_{k=1}^{10} k", "55"),
)


class MathVerifyError(RuntimeError):
    """Comparing a pair of answers failed earlier (in a worker process, say): raised wherever that pair is scored."""


_MISSING = object()


class _Outcomes:
    """A bounded map from a (guess, gold) pair to its Outcome; the least recently used is dropped first."""

    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict[Pair, Outcome] = OrderedDict()

    def __contains__(self, key: Pair) -> bool:
        return key in self._items

    def get(self, key: Pair, default=_MISSING):
        """The outcome remembered for the pair, or `default`."""
        outcome = self._items.get(key, default)
        if outcome is not default:
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
_warm = False


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


def answer_verdict(guess: str, gold: str) -> bool | None:
    """Whether a final answer equals the gold one: same text, same number, or equal by math-verify; None when
    math-verify ran out of time on them, even on its second try.

    `\\frac{1}{2}`, `0.5`, `1/2` and `\\boxed{1/2}` all match gold `\\frac{1}{2}`; `1,234` matches `1234`.
    """
    guess, gold = str(guess).strip(), str(gold).strip()
    settled = _settled(guess, gold)
    return settled if settled is not None else _symbolic_match(guess, gold)


def answers_match(guess: str, gold: str) -> bool:
    """answer_verdict, with an undecided pair counted as no match (for a yes/no such as an accuracy)."""
    return answer_verdict(guess, gold) is True


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
    """math-verify's verdict on two stripped answers, tried twice if the first try runs out of time (None when the
    second does too), or the text of the error comparing them raised. Not remembered: see `remember`."""
    warm_up()
    try:
        outcome = _verify(guess, gold, math_verify_seconds())
        if outcome is None:
            outcome = _verify(guess, gold, RETRY_FACTOR * math_verify_seconds())
    except Exception as err:  # noqa: BLE001 - the error travels back as text, to be raised where it is scored
        return f"{type(err).__name__}: {err}"[:MAX_ERROR_CHARS]
    return outcome


def _symbolic_match(guess: str, gold: str) -> bool | None:
    """math-verify's verdict on two stripped answers, remembered; raises MathVerifyError for a pair whose
    comparison is known to have failed."""
    key = (guess, gold)
    outcome = _OUTCOMES.get(key)
    if outcome is _MISSING:
        outcome = symbolic_outcome(guess, gold)
        remember({key: outcome})
    if isinstance(outcome, str):
        raise MathVerifyError(outcome)
    return outcome


def warm_up() -> None:
    """Compare WARM_UP_PAIRS without a time limit, once per process (later calls return at once)."""
    global _warm
    if _warm:
        return
    _warm = True
    for guess, gold in WARM_UP_PAIRS:
        with contextlib.suppress(Exception):  # a pair math-verify can't compare warms up all the same
            _verify(guess, gold, None)


def math_verify_seconds() -> float:
    """The time a math-verify comparison's first try may take: GRPO_MATH_VERIFY_SECONDS, else
    MATH_VERIFY_SECONDS."""
    try:
        return max(0.01, float(os.environ[SECONDS_ENV]))
    except (KeyError, ValueError):
        return MATH_VERIFY_SECONDS


def longest_comparison_seconds() -> float:
    """The time a comparison may take with its second try."""
    return (1 + RETRY_FACTOR) * math_verify_seconds()


def _verify(guess: str, gold: str, seconds: float | None) -> bool | None:
    """Parse both answers and compare them with math-verify within `seconds` (None: no limit); None when the time
    runs out."""
    _quiet_math_verify()
    from math_verify import verify

    result = False
    with time_limit(seconds) as limit:
        gold_parsed = _parse_gold(gold[:MAX_GOLD_CHARS])
        guess_parsed = _parse(guess)
        if gold_parsed and guess_parsed and not _values_apart(gold_parsed, guess_parsed):
            result = bool(verify(gold_parsed, guess_parsed, timeout_seconds=None))
    return None if limit.expired else result


def _numeric_value(parsed: list) -> complex | None:
    """The value of a parsed answer that is one plain number, or None (anything else, or not finite)."""
    import sympy

    if len(parsed) != 2 or not isinstance(parsed[1], str):  # math-verify's [expression, text]
        return None
    expr = parsed[0]
    # Percentages are UnevaluatedExpr(1/100) factors: math-verify accepts 9% for 9, so they never count as values.
    # Matrix expressions (products, sums) are no numbers, and evaluating them can recurse without end.
    if (
        not isinstance(expr, sympy.Expr)
        or getattr(expr, "is_Matrix", False)
        or expr.free_symbols
        or expr.atoms(sympy.UnevaluatedExpr)
    ):
        return None
    try:
        value = complex(expr.evalf(30))
    except (TypeError, ValueError, ArithmeticError, RecursionError):  # unevaluated functions, overflow
        return None
    return value if math.isfinite(value.real) and math.isfinite(value.imag) else None


def _values_apart(gold_parsed: list, guess_parsed: list) -> bool:
    """Whether both answers are plain numbers more than APART apart (relative): then no comparison holds."""
    gold, guess = _numeric_value(gold_parsed), _numeric_value(guess_parsed)
    if gold is None or guess is None:
        return False
    return abs(gold - guess) > APART * max(1.0, abs(gold), abs(guess))
