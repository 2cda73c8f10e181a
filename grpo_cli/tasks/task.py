"""The Task base class and registry: a task turns a dataset row into a prompt and knows how to check the answer."""

from __future__ import annotations

import difflib
from typing import Any

from grpo_cli.arguments import TaskArguments
from grpo_cli.errors import UserError
from grpo_cli.problems import Problem

TASKS: dict[str, Task] = {}

# Texts longer than this are treated as malformed: every check below scans the text a bounded number of times.
MAX_TEXT_CHARS = 400_000


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: add one instance of the task to TASKS under its name."""
    TASKS[cls.name] = cls()
    return cls


def get_task(name: str) -> Task:
    """The registered task called `name`; UserError listing the known tasks otherwise."""
    if name in TASKS:
        return TASKS[name]
    close = difflib.get_close_matches(name, TASKS, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise UserError(f"unknown task '{name}' (key: task) - {hint}known tasks: {', '.join(sorted(TASKS))}")


class Task:
    """Turns dataset rows into prompts and checks completions; subclasses register with @register_task."""

    name: str = ""
    description: str = ""
    default_dataset: str = ""
    default_config: str | None = None
    answer_columns: tuple[str, ...] = ()
    question_column: str = ""
    default_rewards: tuple[str, ...] = ()
    # Rewards whose top score means a correct answer, by preference: `grpo report` draws the share at the top as
    # the run's accuracy.
    accuracy_rewards: tuple[str, ...] = ()
    default_system_prompt: str = ""
    default_prefill: str = ""

    # Rows: loading, checking, prompting.

    def normalize(self, row: dict) -> dict:
        """The row with the task's canonical columns filled from known aliases (default: unchanged)."""
        return row

    def column_problems(self, row: dict, columns: tuple[str, ...] | None = None) -> list[str]:
        """What is missing or of the wrong type among `columns` (default: the answer columns) of one row."""
        columns = self.answer_columns if columns is None else columns
        return [f"missing column '{c}'" for c in columns if c not in row]

    def question(self, row: dict) -> str:
        """The task's own user message for a row."""
        if self.question_column not in row:
            raise UserError(
                f"task {self.name}: the row has no column '{self.question_column}' for the user message "
                f"(columns: {', '.join(sorted(row))}) - set prompt_column or prompt_template in the recipe"
            )
        return str(row[self.question_column])

    def user_message(self, row: dict, args: TaskArguments | None = None) -> str:
        """The user message: the recipe's prompt_template or prompt_column if set, else the task's own."""
        args = args or TaskArguments(task=self.name)
        if args.prompt_template:
            try:
                return args.prompt_template.format_map(row)
            except (KeyError, IndexError, AttributeError, ValueError) as err:
                raise UserError(
                    f"prompt_template {args.prompt_template!r} does not fit the row ({type(err).__name__}: {err}; "
                    f"columns: {', '.join(sorted(row))}) - use {{column}} placeholders of existing columns "
                    "and write literal braces as {{ and }}"
                ) from None
        if args.prompt_column:
            if args.prompt_column not in row:
                raise UserError(
                    f"prompt_column '{args.prompt_column}' is not a column of the dataset "
                    f"(columns: {', '.join(sorted(row))}) - name an existing column"
                )
            return str(row[args.prompt_column])
        return self.question(row)

    def system_prompt(self, args: TaskArguments | None = None) -> str:
        """The system message: the recipe's when set ('' for none), else the task's."""
        if args is not None and args.system_prompt is not None:
            return args.system_prompt
        return self.default_system_prompt

    def prefill(self, args: TaskArguments | None = None) -> str:
        """The text the assistant turn starts with: the recipe's when set ('' for none), else the task's."""
        if args is not None and args.prefill is not None:
            return args.prefill
        return self.default_prefill

    def prompt(self, row: dict, args: TaskArguments | None = None) -> list[dict]:
        """Chat messages for a row: [system?, user, assistant prefill?].

        A prompt_column holding a conversation (a list of messages) is used as it is, plus the prefill.
        """
        prefill = self.prefill(args)
        conversation = row.get(args.prompt_column) if args is not None and args.prompt_column else None
        if isinstance(conversation, list) and all(isinstance(m, dict) and "role" in m for m in conversation):
            messages = [dict(m) for m in conversation]
            if prefill and (not messages or messages[-1]["role"] != "assistant"):
                messages.append({"role": "assistant", "content": prefill})
            return messages
        messages = []
        system = self.system_prompt(args)
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": self.user_message(row, args)})
        if prefill:
            messages.append({"role": "assistant", "content": prefill})
        return messages

    # Reference and malformed completions (text that follows the task's default prefill).

    def sft_completion(self, row: dict) -> str | None:
        """Well-formatted assistant text built from the row's reference solution, or None if it has none."""
        return None

    def answer_completion(self, row: dict) -> str | None:
        """A short well-formatted completion stating the row's gold answer (when there is no worked solution)."""
        return None

    def reference_completion(self, row: dict) -> str | None:
        """The worked solution if the row has one, else a short completion stating the gold answer."""
        completion = self.sft_completion(row)
        return completion if completion is not None else self.answer_completion(row)

    def malformed_completions(self, row: dict) -> list[str]:
        """Completions a correct reward set must score below the reference one."""
        return []

    # The format check, on text = prefill + completion (correct: the accuracy reward, grpo_cli/rewards/scoring.py).

    def is_formatted(self, text: str) -> bool:
        """Whether the text follows the task's strict format."""
        raise UserError(f"task {self.name} has no format check")

    # Generated data (dataset_generate).

    # The dataset_generate_* keys the task's generator reads beyond dataset_generate and dataset_seed.
    generate_keys: tuple[str, ...] = ()

    def generate(self, args: TaskArguments) -> list[dict] | None:
        """`args.dataset_generate` generated rows from `args.dataset_seed`, for tasks that can make their own data;
        None otherwise."""
        return None

    def generation_problems(self, args: TaskArguments) -> list[Problem]:
        """Problems with the recipe's keys for the task's data that only the task can see (before generating)."""
        return []

    def generated_source(self, args: TaskArguments) -> str:
        """The generated rows, in words."""
        return f"{args.dataset_generate} generated {self.name} tasks (seed {args.dataset_seed})"

    @property
    def generates(self) -> bool:
        """Whether the task can generate its own rows (dataset_generate)."""
        return type(self).generate is not Task.generate


