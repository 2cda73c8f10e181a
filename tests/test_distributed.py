"""`grpo rl` under `accelerate launch` with two CPU processes: one console, one rollouts file, the same step count."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.test_train import recipe_file, state

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
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
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
