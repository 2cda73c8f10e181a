"""Rewards: a registry of TRL reward functions by name, users' own functions, and the guard around each.

Built in: countdown_format, countdown_equation; gsm8k_correctness, gsm8k_int, gsm8k_strict_format,
gsm8k_soft_format, gsm8k_xml_count; dapo_format_exact, dapo_format_approx, dapo_answer, dapo_numbers;
reasoning_gym_format, reasoning_gym_accuracy, reasoning_gym_score; for any task, overlong_penalty.
"""

from __future__ import annotations

from grpo_cli.rewards import (  # noqa: F401  (register the built-in rewards)
    countdown,
    dapo_math,
    gsm8k,
    length,
    reasoning_gym,
)
from grpo_cli.rewards.guard import RewardGuard, build_reward_funcs, conversational, failure_counts
from grpo_cli.rewards.registry import (
    REWARDS,
    RewardSpec,
    accuracy_reward,
    resolve_reward,
    reward,
    reward_names_problems,
)

__all__ = [
    "REWARDS",
    "RewardGuard",
    "RewardSpec",
    "accuracy_reward",
    "build_reward_funcs",
    "conversational",
    "failure_counts",
    "resolve_reward",
    "reward",
    "reward_names_problems",
]