def for_prefill(task: Task, completion: str, prefill: str) -> str:
    """Re-base a completion written after the task's default prefill onto another prefill.

    The full assistant text is default prefill + completion; when it starts with `prefill`, the part after it
    is returned, so the same reference text works with the default prefill, none, or a shorter one.
    """
    full = task.default_prefill + completion
    return full[len(prefill) :] if full.startswith(prefill) else completion


def message_text(content: Any) -> str:
    """Text of a message content: a string, or a list of parts with "text"."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" if isinstance(part, dict) else str(part) for part in content)
    return str(content)


def task_table():
    """A Rich table of the registered tasks: name, default dataset, answer columns, default rewards."""
    from rich.table import Table

    table = Table(title="tasks", title_justify="left")
    table.add_column("task", no_wrap=True)
    table.add_column("default dataset", no_wrap=True)  # whole, to copy
    for column in ("answer columns", "default rewards", "what it is"):
        table.add_column(column, overflow="fold")
    for name in sorted(TASKS):
        task = TASKS[name]
        dataset = task.default_dataset
        if task.generates:
            dataset += "\n(or generated)" if dataset else "(generated)"
        table.add_row(
            name, dataset, ", ".join(task.answer_columns), ", ".join(task.default_rewards), task.description
        )
    return table


def as_chats(completions: list[str]) -> list[list[dict]]:
    """Completion texts as the conversational completions rewards receive (one assistant message each), as TRL
    passes them for chat prompts."""
    return [[{"role": "assistant", "content": text}] for text in completions]


def prefill_of(prompt: Any) -> str:
    """The text the assistant turn starts with: the prompt's last message when it is the assistant's (a chat prompt's
    prefill), else ''. A plain-string prompt carries no prefill that could be told apart from the prompt."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict) and prompt[-1].get("role") == "assistant":
        return message_text(prompt[-1].get("content"))
    return ""


def completion_text(completion: Any) -> str:
    """A completion's text: a conversational one ([{"role": "assistant", "content": ...}, ...]) joined, a string as
    it is."""
    if isinstance(completion, list):
        return "".join(message_text(m.get("content")) if isinstance(m, dict) else str(m) for m in completion)
    if isinstance(completion, dict):
        return message_text(completion.get("content"))
    return message_text(completion)


def last_block(text: str, start: str, end: str) -> str | None:
    """Content of the last start...end block of the text, or None (linear time, no regex)."""
    close = text.rfind(end)
    if close < 0:
        return None
    open_ = text.rfind(start, 0, close)
    if open_ < 0:
        return None
    return text[open_ + len(start) : close]
