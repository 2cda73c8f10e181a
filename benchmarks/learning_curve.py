"""Does grpo's rollout path learn like TRL's? The same GRPO run, rollouts from each, side by side over several seeds.

    python benchmarks/learning_curve.py --out benchmarks/results/cpu-2026-11-29/learning-curve.json  # about 2 minutes on 2 cores

Both arms are TRL's GRPOTrainer with the same model (grpo_bench's tiny random-weight Qwen2, SmolLM2 tokenizer), data,
reward, optimizer and seed; they differ only in who samples the completions: TRL's `model.generate` (`trl`) or
grpo's static-cache rollout function (`grpo`, grpo_cli/engine/rollout.py, the code `grpo rl` runs on a GPU, where
each decode step is also replayed from a CUDA graph). The reward is the share of vowels in the completion. Both
sample with torch.multinomial from the same probabilities and the same random state, so on the CPU the two arms
should draw the same tokens and so follow the same trajectory: the report gives each arm's reward at every step, the
largest difference between them, and the difference of the late-step means against the seed-to-seed spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.distributed.rewards import vowel_share
from benchmarks.grpo_bench import build_model, tokenizer_folder


def prompts_dataset(tokenizer, rows: int):
    from grpo_cli.arguments import TaskArguments
    from grpo_cli.models import render_prompt
    from grpo_cli.tasks import load_task_dataset

    task = TaskArguments(task="countdown", dataset_generate=rows, dataset_seed=0)
    data = load_task_dataset(task, task.dataset_train_split, seed=0)
    return data.map(
        lambda row: {"prompt": render_prompt(tokenizer, row["prompt"])}, remove_columns=["prompt"]
    )


def run_arm(arm: str, seed: int, args, model_dir: Path, tokenizer, data) -> list[float]:
    """Mean reward of each step of one GRPO run of the model saved in `model_dir`."""
    from trl import GRPOConfig, GRPOTrainer

    from grpo_cli.engine import Sampler
    from grpo_cli.train.rollout_func import StaticCacheRollout

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="grpo-curve-"),
        model_init_kwargs={"dtype": "float32"},
        per_device_train_batch_size=args.prompts * args.generations,
        num_generations=args.generations,
        max_completion_length=args.length,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=True,
        seed=seed,
        data_seed=seed,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=[vowel_share],
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        rollout_func=StaticCacheRollout(Sampler()) if arm == "grpo" else None,
    )
    trainer.train()
    return [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--length", type=int, default=24, help="completion tokens")
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--late", type=int, default=3, help="last steps whose mean reward is compared")
    parser.add_argument("--out", default="learning-curve.json")
    args = parser.parse_args(argv)

    import warnings

    import torch

    warnings.filterwarnings("ignore")
    from grpo_cli.models import load_tokenizer
    from grpo_cli.quiet import quiet_libraries

    quiet_libraries()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    work = Path(tempfile.mkdtemp(prefix="grpo-curve-"))
    tokenizer_dir = tokenizer_folder(None, work)
    tokenizer = load_tokenizer(str(tokenizer_dir))
    data = prompts_dataset(tokenizer, args.prompts * (args.steps + 1))
    curves: dict[str, list[list[float]]] = {"trl": [], "grpo": []}
    started = time.perf_counter()
    for seed in range(args.seeds):
        model_dir = work / f"model-{seed}"
        build_model("tiny", tokenizer_dir, model_dir, "cpu", seed=seed)
        for arm, runs in curves.items():
            curve = run_arm(arm, seed, args, model_dir, tokenizer, data)
            runs.append(curve)
            print(f"seed {seed} {arm}: first {curve[0]:.3f} last {curve[-1]:.3f}", file=sys.stderr)

    late = {arm: [statistics.mean(c[-args.late :]) for c in runs] for arm, runs in curves.items()}
    first = {arm: [c[0] for c in runs] for arm, runs in curves.items()}
    diffs = [g - t for g, t in zip(late["grpo"], late["trl"], strict=True)]
    spread = statistics.stdev(late["trl"] + late["grpo"]) if args.seeds > 1 else float("nan")
    report = {
        "command": "python benchmarks/learning_curve.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": vars(args),
        "seconds": round(time.perf_counter() - started, 1),
        "mean_curve": {
            arm: [statistics.mean(step) for step in zip(*runs, strict=True)] for arm, runs in curves.items()
        },
        "curves": curves,
        "first_step_reward": {arm: statistics.mean(v) for arm, v in first.items()},
        "late_reward": {arm: statistics.mean(v) for arm, v in late.items()},
        "late_reward_per_seed": late,
        "late_difference_grpo_minus_trl": statistics.mean(diffs),
        "late_difference_stderr": statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None,
        "late_reward_spread_across_runs": spread,
        "max_step_difference": max(
            abs(g - t)
            for grpo_curve, trl_curve in zip(curves["grpo"], curves["trl"], strict=True)
            for g, t in zip(grpo_curve, trl_curve, strict=True)
        ),
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(
        json.dumps(
            {
                k: report[k]
                for k in (
                    "first_step_reward",
                    "late_reward",
                    "late_difference_grpo_minus_trl",
                    "max_step_difference",
                )
            }
        ),
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
