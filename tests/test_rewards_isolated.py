"""A reward of one's own runs in a process of its own: whatever it does (exit, interrupt, ignore its time limit, end
its interpreter, return inf), scoring goes on, and the next batch gets it back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


STARTS = """
import os, subprocess, sys, time

def started(when):
    sleeper = subprocess.Popen(["sleep", "300"])
    with open(os.environ["STARTED"], "a") as f:
        f.write(f"{when} {sleeper.pid} {os.getpid()}\\n")

started("import")

def starts(completions, **kwargs):
    started("call")
    return [1.0] * len(completions)

def starts_and_waits(completions, **kwargs):
    started("call")
    time.sleep(60)
    return [1.0] * len(completions)
"""


def _started(path: Path) -> list[tuple[str, int, int]]:
    """(when, sleep's pid, pid of the process that started it) for each line the reward module wrote."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [(when, int(pid), int(parent)) for when, pid, parent in (line.split() for line in lines)]


def _gone(pid: int, seconds: float = 5.0) -> bool:
    """Whether the process ended within `seconds` (a zombie awaiting its reaper counts as ended)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def _assert_all_stopped(started: list[tuple[str, int, int]]) -> None:
    left = [pid for _, pid, _ in started if not _gone(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes the reward module started outlived the command: {started}"


@pytest.mark.parametrize(
    "command",
    [
        ["rewards", "score", "-i", str(DATA / "countdown_completions.jsonl")],
        ["rewards", "test", "--rows", "2", "--dataset_name", str(DATA / "countdown.jsonl")],  # fails: exit code 2
    ],
)
def test_what_a_reward_module_starts_ends_with_the_command(tmp_path, monkeypatch, command):
    """At import and when scoring; the module runs only in the trial import's process and in the reward's own."""
    path = tmp_path / "starts.py"
    path.write_text(STARTS)
    monkeypatch.setenv("STARTED", str(tmp_path / "started"))
    errors = tmp_path / "stderr"  # a file: a pipe would stay open as long as what the module started lives
    with errors.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_cli", *command, "-c", "countdown",
             "--reward_funcs", f"[{path}:starts]", "--reward_weights", "[1]"],
            stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
        proc.wait(timeout=120)
    assert proc.returncode == (0 if command[1] == "score" else 2), errors.read_text()
    started = _started(tmp_path / "started")
    _assert_all_stopped(started)
    whens = [when for when, _, _ in started]
    assert whens[:2] == ["import", "import"] and set(whens[2:]) == {"call"}  # trial import, then reward's process
    assert proc.pid not in {parent for _, _, parent in started}


def test_what_a_reward_starts_ends_when_the_command_is_interrupted(tmp_path, monkeypatch):
    path = tmp_path / "starts.py"
    path.write_text(STARTS)
    record = tmp_path / "started"
    monkeypatch.setenv("STARTED", str(record))
    # Ctrl-C as in a terminal, also where the tests run in the background (a shell ignores SIGINT there, and the
    # command would inherit that): the command starts with SIGINT's default action
    as_in_a_terminal = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                        "os.execv(sys.executable, [sys.executable, '-m', 'grpo_cli', *sys.argv[1:]])")
    proc = subprocess.Popen(
        [sys.executable, "-c", as_in_a_terminal, "rewards", "score", "-c", "countdown",
         "-i", str(DATA / "countdown_completions.jsonl"),
         "--reward_funcs", f"[{path}:starts_and_waits]", "--reward_weights", "[1]"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        end = time.monotonic() + 60
        while "call" not in [when for when, _, _ in _started(record)] and time.monotonic() < end:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # Ctrl-C while the reward waits
        assert proc.wait(timeout=30) == 130
    finally:
        proc.kill()
    _assert_all_stopped(_started(record))


def test_resolving_a_reward_file_does_not_run_it_here(tmp_path, monkeypatch):
    path = tmp_path / "two.py"
    path.write_text(
        "import os\nopen(os.environ['IMPORTED'], 'a').write(f'{os.getpid()}\\n')\n"
        "from grpo_cli.rewards import reward\n"
        "@reward(name='capped', low=0.0, high=3.0)\n"
        "def capped(completions, **kwargs):\n    return [3.0] * len(completions)\n"
        "def plain(completions, **kwargs):\n    '''Always one.'''\n    return [1.0] * len(completions)\n"
    )
    monkeypatch.setenv("IMPORTED", str(tmp_path / "imported"))
    capped, plain = build_reward_funcs([f"{path}:capped", f"{path}:plain"], 1.0)
    assert (capped.spec.high, capped.spec.doc) == (3.0, "") and (plain.spec.high, plain.spec.doc) == (None, "Always one.")
    assert capped(completions=["a"]) == [3.0] and plain(completions=["a"]) == [1.0]
    capped.close()
    plain.close()
    importers = [int(pid) for pid in (tmp_path / "imported").read_text().split()]
    assert len(importers) == 4 and os.getpid() not in importers  # a trial import per function, and their processes
