"""Task datasets: load rows (Hub, local file or folder, or generated), hold out the test split, add prompts."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_cli.arguments import TaskArguments
from grpo_cli.errors import UserError
from grpo_cli.problems import Problem, listing
from grpo_cli.tasks.countdown import MAX_GENERATED, NUMBERS_PER_TASK
from grpo_cli.tasks.task import Task, for_prefill, get_task

if TYPE_CHECKING:
    import datasets

LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _looks_local(name: str) -> bool:
    return (
        Path(name).suffix.lower() in LOCAL_FORMATS or name.startswith((".", "/", "~")) or os.path.exists(name)
    )


def dataset_source(args: TaskArguments) -> str:
    """Where the rows come from, in words: the file, the Hub id, or the generator."""
    if args.dataset_generate > 0:
        return get_task(args.task).generated_source(args)
    return args.dataset_name or get_task(args.task).default_dataset


def task_problems(args: TaskArguments) -> list[Problem]:
    """Problems in the task keys of a recipe, each with its key, found without loading anything heavy."""
    from grpo_cli.tasks.task import TASKS

    problems = []
    if args.task not in TASKS:
        try:
            get_task(args.task)
        except UserError as err:
            problems.extend(Problem("task", problem) for problem in err.problems)
        return problems
    task = TASKS[args.task]
    if args.prompt_column and args.prompt_template:
        problems.append(Problem("prompt_column", "prompt_column and prompt_template are both set - keep one of them"))
    if args.dataset_generate < 0:
        problems.append(Problem("dataset_generate", f"dataset_generate must be 0 or more, got {args.dataset_generate}"))
    if args.dataset_generate > MAX_GENERATED:
        problems.append(Problem(
            "dataset_generate", f"dataset_generate must be at most {MAX_GENERATED:,}, got {args.dataset_generate:,}"
        ))
    numbers, (fewest, most) = args.dataset_generate_numbers, NUMBERS_PER_TASK
    if not (len(numbers) == 2 and fewest <= numbers[0] <= numbers[1] <= most):
        problems.append(Problem(
            "dataset_generate_numbers",
            f"dataset_generate_numbers must be [fewest, most] with {fewest} <= fewest <= most <= {most}, got {numbers}",
        ))
    if args.dataset_generate > 0 and not task.generates:
        problems.append(
            Problem("dataset_generate", f"dataset_generate: task {task.name} cannot generate data - set dataset_name instead")
        )
    for key in ("dataset_generate_name", "dataset_generate_config"):
        if getattr(args, key) and key not in task.generate_keys:
            readers = sorted(name for name, other in TASKS.items() if key in other.generate_keys)
            named = f"task {readers[0]}" if len(readers) == 1 else f"tasks {', '.join(readers[:-1])} and {readers[-1]}"
            problems.append(Problem(key, f"{key} is read by {named} only, and the task is {task.name} - drop it"))
    problems.extend(task.generation_problems(args))
    if args.dataset_test_size < 0:
        problems.append(Problem("dataset_test_size", f"dataset_test_size must be 0 or more, got {args.dataset_test_size}"))
    if args.max_samples is not None and args.max_samples < 1:
        problems.append(Problem("max_samples", f"max_samples must be at least 1, got {args.max_samples}"))
    local = args.dataset_generate == 0 and args.dataset_name and _looks_local(args.dataset_name)
    if local and not Path(args.dataset_name).expanduser().exists():
        problems.append(
            Problem("dataset_name", f"dataset_name: file or folder '{args.dataset_name}' not found - check the path")
        )
    if args.chat_template:
        try:
            chat_template_text(args.chat_template)
        except UserError as err:
            problems.extend(Problem("chat_template", problem) for problem in err.problems)
    return problems


def _load_all(args: TaskArguments, task: Task) -> datasets.DatasetDict:
    import datasets

    if args.dataset_generate > 0:
        rows = task.generate(args)
        if rows is None:
            raise UserError(
                f"dataset_generate: task {task.name} cannot generate data - set dataset_name instead"
            )
        return datasets.DatasetDict({args.dataset_train_split: datasets.Dataset.from_list(rows)})
    name = args.dataset_name or task.default_dataset
    config = args.dataset_config if args.dataset_name else (args.dataset_config or task.default_config)
    if _looks_local(name):
        path = Path(name).expanduser()
        if not path.exists():
            raise UserError(f"dataset_name: file or folder '{name}' not found - check the path")
        try:
            if path.is_dir():
                empty = [f for f in sorted(path.rglob("*")) if f.suffix.lower() in LOCAL_FORMATS and f.is_file()
                         and f.stat().st_size == 0]
                if empty:
                    raise UserError(
                        f"dataset_name: {empty[0]} is empty - each data file of a folder is a split (or part of "
                        "one): remove it, or fill it"
                    )
                return datasets.load_dataset(str(path))
            builder = LOCAL_FORMATS.get(path.suffix.lower())
            if builder is None:
                raise UserError(f"dataset_name: '{name}' is not a .jsonl, .json, .parquet or .csv file")
            if path.stat().st_size == 0:
                raise UserError(f"dataset_name: '{name}' is empty")
            bad = _first_bad_json_line(path) if path.suffix.lower() == ".jsonl" else None
            if bad:  # a `null` or a list line loads as a row of nothing: say where, before datasets reads it
                raise UserError(f"dataset_name: {name}: {bad} - each line must be one JSON object")
            # One file is one split: name it as the recipe's train split, so `dataset_train_split` needs no change.
            return datasets.load_dataset(builder, data_files={args.dataset_train_split: str(path)})
        except UserError:
            raise
        except Exception as err:  # noqa: BLE001 - datasets raises many types for unreadable files
            bad = _first_bad_json_line(path) if path.suffix.lower() == ".jsonl" else None
            if bad:
                raise UserError(f"dataset_name: {name}: {bad} - each line must be one JSON object") from None
            raise UserError(f"dataset_name: cannot read '{name}' ({type(err).__name__}: {err})") from None
    from grpo_cli.hub import hub_dataset, model_source, modelscope_snapshot

    local = "use a local .jsonl/.parquet file (dataset_name: path/to/file.jsonl)" + (
        " or generated data (dataset_generate: N)" if task.generates else ""
    )
    if model_source() == "modelscope":
        source = modelscope_snapshot(name, "dataset", key="dataset_name")  # its files, loaded as a local folder
        hub, where = f"ModelScope (its snapshot in {source})", contextlib.nullcontext()
    else:  # where the Hub cannot be reached: the cached copy at once, or one message, not a minute of retries
        hub, source, where = "the Hugging Face Hub", name, hub_dataset(name, local)
    try:
        with where:
            return datasets.load_dataset(source, config)
    except Exception as err:  # noqa: BLE001 - offline, unknown id, gated, wrong config: all the user's to fix
        raise UserError(
            f"dataset_name: cannot load '{name}'{f' (config {config})' if config else ''} from {hub} "
            f"({type(err).__name__}: {str(err)[:300]}) - check the id, or {local}"
        ) from None


def write_generated_rows(args: TaskArguments, path: str, force: bool = False) -> tuple[list[dict], str]:
    """Write the rows the data keys generate to a .jsonl file atomically (an existing file only with `force`);
    the rows and where they came from, in words."""
    from grpo_cli.atomic import write_rows

    task = get_task(args.task)
    if args.dataset_generate <= 0:
        raise UserError(
            f"dataset_generate: the recipe loads its rows from {dataset_source(args)} and generates none - set "
            f"dataset_generate: N{'' if task.generates else f' (task {task.name} cannot generate data)'}"
        )
    problems = task_problems(args)
    if problems:
        raise UserError(*listing(problems))
    return write_rows(path, lambda: task.generate(args), force), dataset_source(args)


def _first_bad_json_line(path: Path) -> str | None:
    """Where a JSONL file stops being JSON lines ("line 11: ..."), or None."""
    kinds = {"NoneType": "null", "list": "array", "str": "string", "int": "number", "float": "number", "bool": "boolean"}
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                return f"line {number}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1})"
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                return f"line {number}: not JSON ({err.msg} at column {err.colno})"
            if not isinstance(row, dict):
                return f"line {number}: a JSON {kinds.get(type(row).__name__, type(row).__name__)}, not an object"
    return None


def _normalize_and_prompt(row: dict, task_name: str, args: TaskArguments, source: str) -> dict:
    task = get_task(task_name)
    shown = str({key: value for key, value in row.items() if key != "prompt"})[:200]
    try:
        row = task.normalize(row)
        problems = task.column_problems(row)  # every row, as the first was checked before
        if problems:
            raise UserError(*(f"{source}: the row {shown}: {problem}" for problem in problems))
        return {**row, "prompt": task.prompt(row, args)}
    except UserError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as err:  # a value of the wrong kind in the user's data
        raise UserError(
            f"{source}: the row {shown} is not a {task_name} row ({type(err).__name__}: {str(err)[:200]}) - fix or "
            "drop it"
        ) from None


def load_task_dataset(args: TaskArguments, split: str, seed: int = 0) -> datasets.Dataset:
    """Rows of one split with a "prompt" column of chat messages built by the task.

    When the dataset has no test split and dataset_test_size > 0, the test split is carved from the train split
    with dataset_seed, identically for every caller, so training never sees test rows. max_samples keeps that
    many train rows, picked with `seed`.
    """
    task = get_task(args.task)
    problems = task_problems(args)
    if problems:
        raise UserError(*listing(problems))
    splits = _load_all(args, task)
    source = dataset_source(args)
    train_name, test_name = args.dataset_train_split, args.dataset_test_split
    if split not in (train_name, test_name) and split not in splits:
        raise UserError(f"{source} has no split '{split}' (splits: {', '.join(splits)})")
    if split in (train_name, test_name) and test_name not in splits and args.dataset_test_size > 0:
        if train_name not in splits:
            raise UserError(
                f"{source} has no split '{train_name}' (splits: {', '.join(splits)}) - set dataset_train_split"
            )
        data = _carve(splits[train_name], args, source)["test" if split == test_name else "train"]
    elif split in splits:
        data = splits[split]
    elif split == test_name:
        raise UserError(
            f"{source} has no split '{split}' (splits: {', '.join(splits)}) - set dataset_test_size "
            "(e.g. 0.05 or 500) to hold out test rows from the train split, or set dataset_test_split"
        )
    else:
        raise UserError(
            f"{source} has no split '{split}' (splits: {', '.join(splits)}) - set dataset_train_split"
        )
    if split == train_name and args.max_samples is not None and args.max_samples < len(data):
        data = data.shuffle(seed=seed).select(range(args.max_samples)).flatten_indices()
    if len(data) == 0:
        raise UserError(f"split '{split}' of {source} has no rows")
    _check_columns(task, data, source)
    return data.map(
        _normalize_and_prompt,
        fn_kwargs={"task_name": task.name, "args": args, "source": source},
        desc=f"Building {task.name} prompts",
    )


def _carve(data: datasets.Dataset, args: TaskArguments, source: str) -> datasets.DatasetDict:
    size = args.dataset_test_size
    test_size = int(size) if size >= 1 else size
    if isinstance(test_size, int) and test_size >= len(data):
        raise UserError(
            f"dataset_test_size {test_size} leaves no training rows: {source} has {len(data)} rows - use fewer"
        )
    return data.train_test_split(test_size=test_size, seed=args.dataset_seed, shuffle=True)


def _check_columns(task: Task, data: datasets.Dataset, source: str) -> None:
    first = task.normalize(data[0])
    missing = [c for c in task.answer_columns if c not in first]
    if missing:
        raise UserError(
            f"{source} lacks the column(s) {', '.join(missing)} that task {task.name} needs "
            f"(columns: {', '.join(data.column_names)}) - pick the right task or dataset"
        )
    problems = task.column_problems(first)
    if problems:
        raise UserError(*(f"{source}, row 1: {p}" for p in problems))


def reference_messages(task: Task, row: dict, args: TaskArguments, completion: str) -> list[dict]:
    """The prompt messages with the assistant turn = prefill + the completion (re-based onto the prefill)."""
    prefill = task.prefill(args)
    messages = [m for m in task.prompt(row, args) if m["role"] != "assistant"]
    return messages + [{"role": "assistant", "content": prefill + for_prefill(task, completion, prefill)}]


def _sft_row(row: dict, task_name: str, args: TaskArguments) -> dict:
    task = get_task(task_name)
    completion = task.sft_completion(row)
    return {"messages": reference_messages(task, row, args, completion) if completion is not None else []}


def sft_dataset(args: TaskArguments, split: str) -> datasets.Dataset:
    """Conversational rows {"messages": [system?, user, assistant]} for SFT, from the rows' reference solutions."""
    task = get_task(args.task)
    data = load_task_dataset(args, split)
    total = len(data)
    data = data.map(
        _sft_row,
        fn_kwargs={"task_name": task.name, "args": args},
        remove_columns=data.column_names,
        desc=f"Building {task.name} SFT conversations",
    )
    data = data.filter(lambda row: len(row["messages"]) > 0, desc="Dropping rows without a solution")
    if len(data) == 0:
        raise UserError(
            f"none of the {total} rows of {dataset_source(args)} has a reference solution task {task.name} can "
            "turn into an SFT target - use a dataset with worked solutions"
        )
    return data


# Chat templates for models without one (base models); a recipe names one, gives Jinja text, or a .jinja path.
CHAT_TEMPLATES = {
    "chatml": (
        "{%- for message in messages %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    ),
}


def chat_template_text(value: str | None) -> str | None:
    """The Jinja text of a recipe's chat_template: a built-in name, a .jinja file path, or the template itself."""
    if not value:
        return None
    if value in CHAT_TEMPLATES:
        return CHAT_TEMPLATES[value]
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    raise UserError(
        f"chat_template: '{value}' is not a file, a built-in template ({', '.join(CHAT_TEMPLATES)}) "
        "or Jinja text - give a path to a .jinja file"
    )
