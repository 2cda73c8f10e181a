"""GSM8K grade-school math in the popular GRPO recipe's XML format (<reasoning> then <answer>)."""

from __future__ import annotations

import logging
import re

from grpo_cli.arguments import TaskArguments
from grpo_cli.errors import UserError
from grpo_cli.problems import Problem
from grpo_cli.tasks import reasoning_gym as gym
from grpo_cli.tasks.answers import parse_number
from grpo_cli.tasks.task import MAX_TEXT_CHARS, Task, register_task

SYSTEM_PROMPT = """\
Respond in the following format:
<reasoning>
...
</reasoning>
<answer>
...
</answer>"""
TAGS = ("<reasoning>", "</reasoning>", "<answer>", "</answer>")
logger = logging.getLogger("grpo_cli.tasks")
GYM_DATASET = "gsm_symbolic"  # reasoning-gym's GSM8K-style word problems: dataset_generate's default source
_CALCULATOR = re.compile(r"<<[^<>]{0,200}>>")  # GSM8K's calculator annotations: 48/2=24 written <<48/2=24>>


def gold_answer(answer) -> str:
    """The gold final answer of a GSM8K `answer` cell: the text after '####' (commas removed), or the whole cell."""
    text = str(answer)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    return text.strip().replace(",", "")


def answer_of(text: str) -> str:
    """The popular recipe's extraction: the text after the last <answer>, up to the next </answer>, stripped."""
    if len(text) > MAX_TEXT_CHARS:
        return ""
    return text.split("<answer>")[-1].split("</answer>")[0].strip()


def is_strict(text: str) -> bool:
    """Exactly `<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...\\n</answer>`, each tag once, then at most one newline.

    The original recipe required a final newline, which a chat model, ending its turn with its end-of-text token
    right after `</answer>`, does not write: there the reward stays 0 and teaches nothing.
    """
    if len(text) > MAX_TEXT_CHARS or any(text.count(tag) != 1 for tag in TAGS):
        return False
    text = text.removesuffix("\n")
    if not (text.startswith("<reasoning>\n") and text.endswith("\n</answer>")):
        return False
    middle = text.find("\n</reasoning>\n<answer>\n")
    return middle >= len("<reasoning>\n") and middle + len("\n</reasoning>\n<answer>\n") <= len(text) - len(
        "\n</answer>"
    )


_SOFT_JOIN = re.compile(r"</reasoning>\s*<answer>")


def is_soft(text: str) -> bool:
    """Starts with <reasoning>, then </reasoning>, optional whitespace, <answer>, ... </answer> (any lines)."""
    if len(text) > MAX_TEXT_CHARS or not text.startswith("<reasoning>"):
        return False
    join = _SOFT_JOIN.search(text)
    return join is not None and "</answer>" in text[join.end() :]


def xml_count(text: str) -> float:
    """The recipe's tag count: 0.125 per well-placed tag, minus 0.001 per character after </answer> (twice).

    Fixed from the original: when the text ends right after "\n</answer>" (no final newline), the original took
    the whole text as "after the answer" and subtracted its length; here only text after the tag counts.
    """
    if len(text) > MAX_TEXT_CHARS:
        return -0.5
    after = text.rsplit("\n</answer>", 1)[1] if "\n</answer>" in text else ""
    trailing = len(after.removeprefix("\n")) * 0.001
    score = 0.0
    if text.count("<reasoning>\n") == 1:
        score += 0.125
    if text.count("\n</reasoning>\n") == 1:
        score += 0.125
    if text.count("\n<answer>\n") == 1:
        score += 0.125 - trailing
    if text.count("\n</answer>") == 1:
        score += 0.125 - trailing
    return max(score, -0.5)


