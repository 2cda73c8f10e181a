"""Held-out accuracy against wall-clock minutes: a plain TRL script and `grpo rl` train the same model on the same
task, data, rewards and seed for the same time budget; `grpo eval` scores the checkpoints saved at fixed minutes.

    # on one GPU, the whole measurement of one model in one command (the steps below, one after the other):
    python3 benchmarks/time_to_accuracy.py run --recipe demo/countdown-rl --model /tmp/sft --name SmolLM2-135M-Instruct \\
        --minutes 4 --marks 1,2,4 --work /tmp/tta --limit 200 --out results.json --set per_device_train_batch_size=64 ...
    # or step by step, per side (each in its own process; the clock starts when the process does):
    python3 benchmarks/time_to_accuracy.py train --side grpo --recipe demo/countdown-rl --model /tmp/sft \\
        --minutes 4 --marks 1,2,4 --work /tmp/tta/grpo --set per_device_train_batch_size=64 ...
    python3 benchmarks/time_to_accuracy.py train --side trl  ... --work /tmp/tta/trl   (the same options)
    # every checkpoint of both sides and the starting model in one `grpo eval`, then the runs' JSON:
    python3 benchmarks/time_to_accuracy.py eval --recipe demo/countdown-rl --model /tmp/sft --name SmolLM2-135M-Instruct \\
        --runs /tmp/tta/grpo /tmp/tta/trl --limit 200 --out results.json --set ...
    # here: merge the runs' JSON files into one and draw accuracy against minutes, one panel per model and task
    python3 benchmarks/time_to_accuracy.py plot --inputs a.json b.json --out benchmarks/results/h200-DATE/time-to-accuracy.json \\
        --png benchmarks/results/h200-DATE/time-to-accuracy.png

`trl` is TRL's GRPOTrainer as its own scripts use it: the library's defaults except the keys that define the GRPO
work (`WORK_KEYS`, read from the same resolved recipe: learning rate and schedule, prompts and generations per step,
completion length, temperature, KL and loss type, reward weights, LoRA, seed), bf16 weights, the same rendered
prompts and the same reward functions. `grpo` is `grpo rl` through its own entry point with the project's defaults.
Both get one callback from here that saves a checkpoint when the clock passes a mark and stops training at the
budget; the time spent writing those checkpoints is taken off the clock (a run saves when its recipe says, not at
these minutes). A step counts as non-finite when its logged loss or gradient norm is NaN or inf.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path

STARTED = time.time()  # the clock of a `train` process: model loading and compilation count

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The keys that define the GRPO work: the TRL side takes them from the resolved recipe; all else is TRL's default.
WORK_KEYS = (
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "beta",
    "loss_type",
    "num_generations",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_completion_length",
    "temperature",
    "reward_weights",
    "max_steps",
    "seed",
)


def overrides_of(pairs: list[str]) -> list[str]:
    """`key=value` pairs as the command-line overrides a recipe takes."""
    tokens = []
    for pair in pairs:
        key, _, value = pair.partition("=")
        tokens += [f"--{key}", value]
    return tokens


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def clock_callback(marks: list[float], budget: float, record: Path, last_step: int | None = None):
    """A TrainerCallback that saves a checkpoint at each mark (minutes on the clock) and stops at the budget (or, with
    `last_step`, at that step if it comes first: runs compared per step), writing what it saved, and each step's
    finiteness, to `record` (JSON, rewritten each time)."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self):
            self.paused = 0.0  # seconds spent saving this callback's checkpoints
            self.pending = None
            self.state = {"marks": [], "non_finite_steps": [], "steps": 0, "status": "training"}

        def minutes(self) -> float:
            return (time.time() - STARTED - self.paused) / 60

        def on_step_end(self, args, state, control, **kwargs):
            now = self.minutes()
            self.state["steps"] = state.global_step
            due = [m for m in marks if m <= now and m not in {e["minutes"] for e in self.state["marks"]}]
            if now >= budget:
                control.should_training_stop = True
                due = due or ([budget] if budget not in {e["minutes"] for e in self.state["marks"]} else [])
            elif last_step is not None and state.global_step >= last_step:
                control.should_training_stop = True
                due = due or [round(now, 3)]
            if due:
                control.should_save = True
                self.pending = {"minutes": max(due), "clock": round(now, 3), "step": state.global_step,
                                "checkpoint": f"checkpoint-{state.global_step}", "started": time.time()}
                for m in due[:-1]:  # marks passed within one step share its checkpoint
                    self.state["marks"].append({**self.pending, "minutes": m})
            self._write()

        def on_save(self, args, state, control, **kwargs):
            if self.pending is None:
                return
            entry = self.pending
            self.pending = None
            self.paused += time.time() - entry.pop("started")
            self.state["marks"] = [{k: v for k, v in e.items() if k != "started"} for e in self.state["marks"]]
            self.state["marks"].append(entry)
            self._write()

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            bad = any(k in logs and not finite(logs[k]) for k in ("loss", "grad_norm"))
            if bad and state.global_step not in self.state["non_finite_steps"]:
                self.state["non_finite_steps"].append(state.global_step)
                self._write()

        def _write(self):
            record.write_text(json.dumps(self.state, indent=1))

    return Clock()


