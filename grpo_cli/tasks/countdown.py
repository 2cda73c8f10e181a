"""Countdown: reach the target with the given numbers, + - * / and parentheses (TinyZero / R1-Zero recipe)."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

from grpo_cli.arguments import TaskArguments
from grpo_cli.errors import UserError
from grpo_cli.tasks.equation import (
    EquationError,
    check_equation,
    evaluate,
    format_tree,
    parse_equation,
    split_equation,
)
from grpo_cli.tasks.task import MAX_TEXT_CHARS, Task, last_block, register_task

SYSTEM_PROMPT = (
    "You are a helpful assistant. You first think about the reasoning process in your mind "
    "and then provide the user with the answer."
)
PREFILL = "Let me solve this step by step.\n<think>"
QUESTION = (
    "Using the numbers {nums}, create an equation that equals {target}. You can use basic arithmetic operations "
    "(+, -, *, /) and parentheses, and you must use every number exactly once. Show your work in <think> </think> "
    "tags. And return the final equation in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
)
TAGS = ("<think>", "</think>", "<answer>", "</answer>")
MAX_SOLVE_NUMBERS = 4


def answer_of(text: str) -> str | None:
    """The content of the last <answer>...</answer> block, or None."""
    if len(text) > MAX_TEXT_CHARS:
        return None
    return last_block(text, "<answer>", "</answer>")


def is_formatted(text: str) -> bool:
    """`... <think> reasoning </think> <answer> equation </answer>`: each tag once, nothing after the answer.

    Text before <think> is allowed (the R1-Zero prefill puts "Let me solve this step by step." there).
    """
    if len(text) > MAX_TEXT_CHARS or any(text.count(tag) != 1 for tag in TAGS):
        return False
    think, end_think, answer, end_answer = (text.index(tag) for tag in TAGS)
    if not think < end_think < answer < end_answer:
        return False
    between = text[end_think + len("</think>") : answer]
    content = text[answer + len("<answer>") : end_answer]
    return (
        between.strip() == ""
        and content.strip() != ""
        and text[end_answer + len("</answer>") :].strip() == ""
    )


def solve(nums: list[int], target: int) -> str | None:
    """An equation using every number once that equals the target, by exhaustive search (up to 4 numbers)."""
    if not 0 < len(nums) <= MAX_SOLVE_NUMBERS:
        return None
    target_value = Fraction(target)
    seen: set = set()

    def search(items: list[tuple[Fraction, tuple]]) -> tuple | None:
        if len(items) == 1:
            return items[0][1] if items[0][0] == target_value else None
        key = tuple(sorted(value for value, _ in items))
        if key in seen:
            return None
        seen.add(key)
        for i, j in itertools.combinations(range(len(items)), 2):
            rest = [items[k] for k in range(len(items)) if k not in (i, j)]
            (a, ta), (b, tb) = items[i], items[j]
            candidates = [
                (a + b, ("+", ta, tb)),
                (a * b, ("*", ta, tb)),
                (a - b, ("-", ta, tb)),
                (b - a, ("-", tb, ta)),
            ]
            if b != 0:
                candidates.append((a / b, ("/", ta, tb)))
            if a != 0:
                candidates.append((b / a, ("/", tb, ta)))
            for value, tree in candidates:
                found = search(rest + [(value, tree)])
                if found is not None:
                    return found
        return None

    tree = search([(Fraction(n), ("num", n)) for n in nums])
    return None if tree is None else format_tree(tree)


def _random_tree(rng: random.Random, nums: list[int], max_target: int) -> tuple | None:
    """Combine all numbers in random order with random operations, keeping every intermediate a positive integer."""
    items = [(n, ("num", n)) for n in nums]
    rng.shuffle(items)
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (a, ta), (b, tb) = items[i], items[j]
        options = [("+", a + b), ("*", a * b)]
        if a > b:
            options.append(("-", a - b))
        if b > 1 and a % b == 0:
            options.append(("/", a // b))
        op, value = rng.choice(options)
        items = [items[k] for k in range(len(items)) if k not in (i, j)] + [(value, (op, ta, tb))]
    value, tree = items[0]
    return tree if 1 <= value <= max_target else None


NUMBERS_PER_TASK = (2, 6)  # the fewest and the most numbers a generated task may have


MAX_GENERATED = 1_000_000  # tasks one generation may make (about a minute); more would run for hours


def generate_rows(
    num: int,
    seed: int,
    min_numbers: int = 3,
    max_numbers: int = 4,
    max_number: int = 99,
    max_target: int = 100,
) -> list[dict]:
    """`num` distinct solvable tasks {"nums", "target", "solution"}; the same seed gives the same rows."""
    if num < 1:
        raise UserError(f"number of tasks to generate must be at least 1, got {num}")
    if num > MAX_GENERATED:
        raise UserError(f"number of tasks to generate must be at most {MAX_GENERATED:,}, got {num:,}")
    fewest, most = NUMBERS_PER_TASK
    if not fewest <= min_numbers <= max_numbers <= most:
        raise UserError(
            f"numbers per task must satisfy {fewest} <= min ({min_numbers}) <= max ({max_numbers}) <= {most}"
        )
    if max_number < 2 or max_target < 1:
        raise UserError("max_number must be at least 2 and max_target at least 1")
    rng = random.Random(seed)
    rows, seen = [], set()
    attempts = 0
    while len(rows) < num:
        attempts += 1
        if attempts > 200 * num + 10_000:
            raise UserError(
                f"could only generate {len(rows)} distinct tasks of {num} - allow more numbers or a larger range"
            )
        nums = [rng.randint(1, max_number) for _ in range(rng.randint(min_numbers, max_numbers))]
        tree = _random_tree(rng, nums, max_target)
        if tree is None:
            continue
        target = int(evaluate(tree))
        key = (tuple(sorted(nums)), target)
        if key in seen:
            continue
        seen.add(key)
        rng.shuffle(nums)
        rows.append({"nums": nums, "target": target, "solution": format_tree(tree)})
    return rows


def write_generated(path: str, num: int, seed: int, force: bool = False, **options: int) -> list[dict]:
    """Generate `num` tasks (see generate_rows for the options) and write them to a .jsonl file atomically; an
    existing file is replaced only with `force`."""
    from grpo_cli.atomic import write_rows

    return write_rows(path, lambda: generate_rows(num, seed, **options), force)


@register_task
class CountdownTask(Task):
    name = "countdown"
    description = "Reach a target number with given numbers and + - * / (R1-Zero / TinyZero)."
    default_dataset = "Jiayi-Pan/Countdown-Tasks-3to4"
    answer_columns = ("nums", "target")
    default_rewards = ("countdown_format", "countdown_equation")
    accuracy_rewards = ("countdown_equation",)
    default_system_prompt = SYSTEM_PROMPT
    default_prefill = PREFILL

    def column_problems(self, row: dict, columns: tuple[str, ...] | None = None) -> list[str]:
        problems = super().column_problems(row, columns)
        columns = self.answer_columns if columns is None else columns
        if "nums" in columns and "nums" in row:
            nums = row["nums"]
            if not isinstance(nums, list) or not nums or not all(_is_int(n) for n in nums):
                problems.append(f"'nums' must be a non-empty list of whole numbers, got {_short(nums)}")
        if "target" in columns and "target" in row and not _is_int(row["target"]):
            problems.append(f"'target' must be a whole number, got {_short(row['target'])}")
        return problems

    def question(self, row: dict) -> str:
        return QUESTION.format(nums=list(row["nums"]), target=row["target"])

    def solution(self, row: dict) -> str | None:
        """The row's reference equation (its `solution` column if valid), else one found by search."""
        nums, target = list(row["nums"]), int(row["target"])
        given = row.get("solution")
        if isinstance(given, str) and check_equation(given, nums, target) is None:
            return split_equation(given, target).strip()
        return solve(nums, target)

    def sft_completion(self, row: dict) -> str | None:
        equation = self.solution(row)
        if equation is None:
            return None
        steps: list[str] = []
        evaluate(parse_equation(equation), steps)
        lines = "\n".join(steps)
        return (
            f" I need to reach {row['target']} using each of {list(row['nums'])} once.\n{lines}\n"
            f"So {equation} = {row['target']}.\n</think>\n<answer>{equation}</answer>"
        )

    def malformed_completions(self, row: dict) -> list[str]:
        equation = self.solution(row) or " + ".join(str(n) for n in row["nums"])
        wrong = " + ".join(str(n) for n in row["nums"])
        if check_equation(wrong, list(row["nums"]), int(row["target"])) is None:
            wrong = " * ".join(str(n) for n in row["nums"])
        return [
            f" Thinking.</think>\n<answer>{wrong}</answer>",  # well formatted, wrong equation
            f" Thinking.</think>\n{equation}",  # no answer tags
            f" Thinking.</think>\n<answer>{equation}</answer>\n<answer>{equation}</answer>",  # doubled
            f" Thinking.</think>\n<answer>{equation}</answer> Hope that helps!",  # trailing text
            f" Thinking.\n<answer>{equation}",  # unclosed tags
        ]

    def is_formatted(self, text: str) -> bool:
        return is_formatted(text)

    generate_keys = ("dataset_generate_numbers",)

    def generate(self, args: TaskArguments) -> list[dict] | None:
        fewest, most = args.dataset_generate_numbers
        return generate_rows(args.dataset_generate, args.dataset_seed, min_numbers=fewest, max_numbers=most)

    def generated_source(self, args: TaskArguments) -> str:
        numbers = "-".join(str(n) for n in dict.fromkeys(args.dataset_generate_numbers))  # 3-4, or 2 for [2, 2]
        return f"{args.dataset_generate} generated countdown tasks of {numbers} numbers (seed {args.dataset_seed})"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = [
    "CountdownTask",
    "EquationError",
    "answer_of",
    "generate_rows",
    "is_formatted",
    "solve",
    "write_generated",
]
