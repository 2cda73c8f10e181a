"""reasoning-gym: about a hundred procedural reasoning datasets (GSM-style word problems, arithmetic, logic, puzzles),
generated offline from a seed and scored by each dataset's own scorer.

A row is `question`, `answer` (None where a dataset checks answers without one), `metadata` (what the scorer reads,
as JSON text: reasoning-gym's metadata holds tuples, which plain JSON would turn into lists), `source_dataset` and
`source_config` (the dataset and its config, as JSON text, to build the same scorer again). Rows are plain JSON,
so `grpo data reasoning_gym` can write them and a recipe can load them back with `dataset_name`.

The model answers as in the R1-Zero format: reasoning in <think> tags, the final answer in <answer> tags.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import json
import logging
import re
import typing
from fractions import Fraction
from typing import Any

from grpo_cli.arguments import TaskArguments
from grpo_cli.errors import UserError
from grpo_cli.problems import Problem
from grpo_cli.tasks.answers import parse_number
from grpo_cli.tasks.countdown import PREFILL, answer_of, is_formatted
from grpo_cli.tasks.task import Task, register_task

INSTALL = "pip install 'grpo-cli[gym]'"
SYSTEM_PROMPT = (
    "You are a helpful assistant. You first think about the reasoning process in your mind and then provide the user "
    "with the answer. Show your reasoning in <think> </think> tags and give only the final answer in <answer> "
    "</answer> tags, i.e. <think> reasoning here </think> <answer> answer here </answer>. When the question shows "
    "the format of the answer, follow it exactly."
)
# Scorers that hand the model's answer to Python's eval, or to SymPy's parse_expr or sympify (which call eval), are
# refused. In reasoning-gym 0.1.25: binary_matrix, n_queens, spiral_matrix and string_insertion (eval), countdown,
# puzzle24, polynomial_multiplication, simple_integration and intermediate_integration (parse_expr); number_sorting
# evals the row's own answer. The project's own countdown task checks equations without evaluating them.
_EVALUATING = re.compile(r"(?<!\w)(eval|exec|parse_expr|sympify|parse_latex)\s*\(")
FULL_MARKS = 1.0 - 1e-9  # reasoning-gym's top score, allowing for float rounding in scorers that compute it

logger = logging.getLogger("grpo_cli.tasks")


def library():
    """reasoning-gym's registry of datasets: name -> (dataset class, config class); UserError when not installed."""
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError as err:
        missing = (err.name or "").split(".")[0] == "reasoning_gym"
        why = "which is not installed" if missing else f"which does not load ({err})"
        raise UserError(f"task reasoning_gym needs the reasoning-gym package, {why} - {INSTALL}") from None
    return DATASETS


# --- metadata as JSON text ---------------------------------------------------------------------------------------

_TUPLE, _ITEMS, _FRACTION = "__tuple__", "__items__", "__fraction__"
_TAGS = {_TUPLE, _ITEMS, _FRACTION}


