"""Every built-in reward on literal completions: prefills, tags, trailing text, arithmetic traps, number formats."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from grpo_cli.errors import UserError
from grpo_cli.rewards import REWARDS
from grpo_cli.rewards.countdown import countdown_equation, countdown_format
from grpo_cli.rewards.dapo_math import (
    UNDECIDED_METRIC,
    dapo_answer,
    dapo_format_approx,
    dapo_format_exact,
    dapo_numbers,
)
from grpo_cli.rewards.gsm8k import (
    gsm8k_correctness,
    gsm8k_int,
    gsm8k_soft_format,
    gsm8k_strict_format,
    gsm8k_xml_count,
)
from grpo_cli.tasks import answers, equation
from grpo_cli.tasks.countdown import PREFILL
from grpo_cli.tasks.task import MAX_TEXT_CHARS, prefill_of

DATA = Path(__file__).parent / "data"
COUNTDOWN_PROMPT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Using the numbers [44, 19, 35], create an equation that equals 98."},
    {"role": "assistant", "content": PREFILL},
]
DAPO_PROMPT = [
    {"role": "user", "content": "Compute 3/4 - 1/4."},
    {"role": "assistant", "content": "<start_working_out>"},
]


def chat(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def one(func, completion: str, prompt=None, **columns):
    """Score one conversational completion (prompt given: its prefill counts)."""
    columns = {k: [v] for k, v in columns.items()}
    return func(prompts=[prompt], completions=[chat(completion)], prefill=[prefill_of(prompt)], **columns)[0]


def equation_score(answer: str, nums=(44, 19, 35), target=98) -> float:
    return one(
        countdown_equation,
        f" ok</think>\n<answer>{answer}</answer>",
        COUNTDOWN_PROMPT,
        nums=list(nums),
        target=target,
    )


# --- countdown ---------------------------------------------------------------------------------------------------


def test_countdown_format_counts_the_prefilled_think_tag():
    completion = " 44 + 19 = 63, 63 + 35 = 98.\n</think>\n<answer>44 + 19 + 35</answer>"
    assert one(countdown_format, completion, COUNTDOWN_PROMPT) == 1.0
    # Without the prefill the opening <think> is missing.
    assert one(countdown_format, completion, COUNTDOWN_PROMPT[:2]) == 0.0
    # A model that writes its own <think> without a prefill is formatted too.
    assert one(countdown_format, "<think>x</think><answer>1</answer>", COUNTDOWN_PROMPT[:2]) == 1.0


@pytest.mark.parametrize(
    "completion",
    [
        " thinking</think>\n44 + 19 + 35",  # no answer tags
        " thinking\n<answer>44 + 19 + 35</answer>",  # </think> missing
        " thinking</think>\n<answer>44 + 19 + 35",  # </answer> missing
        " a</think><think>b</think>\n<answer>44 + 19 + 35</answer>",  # doubled think
        " a</think>\n<answer>1</answer><answer>44 + 19 + 35</answer>",  # doubled answer
        " a</think>\n<answer>44 + 19 + 35</answer> I hope that helps!",  # trailing text
        " a</think> so <answer>44 + 19 + 35</answer>",  # text between think and answer
        " a</think>\n<answer>   </answer>",  # empty answer
        " <answer>44 + 19 + 35</answer></think>",  # answer inside think
    ],
)
def test_countdown_format_rejects_malformed(completion):
    assert one(countdown_format, completion, COUNTDOWN_PROMPT) == 0.0


def test_countdown_format_allows_surrounding_whitespace_and_newlines():
    assert (
        one(countdown_format, " a\n\n</think>\n\n<answer>\n44 + 19 + 35\n</answer>\n\n", COUNTDOWN_PROMPT)
        == 1.0
    )


def test_countdown_rewards_take_plain_string_prompts_and_completions():
    completions = [
        "<think>x</think><answer>44 + 19 + 35</answer>",
        "<think>x</think><answer>44 + 19</answer>",
    ]
    prompts = ["Using the numbers ...", "Using the numbers ..."]
    assert countdown_format(prompts=prompts, completions=completions) == [1.0, 1.0]
    assert countdown_equation(
        prompts=prompts, completions=completions, nums=[[44, 19, 35]] * 2, target=[98, 98]
    ) == [
        1.0,
        0.0,
    ]


def test_countdown_equation_accepts_correct_equations():
    assert equation_score("44 + 19 + 35") == 1.0
    assert equation_score("(44 + 19) + 35 = 98") == 1.0  # "= target" is allowed
    assert equation_score("\n  35 +\n 44 + 19 \n") == 1.0  # whitespace and newlines
    assert equation_score("(-19 + 44) * 4 - 2", nums=(44, 19, 4, 2)) == 1.0  # unary minus
    assert equation_score("100 / (2 * 5)", nums=(100, 2, 5), target=10) == 1.0  # exact division
    assert equation_score("7 / 2 * 2", nums=(7, 2, 2), target=7) == 1.0  # exact fractions, no float error


@pytest.mark.parametrize(
    ("answer", "nums", "target"),
    [
        ("44 + 19 + 35 = 99", (44, 19, 35), 98),  # right side is not the target
        ("44 + 19", (44, 19, 35), 63),  # not every number used (the reference recipe's rule)
        ("44 + 44 + 10", (44, 19, 35), 98),  # a number used twice
        ("3.5 + 7", (3, 5, 7), 10.5),  # fused digits "3.5" from 3 and 5
        ("35 + 7", (3, 5, 7), 42),  # fused digits "35"
        ("3 ** 5 - 7", (3, 5, 7), 236),  # power
        ("44**19**35", (44, 19, 35), 98),  # the reference eval's hang
        ("(7 // 5) * 3 * 5", (3, 5, 7), 15),  # floor division
        ("3 * 5 + 7 / (5 - 5)", (3, 5, 5, 7), 22),  # division by zero
        ("٣ * ٥ + ٧", (3, 5, 7), 22),  # Arabic-Indic digits
        ("３ * ５ + ７", (3, 5, 7), 22),  # full-width digits
        ("3 × 5 + 7", (3, 5, 7), 22),  # a multiplication sign that is not *
        ("3(5) + 7", (3, 5, 7), 22),  # implicit multiplication
        ("abs(3) * 5 + 7", (3, 5, 7), 22),  # a function call
        ("", (3, 5, 7), 22),  # empty
    ],
)
def test_countdown_equation_rejects(answer, nums, target):
    assert equation_score(answer, nums=nums, target=target) == 0.0


def test_countdown_equation_bounds_huge_numbers_before_work():
    # A literal longer than MAX_DIGITS is refused by the tokenizer, before any arithmetic.
    assert "digits" in equation.check_equation("9" * 50 + " * 2", [2, int("9" * 12)], 1)
    # Products of allowed numbers that outgrow MAX_VALUE_BITS stop with a reason instead of growing.
    nums = [999_999_999_999] * 8
    text = " * ".join(str(n) for n in nums)
    assert "bits" in equation.check_equation(text, nums, 1)
    # Long or deeply nested text is refused before parsing.
    assert "longer than" in equation.check_equation("1 + " * 100 + "1", [1] * 101, 101)
    assert "nested" in equation.check_equation("(" * 40 + "1" + ")" * 40, [1], 1)
    assert "nested" in equation.check_equation("-" * 40 + "1", [1], 1)


def test_countdown_equation_uses_the_last_answer_block():
    # The equation reward reads the last <answer>; the format reward is what punishes the repetition.
    completion = " a</think>\n<answer>1 + 2</answer>\n<answer>44 + 19 + 35</answer>"
    assert one(countdown_equation, completion, COUNTDOWN_PROMPT, nums=[44, 19, 35], target=98) == 1.0
    assert one(countdown_format, completion, COUNTDOWN_PROMPT) == 0.0


def test_countdown_equation_scores_text_without_answer_zero():
    assert one(countdown_equation, " I give up.", COUNTDOWN_PROMPT, nums=[44, 19, 35], target=98) == 0.0


# --- gsm8k -------------------------------------------------------------------------------------------------------

STRICT = "<reasoning>\n24 + 18 = 42\n42 - 30 = 12\n</reasoning>\n<answer>\n{}\n</answer>\n"


@pytest.mark.parametrize(
    ("answer", "gold", "score"),
    [
        ("12", "She has 42 - 30 = <<42-30=12>>12 left.\n#### 12", 2.0),
        ("1,234", "#### 1234", 2.0),  # grouping commas
        ("1234", "#### 1,234", 2.0),
        ("72.0", "#### 72", 2.0),  # same number
        ("$72", "#### 72", 2.0),
        ("72.", "#### 72", 2.0),
        ("72", "72", 2.0),  # a gold column holding only the number
        ("٧٢", "#### 72", 0.0),  # Arabic-Indic digits are not read as 72
        ("73", "#### 72", 0.0),
        ("72 apples", "#### 72", 0.0),
        ("12,34", "#### 1234", 0.0),  # not a valid grouping
    ],
)
def test_gsm8k_correctness(answer, gold, score):
    assert one(gsm8k_correctness, STRICT.format(answer), answer=gold) == score


def test_gsm8k_correctness_reads_the_last_answer():
    text = "<answer>\n5\n</answer>\n<answer>\n12\n</answer>"
    assert one(gsm8k_correctness, text, answer="#### 12") == 2.0
    assert one(gsm8k_correctness, "The answer is 12.", answer="#### 12") == 0.0  # no tags: the whole text


@pytest.mark.parametrize(
    ("answer", "score"),
    [("72", 0.5), ("-3", 0.5), ("72.0", 0.0), ("1,234", 0.0), ("٧٢", 0.0), ("²", 0.0), ("", 0.0)],
)
def test_gsm8k_int(answer, score):
    assert one(gsm8k_int, STRICT.format(answer)) == score


def test_gsm8k_strict_format():
    assert one(gsm8k_strict_format, STRICT.format("12")) == 0.5  # multi-line reasoning is fine
    # a chat model's turn ends with its end-of-text token right after </answer>: no final newline
    assert one(gsm8k_strict_format, STRICT.format("12").rstrip("\n")) == 0.5
    assert one(gsm8k_strict_format, STRICT.format("12") + "\n") == 0.0  # more than one final newline
    assert one(gsm8k_strict_format, STRICT.format("12") + "More text.\n") == 0.0  # trailing text
    assert one(gsm8k_strict_format, STRICT.format("12") + "<answer>\n12\n</answer>\n") == 0.0  # doubled tags
    assert one(gsm8k_strict_format, "<reasoning>x</reasoning><answer>12</answer>") == 0.0  # no newlines
    assert one(gsm8k_strict_format, " " + STRICT.format("12")) == 0.0  # leading text


def test_gsm8k_soft_format():
    assert one(gsm8k_soft_format, "<reasoning>a\nb</reasoning>  \n <answer>12</answer> trailing") == 0.5
    assert one(gsm8k_soft_format, STRICT.format("12")) == 0.5
    assert (
        one(gsm8k_soft_format, "Sure! <reasoning>a</reasoning><answer>12</answer>") == 0.0
    )  # must start with it
    assert one(gsm8k_soft_format, "<reasoning>a</reasoning> so <answer>12</answer>") == 0.0  # text between
    assert one(gsm8k_soft_format, "<reasoning>a</reasoning><answer>12") == 0.0  # </answer> missing


def test_gsm8k_xml_count():
    assert one(gsm8k_xml_count, STRICT.format("12")) == 0.5
    # Ending right after </answer> costs nothing (the original subtracted the whole text's length here).
    assert one(gsm8k_xml_count, STRICT.format("12").rstrip("\n")) == 0.5
    assert one(gsm8k_xml_count, STRICT.format("12").replace("<reasoning>\n", "<reasoning>")) == 0.375
    assert one(gsm8k_xml_count, STRICT.format("12") + "abc") == pytest.approx(0.5 - 0.003 - 0.003)
    assert one(gsm8k_xml_count, STRICT.format("12") + "x" * 5000) == -0.5  # bottoms out
    assert one(gsm8k_xml_count, "12") == 0.0


# --- dapo_math ---------------------------------------------------------------------------------------------------

GOOD_DAPO = "3/4 - 1/4 = 2/4<end_working_out><SOLUTION>{}</SOLUTION>"
IDENTITY = "\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}"


def test_dapo_format_exact_counts_the_prefill():
    assert one(dapo_format_exact, GOOD_DAPO.format("\\frac{1}{2}"), DAPO_PROMPT) == 3.0
    assert one(dapo_format_exact, GOOD_DAPO.format("1") + "\n  ", DAPO_PROMPT) == 3.0  # trailing whitespace
    assert (
        one(dapo_format_exact, GOOD_DAPO.format("1"), DAPO_PROMPT[:1]) == 0.0
    )  # no prefill: start tag missing
    assert one(dapo_format_exact, "<start_working_out>" + GOOD_DAPO.format("1"), DAPO_PROMPT[:1]) == 3.0


@pytest.mark.parametrize(
    "completion",
    [
        GOOD_DAPO.format("1") + " Done.",  # trailing text
        GOOD_DAPO.format("1") + "<SOLUTION>1</SOLUTION>",  # doubled solution
        "x<end_working_out><SOLUTION></SOLUTION>",  # empty solution
        "x<end_working_out> so <SOLUTION>1</SOLUTION>",  # text between working out and solution
        "x<SOLUTION>1</SOLUTION>",  # no end of working out
        "<start_working_out>" + GOOD_DAPO.format("1"),  # start tag twice (prefill + completion)
    ],
)
def test_dapo_format_exact_rejects(completion):
    assert one(dapo_format_exact, completion, DAPO_PROMPT) == 0.0


def test_dapo_format_approx_counts_each_tag():
    assert one(dapo_format_approx, GOOD_DAPO.format("1"), DAPO_PROMPT) == 2.0
    assert (
        one(dapo_format_approx, "The answer is 1.", DAPO_PROMPT) == 0.5 - 3.0
    )  # only the prefilled start tag
    assert one(dapo_format_approx, GOOD_DAPO.format("1") + "<SOLUTION>", DAPO_PROMPT) == 1.5 - 1.0


@pytest.mark.parametrize(
    ("guess", "gold", "score"),
    [
        ("\\frac{1}{2}", "\\frac{1}{2}", 5.0),
        ("0.5", "\\frac{1}{2}", 5.0),  # math-verify equivalence, not strings
        ("\\boxed{1/2}", "\\frac{1}{2}", 5.0),
        ("1/2", "0.5", 5.0),
        (" 56 ", "56", 5.0),
        ("1,234", "1234", 5.0),
        ("72.0", "72", 5.0),
        ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", 5.0),
        ("60", "56", 2.0),  # within 10%
        ("66", "56", 1.5),  # within 20%
        ("100", "56", -2.5),  # wrong number
        ("5", "0", -2.5),  # no ratio to a zero gold
        ("\\pi", "56", -4.5),  # not a number, not equivalent
        ("9^{9^{9}}", "3", -4.5),  # would never finish in SymPy: not compared symbolically
        (IDENTITY + IDENTITY, IDENTITY, 5.0),  # a matrix product is no number to evaluate
        (IDENTITY + "+" + IDENTITY, "\\begin{pmatrix}2&0\\\\0&2\\end{pmatrix}", 5.0),
        ("11,\\! 111,\\! 111,\\! 100", "11111111100", 5.0),  # `\\!` is a thin space, not a factorial
        ("1 000", "1000", 5.0),  # thousands split by a space
        ("1\\,000\\,000", "10^6", 5.0),  # or by a thin space
        ("111", "0,111", -4.5),  # "0,111" is no thousands number (math-verify reads 0.111)
        ("2^{n+1}", "2 \\cdot 2^n", 5.0),  # a power of a variable computes nothing: it is compared
    ],
)
def test_dapo_answer(guess, gold, score):
    assert one(dapo_answer, GOOD_DAPO.format(guess), DAPO_PROMPT, solution=gold) == score


def test_text_or_code_before_the_answer_earns_what_the_answer_alone_earns_and_never_runs(tmp_path):
    """A solution is read as math-verify reads it, by its last expression; nothing in it is executed."""
    marker = tmp_path / "ran"
    code = f"__import__('pathlib').Path('{marker}').touch() or 42"
    for solution in (code, "The answer is 42", "x = 42"):
        assert one(dapo_answer, GOOD_DAPO.format(solution), DAPO_PROMPT, solution="42") == 5.0, solution
        assert _math_verify_directly(solution, "42") is True
    assert not marker.exists()
    # Hedging gains nothing: two candidates are a set, equal to neither.
    for gold in ("41", "42"):
        assert one(dapo_answer, GOOD_DAPO.format("41 or 42"), DAPO_PROMPT, solution=gold) == -4.5


def test_dapo_answer_needs_the_solution_format():
    assert one(dapo_answer, "The answer is 56.", DAPO_PROMPT, solution="56") == -2.0
    assert one(dapo_answer, GOOD_DAPO.format("56") + " Done.", DAPO_PROMPT, solution="56") == -2.0
    # OpenMathReasoning rows carry the gold answer as expected_answer.
    assert one(dapo_answer, GOOD_DAPO.format("56"), DAPO_PROMPT, expected_answer="56") == 5.0


@pytest.mark.parametrize(
    ("completion", "gold", "score"),
    [
        (GOOD_DAPO.format("56"), "56", 3.5),
        (GOOD_DAPO.format("x = 1,234 units"), "1234", 3.5),
        (GOOD_DAPO.format("72.0"), "72", 3.5),
        (GOOD_DAPO.format("57"), "56", -1.5),
        (
            "x<end_working_out><SOLUTION>56",
            "56",
            3.5,
        ),  # the recipe's numeric check needs only the opening tag
        ("No solution tag, 56.", "56", -2.5),
        (GOOD_DAPO.format("none"), "56", -2.5),
        (GOOD_DAPO.format("\\frac{1}{2}"), "\\frac{1}{2}", None),  # gold not a plain number: does not apply
    ],
)
def test_dapo_numbers(completion, gold, score):
    assert one(dapo_numbers, completion, DAPO_PROMPT, solution=gold) == score


# --- bounded by construction -------------------------------------------------------------------------------------


def test_oversized_texts_are_malformed_before_any_scan():
    huge = " " + "x" * MAX_TEXT_CHARS + "</think>\n<answer>44 + 19 + 35</answer>"
    assert one(countdown_format, huge, COUNTDOWN_PROMPT) == 0.0
    assert one(countdown_equation, huge, COUNTDOWN_PROMPT, nums=[44, 19, 35], target=98) == 0.0
    assert one(gsm8k_strict_format, STRICT.format("1") + "\n" * MAX_TEXT_CHARS) == 0.0
    assert one(dapo_answer, "x" * MAX_TEXT_CHARS + GOOD_DAPO.format("1"), DAPO_PROMPT, solution="1") == -2.0


def test_math_answers_that_could_explode_are_never_handed_to_sympy():
    # Capped length.
    assert answers.answers_match("1" + " + 1" * answers.MAX_ANSWER_CHARS, "401") is False
    # Growth operators next to 5+ digit numbers, or stacked factorial-like ones, are not parsed at all.
    for text in (
        "\\binom{1000000000}{500000000}",
        "100000!",
        "\\prod_{i=1}^{100000} i",
        "3!!",
        "\\binom{9}{3}!",
    ):
        assert answers._costly(text), text
    assert not answers._costly("\\frac{1}{2}") and not answers._costly("2^{10}") and not answers._costly("5!")
    assert not answers._costly("11,\\! 111,\\! 111,\\! 100^2")  # LaTeX thin spaces, no factorials
    assert answers._costly("100000\\!!") and answers._parse("100\\,000!") == []
    # Parsed powers whose value could exceed MAX_VALUE_BITS are dropped before SymPy evaluates them.
    assert answers._parse("9^{9^{9}}") == []
    assert answers._parse("2^{2^{2^{2^{2^{2}}}}}") == []
    assert answers._parse("2^{10}") != []
    # A sum or product is bounded by its limits: a variable's power computes nothing until a limit gives it a value.
    for text in ("\\sum_{i=0}^{10^9} 2^i", "\\prod_{k=1}^{1000} k^{1000}"):
        assert answers._parse(text) == [], text
    for text in ("\\sum_{i=0}^{4} 2^i", "\\sum_{n=1}^{\\infty} 2^{-n}", "2^{n+1}"):
        assert answers._parse(text) != [], text


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1,234", 1234),
        ("1 234", 1234),
        ("1\\,234", 1234),
        ("1{,}234", 1234),
        ("11,\\! 111,\\! 111,\\! 100", 11111111100),
        ("-1 234 567.5", -1234567.5),
        ("$1,000", 1000),
        ("0,111", None),  # a first group of 0 is no thousands group
        ("1,000 000", None),  # one separator throughout
        ("1,23", None),
        ("1 23", None),
        ("12 3456", None),
    ],
)
def test_parse_number_reads_thousands_separators(text, value):
    assert answers.parse_number(text) == (None if value is None else Fraction(str(value)))


def test_first_number_reads_thousands_separators_as_one_number():
    assert answers.first_number("x = 11,\\! 111 units") == 11111
    assert answers.first_number("about 1 000 000 people") == 1000000
    assert answers.first_number("0,111") == 0
    assert answers.first_number("1,2,3") == 1


def test_every_builtin_reward_has_a_range_a_doc_and_a_task():
    """...a task, except the length shaping, which reads token counts and suits any task."""
    assert set(REWARDS) >= {
        "overlong_penalty",
        "countdown_format",
        "countdown_equation",
        "gsm8k_correctness",
        "gsm8k_int",
        "gsm8k_strict_format",
        "gsm8k_soft_format",
        "gsm8k_xml_count",
        "dapo_format_exact",
        "dapo_format_approx",
        "dapo_answer",
        "dapo_numbers",
    }
    for spec in REWARDS.values():
        if spec.source == "built-in":
            assert (
                spec.low is not None
                and spec.high is not None
                and spec.low < spec.high
                and spec.doc
                and (spec.task or spec.name == "overlong_penalty")
            )
            assert spec.low <= spec.failure <= spec.high


# --- batches of math answers: each distinct pair once, in worker processes when there are many ------------------

# (guess, gold): equal, unequal, numbers, fractions vs decimals, boxed, intervals, sets, text, symbolic.
VARIED_PAIRS = [
    ("\\frac{3}{4}", "\\frac{3}{4}"),
    ("x^2+1", "x^2+1"),
    ("56", "56"),
    (" 56 ", "56"),
    ("72.0", "72"),
    ("1,234", "1234"),
    ("57", "56"),
    ("0.5", "0.50"),
    ("-3", "-3.0"),
    ("5%", "5"),
    ("$72", "72"),
    ("0.75", "\\frac{3}{4}"),
    ("0.7", "\\frac{3}{4}"),
    ("\\frac{6}{8}", "\\frac{3}{4}"),
    ("3/4", "0.75"),
    ("\\dfrac{1}{3}", "0.333333"),
    ("\\frac{10}{2}", "5"),
    ("\\frac{10}{3}", "5"),
    ("\\boxed{5}", "5"),
    ("\\boxed{6}", "5"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("$\\boxed{2\\sqrt{2}}$", "\\sqrt{8}"),
    ("(1,2]", "(1,2]"),
    ("[1,2)", "(1,2]"),
    ("(-\\infty, 3)", "x < 3"),
    ("(0,1)\\cup(2,3)", "(0,1) \\cup (2,3)"),
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("(1,2)", "(2,1)"),
    ("\\text{yes}", "yes"),
    ("no", "yes"),
    ("\\text{Monday}", "\\text{Tuesday}"),
    ("I don't know", "5"),
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}"),
    ("\\sqrt{2}+1", "1+\\sqrt{2}"),
    ("2\\pi", "\\pi"),
    ("x=5", "5"),
    ("2", "\\sqrt{4}"),
    ("1e3", "1000"),
    ("60", "56"),
    ("\\pi", "56"),
]


@pytest.fixture
def math_workers(monkeypatch):
    """dapo_answer with a pool of two math-verify workers, nothing remembered before or after."""
    from grpo_cli.rewards import math_pool

    monkeypatch.setenv(math_pool.WORKERS_ENV, "2")
    # Scores equal one-at-a-time scores only where no comparison runs out of time: on a loaded machine a slow
    # pair can take longer than the usual 0.5 s, in the pool or in-process, so give every comparison ample time.
    monkeypatch.setenv(answers.SECONDS_ENV, "20")
    math_pool.close_shared_pool()
    answers.forget_outcomes()
    yield math_pool
    math_pool.close_shared_pool()
    answers.forget_outcomes()


def symbolic_keys(pairs) -> list[tuple[str, str]]:
    return [
        (guess.strip(), gold.strip())
        for guess, gold in pairs
        if answers._settled(guess.strip(), gold.strip()) is None
    ]


def test_the_fast_paths_agree_with_plain_math_verify():
    answers.forget_outcomes()
    plain = [answers._verify(guess.strip(), gold.strip(), None) for guess, gold in VARIED_PAIRS]
    assert [answers.answers_match(guess, gold) for guess, gold in VARIED_PAIRS] == plain
    # Equal text and plain numbers were settled without math-verify, the same way.
    settled = [answers._settled(guess.strip(), gold.strip()) for guess, gold in VARIED_PAIRS]
    assert [s for s in settled if s is not None] == [p for s, p in zip(settled, plain) if s is not None]
    assert settled.count(None) >= 20


# Numeric answers near and around math-verify's own tolerances: percentages, rounding, constants, units.
NUMERIC_PAIRS = [
    ("\\sqrt{2}+\\frac{26}{3}", "\\sqrt{2}+\\frac{25}{3}"),
    ("\\frac{100}{101}+\\sqrt{2}", "\\sqrt{2}+\\frac{26}{3}"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("2\\sqrt{2}", "2.828427"),
    ("2\\sqrt{2}", "2.83"),
    ("\\frac{1}{3}", "0.333"),
    ("\\frac{1}{3}", "0.3333333"),
    ("2.0000004", "2"),
    ("2.0004", "2"),
    ("2.01", "2"),
    ("3.14159265", "\\pi"),
    ("3.14", "\\pi"),
    ("2.718281828", "e"),
    ("9", "9\\%"),
    ("0.09", "9\\%"),
    ("50\\%", "0.5"),
    ("5", "5\\%"),
    ("30^\\circ", "30"),
    ("\\frac{\\pi}{6}", "30^\\circ"),
    ("1.5\\times10^{3}", "1500"),
    ("1.5\\times10^{3}", "1501"),
    ("10^{100}+1", "10^{100}"),
    ("-\\sqrt{3}", "\\sqrt{3}"),
    ("\\sqrt{-1}", "i"),
    ("1+i", "1-i"),
    ("\\infty", "\\infty"),
    ("-\\infty", "\\infty"),
    ("\\log_2 8", "3"),
    ("\\sin(\\pi/6)", "\\frac{1}{2}"),
    ("\\binom{5}{2}", "10"),
    ("5!", "120"),
    ("x=3", "3"),
    ("3", "x=4"),
    ("\\{3\\}", "3"),
    ("(3)", "4"),
    ("f(2)", "4"),
    ("3\\text{ cm}", "3"),
    ("4\\text{ cm}", "3"),
    ("0", "0.0005"),
    ("0.001", "0.0011"),
]


def _math_verify_alone(guess: str, gold: str) -> bool:
    """math-verify's own verdict on the parsed answers, without the project's shortcut for values far apart."""
    from math_verify import verify

    gold_parsed, guess_parsed = answers._parse_gold(gold), answers._parse(guess)
    return bool(gold_parsed and guess_parsed and verify(gold_parsed, guess_parsed, timeout_seconds=None))


def test_values_far_apart_get_math_verifys_verdict_without_it():
    pairs = [(guess.strip(), gold.strip()) for guess, gold in VARIED_PAIRS + NUMERIC_PAIRS]
    assert [answers._verify(guess, gold, None) for guess, gold in pairs] == [
        _math_verify_alone(guess, gold) for guess, gold in pairs
    ]
    apart = [
        (guess, gold)
        for guess, gold in pairs
        if answers._values_apart(answers._parse_gold(gold), answers._parse(guess))
    ]
    assert len(apart) >= 10  # the shortcut does decide a good share of them
    # never a percentage (math-verify takes 9% for 9), a set, a relation or an unknown function's value
    assert not [pair for pair in apart if any(mark in pair[0] + pair[1] for mark in ("%", "\\{", "=", "f("))]


def test_plain_numbers_compare_exactly_where_math_verify_rounds():
    """math-verify rounds decimals to 6 places; two plain numbers are compared exactly instead."""
    assert answers._verify("0.1000001", "0.1", None) is True
    assert answers.answers_match("0.1000001", "0.1") is False


def test_each_distinct_pair_needing_math_verify_is_listed_once():
    answers.forget_outcomes()
    pairs = [
        ("\\frac{10}{2}", "5"),
        (" \\frac{10}{2} ", "5 "),
        ("5", "5"),
        ("72.0", "72"),
        ("\\boxed{5}", "5"),
    ]
    assert answers.symbolic_pairs(pairs) == [("\\frac{10}{2}", "5"), ("\\boxed{5}", "5")]
    assert answers.answers_match("\\boxed{5}", "5") is True  # now remembered
    assert answers.symbolic_pairs(pairs) == [("\\frac{10}{2}", "5")]


def test_a_batch_scores_as_each_completion_alone(math_workers):
    """A GRPO-like batch (each gold repeated, answers repeated) through the pool scores exactly as one completion at
    a time with nothing remembered."""
    batch = [pair for pair in VARIED_PAIRS for _ in range(3)]
    batch = batch[::2] + batch[1::2]
    completions = [chat(GOOD_DAPO.format(guess)) for guess, _ in batch]
    golds = [gold for _, gold in batch]
    pool = math_workers.shared_pool()
    assert pool is not None and pool.wait_ready(60)
    assert len(answers.symbolic_pairs(batch)) >= math_workers.MIN_POOL_PAIRS
    together = dapo_answer(prompts=[DAPO_PROMPT] * len(batch), completions=completions, solution=golds)
    assert pool.workers and pool.workers[0].gold is not None, "the workers compared the batch"

    alone = []
    for completion, gold in zip(completions, golds):
        answers.forget_outcomes()
        alone.append(dapo_answer(prompts=[DAPO_PROMPT], completions=[completion], solution=[gold])[0])
    assert together == alone
    assert together[golds.index("56")] == 5.0


def test_the_pool_returns_what_math_verify_says_in_process():
    from grpo_cli.rewards.math_pool import MathPool

    keys = symbolic_keys(VARIED_PAIRS)
    pool = MathPool(2)
    try:
        answers.forget_outcomes()
        outcomes = pool.compare(keys)
        assert pool.wait_ready(60)
        again = pool.compare(keys)  # every pair through the ready workers this time
    finally:
        pool.close()
    plain = {key: answers._verify(*key, None) for key in keys}
    assert outcomes == plain and again == plain


def ready_pool(hang_seconds: float):
    from grpo_cli.rewards.math_pool import MathPool

    pool = MathPool(2, hang_seconds=hang_seconds)
    assert pool.wait_ready(60)
    return pool


def halves(start: int, n: int) -> list[tuple[str, str]]:
    """Pairs math-verify finds equal: \\frac{2k}{2} and k."""
    return [(f"\\frac{{{2 * k}}}{{2}}", str(k)) for k in range(start, start + n)]


def test_a_hung_worker_is_stopped_its_pair_is_undecided_and_the_pool_goes_on():
    import os
    import signal

    pool = ready_pool(hang_seconds=2.0)
    try:
        hung = pool.workers[0].proc
        os.kill(hung.pid, signal.SIGSTOP)
        outcomes = pool.compare(halves(1, 10))
        assert list(outcomes.values()) == [None] + [True] * 9  # the first pair went to the stopped worker
        assert pool.hangs == 1 and hung.poll() is not None
        assert pool.compare(halves(100, 10)) == dict.fromkeys(halves(100, 10), True)
    finally:
        pool.close()
        answers.forget_outcomes()


def test_a_worker_dying_on_a_pair_fails_only_that_completion(caplog):
    import logging
    import os
    import signal
    import threading

    from grpo_cli.rewards import RewardGuard

    pool = ready_pool(hang_seconds=120.0)
    try:
        doomed = pool.workers[0]
        os.kill(doomed.proc.pid, signal.SIGSTOP)

        def kill_once_busy():
            while doomed.task is None and doomed.proc.poll() is None:
                threading.Event().wait(0.01)
            doomed.proc.kill()

        killer = threading.Thread(target=kill_once_busy)
        killer.start()
        pairs = halves(1, 10)
        outcomes = pool.compare(pairs)
        killer.join()
        assert isinstance(outcomes[pairs[0]], str) and "worker exited" in outcomes[pairs[0]]
        assert [outcomes[p] for p in pairs[1:]] == [True] * 9 and pool.crashes == 1
        with pytest.raises(answers.MathVerifyError):
            answers.answers_match(*pairs[0])

        guard = RewardGuard(dapo_answer.reward_spec, timeout=5)
        with caplog.at_level(logging.WARNING, logger="grpo_cli.rewards"):
            scores = guard(
                prompts=[DAPO_PROMPT] * 3,
                completions=[chat(GOOD_DAPO.format(guess)) for guess, _ in pairs[:3]],
                solution=[gold for _, gold in pairs[:3]],
            )
        assert scores == [dapo_answer.reward_spec.failure, 5.0, 5.0]
        assert guard.exceptions == 1 and guard.timeouts == 0
        assert "MathVerifyError: math-verify worker exited" in caplog.text
        assert pool.compare(halves(100, 10)) == dict.fromkeys(halves(100, 10), True)
    finally:
        pool.close()
        answers.forget_outcomes()


def test_the_guard_time_limit_holds_while_waiting_on_workers(math_workers, monkeypatch):
    import os
    import signal

    from grpo_cli.rewards import RewardGuard

    monkeypatch.setattr("grpo_cli.rewards.guard.MIN_BATCH_SECONDS", 1.0)
    monkeypatch.setattr(math_workers, "HANG_SECONDS", 120.0)
    pool = math_workers.shared_pool()
    assert pool is not None and pool.wait_ready(60) and pool.hang_seconds >= 120.0
    pairs = halves(1, math_workers.MIN_POOL_PAIRS + 4)
    batch = {
        "prompts": [DAPO_PROMPT] * len(pairs),
        "completions": [chat(GOOD_DAPO.format(guess)) for guess, _ in pairs],
        "solution": [gold for _, gold in pairs],
    }
    guard = RewardGuard(dapo_answer.reward_spec, timeout=0.01)
    for worker in pool.workers:
        os.kill(worker.proc.pid, signal.SIGSTOP)
    try:
        assert guard(**batch) == [dapo_answer.reward_spec.failure] * len(pairs)
        assert guard.timeouts == 1
    finally:
        for worker in pool.workers:
            os.kill(worker.proc.pid, signal.SIGCONT)
    assert guard(**batch) == [5.0] * len(pairs)
    assert pool.hangs == 0 and pool.crashes == 0


def score_in_child(pairs: list[tuple[str, str]]) -> tuple[list[float], bool]:
    """dapo_answer in a child process: the scores, and whether that process ran its own pool of workers."""
    import os

    from grpo_cli.rewards import math_pool

    scores = dapo_answer(
        prompts=None,
        completions=[chat(GOOD_DAPO.format(guess)) for guess, _ in pairs],
        solution=[gold for _, gold in pairs],
    )
    pool = math_pool.shared_pool()
    return scores, pool is not None and pool.pid == os.getpid() and bool(pool.workers)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_child_process_started_by_fork_or_spawn_runs_its_own_pool(math_workers, method):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = math_workers.shared_pool()
    assert pool is not None and pool.wait_ready(60)  # a fork child inherits this process's started pool
    n = math_workers.MIN_POOL_PAIRS + 4
    pairs = halves(1, n) + [("\\frac{7}{3}", "2"), ("\\boxed{3}", "4")]
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(method)) as executor:
        scores, own_pool = executor.submit(score_in_child, pairs).result(timeout=120)
    assert own_pool
    assert scores == [5.0] * n + [-4.5, -4.5]
    assert pool.compare(halves(200, 10)) == dict.fromkeys(halves(200, 10), True)


# --- hard equivalences: grpo's verdict is math-verify's --------------------------------------------------------

# (kind, guess, gold, equal): equations, intervals, sets, tuples, matrices, units, separators, percentages, sums,
# powers, text, solutions written as equations against the same as a tuple or a set; `equal` is math-verify's verdict, except where a line's `math_verify` says what math-verify alone
# gives (digit groups split by spaces: grpo reads one number where math-verify reads a product).
EQUIVALENCES = [
    json.loads(line) for line in (DATA / "math_equivalences.jsonl").read_text(encoding="utf-8").splitlines()
]


def _math_verify_directly(guess: str, gold: str) -> bool:
    """math-verify alone with grpo's settings: each answer between $...$ unless it has delimiters, math-verify's
    default extraction and comparison, no time limit."""
    from math_verify import parse, verify

    def delimited(text: str) -> str:
        return text if any(mark in text for mark in ("$", "\\(", "\\[", "\\boxed")) else f"${text}$"

    gold_parsed = parse(delimited(gold), parsing_timeout=None)
    return bool(verify(gold_parsed, parse(delimited(guess), parsing_timeout=None), timeout_seconds=None))


def test_the_equivalence_set_covers_each_hard_form():
    kinds = {case["kind"] for case in EQUIVALENCES}
    assert kinds >= {"equation", "interval", "set", "tuple", "matrix", "unit", "separator", "percent", "sum", "solutions"}
    pairs = {(c["guess"], c["gold"]) for c in EQUIVALENCES}
    assert len(EQUIVALENCES) >= 150 and len(pairs) == len(EQUIVALENCES)
    # where grpo's verdict is right and math-verify's alone is not: thousands separators, and an escaped dollar
    # (a currency sign: math-verify leaves `\$18.90` unparsed)
    assert {c["kind"] for c in EQUIVALENCES if "math_verify" in c} == {"separator", "currency"}


def test_grpo_gives_math_verifys_verdict_on_every_hard_equivalence(monkeypatch):
    monkeypatch.setenv(answers.SECONDS_ENV, "20")  # verdicts, not timings: nothing may run out here
    answers.forget_outcomes()
    grpo = {(c["guess"], c["gold"]): answers.answer_verdict(c["guess"], c["gold"]) for c in EQUIVALENCES}
    direct = {(c["guess"], c["gold"]): _math_verify_directly(c["guess"], c["gold"]) for c in EQUIVALENCES}
    assert [c for c in EQUIVALENCES if grpo[c["guess"], c["gold"]] != c["equal"]] == []
    expected = {(c["guess"], c["gold"]): c.get("math_verify", c["equal"]) for c in EQUIVALENCES}
    assert {pair: verdict for pair, verdict in direct.items() if verdict != expected[pair]} == {}


def test_hard_equivalences_score_the_same_through_the_workers(math_workers):
    pool = math_workers.shared_pool()
    assert pool is not None and pool.wait_ready(60)
    scores = dapo_answer(
        prompts=[DAPO_PROMPT] * len(EQUIVALENCES),
        completions=[chat(GOOD_DAPO.format(c["guess"])) for c in EQUIVALENCES],
        solution=[c["gold"] for c in EQUIVALENCES],
    )
    assert pool.workers and pool.workers[0].gold is not None, "the workers compared the batch"
    assert [c for c, score in zip(EQUIVALENCES, scores) if (score == 5.0) != c["equal"]] == []


# --- running out of time: a longer second try, then undecided (None), never "wrong" -----------------------------

SLOW_PAIR = ("(x+y+1)^{120}", "(x+y-1)^{120}")  # SymPy expands both: far longer than the limits set below


def test_a_comparison_that_runs_out_once_is_decided_by_its_longer_second_try(monkeypatch):
    monkeypatch.setenv(answers.SECONDS_ENV, "0.01")
    monkeypatch.setattr(answers, "RETRY_FACTOR", 10_000)
    answers.warm_up()
    answers.forget_outcomes()
    expands = ("(x+1)^{300}-(x-1)^{300}", "0")  # SymPy expands both powers: far longer than 0.01 s
    assert answers._verify(*expands, answers.math_verify_seconds()) is None
    assert answers.symbolic_outcome(*expands) is False
    assert answers.symbolic_outcome("x^2/4+y^2/3=1", "x^2/16+y^2/12=1/4") is True


def test_a_comparison_that_runs_out_twice_is_undecided_neither_wrong_nor_a_failure(monkeypatch):
    from grpo_cli.rewards import RewardGuard

    monkeypatch.setenv(answers.SECONDS_ENV, "0.05")
    answers.forget_outcomes()
    metrics = {}
    guard = RewardGuard(dapo_answer.reward_spec, timeout=5)
    scores = guard(
        prompts=[DAPO_PROMPT] * 2,
        completions=[chat(GOOD_DAPO.format(SLOW_PAIR[0])), chat(GOOD_DAPO.format("\\frac{1}{2}"))],
        solution=[SLOW_PAIR[1], "0.5"],
        log_metric=metrics.__setitem__,
    )
    assert scores == [None, 5.0]  # TRL leaves the first completion out of this reward
    assert guard.failures == 0 and metrics[UNDECIDED_METRIC] == 0.5
    # Remembered: the same pair is undecided again at once; as a yes/no it is no match.
    assert answers.answer_verdict(*SLOW_PAIR) is None and answers.answers_match(*SLOW_PAIR) is False
    answers.forget_outcomes()


def test_a_worker_says_when_a_comparison_is_undecided(monkeypatch):
    from grpo_cli.rewards.math_pool import MathPool

    monkeypatch.setenv(answers.SECONDS_ENV, "0.05")  # the workers take their limits from the environment
    pool = MathPool(2)
    try:
        assert pool.wait_ready(60)
        answers.forget_outcomes()
        outcomes = pool.compare([SLOW_PAIR, *halves(1, 5)])
    finally:
        pool.close()
        answers.forget_outcomes()
    assert outcomes == {SLOW_PAIR: None, **dict.fromkeys(halves(1, 5), True)}
    assert pool.hangs == 0 and pool.crashes == 0


# ------------------------------------------------------------------------------------------------ length shaping


def test_overlong_penalty_ramps_down_over_the_last_tokens_before_the_limit():
    from grpo_cli.rewards.length import overlong_penalty

    lengths = [10, 80, 81, 90, 100]
    texts = ["x"] * len(lengths)
    ramp = overlong_penalty(completions=texts, completion_lengths=lengths, max_completion_length=100, overlong_buffer=20)
    assert ramp == [0.0, 0.0, -0.05, -0.5, -1.0]
    # TRL's token ids count the same; unset, the buffer is a fifth of the limit
    ids = [[1] * n for n in lengths]
    assert overlong_penalty(completions=texts, completion_ids=ids, max_completion_length=100, overlong_buffer=20) == ramp
    assert overlong_penalty(completions=texts, completion_ids=ids, max_completion_length=100) == ramp
    # texts alone (no counts) or no limit: nothing to say
    assert overlong_penalty(completions=texts, max_completion_length=100) == [None] * 5
    assert overlong_penalty(completions=texts, completion_lengths=lengths) == [None] * 5


def test_a_reward_gets_the_recipe_keys_it_reads(tmp_path):
    from grpo_cli.recipe import load_recipe, reward_funcs

    recipe = load_recipe(None, ["--reward_funcs", "overlong_penalty", "--max_completion_length", "10",
                                "--overlong_buffer", "4", "--output_dir", str(tmp_path)], "rl")
    (guard,) = reward_funcs(recipe)
    assert guard(prompts=["p"] * 3, completions=["a", "b", "c"], completion_ids=[[1] * 5, [1] * 8, [1] * 10]) == [
        0.0, -0.5, -1.0,
    ]


def test_overlong_buffer_past_the_length_limit_is_refused(tmp_path):
    from grpo_cli.recipe.show import check_and_show

    for value, message in (("600", "at most `max_completion_length` (512)"), ("0", "a whole number of tokens of at least 1")):
        with pytest.raises(UserError) as err:
            check_and_show(None, ["--max_completion_length", "512", "--overlong_buffer", value,
                                  "--output_dir", str(tmp_path)], "rl", show=False)
        assert any("overlong_buffer" in p and message in p for p in err.value.problems), err.value.problems


def test_grpo_trains_with_the_overlong_penalty(tmp_path, tiny_model_dir):
    """A real GRPO run: TRL hands the reward its completion ids, the recipe its limit; the tiny model never stops
    before 12 tokens, so every completion is at the limit and scores -1."""
    from test_train import recipe_file, train

    out = train(recipe_file(tmp_path, tiny_model_dir, "rl"), "rl", ["--reward_funcs", "countdown_format", "overlong_penalty"])
    logged = [e for e in json.loads((out / "train_summary.json").read_text())["log_history"] if "reward" in e]
    assert logged and all(e["rewards/overlong_penalty/mean"] == -1.0 for e in logged)
    assert all(e["rewards/overlong_penalty/failed_frac"] == 0.0 for e in logged)