def train(args) -> None:
    from grpo_cli.recipe import load_recipe

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    record = work / "clock.json"
    marks = sorted(float(m) for m in args.marks.split(","))
    clock = clock_callback(marks, args.minutes, record, args.last_step)
    overrides = overrides_of(args.set) + [
        "--model_name_or_path", args.model, "--output_dir", str(work / "run"),
        # the clock saves and stops: no other checkpoint, none deleted, and steps enough for any budget
        "--save_steps", "1000000", "--save_total_limit", "1000", "--max_steps", str(args.max_steps),
    ]
    recipe = load_recipe(args.recipe, overrides, "rl")
    (work / "command.json").write_text(json.dumps({
        "side": args.side, "seed": recipe.resolved()["seed"],
        "command": " ".join(["python3", "benchmarks/time_to_accuracy.py", *sys.argv[1:]]),
    }))
    (train_grpo if args.side == "grpo" else train_trl)(recipe, clock)
    clock.state["status"] = "done"
    clock._write()


def train_grpo(recipe, clock) -> None:
    from grpo_cli.train import run
    from grpo_cli.train.rl import run_rl

    callbacks = run.TrainingRun.callbacks
    run.TrainingRun.callbacks = lambda self: [clock, *callbacks(self)]  # first: the guard keeps the last word
    run_rl(recipe, resume=False, overwrite=True)


def train_trl(recipe, clock) -> None:
    """The plain TRL script: GRPOTrainer, its defaults, the recipe's GRPO work keys."""
    import torch
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer, get_peft_config

    from grpo_cli.models import render_prompt
    from grpo_cli.recipe import reward_names
    from grpo_cli.rewards import build_reward_funcs, conversational
    from grpo_cli.tasks import load_task_dataset

    values = recipe.resolved()
    cuda = torch.cuda.is_available()
    tokenizer = AutoTokenizer.from_pretrained(values["model_name_or_path"])
    rows = load_task_dataset(recipe.task, recipe.task.dataset_train_split, seed=values["seed"])
    prompts = rows.map(lambda row: {"prompt": render_prompt(tokenizer, row["prompt"]), "prompt_messages": row["prompt"]})
    config = GRPOConfig(
        output_dir=values["output_dir"],
        model_init_kwargs={"dtype": "bfloat16" if cuda else "float32"},
        bf16=cuda,
        use_cpu=not cuda,
        report_to="none",
        save_strategy="no",  # the clock saves
        logging_steps=1,
        **{key: values[key] for key in WORK_KEYS if values.get(key) is not None},
    )
    trainer = GRPOTrainer(
        model=values["model_name_or_path"],
        reward_funcs=[conversational(f) for f in build_reward_funcs(reward_names(recipe), 10.0, params=values)],
        args=config,
        train_dataset=prompts,
        processing_class=tokenizer,
        peft_config=get_peft_config(recipe.model_config()),
        callbacks=[clock],
    )
    trainer.train()


def evaluate(args) -> None:
    """One `grpo eval` over the starting model and every side's checkpoints; writes the runs in the published form."""
    sides = []
    models = [args.model]
    for folder in args.runs:
        state = json.loads((Path(folder) / "clock.json").read_text())
        sides.append((folder, state))
        models += [str(Path(folder) / "run" / entry["checkpoint"]) for entry in state["marks"]]
    out_dir = Path(args.eval_dir)
    command = [sys.executable, "-m", "grpo_cli", "eval", "-c", args.recipe, "--limit", str(args.limit),
               "--batch-size", str(args.batch_size), "--output", str(out_dir)]
    for model in dict.fromkeys(models):
        command += ["--model", model]
    # the training keys grpo eval does not read are left to training (it refuses num_generations: its k is -k)
    keys = [pair for pair in args.set if pair.partition("=")[0] not in ("num_generations",)]
    code = subprocess.run(command + overrides_of(keys), check=False).returncode
    if code != 0:
        sys.exit(f"`grpo eval` exited with {code}; its output is above")
    summary = json.loads((out_dir / "summary.json").read_text())
    scores = dict(zip(dict.fromkeys(models), summary["models"], strict=True))

    def point(minutes, step, model):
        return {"minutes": minutes, "step": step, "accuracy": scores[model]["accuracy"],
                "format_rate": scores[model]["format_rate"]}

    runs = []
    for folder, state in sides:
        meta = json.loads((Path(folder) / "command.json").read_text())
        curve = [point(0.0, 0, args.model)]
        curve += [point(e["minutes"], e["step"], str(Path(folder) / "run" / e["checkpoint"])) for e in state["marks"]]
        runs.append({
            "model": args.name,
            "task": args.task,
            "problems": summary["models"][0]["num_prompts"],
            "side": meta["side"],
            "seed": meta["seed"],
            "steps": state["steps"],
            "non_finite_steps": len(state["non_finite_steps"]),
            "curve": curve,
            "command": meta["command"],
        })
    Path(args.out).write_text(json.dumps({"runs": runs, "eval": {"limit": args.limit, "decoding": "greedy"}}, indent=1))
    for run in runs:
        points = ", ".join(f"{p['minutes']:g} min {100 * p['accuracy']:.1f}%" for p in run["curve"])
        print(f"{run['model']} {run['side']}: {run['steps']} steps, non-finite {run['non_finite_steps']}: {points}")


