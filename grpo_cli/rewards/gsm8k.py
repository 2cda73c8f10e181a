"""GSM8K rewards: the popular GRPO recipe's five (correctness, integer, strict and soft format, XML count).

Fixed from the original: the format patterns accept multi-line reasoning (the original regexes lacked DOTALL,
so they almost never fired; the strict one also wanted a newline after </answer>, which a chat model ending its
turn does not write), numbers compare by value ("1,234" = "1234", "72.0" = "72"), digits are ASCII only,
and the XML count penalises only text after </answer> (not the whole text when the final newline is
missing) and bottoms out at -0.5.
"""

from __future__ import annotations

from grpo_cli.rewards.registry import reward
from grpo_cli.rewards.texts import texts
from grpo_cli.tasks.answers import is_integer_text, parse_number
from grpo_cli.tasks.gsm8k import answer_of, gold_answer, is_soft, is_strict, xml_count


def _correct(guess: str, gold: str) -> bool:
    if guess == gold:
        return bool(guess)
    guess_number, gold_number = parse_number(guess), parse_number(gold)
    return guess_number is not None and guess_number == gold_number


@reward(
    name="gsm8k_correctness",
    task="gsm8k",
    low=0.0,
    high=2.0,
    doc="2 if the <answer> equals the gold answer after '####' (as numbers: 1,234 = 1234, 72.0 = 72)",
    columns=("answer",),
)
def gsm8k_correctness(prompts=None, completions=None, prefill=None, answer=None, **kwargs) -> list[float]:
    """2.0 when the extracted answer equals the gold answer, else 0.0."""
    return [
        2.0 if _correct(answer_of(text), gold_answer(gold)) else 0.0
        for text, gold in zip(texts(completions, prefill), answer, strict=True)
    ]


@reward(
    name="gsm8k_int",
    task="gsm8k",
    low=0.0,
    high=0.5,
    doc="0.5 if the <answer> is a plain integer (ASCII digits)",
)
def gsm8k_int(prompts=None, completions=None, prefill=None, **kwargs) -> list[float]:
    """0.5 when the extracted answer is an integer such as 72 or -3, else 0.0."""
    return [0.5 if is_integer_text(answer_of(text)) else 0.0 for text in texts(completions, prefill)]


@reward(
    name="gsm8k_strict_format",
    task="gsm8k",
    low=0.0,
    high=0.5,
    doc="0.5 if exactly '<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...\\n</answer>', each tag once (one final newline allowed)",
)
def gsm8k_strict_format(prompts=None, completions=None, prefill=None, **kwargs) -> list[float]:
    """0.5 when the text follows the strict reasoning/answer layout, else 0.0."""
    return [0.5 if is_strict(text) else 0.0 for text in texts(completions, prefill)]


@reward(
    name="gsm8k_soft_format",
    task="gsm8k",
    low=0.0,
    high=0.5,
    doc="0.5 if it starts '<reasoning>...</reasoning>' then '<answer>...</answer>' (any spacing)",
)
def gsm8k_soft_format(prompts=None, completions=None, prefill=None, **kwargs) -> list[float]:
    """0.5 when the text has reasoning then answer tags, with any whitespace, else 0.0."""
    return [0.5 if is_soft(text) else 0.0 for text in texts(completions, prefill)]


@reward(
    name="gsm8k_xml_count",
    task="gsm8k",
    low=-0.5,
    high=0.5,
    doc="0.125 per well-placed tag, minus 0.001 per character after </answer>",
)
def gsm8k_xml_count(prompts=None, completions=None, prefill=None, **kwargs) -> list[float]:
    """The recipe's partial credit for each tag on its own line, penalising trailing text."""
    return [xml_count(text) for text in texts(completions, prefill)]
