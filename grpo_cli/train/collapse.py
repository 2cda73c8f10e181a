"""Collapse that stays finite: the console says once when a run stops being rewarded with every completion cut at
the length limit, or when the policy's entropy falls near zero. Light to import (the console uses it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class CollapseWatch:
    """Says once, in one line, when a run collapses without a NaN: every completion cut at the length limit and none
    rewarded any more after some were, or the policy's entropy near zero. A state must hold for `hold` logs in a
    row; the line names the step it began."""

    hold: int = 3
    entropy_floor: float = 0.02
    _best: tuple[float, int] | None = None
    _since: dict[str, int] = field(default_factory=dict)  # the step each state began
    _count: dict[str, int] = field(default_factory=dict)  # logs in a row it has held
    _said: set[str] = field(default_factory=set)

    def update(self, step: int, logs: dict) -> list[str]:
        reward, std = finite_number(logs, "reward"), finite_number(logs, "reward_std")
        clipped, entropy = finite_number(logs, "completions/clipped_ratio"), finite_number(logs, "entropy")
        found = []
        if reward is not None and (self._best is None or reward > self._best[0]):
            self._best = (reward, step)
        truncated = (
            clipped is not None and clipped >= 0.99 and std is not None and std <= 1e-6
            and self._best is not None and reward is not None and self._best[0] > reward + 1e-6
        )
        if self._held("truncated", truncated, step):
            best, at = self._best
            found.append(
                f"collapse since step {self._since['truncated']}: every completion runs to the length limit and "
                f"none is rewarded any more (reward {reward:.3f}, best {best:.3f} at step {at}) - resume from a "
                "checkpoint before it with a lower learning_rate"
            )
        if self._held("entropy", entropy is not None and entropy < self.entropy_floor, step):
            found.append(
                f"entropy {entropy:.4f} since step {self._since['entropy']}: the policy samples almost one "
                "completion per prompt, so groups stop telling completions apart - a lower learning_rate or a "
                "higher temperature keeps it exploring"
            )
        return found

    def _held(self, name: str, holds: bool, step: int) -> bool:
        """Whether state `name` has now held `hold` logs in a row, for the first time in the run."""
        if not holds:
            self._since.pop(name, None)
            self._count.pop(name, None)
            return False
        self._since.setdefault(name, step)
        self._count[name] = self._count.get(name, 0) + 1
        if self._count[name] >= self.hold and name not in self._said:
            self._said.add(name)
            return True
        return False


def finite_number(logs: dict, key: str) -> float | None:
    """The log's value for `key` when it is a finite number, else None."""
    value = logs.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