def _encodable(value: Any) -> Any:
    """The value with tuples, fractions and dicts of non-string keys as tagged objects plain JSON keeps apart."""
    if isinstance(value, Fraction):
        return {_FRACTION: str(value)}
    if isinstance(value, tuple):
        return {_TUPLE: [_encodable(v) for v in value]}
    if isinstance(value, list):
        return [_encodable(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not (len(value) == 1 and set(value) & _TAGS):
            return {k: _encodable(v) for k, v in value.items()}
        return {_ITEMS: [[_encodable(k), _encodable(v)] for k, v in value.items()]}
    return value


def _decoded(obj: dict) -> Any:
    if len(obj) == 1 and _TUPLE in obj:
        return tuple(obj[_TUPLE])
    if len(obj) == 1 and _FRACTION in obj:
        return Fraction(obj[_FRACTION])
    if len(obj) == 1 and _ITEMS in obj:
        return dict(obj[_ITEMS])  # keys come back as they went: tuples decode before this
    return obj


def to_json(value: Any) -> str:
    """JSON text of reasoning-gym metadata or config that from_json turns back into an equal value."""
    return json.dumps(_encodable(value), ensure_ascii=False)


def from_json(text: str) -> Any:
    """The value to_json wrote."""
    return json.loads(text, object_hook=_decoded)


# --- datasets, configs, scorers ----------------------------------------------------------------------------------


@functools.cache
def unsupported(name: str) -> str | None:
    """Why the dataset cannot be used here, or None."""
    if name == "composite":
        return "composite mixes several datasets - name one dataset (dataset_generate_name) per recipe"
    dataset_cls, _ = library()[name]
    try:
        source = inspect.getsource(dataset_cls.score_answer)
    except (OSError, TypeError):
        return "its scorer's source cannot be read to check that it never evaluates the model's answer"
    found = _EVALUATING.search(source)
    if found is None:
        return None
    why = f"its scorer calls {found.group(1)}(), and grpo runs neither model output nor data as code"
    return why + (" - use task: countdown, which checks equations without evaluating them" if name == "countdown" else "")


def name_problem(name: Any) -> str | None:
    """What is wrong with a reasoning-gym dataset name (unknown, or refused), or None."""
    datasets = library()
    if not isinstance(name, str) or name not in datasets:
        close = difflib.get_close_matches(str(name), datasets, n=3)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        return (
            f"unknown reasoning-gym dataset {name!r} - {hint}`grpo data reasoning_gym` lists the "
            f"{len(datasets)} datasets"
        )
    why = unsupported(name)
    return f"reasoning-gym dataset '{name}' is not supported: {why}" if why else None


_PLAIN = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}


def config_problem(name: str, config: Any) -> str | None:
    """What is wrong with a dataset's config (unknown keys, values of the wrong kind, values it refuses), or None."""
    _, config_cls = library()[name]
    if not isinstance(config, dict):
        return f"the config of '{name}' must be a mapping of its keys, got {config!r:.60}"
    fields = {f.name: f for f in dataclasses.fields(config_cls) if f.init}
    keys = sorted(set(fields) - {"seed", "size"})
    for key in config:
        if key in ("seed", "size"):
            instead = "dataset_seed" if key == "seed" else "dataset_generate (or --num)"
            return f"'{key}' does not belong in the config of '{name}' - set {instead}"
        if key not in fields:
            close = difflib.get_close_matches(str(key), keys, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            return f"'{name}' has no config key '{key}' - {hint}its keys: {', '.join(keys) or 'none'}"
    hints = _type_hints(config_cls)
    for key, value in config.items():
        kinds = _PLAIN.get(hints.get(key))
        if kinds and (not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool))):
            return f"config key '{key}' of '{name}' must be {hints[key].__name__}, got {value!r:.60}"
    try:
        _config(name, config, seed=0, size=1)
    except Exception as err:  # noqa: BLE001 - reasoning-gym checks configs with assert, TypeError, ValueError
        return f"'{name}' refuses the config {config} ({type(err).__name__}: {str(err)[:200] or 'no reason given'})"
    return None


def _type_hints(config_cls: type) -> dict:
    try:
        return typing.get_type_hints(config_cls)
    except Exception:  # noqa: BLE001 - annotations that don't resolve: no type check, the config's own checks remain
        return {}


def _config(name: str, config: dict, seed: int, size: int):
    """The dataset's config object (its validate() run), lists made tuples where its default is a tuple."""
    _, config_cls = library()[name]
    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(config_cls)
        if f.init and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)
    }
    values = {k: tuple(v) if isinstance(v, list) and isinstance(defaults.get(k), tuple) else v for k, v in config.items()}
    made = config_cls(**values, seed=seed, size=size)
    if callable(getattr(made, "validate", None)):
        made.validate()
    return made


@functools.lru_cache(maxsize=64)
def _scorer(name: str, config_text: str):
    """The dataset's score_answer, built with the row's config (some scorers read it)."""
    problem = name_problem(name)
    if problem:
        raise UserError(problem)
    dataset_cls, _ = library()[name]
    return dataset_cls(config=_config(name, from_json(config_text), seed=0, size=1)).score_answer


def score(answer: str | None, row: dict) -> float:
    """reasoning-gym's score of an answer for a row, from 0 to 1 (some scorers give partial credit)."""
    if answer is None:
        return 0.0
    entry = {"question": row.get("question"), "answer": row.get("answer"), "metadata": from_json(row["metadata"])}
    value = float(_scorer(str(row["source_dataset"]), row.get("source_config") or "{}")(answer, entry))
    return min(max(value, 0.0), 1.0)


def completion_score(text: str, row: dict) -> float:
    """reasoning-gym's score of the completion's last <answer> (0 without one)."""
    answer = answer_of(text)
    return score(None if answer is None else answer.strip(), row)


# --- generation --------------------------------------------------------------------------------------------------


def generate_rows(name: str, num: int, seed: int, config: dict | None = None) -> list[dict]:
    """The first `num` items of reasoning-gym's `create_dataset(name, size=num, seed=seed, **config)` as rows, each
    question once (a repeated question would leak into a held-out split). Same name, seed and config: same rows."""
    config = dict(config or {})
    config_text = to_json(config)
    return [_row(name, item, config_text) for item in generated_items(name, num, seed, config)]