def run_all(args) -> None:
    """Both sides, each in its own process with its own clock, one after the other; then the eval of both."""
    work = Path(args.work)
    for side, marks in (("grpo", args.marks), ("trl", args.trl_marks or args.marks)):
        command = [sys.executable, __file__, "train", "--side", side, "--recipe", args.recipe, "--model", args.model,
                   "--minutes", str(args.minutes), "--marks", marks, "--work", str(work / side), "--set", *args.set]
        print(f"== {side}: {args.minutes:g} minutes, marks {marks}", flush=True)
        code = subprocess.run(command, check=False).returncode
        if code != 0:
            sys.exit(f"the {side} side exited with {code}; its output is above, its files in {work / side}")
    args.runs = [str(work / "grpo"), str(work / "trl")]
    args.eval_dir = str(work / "eval")
    evaluate(args)


def plot(args) -> None:
    """Merge the runs' JSON files and draw accuracy against minutes, one panel per model and task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [run for path in args.inputs for run in json.loads(Path(path).read_text())["runs"]]
    Path(args.out).write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    panels = list(dict.fromkeys((run["model"], run["task"]) for run in runs))
    columns = min(len(panels), 2)
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 3.8 * rows), squeeze=False)
    colours = {"trl": "tab:gray", "grpo": "tab:blue"}
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (model, task) in zip(axes.flat, panels, strict=False):
        mine = [r for r in runs if (r["model"], r["task"]) == (model, task)]
        for run in mine:
            xs = [p["minutes"] for p in run["curve"]]
            ys = [100 * p["accuracy"] for p in run["curve"]]
            # one standard error of a share measured on `problems` held-out problems
            errors = [100 * math.sqrt(p["accuracy"] * (1 - p["accuracy"]) / run["problems"]) for p in run["curve"]]
            label = "plain TRL" if run["side"] == "trl" else "grpo rl"
            ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, color=colours[run["side"]],
                        label=f"{label} ({run['steps']} steps in {xs[-1]:g} min)")
        ax.set_title(f"{model}\n{textwrap.fill(task, 60)}", fontsize=9)
        ax.set_xlabel("training minutes (one H200)")
        ax.set_ylabel(f"held-out accuracy, greedy, {mine[0]['problems']} problems (%)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.out} and {args.png}")


def main() -> None:
    # the options the commands share: the starting point, the clock, the scoring
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--recipe", required=True)
    shared.add_argument("--model", required=True, help="the model both sides start from")
    shared.add_argument("--set", nargs="*", default=[], help="recipe keys, key=value, the same for both sides")
    clock = argparse.ArgumentParser(add_help=False)
    clock.add_argument("--minutes", type=float, required=True, help="the time budget of a side")
    clock.add_argument("--marks", required=True, help="minutes at which a side saves a checkpoint, e.g. 1,2,4")
    clock.add_argument("--work", required=True, help="where a side writes (`run`: grpo/, trl/ and eval/ in it)")
    scoring = argparse.ArgumentParser(add_help=False)
    scoring.add_argument("--name", required=True, help="the model's name in the results")
    scoring.add_argument("--task", default="countdown")
    scoring.add_argument("--limit", type=int, default=200)
    scoring.add_argument("--batch-size", type=int, default=64)
    scoring.add_argument("--out", required=True)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("train", parents=[shared, clock])
    t.add_argument("--side", choices=("grpo", "trl"), required=True)
    t.add_argument("--max-steps", type=int, default=100000, help="more than the budget allows (the lr schedule's length)")
    t.add_argument("--last-step", type=int, help="also stop and save at this step (runs compared per step)")
    e = sub.add_parser("eval", parents=[shared, scoring])
    e.add_argument("--runs", nargs="+", required=True, help="the --work folders of `train`")
    e.add_argument("--eval-dir", default="/tmp/tta-eval")
    r = sub.add_parser("run", parents=[shared, clock, scoring], help="train both sides, then eval: one model")
    r.add_argument("--trl-marks", help="the TRL side's own marks (default: --marks)")
    p = sub.add_parser("plot")
    p.add_argument("--inputs", nargs="+", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--png", required=True)
    args = parser.parse_args()
    from grpo_cli.errors import UserError

    try:
        if args.what == "train":
            train(args)
        elif args.what == "eval":
            evaluate(args)
        elif args.what == "run":
            run_all(args)
        else:
            plot(args)
    except UserError as err:  # a bad model path, recipe key or value: the message `grpo` gives, no traceback
        from grpo_cli.console import print_problems

        print_problems(err.problems)
        sys.exit(2)


if __name__ == "__main__":
    main()
