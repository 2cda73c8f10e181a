"""What float32 master weights change in learning: the same full fine-tuning of a model whose weights are stored in
bfloat16, four ways at each learning rate, then one `grpo eval` of every result on the same held-out problems:
- `dtype: bfloat16` with the optimizer updating float32 copies (`master_weights: true`, grpo's default there),
  rounded to the nearest bfloat16 value after each step, and rounded stochastically
  (`master_weights_rounding: stochastic`);
- `dtype: bfloat16` with the optimizer updating the bfloat16 weights in place (`master_weights: false`);
- `dtype: float32`, the weights and the optimizer in float32 with bfloat16 autocast where the machine has it (TRL's
  default set-up, at 16 bytes a parameter): the reference the copies should match.

    python benchmarks/master_weights.py --work /tmp/master --out benchmarks/results/cpu-2026-12-05/master-weights-sft.json

All four start from the same weights: the model loaded in bfloat16 and saved (`WORK/start`), as the Hub's
checkpoints are stored. That matters: an update smaller than half a bfloat16 unit rounds back to a weight that lies on
the bfloat16 grid, while weights between its points (the demo model's, converted from its 4-bit file to float32) round
up or down at random and so show even small updates at once. By default it runs the demo's cold start
(`demo/countdown-sft`, SmolLM2-135M-Instruct, 2-number Countdown) at its own learning rate (1e-4, cosine, 8 steps) and
at 2e-5 for 16 steps, on the CPU in about 27 minutes; `--model`, `--recipe`, `--lrs` and `--set KEY=VALUE` change
that (add `--set use_cpu=false` on a GPU). `benchmarks/bf16_rounding.py` counts the weights a single update leaves as
they were.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.time_to_accuracy import overrides_of


def grpo(*args: str) -> None:
    code = subprocess.run([sys.executable, "-m", "grpo_cli", *args], cwd=ROOT, check=False).returncode
    if code != 0:
        sys.exit(f"`grpo {args[0]}` exited with {code}; its output is above")


def losses(run: Path) -> list[float]:
    return [round(row["loss"], 4) for row in json.loads((run / "train_summary.json").read_text())["log_history"]
            if "loss" in row]


# (name, dtype, master_weights, master_weights_rounding): the set-ups trained at each learning rate
SETUPS = (
    ("bfloat16-master", "bfloat16", True, "nearest"),
    ("bfloat16-master-stochastic", "bfloat16", True, "stochastic"),
    ("bfloat16-in-place", "bfloat16", False, None),
    ("float32-mixed-precision", "float32", False, None),
)


def bfloat16_start(model: str, out: Path) -> Path:
    """`model` loaded in bfloat16 and saved to `out`: every set-up starts from weights on the bfloat16 grid."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_cli.models import resolve_model

    path = resolve_model(model)
    AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(path).save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a model name or folder")
    parser.add_argument("--recipe", default="demo/countdown-sft", help="an SFT recipe (full fine-tuning)")
    parser.add_argument("--lrs", default="1e-4:8,2e-5:16", help="learning rate:steps pairs, comma-separated")
    parser.add_argument("--eval-recipe", default="demo/countdown-rl", help="the recipe `grpo eval` scores with")
    parser.add_argument("--limit", type=int, default=48, help="held-out problems")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--set", nargs="*", default=[], help="KEY=VALUE overrides of the SFT recipe")
    args = parser.parse_args()

    start = bfloat16_start(args.model, args.work / "start")
    runs = []
    for pair in args.lrs.split(","):
        lr, _, steps = pair.partition(":")
        for name, dtype, master, rounding in SETUPS:
            folder = args.work / f"lr{lr}-{name}"
            grpo("sft", "-c", args.recipe, "--model_name_or_path", str(start), "--dtype", dtype,
                 *(["--master_weights", str(master).lower()] if dtype == "bfloat16" else []),
                 *(["--master_weights_rounding", rounding] if rounding else []),
                 "--learning_rate", lr, "--max_steps", steps, "--save_steps", steps, "--output_dir", str(folder),
                 "--no-resume", "--overwrite", *overrides_of(args.set))
            runs.append({"learning_rate": float(lr), "steps": int(steps), "setup": name, "dtype": dtype,
                         "master_weights": master, "rounding": rounding, "folder": folder, "loss": losses(folder)})
    eval_dir = args.work / "eval"
    models = [arg for folder in [start] + [run["folder"] for run in runs] for arg in ("--model", str(folder))]
    grpo("eval", "-c", args.eval_recipe, *models, "--dtype", "float32", "--limit", str(args.limit),
         "--batch-size", "16", "--output", str(eval_dir))
    scores = json.loads((eval_dir / "summary.json").read_text())["models"]
    for run, score in zip(runs, scores[1:], strict=True):
        run["accuracy"], run["format_rate"] = score["accuracy"], score["format_rate"]
        del run["folder"]

    print(f"the starting model: accuracy {scores[0]['accuracy']:.1%}, format {scores[0]['format_rate']:.1%}")
    print(f"{'learning rate':>13}  {'steps':>5}  {'set-up':<27}  {'first loss':>10}  {'last loss':>9}  "
          f"{'accuracy':>8}  {'format':>6}")
    for run in runs:
        print(f"{run['learning_rate']:>13g}  {run['steps']:>5}  {run['setup']:<27}  "
              f"{run['loss'][0]:>10.3f}  {run['loss'][-1]:>9.3f}  {run['accuracy']:>8.1%}  {run['format_rate']:>6.1%}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/master_weights.py " + " ".join(sys.argv[1:])
    result = {"command": command, "model": args.model, "recipe": args.recipe, "eval_recipe": args.eval_recipe,
              "problems": scores[0]["num_prompts"], "start": {"accuracy": scores[0]["accuracy"],
              "format_rate": scores[0]["format_rate"]}, "runs": runs}
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
