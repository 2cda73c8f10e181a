"""A reward of one's own runs in a process of its own: whatever it does (exit, interrupt, ignore its time limit, end
its interpreter, return inf), scoring goes on, and the next batch gets it back."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from grpo_cli.rewards.guard import build_reward_funcs

DATA = Path(__file__).parent / "data"

REWARDS = """
import os, sys, time

CALLS = [0]

def exits(completions, **kwargs):
    sys.exit(3)

def interrupts(completions, **kwargs):
    raise KeyboardInterrupt

def stubborn(completions, **kwargs):
    end = time.time() + 60
    while time.time() < end:
        try:
            time.sleep(0.05)
        except BaseException:
            pass
    return [1.0] * len(completions)

def dies_once(completions, **kwargs):
    if not os.path.exists(os.environ["MARK"]):
        open(os.environ["MARK"], "w").close()
        os._exit(7)
    return [2.0] * len(completions)

def counts(completions, trainer_state=None, log_metric=None, **kwargs):
    CALLS[0] += 1
    log_metric("custom/calls", CALLS[0])
    log_metric("custom/step", trainer_state.global_step)
    return [float(len(c)) + CALLS[0] for c in completions]

def infinite(completions, **kwargs):
    return [float("inf"), 1.0][: len(completions)]
"""


def rewards_file(tmp_path: Path) -> Path:
    path = tmp_path / "rw.py"
    path.write_text(REWARDS)
    return path


def test_exit_interrupt_and_an_ended_process_score_the_failure_value_and_scoring_goes_on(tmp_path, monkeypatch):
    path = rewards_file(tmp_path)
    monkeypatch.setenv("MARK", str(tmp_path / "died"))
    exits, interrupts, dies_once = build_reward_funcs([f"{path}:exits", f"{path}:interrupts", f"{path}:dies_once"], 1.0)
    assert exits(completions=["a", "b"]) == [0.0, 0.0] and exits.exceptions == 2
    assert interrupts(completions=["a"]) == [0.0]
    assert dies_once(completions=["a", "b"]) == [0.0, 0.0]  # its process ended with the batch
    assert dies_once(completions=["a"]) == [2.0]  # a new process for the next batch
    assert dies_once.process.starts == 2


def test_a_reward_that_swallows_its_time_limit_is_stopped_in_time(tmp_path, monkeypatch):
    monkeypatch.setattr("grpo_cli.rewards.guard.MIN_BATCH_SECONDS", 1.0)
    (stubborn,) = build_reward_funcs([f"{rewards_file(tmp_path)}:stubborn"], 0.5)
    started = time.monotonic()
    assert stubborn(completions=["a", "b"]) == [0.0, 0.0]
    assert time.monotonic() - started < 10  # the batch's 1 s, and the process's start and stop
    assert stubborn.timeouts == 1


def test_columns_state_and_logged_metrics_cross_to_the_process_and_back(tmp_path):
    (counts,) = build_reward_funcs([f"{rewards_file(tmp_path)}:counts"], 1.0)
    metrics = []
    def log(name, value):
        metrics.append((name, value))

    from transformers import TrainerState

    state = TrainerState(global_step=7)
    assert counts(completions=["ab", "c"], log_metric=log, trainer_state=state) == [3.0, 2.0]
    assert counts(completions=["ab"], log_metric=log, trainer_state=state) == [4.0]  # its process lives on
    assert ("custom/calls", 2) in metrics and ("custom/step", 7) in metrics
    assert ("rewards/counts/failed_frac", 0.0) in metrics


def test_inf_from_a_reward_is_its_failure(tmp_path):
    (infinite,) = build_reward_funcs([f"{rewards_file(tmp_path)}:infinite"], 1.0)
    assert infinite(completions=["a", "b"]) == [0.0, 1.0] and infinite.bad_values == 1


def test_rewards_score_goes_on_past_a_reward_that_exits(tmp_path):
    path = rewards_file(tmp_path)
    out = tmp_path / "scored.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "rewards", "score", "-c", "countdown", "-i",
         str(DATA / "countdown_completions.jsonl"), "-o", str(out),
         "--reward_funcs", f"[{path}:exits, countdown_format]"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "raised SystemExit: 3" in proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(row["exits"] == 0.0 for row in rows)
    assert "│ exits " in proc.stderr and "11 │" in proc.stderr  # the failures column counts them
