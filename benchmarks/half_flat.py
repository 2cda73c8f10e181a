"""A reward for timing steps where half the groups teach nothing: every other group of completions (the consecutive
completions of one prompt) gets one score, the others a different score for each of their completions.

    python3 benchmarks/grpo_bench.py --rewards benchmarks/half_flat.py:half_flat --plan ...

Random weights score every completion of the Countdown rewards 0, so all groups are flat; a real run sits between
(half its groups flat is common once a model solves half its prompts). The scores do not read the completions: both
sides of a pair get the same advantages.
"""

from __future__ import annotations


def half_flat(prompts, completions, **kwargs) -> list[float]:
    scores, group, index, previous = [], -1, 0, object()
    for prompt in prompts:
        if prompt != previous:
            group, index, previous = group + 1, 0, prompt
        scores.append(1.0 if group % 2 == 0 else float(index))
        index += 1
    return scores
