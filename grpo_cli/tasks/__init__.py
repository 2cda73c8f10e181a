"""Tasks: turn dataset rows into prompts, know their answer columns, default rewards and correctness check.

Built in: countdown, gsm8k, dapo_math, reasoning_gym. Nothing heavy is imported here (datasets, math-verify and
reasoning-gym load lazily).
"""

from __future__ import annotations

from grpo_cli.tasks import countdown, dapo_math, gsm8k, reasoning_gym  # noqa: F401  (register the built-in tasks)
from grpo_cli.tasks.dataset import (
    CHAT_TEMPLATES,
    chat_template_text,
    dataset_source,
    load_task_dataset,
    reference_messages,
    sft_dataset,
    task_problems,
)
from grpo_cli.tasks.task import (
    TASKS,
    Task,
    as_chats,
    completion_text,
    for_prefill,
    get_task,
    prefill_of,
    register_task,
    task_table,
)

__all__ = [
    "CHAT_TEMPLATES",
    "TASKS",
    "Task",
    "as_chats",
    "chat_template_text",
    "completion_text",
    "dataset_source",
    "for_prefill",
    "get_task",
    "load_task_dataset",
    "prefill_of",
    "reference_messages",
    "register_task",
    "sft_dataset",
    "task_problems",
    "task_table",
]
