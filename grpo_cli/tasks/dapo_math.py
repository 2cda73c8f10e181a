"""Competition math in Unsloth's Qwen3 GRPO format: working out, then the answer between <SOLUTION> tags.

Two row styles: DAPO-Math-17k-Processed (`prompt`, `solution` = the final answer) for GRPO and
OpenMathReasoning-mini (`problem`, `generated_solution`, `expected_answer`) for the SFT cold start.
"""

from __future__ import annotations

from fractions import Fraction

from grpo_cli.arguments import TaskArguments
from grpo_cli.problems import Problem
from grpo_cli.tasks import reasoning_gym as gym
from grpo_cli.tasks.answers import parse_number
from grpo_cli.tasks.task import MAX_TEXT_CHARS, Task, register_task

REASONING_START = "<start_working_out>"
REASONING_END = "<end_working_out>"
SOLUTION_START = "<SOLUTION>"
SOLUTION_END = "</SOLUTION>"
TAGS = (REASONING_START, REASONING_END, SOLUTION_START, SOLUTION_END)
SYSTEM_PROMPT = (
    "You are given a problem.\n"
    "Think about the problem and provide your working out.\n"
    f"Place it between {REASONING_START} and {REASONING_END}.\n"
    f"Then, provide your solution between {SOLUTION_START}{SOLUTION_END}"
)


def solution_of(text: str) -> str | None:
    """The final answer: the last <SOLUTION>...</SOLUTION> after <end_working_out>, with only whitespace after it.

    This is what Unsloth's recipe regex `<end_working_out>.*?<SOLUTION>(.+?)</SOLUTION>\\s*$` accepts, found with
    linear string searches instead of a backtracking regex.
    """
    if len(text) > MAX_TEXT_CHARS:
        return None
    close = text.rfind(SOLUTION_END)
    if close < 0 or text[close + len(SOLUTION_END) :].strip():
        return None
    open_ = text.rfind(SOLUTION_START, 0, close)
    if open_ < 0 or text.rfind(REASONING_END, 0, open_) < 0:
        return None
    answer = text[open_ + len(SOLUTION_START) : close]
    return answer if answer.strip() else None


def is_exact(text: str) -> bool:
    """`<start_working_out> ... <end_working_out> <SOLUTION>answer</SOLUTION>`: each tag once, in order,
    only whitespace between the working out and the solution and after it."""
    if len(text) > MAX_TEXT_CHARS or any(text.count(tag) != 1 for tag in TAGS):
        return False
    start, end, sol, sol_end = (text.index(tag) for tag in TAGS)
    if not start < end < sol < sol_end:
        return False
    return (
        text[:start].strip() == ""
        and text[end + len(REASONING_END) : sol].strip() == ""
        and text[sol + len(SOLUTION_START) : sol_end].strip() != ""
        and text[sol_end + len(SOLUTION_END) :].strip() == ""
    )


def tag_score(text: str) -> float:
    """+0.5 for each of the four tags that appears exactly once, -1.0 for each that doesn't."""
    if len(text) > MAX_TEXT_CHARS:
        return -4.0
    return sum(0.5 if text.count(tag) == 1 else -1.0 for tag in TAGS)


def gold_of(row: dict) -> str | None:
    """The gold answer of a row in either style."""
    for column in ("solution", "expected_answer", "answer"):
        value = row.get(column)
        if value is not None and not isinstance(value, bool) and str(value).strip():
            return str(value).strip()
    return None


def exact_answer(item: dict) -> str:
    """A reasoning-gym item's answer; `\\frac{n}{d}` where its metadata records the exact fraction (`rational`)."""
    rational = (item.get("metadata") or {}).get("rational")
    if isinstance(rational, dict):
        try:
            value = Fraction(int(rational["numerator"]), int(rational["denominator"]))
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return str(item["answer"])
        return str(value.numerator) if value.denominator == 1 else f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
    return str(item["answer"])