def generated_items(name: str, num: int, seed: int, config: dict | None = None) -> list[dict]:
    """reasoning-gym's items of generate_rows, as the library makes them (each question once)."""
    config = dict(config or {})
    if num < 1:
        raise UserError(f"number of rows to generate must be at least 1, got {num}")
    problem = name_problem(name) or config_problem(name, config)
    if problem:
        raise UserError(problem)
    dataset_cls, _ = library()[name]
    dataset = dataset_cls(config=_config(name, config, seed=seed, size=num))
    items, seen = [], set()
    for index in range(num):
        try:
            item = dataset[index]
        except Exception as err:  # noqa: BLE001 - a generator that fails on this config: say which and why
            raise UserError(
                f"reasoning-gym dataset '{name}' failed on item {index} with the config {config} "
                f"({type(err).__name__}: {str(err)[:200]}) - change the config or the seed"
            ) from None
        if item["question"] in seen:
            continue
        seen.add(item["question"])
        items.append(item)
    if len(items) < num:
        logger.warning(
            "reasoning-gym dataset '%s' repeated %d of its %d questions; kept each once (%d rows)",
            name, num - len(items), num, len(items),
        )  # fmt: skip
    return items


def _row(name: str, item: dict, config_text: str) -> dict:
    """A JSON row of a reasoning-gym item; UserError when its metadata would not come back equal from JSON."""
    metadata = item.get("metadata") or {}
    try:
        text = to_json(metadata)
        same = from_json(text) == metadata
    except (TypeError, ValueError) as err:
        text, same = "", False
        why = f"{type(err).__name__}: {err}"
    else:
        why = "it reads back different"
    if not same:
        raise UserError(
            f"reasoning-gym dataset '{name}': the metadata of its items does not survive being written as JSON "
            f"({why}), so its rows could not be saved and scored again - choose another dataset"
        )
    answer = item.get("answer")
    return {
        "question": str(item["question"]),
        "answer": None if answer is None else str(answer),
        "metadata": text,
        "source_dataset": name,
        "source_config": config_text,
    }


def write_generated(path: str, name: str, num: int, seed: int, config: dict | None = None, force: bool = False):
    """Generate rows (see generate_rows) and write them to a .jsonl file atomically; an existing file is replaced
    only with `force`."""
    from grpo_cli.atomic import write_rows

    return write_rows(path, lambda: generate_rows(name, num, seed, config), force)


def dataset_table():
    """A Rich table of reasoning-gym's datasets: name, category, config keys, and why one is refused."""
    from rich.table import Table

    table = Table(title="reasoning-gym datasets", title_justify="left")
    table.add_column("dataset", no_wrap=True)
    table.add_column("category", no_wrap=True)
    table.add_column("config keys", overflow="fold")
    table.add_column("note", overflow="fold")
    for name, (dataset_cls, config_cls) in sorted(library().items()):
        keys = [f.name for f in dataclasses.fields(config_cls) if f.init and f.name not in ("seed", "size")]
        category = dataset_cls.__module__.split(".")[1] if dataset_cls.__module__.count(".") >= 2 else "-"
        why = unsupported(name)
        table.add_row(name, category, ", ".join(keys), f"not supported: {why}" if why else "")
    return table


# --- reasoning-gym as the data source of other tasks ------------------------------------------------------------

GENERATE_KEYS = ("dataset_generate_name", "dataset_generate_config")


def source_problems(task: str, args: TaskArguments, default: str | None = None, example: str = "gsm_symbolic") -> list[Problem]:
    """What is wrong with the dataset_generate_* keys that name a reasoning-gym dataset (`default` when unset)."""
    if args.dataset_generate <= 0:
        return []
    name = args.dataset_generate_name or default
    if not name:
        return [Problem(
            "dataset_generate_name",
            f"task {task} with dataset_generate needs dataset_generate_name: the reasoning-gym dataset, "
            f"e.g. {example} (`grpo data reasoning_gym` lists them)",
        )]  # fmt: skip
    try:
        problem = name_problem(name)
        if problem:
            return [Problem("dataset_generate_name", f"dataset_generate_name: {problem}")]
        problem = config_problem(name, args.dataset_generate_config)
        if problem:
            return [Problem("dataset_generate_config", f"dataset_generate_config: {problem}")]
    except UserError as err:  # the package is not installed
        return [Problem("task", text) for text in err.problems]
    return []


def source_words(args: TaskArguments, default: str | None = None) -> str:
    """The generated rows, in words."""
    config = f" {args.dataset_generate_config}" if args.dataset_generate_config else ""
    name = args.dataset_generate_name or default
    return f"{args.dataset_generate} generated reasoning-gym {name}{config} rows (seed {args.dataset_seed})"


