"""`grpo rl` under `accelerate launch` on CPU processes: two DDP-style processes keep one console, one rollouts file and
the same step count; one ZeRO-3 process (DeepSpeed on the CPU) saves whole weights, resumes and merges."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_cli.merge import merge_adapter
from tests.test_train import recipe_file, state

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_two_processes_train_like_one(tmp_path, tiny_model_dir):
    path = recipe_file(tmp_path, tiny_model_dir, "rl", "use_peft: true\nlora_r: 4\n")
    # accelerate 1.15 runs `--cpu --num_processes 2` as ONE process (its simple launcher); `--multi_gpu` starts two
    # through torchrun, and with no GPU grpo makes them one gloo (MULTI_CPU) group (`use_cpu`).
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
        "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "grpo_cli", "rl", "-c", str(path),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = tmp_path / "rl"
    # One console: the plan and each metrics line appear once, not once per process.
    assert run.stderr.count("Plan: rl") == 1
    assert run.stderr.count("step 1/2 |") == 1 and run.stderr.count("step 2/2 |") == 1
    # One rollouts file with the global batch of each step: 4 per device x 2 processes.
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 2 * 8
    assert sorted({r["step"] for r in rollouts}) == [0, 1]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["num_processes"] == 2
    assert state(out / "checkpoint-2")["global_step"] == 2  # the same final step count as one process
    assert (out / "adapter_model.safetensors").is_file()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch_zero3(recipe: Path, *overrides: str) -> subprocess.CompletedProcess:
    """One process under the shipped configs/accelerate/zero3.yaml, on the CPU."""
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs/accelerate/zero3.yaml"),
        "--num_processes", "1", "--mixed_precision", "no", "--main_process_port", str(_free_port()),
        "-m", "grpo_cli", "rl", "-c", str(recipe), "--use_cpu", "true", *overrides,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_zero3_saves_whole_weights_resumes_and_merges(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file

    initial = load_file(tiny_model_dir / "model.safetensors")
    full = recipe_file(tmp_path / "full", tiny_model_dir, "rl")
    _launch_zero3(full)
    out = tmp_path / "full" / "rl"
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
        "use_peft: true\nlora_r: 4\nlora_alpha: 8\ngradient_checkpointing: true\n"
        "gradient_checkpointing_kwargs: {use_reentrant: true}\n",
    )  # fmt: skip
    _launch_zero3(lora)
    adapter = load_file(tmp_path / "lora" / "rl" / "adapter_model.safetensors")
    assert adapter and all(t.numel() > 0 for t in adapter.values())
    assert all(t.abs().sum() > 0 for k, t in adapter.items() if "lora_B" in k)
    report = merge_adapter(tmp_path / "lora" / "rl", tmp_path / "merged")
    assert report.changed_modules == report.lora_modules > 0
