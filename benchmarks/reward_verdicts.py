"""Whether math answers get the same verdicts run after run: one batch of the DAPO-Math recipe's size (8 prompts x
8 completions, `tests/data/dapo_math_hard_completions.jsonl`: equations, intervals, tuples, sums, fractions) scored
by `grpo rewards score -c dapo-math` several times, each in a fresh process (so each pays math-verify's first,
slowest comparisons), on whatever else the machine is doing; the `dapo_answer` column of every run compared.

    python benchmarks/reward_verdicts.py --runs 10 --out benchmarks/results/cpu-DATE/reward-verdicts.json [--code DIR]

`--code DIR` scores with the grpo_cli of another checkout (e.g. `git archive` of an older commit) instead.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BATCH = ROOT / "tests" / "data" / "dapo_math_hard_completions.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", required=True)
    parser.add_argument("--code", help="a checkout whose grpo_cli scores instead of this one")
    parser.add_argument("--label", default="this checkout")
    args = parser.parse_args()
    env = dict(os.environ)
    code = Path(args.code).resolve() if args.code else ROOT  # `python -m` imports from its working folder first
    env["PYTHONPATH"] = str(code)
    rows = [json.loads(line) for line in BATCH.read_text().splitlines()]
    vectors, runs = [], []
    with tempfile.TemporaryDirectory() as work:
        for i in range(args.runs):
            out = Path(work) / f"run{i}.jsonl"
            started = time.monotonic()
            subprocess.run(
                [sys.executable, "-m", "grpo_cli", "rewards", "score", "-c", "dapo-math", "-i", str(BATCH), "-o",
                 str(out)],
                check=True, env=env, cwd=code, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            scores = [json.loads(line)["dapo_answer"] for line in out.read_text().splitlines()]
            vectors.append(tuple(scores))
            counts = collections.Counter(str(s) for s in scores)
            runs.append({"seconds": round(time.monotonic() - started, 1), "load_1min": round(os.getloadavg()[0], 2),
                         "verdicts": dict(counts)})
            print(f"run {i}: {runs[-1]['seconds']} s, load {runs[-1]['load_1min']}, {dict(counts)}", flush=True)
    changed = [j for j in range(len(rows)) if len({v[j] for v in vectors}) > 1]
    report = {
        "label": args.label,
        "batch": str(BATCH.relative_to(ROOT)),
        "completions": len(rows),
        "runs": runs,
        "distinct_verdict_vectors": len(set(vectors)),
        "rows_that_changed": [
            {"answer": rows[j]["completion"].rsplit("<SOLUTION>", 1)[-1].split("</SOLUTION>")[0],
             "gold": rows[j]["solution"], "verdicts": sorted({str(v[j]) for v in vectors})}
            for j in changed
        ],
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"{len(set(vectors))} distinct verdict vectors over {args.runs} runs; {len(changed)} rows changed")


if __name__ == "__main__":
    main()
