"""`grpo rl` under `accelerate launch` on CPU processes: two DDP-style processes keep one console, one rollouts file and
the same step count; one ZeRO-3 process (DeepSpeed on the CPU) saves whole weights, resumes and merges; grpo's sampler
(`rollout_engine: grpo`, which runs on the CPU too when asked) samples the same completions under ZeRO-3, with its
weights gathered, as without DeepSpeed, on one process and on two."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_cli.merge import merge_adapter
from tests.test_train import recipe_file, state, train

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch_zero3(recipe: Path, *overrides: str, processes: int = 1) -> subprocess.CompletedProcess:
    """`processes` processes under the shipped configs/accelerate/zero3.yaml, on the CPU."""
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs/accelerate/zero3.yaml"),
        "--num_processes", str(processes), "--mixed_precision", "no", "--main_process_port", str(_free_port()),
        "-m", "grpo_cli", "rl", "-c", str(recipe), "--use_cpu", "true", *overrides,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def _launch_ddp(recipe: Path, *overrides: str) -> subprocess.CompletedProcess:
    """Two DDP processes on the CPU. accelerate 1.15 runs `--cpu --num_processes 2` as ONE process (its simple
    launcher); `--multi_gpu` starts two through torchrun, and with no GPU grpo makes them one gloo (MULTI_CPU)
    group (`use_cpu`)."""
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
        "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
        "-m", "grpo_cli", "rl", "-c", str(recipe), *overrides,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def rollouts(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines()]


def same_rollouts(a: list[dict], b: list[dict]) -> bool:
    """Step for step the same completions with the same rewards, in the same order."""
    keys = ("step", "prompt", "completion", "rewards")
    return [tuple(str(r[k]) for k in keys) for r in a] == [tuple(str(r[k]) for k in keys) for r in b]


SAMPLER = "rollout_engine: grpo\n"


def test_two_processes_train_like_one_and_sample_alike_under_ddp_and_zero3(tmp_path, tiny_model_dir):
    """Two DDP processes keep one console, one rollouts file and the one process's step count. With grpo's sampler,
    each process sampling its own prompts, two ZeRO-3 processes (the weights and adapters gathered from two shards)
    give the same completions and rewards as DDP, step for step. Against one process of the same seed each step
    trains on the same prompts; the completions differ, as each process draws from its own random stream. The ZeRO-3
    processes train with `packed_forward` (the same gradients as DDP's padded batches: no dropout to draw apart)."""
    lora = "use_peft: true\nlora_r: 4\nlora_dropout: 0.0\ngradient_checkpointing_kwargs: {use_reentrant: true}\n"
    # reentrant checkpointing (LoRA under ZeRO-3 needs it) with DDP needs DDP told that every parameter is used
    path = recipe_file(tmp_path, tiny_model_dir, "rl", lora + "ddp_find_unused_parameters: false\n" + SAMPLER)
    run = _launch_ddp(path)
    out = tmp_path / "rl"
    # One console: the plan and each metrics line appear once, not once per process.
    assert run.stdout.count("Plan: rl") == 1
    assert run.stderr.count("step 1/2 |") == 1 and run.stderr.count("step 2/2 |") == 1
    assert "rollouts through TRL's generation" not in run.stderr
    # One rollouts file with the global batch of each step: 4 per device x 2 processes.
    ddp_rows = rollouts(out)
    assert len(ddp_rows) == 2 * 8
    assert sorted({r["step"] for r in ddp_rows}) == [0, 1]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["num_processes"] == 2
    assert state(out / "checkpoint-2")["global_step"] == 2  # the same final step count as one process
    assert (out / "adapter_model.safetensors").is_file()
    assert len({r["rewards"]["vowel_share"] for r in ddp_rows}) > 1  # the rewards varied: the adapters moved

    zero3 = _launch_zero3(path, "--output_dir", str(tmp_path / "zero3"), "--packed_forward", "true", processes=2)
    assert "ran padded" not in zero3.stderr
    assert same_rollouts(ddp_rows, rollouts(tmp_path / "zero3"))
    one = rollouts(train(path, "rl", ["--output_dir", str(tmp_path / "one"), "--per_device_train_batch_size", "8"]))
    for step in range(2):
        assert sorted(r["prompt"] for r in one if r["step"] == step) == sorted(
            r["prompt"] for r in ddp_rows if r["step"] == step
        )


PARITY = """
def by_target(completions, target, **kwargs):
    # every completion of an even target scores 1.0 (a flat group), of an odd one its place in the group
    return [1.0 if int(t) % 2 == 0 else float(i) for i, t in enumerate(target)]
"""


@pytest.mark.parametrize("launcher", ["ddp", "zero3"])
def test_two_processes_leave_out_different_numbers_of_rows_and_train_as_without(tmp_path, tiny_model_dir, launcher):
    """`skip_zero_advantage` and `pack_micro_batches` with two micro-batches of 4 a step and two groups per process,
    flat on one process and not the other at some steps: each process trains as many rows in each micro-batch as the
    other (TRL gathers one value per row for its metrics), DDP leaves the same micro-batches out on both, and the run
    samples, scores and trains as the one that trains every row in TRL's micro-batches."""
    (tmp_path / "parity.py").write_text(PARITY)
    # float32 throughout: bfloat16 autocast rounds each micro-batch's weight gradients, and the rows are regrouped
    path = recipe_file(tmp_path, tiny_model_dir, "rl", SAMPLER + "gradient_accumulation_steps: 2\nbf16: false\n")
    runs = {}
    for skip in ("true", "false"):
        out = tmp_path / f"skip-{skip}"
        overrides = ("--output_dir", str(out), "--reward_funcs", f"{tmp_path / 'parity.py'}:by_target",
                     "--max_steps", "3", "--skip_zero_advantage", skip, "--pack_micro_batches", skip)  # fmt: skip
        _launch_ddp(path, *overrides) if launcher == "ddp" else _launch_zero3(path, *overrides, processes=2)
        runs[skip] = out
    assert same_rollouts(rollouts(runs["true"]), rollouts(runs["false"]))
    logs = {skip: [e for e in json.loads((out / "train_summary.json").read_text())["log_history"] if "reward" in e]
            for skip, out in runs.items()}
    for on, off in zip(logs["true"], logs["false"]):
        assert on["loss"] == pytest.approx(off["loss"], rel=1e-6, abs=1e-9)
        assert on["grad_norm"] == pytest.approx(off["grad_norm"], rel=1e-6, abs=1e-9)
    flat = [e["frac_reward_zero_std"] for e in logs["true"]]
    assert any(0 < share < 1 for share in flat), flat  # some groups flat, others not
    # a process keeps as many rows as the other: a step leaves rows out where both had a flat group, none where no
    # group was flat. DDP leaves a whole micro-batch of each process's two out (4 of 8 rows); DeepSpeed trains a row
    # in it (3 of 8 left out).
    skipped = [e["frac_rows_skipped"] for e in logs["true"]]
    assert max(skipped) == (0.5 if launcher == "ddp" else 0.375), skipped
    assert all(s == 0 for s, f in zip(skipped, flat) if f == 0), skipped


def test_zero3_saves_whole_weights_resumes_and_merges(tmp_path, tiny_model_dir):
    """With grpo's sampler, whose rollouts under ZeRO-3 read the weights gathered from their shards: the same
    completions and rewards step for step as the same recipe without DeepSpeed (full fine-tuning and LoRA)."""
    from safetensors.torch import load_file

    initial = load_file(tiny_model_dir / "model.safetensors")
    full = recipe_file(tmp_path / "full", tiny_model_dir, "rl", SAMPLER)
    run = _launch_zero3(full)
    assert "rollouts through grpo's sampler: the ZeRO-3 weights gathered once per generation batch" in run.stderr
    out = tmp_path / "full" / "rl"
    plain = train(full, "rl", ["--output_dir", str(tmp_path / "full-plain")])
    assert len(rollouts(out)) == 2 * 4 and same_rollouts(rollouts(out), rollouts(plain))
    assert (out / "checkpoint-2" / "global_step2").is_dir()  # DeepSpeed's sharded state: it did run ZeRO-3
    for folder in (out / "checkpoint-2", out):
        saved = load_file(folder / "model.safetensors")
        # every tensor at full shape: gathered from the shards (an ungathered ZeRO-3 save holds empty tensors)
        assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in initial.items()}
    assert any(not saved[k].equal(initial[k]) for k in initial)
    resumed = _launch_zero3(full, "--max_steps", "3")
    assert "resuming from" in resumed.stderr and "step 3/3" in resumed.stderr
    assert state(out / "checkpoint-3")["global_step"] == 3

    lora = recipe_file(
        tmp_path / "lora", tiny_model_dir, "rl",
        "use_peft: true\nlora_r: 4\nlora_alpha: 8\nlora_target_modules: all-linear\ngradient_checkpointing: true\n"
        + SAMPLER,
    )  # fmt: skip: the checkpointing left to TRL, which makes it reentrant under ZeRO-3 (as recipes/countdown.yaml)
    _launch_zero3(lora)
    plain = train(lora, "rl", ["--output_dir", str(tmp_path / "lora-plain")])
    # the adapters gathered too, each folded into the decode steps (q/k/v merged, gate and up from one product with A)
    assert same_rollouts(rollouts(tmp_path / "lora" / "rl"), rollouts(plain))
    adapter = load_file(tmp_path / "lora" / "rl" / "adapter_model.safetensors")
    assert adapter and all(t.numel() > 0 for t in adapter.values())
    assert all(t.abs().sum() > 0 for k, t in adapter.items() if "lora_B" in k)
    report = merge_adapter(tmp_path / "lora" / "rl", tmp_path / "merged")
    assert report.changed_modules == report.lora_modules > 0

