"""Compare the two sides' reward curves in a grpo_bench JSON (a `--plan` of one `trl` and one `grpo` run, same seed):

    python benchmarks/curve_stats.py benchmarks/results/h200-x2-2026-11-30/learning-curve.json

Per side: the mean reward over the first and the last five logged steps, the least-squares slope per step, and the
mean over the run; between them: each step's difference in standard errors of a difference (each step's reward is a
mean over its completions, whose standard deviation the log holds) and the run's mean difference against its own.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path


def slope(values: list[float]) -> float:
    steps = range(len(values))
    mean_step, mean_value = statistics.fmean(steps), statistics.fmean(values)
    spread = sum((s - mean_step) ** 2 for s in steps)
    return sum((s - mean_step) * (v - mean_value) for s, v in zip(steps, values, strict=True)) / spread


def curve_stats(result: dict) -> dict:
    completions = result["per_step"]["prompts"] * result["per_step"]["generations"]
    sides = {r["side"]: r["logs"] for r in result["results"]}
    rewards = {side: [row["reward"] for row in logs] for side, logs in sides.items()}
    stds = {side: [row["reward_std"] for row in logs] for side, logs in sides.items()}
    steps = min(len(v) for v in rewards.values())
    errors = [
        math.sqrt((stds["trl"][i] ** 2 + stds["grpo"][i] ** 2) / completions) for i in range(steps)
    ]  # standard error of one step's difference
    differences = [rewards["grpo"][i] - rewards["trl"][i] for i in range(steps)]
    report = {
        side: {
            "first_5": statistics.fmean(values[:5]),
            "last_5": statistics.fmean(values[steps - 5 : steps]),
            "slope_per_step": slope(values[:steps]),
            "mean": statistics.fmean(values[:steps]),
        }
        for side, values in rewards.items()
    }
    report["steps"] = steps
    report["largest_difference_in_standard_errors"] = max(abs(d) / e for d, e in zip(differences, errors))
    report["median_standard_error"] = statistics.median(errors)
    mean_error = math.sqrt(sum(e**2 for e in errors)) / steps
    report["mean_difference"] = statistics.fmean(differences)
    report["mean_difference_in_standard_errors"] = report["mean_difference"] / mean_error
    return report


if __name__ == "__main__":
    print(json.dumps(curve_stats(json.loads(Path(sys.argv[1]).read_text())), indent=1))
