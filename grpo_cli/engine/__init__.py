"""The speed layer under training and evaluation: grpo's static-cache sampler (`rollout`), the lean LM-head
backward (`lm_head`), layer-input offloading (`offload`), and where a run ran out of GPU memory (`memory`).

`grpo rl` (through TRL's `rollout_func`, grpo_cli/train/rollout_func.py) and `grpo eval` sample through a `Sampler`,
so both draw completions the same way. The engine sits below the commands: it imports none of them, nor
the recipe or the trainer.
"""

from grpo_cli.engine.rollout import (
    EngineOptions,
    NonFiniteProbabilities,
    Sampler,
    Sampling,
    cannot_serve,
    distinct_rows,
    is_nonfinite_sampling,
    without_peft_wrapper,
)

__all__ = [
    "EngineOptions",
    "NonFiniteProbabilities",
    "Sampler",
    "Sampling",
    "cannot_serve",
    "distinct_rows",
    "is_nonfinite_sampling",
    "without_peft_wrapper",
]