def generated_answers(task: str, args: TaskArguments, default: str | None = None) -> list[dict]:
    """The items the dataset_generate_* keys name (`question`, `answer`, reasoning-gym's `metadata`), for a task that
    scores answers its own way; UserError naming the first item without an answer."""
    name = str(args.dataset_generate_name or default)
    items = generated_items(name, args.dataset_generate, args.dataset_seed, args.dataset_generate_config)
    for index, item in enumerate(items):
        if item.get("answer") is None or not str(item["answer"]).strip():
            raise UserError(
                f"dataset_generate_name: reasoning-gym '{name}' has no answer in row {index}, and task {task} "
                "compares answers - use task: reasoning_gym, which scores with the dataset's own scorer"
            )
    return items


# --- the task ----------------------------------------------------------------------------------------------------


@register_task
class ReasoningGymTask(Task):
    name = "reasoning_gym"
    description = "Any reasoning-gym dataset (GSM-style, arithmetic, logic, puzzles), generated offline, scored by its own scorer."
    default_dataset = ""
    answer_columns = ("answer", "metadata", "source_dataset")
    question_column = "question"
    default_rewards = ("reasoning_gym_format", "reasoning_gym_accuracy")
    accuracy_rewards = ("reasoning_gym_accuracy",)
    default_system_prompt = SYSTEM_PROMPT
    default_prefill = PREFILL
    generate_keys = GENERATE_KEYS

    def column_problems(self, row: dict, columns: tuple[str, ...] | None = None) -> list[str]:
        problems = super().column_problems(row, columns)
        if problems:
            return problems
        columns = self.answer_columns if columns is None else columns
        if "answer" in columns and row["answer"] is not None and not isinstance(row["answer"], str):
            problems.append(f"'answer' must be a string or null, got {row['answer']!r:.60}")
        for column in ("metadata", "source_config"):  # source_config may be left out: the dataset's defaults
            if column in columns or (column == "source_config" and row.get(column) is not None):
                value = row.get(column)
                if not isinstance(value, str) or not isinstance(_parsed(value), dict):
                    problems.append(
                        f"'{column}' must be JSON text of an object, as `grpo data reasoning_gym` writes it, "
                        f"got {value!r:.60}"
                    )
        if "source_dataset" in columns:
            problem = name_problem(row["source_dataset"])
            if problem:
                problems.append(f"'source_dataset': {problem}")
        return problems

    def generation_problems(self, args: TaskArguments) -> list[Problem]:
        if args.dataset_generate <= 0 and not args.dataset_name:
            return [Problem(
                "dataset_generate",
                "task reasoning_gym has no dataset of its own - set dataset_generate: N with "
                "dataset_generate_name (e.g. gsm_symbolic), or dataset_name: a file `grpo data reasoning_gym` wrote",
            )]  # fmt: skip
        return source_problems(self.name, args)

    def generated_source(self, args: TaskArguments) -> str:
        return source_words(args)

    def generate(self, args: TaskArguments) -> list[dict] | None:
        return generate_rows(
            str(args.dataset_generate_name), args.dataset_generate, args.dataset_seed, args.dataset_generate_config
        )

    def answer_completion(self, row: dict) -> str | None:
        answer = row.get("answer")
        if not isinstance(answer, str) or not answer.strip() or "<" in answer:
            return None
        return f" I worked it out.\n</think>\n<answer>{answer}</answer>"

    def malformed_completions(self, row: dict) -> list[str]:
        answer = str(row.get("answer"))
        completions = [
            f" I worked it out.\n</think>\nThe answer is {answer}.",  # no answer tags
            f" I worked it out.\n<answer>{answer}",  # unclosed tags, no end of thinking
            f" I worked it out.\n</think>\n<answer>{answer}</answer>\n<answer>{answer}</answer>",  # doubled
            f" I worked it out.\n</think>\n<answer>{answer}</answer> Hope that helps!",  # trailing text
        ]
        number = parse_number(answer)
        if number is not None and number.denominator == 1:
            completions.insert(0, f" I worked it out.\n</think>\n<answer>{number.numerator + 1}</answer>")  # wrong
        return completions

    def is_formatted(self, text: str) -> bool:
        return is_formatted(text)


def _parsed(text: str) -> Any:
    try:
        return from_json(text)
    except ValueError:
        return None


__all__ = [
    "GENERATE_KEYS",
    "ReasoningGymTask",
    "completion_score",
    "config_problem",
    "dataset_table",
    "from_json",
    "generate_rows",
    "generated_answers",
    "generated_items",
    "library",
    "name_problem",
    "score",
    "source_problems",
    "source_words",
    "to_json",
    "write_generated",
]
