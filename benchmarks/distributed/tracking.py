"""Whether two `grpo rl` runs of the same recipe, seed and data train alike: their logged rewards step by step.

    python3 benchmarks/distributed/tracking.py --runs /tmp/plain /tmp/zero3 --names plain zero3 --out tracking.json

Reads each run folder's `train_summary.json` (its log history) and `rollouts.jsonl`, and writes one JSON: per step
each run's mean reward, per reward function and overall, step time, loss, gradient norm and share of completions
left out of the forward/backward (`frac_rows_skipped`, where logged); the steps whose rollouts were the same
completions; the difference of the runs' mean rewards over windows of steps (the noise of one step's mean over a
few dozen completions is large: windows say whether the curves track); the non-finite steps of each run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

WINDOW = 10  # steps per window of the curves' comparison


def run_log(folder: Path) -> dict:
    summary = json.loads((folder / "train_summary.json").read_text())
    steps = [entry for entry in summary["log_history"] if "reward" in entry]
    completions: dict[int, list[str]] = {}
    for line in (folder / "rollouts.jsonl").read_text(encoding="utf-8").split("\n"):
        if line.strip():
            row = json.loads(line)
            completions.setdefault(row["step"], []).append(row["completion"])
    return {
        "global_step": summary["global_step"],
        "non_finite_steps": summary.get("non_finite_steps", []),
        "skipped_steps": summary.get("skipped_steps", 0),
        "peak_gpu_memory_gib": summary.get("peak_gpu_memory_gib"),
        "steps": [
            {
                "step": entry["step"],
                "reward": entry["reward"],
                **{k.split("/")[1]: v for k, v in entry.items() if k.startswith("rewards/") and k.endswith("/mean")},
                "step_time": entry.get("step_time"),
                **{k: entry[k] for k in ("loss", "grad_norm", "frac_rows_skipped") if k in entry},
            }
            for entry in steps
        ],
        "completions": completions,
    }


def compare(runs: list[dict], names: list[str]) -> dict:
    a, b = runs
    steps = min(len(a["steps"]), len(b["steps"]))
    rewards = [[r["steps"][i]["reward"] for i in range(steps)] for r in runs]
    same = [step for step in sorted(a["completions"]) if a["completions"][step] == b["completions"].get(step)]
    windows = []
    for start in range(0, steps, WINDOW):
        means = [statistics.fmean(r[start : start + WINDOW]) for r in rewards]
        windows.append({"steps": f"{start + 1}-{min(steps, start + WINDOW)}", names[0]: means[0], names[1]: means[1]})
    return {
        "steps_compared": steps,
        "identical_rollout_steps": same,
        "first_step_with_other_completions": next((s for s in range(steps) if s not in same), None),
        "windows": windows,
        "largest_window_difference": max(abs(w[names[0]] - w[names[1]]) for w in windows),
        "mean_reward": {name: statistics.fmean(r) for name, r in zip(names, rewards)},
        "median_step_time_s": {
            name: statistics.median(s["step_time"] for s in run["steps"][1:] if s["step_time"] is not None)
            for name, run in zip(names, runs)
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs=2, required=True, type=Path)
    parser.add_argument("--names", nargs=2, default=["a", "b"])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    runs = [run_log(folder) for folder in args.runs]
    report = {
        "runs": {
            name: {k: v for k, v in run.items() if k != "completions"} for name, run in zip(args.names, runs)
        },
        "comparison": compare(runs, args.names),
    }
    args.out.write_text(json.dumps(report, indent=1))
    table = report["comparison"]
    print(json.dumps({k: v for k, v in table.items() if k != "identical_rollout_steps"}, indent=1), file=sys.stderr)


if __name__ == "__main__":
    main()