@register_task
class DapoMathTask(Task):
    name = "dapo_math"
    description = "Competition math, Unsloth's Qwen3 GRPO format; answers compared with math-verify."
    default_dataset = "open-r1/DAPO-Math-17k-Processed"
    default_config = "en"
    answer_columns = ("solution",)
    question_column = "problem"
    default_rewards = ("dapo_format_exact", "dapo_format_approx", "dapo_answer", "dapo_numbers")
    accuracy_rewards = ("dapo_answer", "dapo_numbers")
    default_system_prompt = SYSTEM_PROMPT
    default_prefill = REASONING_START
    generate_keys = gym.GENERATE_KEYS

    def generation_problems(self, args: TaskArguments) -> list[Problem]:
        return gym.source_problems(self.name, args, example="coin_flip")

    def generated_source(self, args: TaskArguments) -> str:
        return gym.source_words(args)

    def generate(self, args: TaskArguments) -> list[dict] | None:
        """Rows of the reasoning-gym dataset dataset_generate_name names (e.g. coin_flip: probabilities, compared as
        fractions or decimals), its answer as the solution: the exact fraction in LaTeX where the item records one
        (coin_flip's answers are rounded decimals of it)."""
        return [
            {"problem": item["question"], "solution": exact_answer(item)}
            for item in gym.generated_answers(self.name, args)
        ]

    def normalize(self, row: dict) -> dict:
        """Fill `problem` from DAPO's `prompt` text (or a `question`, as `grpo data reasoning_gym` writes) and
        `solution` from `expected_answer`/`answer`."""
        extra = {}
        question = row.get("prompt") if isinstance(row.get("prompt"), str) else row.get("question")
        if "problem" not in row and isinstance(question, str):
            extra["problem"] = question
        if "solution" not in row and gold_of(row) is not None:
            extra["solution"] = gold_of(row)
        return {**row, **extra} if extra else row

    def column_problems(self, row: dict, columns: tuple[str, ...] | None = None) -> list[str]:
        columns = self.answer_columns if columns is None else columns
        problems = []
        for column in columns:
            if column not in row:
                hint = " (or 'expected_answer')" if column == "solution" else ""
                problems.append(f"missing column '{column}'{hint}")
            elif column == "solution":
                value = row[column]
                if (
                    isinstance(value, bool)
                    or not isinstance(value, (str, int, float))
                    or not str(value).strip()
                ):
                    problems.append(f"'solution' must be a non-empty string or number, got {value!r:.60}")
        return problems

    def sft_completion(self, row: dict) -> str | None:
        thoughts, gold = row.get("generated_solution"), gold_of(row)
        if not isinstance(thoughts, str) or gold is None:
            return None
        # As Unsloth's cold start: the whole generated solution, minus its <think> tags, is the working out.
        thoughts = thoughts.replace("<think>", "").replace("</think>", "").strip()
        if not thoughts or any(tag in thoughts for tag in TAGS):
            return None
        return f"{thoughts}{REASONING_END}{SOLUTION_START}{gold}{SOLUTION_END}"

    def answer_completion(self, row: dict) -> str | None:
        gold = gold_of(row)
        if gold is None:
            return None
        return f"Working through the problem gives {gold}.{REASONING_END}{SOLUTION_START}{gold}{SOLUTION_END}"

    def malformed_completions(self, row: dict) -> list[str]:
        gold = gold_of(row) or "0"
        number = parse_number(gold)
        wrong = str(number * 3 + 7) if number is not None else "\\pi + 12345"
        return [
            f"Working out.{REASONING_END}{SOLUTION_START}{wrong}{SOLUTION_END}",  # wrong answer
            f"The answer is {gold}.",  # no tags at all
            f"Working out.{REASONING_END}{SOLUTION_START}{gold}{SOLUTION_END}{SOLUTION_START}{gold}{SOLUTION_END}",
            f"Working out.{REASONING_END}{SOLUTION_START}{gold}{SOLUTION_END} So that is it.",  # trailing text
            f"Working out.{SOLUTION_START}{gold}",  # unclosed, no end of working out
        ]

    def is_formatted(self, text: str) -> bool:
        return is_exact(text)