@register_task
class Gsm8kTask(Task):
    name = "gsm8k"
    description = (
        "Grade-school math word problems; answer after '####' (openai/gsm8k, or generated: reasoning-gym's "
        "gsm_symbolic)."
    )
    default_dataset = "openai/gsm8k"
    default_config = "main"
    answer_columns = ("answer",)
    question_column = "question"
    default_rewards = (
        "gsm8k_xml_count",
        "gsm8k_soft_format",
        "gsm8k_strict_format",
        "gsm8k_int",
        "gsm8k_correctness",
    )
    accuracy_rewards = ("gsm8k_correctness",)
    default_system_prompt = SYSTEM_PROMPT
    generate_keys = gym.GENERATE_KEYS

    def generation_problems(self, args: TaskArguments) -> list[Problem]:
        return gym.source_problems(self.name, args, default=GYM_DATASET)

    def generated_source(self, args: TaskArguments) -> str:
        return gym.source_words(args, default=GYM_DATASET)

    def generate(self, args: TaskArguments) -> list[dict] | None:
        """Rows of a reasoning-gym dataset (gsm_symbolic unless dataset_generate_name says another) whose answers are
        whole numbers, as GSM8K's are and its rewards expect; the worked solution in GSM8K's form where the dataset has
        one (gsm_symbolic does: a cold start can learn the format from it)."""
        items = gym.generated_answers(self.name, args, default=GYM_DATASET)
        rows, other = [], []
        for item in items:
            answer = gold_answer(item["answer"])
            number = parse_number(answer)
            if number is None or number.denominator != 1:
                other.append(str(item["answer"]))
                continue
            worked = (item.get("metadata") or {}).get("answer_cot")
            same = isinstance(worked, str) and "####" in worked and gold_answer(worked) == answer
            rows.append({"question": item["question"], "answer": worked if same else f"#### {answer}"})
        name = args.dataset_generate_name or GYM_DATASET
        if len(other) * 2 > len(items):
            raise UserError(
                f"dataset_generate_name: reasoning-gym '{name}' answers {len(other)} of {len(items)} rows with other "
                f"than a whole number (e.g. {other[0]!r:.40}), and GSM8K's answers and its rewards are whole numbers - "
                "choose a dataset with whole-number answers, or task: reasoning_gym"
            )
        if other:
            logger.warning(
                "reasoning-gym dataset '%s' answers %d of its %d rows with other than a whole number (e.g. %s); "
                "kept the %d rows with whole-number answers, as GSM8K's are", name, len(other), len(items),
                other[0][:40], len(rows),
            )  # fmt: skip
        return rows

    def column_problems(self, row: dict, columns: tuple[str, ...] | None = None) -> list[str]:
        problems = super().column_problems(row, columns)
        columns = self.answer_columns if columns is None else columns
        if "answer" in columns and "answer" in row:
            value = row["answer"]
            if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not gold_answer(value):
                problems.append(f"'answer' must be a non-empty string or number, got {value!r:.60}")
        return problems

    def sft_completion(self, row: dict) -> str | None:
        text = str(row.get("answer", ""))
        if "####" not in text:
            return None
        reasoning = _CALCULATOR.sub("", text.rsplit("####", 1)[0]).strip()
        if not reasoning or any(tag in reasoning for tag in TAGS):
            return None
        return f"<reasoning>\n{reasoning}\n</reasoning>\n<answer>\n{gold_answer(text)}\n</answer>\n"

    def answer_completion(self, row: dict) -> str | None:
        gold = gold_answer(row.get("answer", ""))
        if not gold:
            return None
        return f"<reasoning>\nThe answer is {gold}.\n</reasoning>\n<answer>\n{gold}\n</answer>\n"

    def malformed_completions(self, row: dict) -> list[str]:
        gold = gold_answer(row.get("answer", ""))
        number = parse_number(gold)
        wrong = str(number.numerator + 1) if number is not None and number.denominator == 1 else "0"
        return [
            f"<reasoning>\nI worked it out.\n</reasoning>\n<answer>\n{wrong}\n</answer>\n",  # wrong answer
            f"The answer is {gold}.",  # no tags
            f"<answer>\n{gold}\n</answer>\n",  # no reasoning
            f"<reasoning>\nI worked it out.\n</reasoning>\n<answer>\n{gold}\n</answer>\n<answer>\n{gold}\n</answer>\n",
        ]

    def is_formatted(self, text: str) -> bool:
        return is_strict(text)
