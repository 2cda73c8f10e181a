"""Distributed launch: process counts, re-launching through accelerate, launcher warnings, shipped scripts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_cli import launch
from grpo_cli.errors import UserError
from grpo_cli.launch import (
    accelerate_config_from_env,
    accelerate_config_path,
    is_launched,
    is_main_process,
    launch_warnings,
    load_accelerate_config,
    num_processes,
    rank_prefix,
    relaunch_command,
    run_relaunch,
    should_relaunch,
    strip_launch_options,
)

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs" / "accelerate"
SCRIPTS = REPO / "scripts"
ENV_VARS = ["WORLD_SIZE", "RANK", "LOCAL_RANK", *launch.LAUNCHER_VARIABLES, "ACCELERATE_MIXED_PRECISION"]


@pytest.fixture(autouse=True)
def not_launched(monkeypatch):
    """Tests start outside any launcher, on a machine showing 8 GPUs, whatever ran pytest."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "accelerate.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


# --- num_processes ------------------------------------------------------------------------------------------


def test_num_processes_precedence(tmp_path, monkeypatch):
    config = write_config(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: 4\n")
    assert num_processes(None, None) == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert num_processes(None, None) == 2
    assert num_processes(config, None) == 4
    assert num_processes(config, 3) == 3
    assert num_processes(None, 5) == 5


def test_num_processes_of_multinode_config_is_the_total():
    # accelerate starts num_processes / num_machines per machine: the file counts every machine already
    assert num_processes("zero3_multinode", None) == 16


def test_num_processes_rejects_bad_values(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="--num-processes 0"):
        num_processes(None, 0)
    unset = write_config(tmp_path, "distributed_type: DEEPSPEED\nnum_processes: -1\n")
    with pytest.raises(UserError, match="num_processes` is not set"):
        num_processes(unset, None)
    monkeypatch.setenv("WORLD_SIZE", "6")
    assert num_processes(unset, None) == 6
    monkeypatch.setenv("WORLD_SIZE", "many")
    with pytest.raises(UserError, match="WORLD_SIZE"):
        num_processes(None, None)


def test_single_process_config_without_count_is_one(tmp_path):
    assert num_processes(write_config(tmp_path, "distributed_type: 'NO'\n"), None) == 1


# --- accelerate config files --------------------------------------------------------------------------------


def test_shipped_config_names_resolve(tmp_path):
    assert accelerate_config_path("zero3") == CONFIGS / "zero3.yaml"
    assert accelerate_config_path("zero3_offload.yaml") == CONFIGS / "zero3_offload.yaml"
    own = write_config(tmp_path, "distributed_type: 'NO'\n")
    assert accelerate_config_path(own) == Path(own).resolve()
    with pytest.raises(UserError, match="zero3_offload"):  # the message lists the shipped names
        accelerate_config_path("zero4")


def test_load_accelerate_config(tmp_path):
    assert load_accelerate_config("zero3")["deepspeed_config"]["zero_stage"] == 3
    assert load_accelerate_config(None) is None  # not launched, no file
    with pytest.raises(UserError, match="not valid YAML"):
        load_accelerate_config(write_config(tmp_path, "distributed_type: [\n"))
    with pytest.raises(UserError, match="YAML mapping"):
        load_accelerate_config(write_config(tmp_path, "- a list\n"))


def test_config_read_back_from_the_launchers_environment(monkeypatch):
    """What accelerate's DeepSpeed launcher puts in each process's environment reads back as the config."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    args = launch_command_parser().parse_args(
        ["--config_file", str(CONFIGS / "zero3_offload.yaml"), "-m", "grpo_cli"]
    )
    args, defaults, _ = _validate_launch_command(args)
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
    _, env = prepare_deepspeed_cmd_env(args)
    env = {**env, "WORLD_SIZE": "2", "LOCAL_RANK": "0", "RANK": "0"}  # what torchrun adds
    config = accelerate_config_from_env(env)
    assert config["distributed_type"] == "DEEPSPEED"
    assert config["num_processes"] == 2 and config["mixed_precision"] == "bf16"
    assert config["deepspeed_config"] == {
        "zero_stage": 3,
        "offload_optimizer_device": "cpu",
        "offload_param_device": "cpu",
        "zero3_init_flag": True,
        "zero3_save_16bit_model": True,
    }
    assert accelerate_config_from_env({"PATH": "/bin"}) is None
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    assert load_accelerate_config(None)["deepspeed_config"]["zero_stage"] == 3


# --- launched or not, ranks ---------------------------------------------------------------------------------


def test_is_launched_and_should_relaunch(monkeypatch):
    assert not is_launched()
    assert should_relaunch(2, None) and should_relaunch(None, "zero3")
    assert not should_relaunch(None, None)
    monkeypatch.setenv("ACCELERATE_LOG_LEVEL", "info")  # people export this: it is no launcher
    assert not is_launched()
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert is_launched()
    assert not should_relaunch(2, "zero3")  # never recursively
    assert is_launched({"ACCELERATE_USE_CPU": "False"})  # accelerate's single-process launcher


def test_ranks_from_environment(monkeypatch):
    assert is_main_process() and rank_prefix() == ""
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "5")  # second machine: the global rank decides
    assert not is_main_process()
    assert rank_prefix() == "[rank 5] "
    monkeypatch.setenv("RANK", "0")
    assert is_main_process() and rank_prefix() == "[rank 0] "


# --- relaunch -----------------------------------------------------------------------------------------------


def test_strip_launch_options_in_every_form():
    argv = [
        "rl",
        "--config",
        "c.yaml",
        "--num-processes",
        "4",
        "--accelerate-config=zero3",
        "--max_steps",
        "5",
    ]
    assert strip_launch_options(argv) == ["rl", "--config", "c.yaml", "--max_steps", "5"]
    argv = ["rl", "--accelerate-config", "zero3", "--num-processes=2", "--", "--num-processes", "9"]
    assert strip_launch_options(argv) == ["rl", "--", "--num-processes", "9"]


def test_relaunch_command_is_an_accelerate_launch_of_the_same_grpo_command():
    from accelerate.commands.launch import launch_command_parser

    argv = [
        "rl",
        "--config",
        "countdown",
        "--num-processes",
        "2",
        "--accelerate-config",
        "zero3",
        "--seed",
        "1",
    ]
    cmd = relaunch_command(argv, 2, "zero3")
    assert cmd[:3] == [sys.executable, "-m", "grpo_cli.launch"]
    assert cmd[3:] == [
        "--config_file", str(CONFIGS / "zero3.yaml"), "--num_processes", "2",
        "-m", "grpo_cli", "rl", "--config", "countdown", "--seed", "1",
    ]  # fmt: skip
    args = launch_command_parser().parse_args(cmd[3:])
    assert args.config_file == str(CONFIGS / "zero3.yaml") and args.num_processes == 2
    assert args.module and args.training_script == "grpo_cli"
    assert args.training_script_args == ["rl", "--config", "countdown", "--seed", "1"]


def test_relaunch_without_config_uses_ddp_for_several_processes():
    assert relaunch_command(["sft", "-c", "x"], 4, None)[3:] == [
        "--multi_gpu", "--num_processes", "4", "-m", "grpo_cli", "sft", "-c", "x",
    ]  # fmt: skip
    assert "--multi_gpu" not in relaunch_command(["sft"], 1, None)


def test_relaunch_refuses_more_processes_than_gpus(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(UserError, match="--num-processes 2: one process per GPU"):
        relaunch_command(["rl"], 8, "zero3")  # the shipped config's num_processes is 8
    assert "2" in relaunch_command(["rl"], 2, "zero3")
    assert "16" in relaunch_command(["rl"], 16, "zero3_multinode")  # a total over machines
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    nvidia_smi = tmp_path / "nvidia-smi"
    nvidia_smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-1)'\n")
    nvidia_smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert launch.gpu_count() == 1
    with pytest.raises(UserError, match="has 1 GPU"):
        relaunch_command(["rl"], 2, None)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no nvidia-smi: cannot tell, no check
    assert launch.gpu_count() is None
    assert "--multi_gpu" in relaunch_command(["rl"], 2, None)


def test_run_relaunch_prints_command_and_returns_exit_code(capfd):
    code = run_relaunch([sys.executable, "-c", "import sys; print('child ran'); sys.exit(3)", "a b"])
    out, err = capfd.readouterr()
    assert code == 3
    assert "child ran" in out
    assert (
        f"launching: {sys.executable} -c 'import sys; print('\"'\"'child ran'\"'\"'); sys.exit(3)' 'a b'"
        in err
    )


def test_run_relaunch_reports_death_by_signal():
    assert (
        run_relaunch([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]) == 137
    )


CHILD = """
import signal, sys, time, pathlib
signal.signal(signal.SIGINT, lambda *_: sys.exit(7))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(8))
pathlib.Path(sys.argv[1]).write_text("ready")
time.sleep(120)
sys.exit(1)
"""


@pytest.mark.parametrize("signum, expected", [(signal.SIGINT, 7), (signal.SIGTERM, 8)])
def test_run_relaunch_passes_interrupts_on(tmp_path, signum, expected):
    """Ctrl-C or SIGTERM sent to grpo alone reaches the launcher, and grpo exits with the launcher's code."""
    child, ready = tmp_path / "child.py", tmp_path / "ready"
    child.write_text(CHILD)
    cmd = [sys.executable, str(child), str(ready)]
    # A shell that starts the tests in the background makes them ignore SIGINT, and children inherit that: the
    # driver restores Python's usual Ctrl-C handling, as in a grpo started from a terminal.
    driver = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"from grpo_cli.launch import run_relaunch; sys.exit(run_relaunch({cmd!r}))"
    )
    process = subprocess.Popen([sys.executable, "-c", driver], start_new_session=True, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), process.communicate()[1]
    os.kill(process.pid, signum)
    assert process.wait(timeout=60) == expected


def test_ctrl_c_in_a_terminal_is_not_sent_twice():
    """In a terminal's foreground group Ctrl-C reaches the launcher by itself; without one we forward it."""
    import pty

    code = "from grpo_cli.launch import _in_terminal_foreground as f; print('foreground', f())"
    pid, fd = pty.fork()
    if pid == 0:  # the child gets the pty as its controlling terminal
        os.execv(sys.executable, [sys.executable, "-c", code])
    output = b""
    while True:
        try:
            chunk = os.read(fd, 1024)
        except OSError:  # the pty closes when the child is done
            break
        if not chunk:
            break
        output += chunk
    os.close(fd)
    assert os.waitpid(pid, 0)[1] == 0
    assert b"foreground True" in output
    detached = subprocess.run(
        [sys.executable, "-c", code], start_new_session=True, capture_output=True, text=True, check=False
    )
    assert detached.stdout.strip() == "foreground False"


@pytest.mark.parametrize("config, processes", [("zero3", 2), ("single_gpu", 1)])
def test_relaunch_runs_under_accelerate(config, processes, capfd):
    """The real accelerate launcher runs `grpo --version` once per process, from a venv not activated."""
    code = run_relaunch(relaunch_command(["--version", "--num-processes", str(processes)], processes, config))
    out, err = capfd.readouterr()
    assert code == 0, err
    assert out.count("grpo ") == processes


PROBE = """
import json, os
from grpo_cli.launch import accelerate_config_from_env, is_launched, is_main_process, rank_prefix
report = {"launched": is_launched(), "main": is_main_process(), "prefix": rank_prefix(),
          "config": accelerate_config_from_env()}
with open(f"report-{os.environ['RANK']}.json", "w") as f:
    json.dump(report, f)
"""


def test_launched_processes_know_their_rank_and_config(tmp_path):
    """Inside `accelerate launch` (DeepSpeed launcher, 2 processes): ranks, one main process, ZeRO-3 seen."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    cmd = launch.accelerate_launcher() + [
        "--config_file",
        str(CONFIGS / "zero3.yaml"),
        "--num_processes",
        "2",
        str(probe),
    ]
    assert subprocess.run(cmd, cwd=tmp_path, check=False).returncode == 0
    # One file per rank: two processes printing to one pipe can interleave their lines.
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("report-*.json"))]
    assert len(reports) == 2 and all(r["launched"] for r in reports)
    assert sorted(r["prefix"] for r in reports) == ["[rank 0] ", "[rank 1] "]
    assert [r["main"] for r in reports].count(True) == 1
    config = reports[0]["config"]
    assert config["num_processes"] == 2 and config["deepspeed_config"]["zero_stage"] == 3
    assert config["deepspeed_config"]["zero3_save_16bit_model"] is True


# Each rank: on the first stop signal, 3 s (SLOW_STOP_S) of "finishing the step and saving", then the exit code of
# that signal; the same stop passed on again by torchrun is the same request.
SLOW_STOP = """
import os, signal, sys, time
from pathlib import Path
rank = os.environ.get("RANK", "0")
def stop(signum, frame):
    if Path(f"stopping-{rank}").exists():
        return
    Path(f"stopping-{rank}").touch()
    time.sleep(float(os.environ.get("SLOW_STOP_S", "3")))
    Path(f"saved-{rank}").touch()
    sys.exit(128 + signum)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
Path(f"ready-{rank}").touch()
time.sleep(120)
"""


def _start_slow_stop(cmd: list[str], folder, env: dict, ranks: int) -> subprocess.Popen:
    """Launch `cmd` (SLOW_STOP's ranks) in `folder`, in a session of its own; return once every rank is ready."""
    proc = subprocess.Popen(cmd, cwd=folder, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not all((folder / f"ready-{rank}").exists() for rank in range(ranks)):
        assert proc.poll() is None and time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.1)
    return proc


@pytest.mark.parametrize("grace", [None, "1"], ids=["grpo-grace", "user-grace-1s"])
def test_a_stopped_launch_lets_the_ranks_save_and_exits_as_the_signal(tmp_path, grace):
    """Ctrl-C on a two-process launch (every process of the group signalled): torchrun waits STOP_GRACE_S for its
    ranks, unless the environment sets its own grace (here 1 s: the ranks are killed before they save), and the
    launch ends with 130 and no traceback either way."""
    (tmp_path / "slow_stop.py").write_text(SLOW_STOP)
    env = {k: v for k, v in os.environ.items() if k != launch.STOP_GRACE_VARIABLE}
    if grace:
        env[launch.STOP_GRACE_VARIABLE] = grace
    cmd = launch.accelerate_launcher() + ["--multi_gpu", "--num_processes", "2", "slow_stop.py"]
    proc = _start_slow_stop(cmd, tmp_path, env, ranks=2)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    saved = sorted(p.name for p in tmp_path.glob("saved-*"))
    assert saved == ([] if grace else ["saved-0", "saved-1"]), stderr


def test_a_sigterm_to_a_one_process_launch_waits_for_the_run_to_save(tmp_path):
    """SIGTERM to the launcher of one process (what `grpo` passes on from kill or a container runtime): the run gets
    it once and has as long as it needs to save (7 s here; accelerate's own launcher would kill it after 5 s), and the
    launch ends with 143 once it has."""
    (tmp_path / "slow_stop.py").write_text(SLOW_STOP)
    env = {**os.environ, "SLOW_STOP_S": "7"}
    cmd = launch.accelerate_launcher() + ["--num_processes", "1", "slow_stop.py"]
    proc = _start_slow_stop(cmd, tmp_path, env, ranks=1)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert (tmp_path / "saved-0").exists() and "Traceback" not in stderr, stderr


# --- launch warnings ----------------------------------------------------------------------------------------

ZERO3 = {
    "distributed_type": "DEEPSPEED",
    "mixed_precision": "bf16",
    "deepspeed_config": {"zero_stage": 3, "zero3_save_16bit_model": True},
}
ZERO2 = {"distributed_type": "DEEPSPEED", "mixed_precision": "bf16", "deepspeed_config": {"zero_stage": 2}}
LORA = {"use_peft": True, "gradient_checkpointing": True, "bf16": True}


def test_peft_zero3_gradient_checkpointing_needs_reentrant():
    """TRL 1.16 makes LoRA's checkpointing under ZeRO-3 reentrant: a recipe that says otherwise is told."""
    [warning] = launch_warnings({**LORA, "gradient_checkpointing_kwargs": {"use_reentrant": False}}, ZERO3)
    assert "use_reentrant: false" in warning and "set it to true" in warning
    for kwargs in (None, {}, {"use_reentrant": True}):  # left to TRL, or as TRL makes it
        assert launch_warnings({**LORA, "gradient_checkpointing_kwargs": kwargs}, ZERO3) == []
    assert launch_warnings({**LORA, "gradient_checkpointing": False}, ZERO3) == []
    assert launch_warnings(LORA, ZERO2) == []
    assert launch_warnings(LORA, None) == []


def test_peft_ddp_reentrant_checkpointing_needs_find_unused_parameters_off():
    ddp = {"distributed_type": "MULTI_GPU", "num_processes": 2}
    reentrant = {**LORA, "gradient_checkpointing_kwargs": {"use_reentrant": True}}
    [warning] = launch_warnings(reentrant, ddp)
    assert "ddp_find_unused_parameters: false" in warning
    assert launch_warnings({**reentrant, "ddp_find_unused_parameters": False}, ddp) == []
    assert launch_warnings(LORA, ddp) == []  # TRL's default (non-reentrant) checkpointing is fine


def test_countdown_recipe_on_the_shipped_configs():
    """The resolved countdown recipe (TRL defaults filled in, LoRA) is clean everywhere; LoRA on ZeRO-3 with
    non-reentrant checkpointing warns."""
    from grpo_cli.recipe import load_recipe

    def warnings(overrides: list[str], config: str) -> list[str]:
        return launch_warnings(
            load_recipe("countdown", overrides, "rl").resolved(), load_accelerate_config(config)
        )

    for name in ("single_gpu", "ddp", "zero2", "zero3", "zero3_offload", "zero3_multinode"):
        assert warnings([], name) == [], name
    lora = ["--use_peft", "true", "--gradient_checkpointing_kwargs", "{use_reentrant: false}"]
    [warning] = warnings(lora, "zero3")
    assert "use_reentrant: false" in warning
    assert warnings(lora, "zero2") == []
    assert (
        warnings(["--use_peft", "true", "--gradient_checkpointing_kwargs", "{use_reentrant: true}"], "zero3")
        == []
    )


def test_vllm_with_zero3():
    [warning] = launch_warnings({"use_vllm": True, "ds3_gather_for_generation": False}, ZERO3)
    assert "ds3_gather_for_generation: true" in warning
    [warning] = launch_warnings({"use_vllm": True, "vllm_mode": "colocate"}, ZERO3)
    assert "vllm_enable_sleep_mode: true" in warning
    assert (
        launch_warnings({"use_vllm": True, "vllm_mode": "colocate", "vllm_enable_sleep_mode": True}, ZERO3)
        == []
    )
    assert launch_warnings({"use_vllm": True, "vllm_mode": "server"}, ZERO3) == []
    assert launch_warnings({"use_vllm": True, "ds3_gather_for_generation": False}, ZERO2) == []


def test_quantized_model_with_zero3():
    lora = {"use_peft": True, "gradient_checkpointing": False}
    [warning] = launch_warnings({**lora, "load_in_4bit": True, "dtype": "bfloat16"}, ZERO3)
    assert "bnb_4bit_quant_storage: bfloat16" in warning
    qlora = {**lora, "load_in_4bit": True, "dtype": "bfloat16", "bnb_4bit_quant_storage": "bfloat16"}
    assert launch_warnings(qlora, ZERO3) == []
    [warning] = launch_warnings({**lora, "load_in_8bit": True}, ZERO3)
    assert "load_in_8bit" in warning
    assert launch_warnings({**lora, "load_in_4bit": True}, ZERO2) == []


def test_precision_mismatch_between_recipe_and_config():
    [warning] = launch_warnings({"fp16": True}, ZERO2)
    assert "fp16" in warning and "mixed_precision: fp16" in warning
    [warning] = launch_warnings({"bf16": False, "fp16": False}, ZERO2)
    assert "trains in bf16" in warning and "mixed_precision: no" in warning
    assert launch_warnings({}, ZERO2) == []  # TRL turns bf16 on when fp16 is not set
    assert launch_warnings({"bf16": False, "fp16": False}, {**ZERO2, "mixed_precision": "no"}) == []
    assert launch_warnings({"fp16": True}, {"distributed_type": "MULTI_GPU", "mixed_precision": False}) == []


def test_deepspeed_values_that_must_match_the_recipe():
    config = {
        **ZERO2,
        "deepspeed_config": {"zero_stage": 2, "gradient_accumulation_steps": 4, "gradient_clipping": 0.5},
    }
    warnings = launch_warnings({"gradient_accumulation_steps": 8, "max_grad_norm": 1.0}, config)
    assert len(warnings) == 2
    assert "gradient_accumulation_steps: 4" in warnings[0] and "gradient_clipping: 0.5" in warnings[1]
    assert launch_warnings({"gradient_accumulation_steps": 4, "max_grad_norm": 0.5}, config) == []


def test_zero3_without_16bit_save():
    [warning] = launch_warnings({}, {**ZERO3, "deepspeed_config": {"zero_stage": 3}})
    assert "zero3_save_16bit_model: true" in warning
    for name in ("zero3", "zero3_offload", "zero3_multinode", "zero2", "ddp", "single_gpu"):
        assert launch_warnings({}, load_accelerate_config(name)) == [], name


# --- scripts ------------------------------------------------------------------------------------------------

RECORDER = """#!/usr/bin/env bash
# records one call: its argv, and whether SWANLAB_PROJECT reached it
{
  echo "CALL SWANLAB_PROJECT=${SWANLAB_PROJECT-unset} SLURM_NODEID=${SLURM_NODEID-none}"
  printf '%s\\n' "$@"
} >> "$FAKE_LOG"
exit "${FAKE_EXIT:-0}"
"""


def fake_bin(tmp_path: Path, **programs: str) -> dict[str, str]:
    """A PATH whose first folder holds the given programs; returns the environment to run scripts in."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name, text in programs.items():
        path = folder / name
        path.write_text(text)
        path.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWANLAB_", "GRPO_", "SLURM_", "CUDA_"))}
    return {**env, "PATH": f"{folder}:{env['PATH']}", "FAKE_LOG": str(tmp_path / "calls.log")}


def calls(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "calls.log"
    if not log.exists():
        return []
    return [block.strip("\n").split("\n") for block in log.read_text().split("CALL ")[1:]]


def run_script(name: str, env: dict, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPTS / name), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def test_entrypoint_builds_the_grpo_command(tmp_path):
    env = fake_bin(tmp_path, grpo=RECORDER)
    env.update(
        GRPO_RECIPE="countdown", GRPO_NUM_GPUS="2", GRPO_OUTPUT_DIR="/data/out dir", SWANLAB_MODE="offline",
        SWANLAB_PROJECT="r1", GRPO_EXTRA_ARGS="--max_steps 5 --learning_rate 1e-6",
    )  # fmt: skip
    result = run_script("entrypoint.sh", env, "--seed", "3")
    assert result.returncode == 0, result.stderr
    [call] = calls(tmp_path)
    assert call == [
        "SWANLAB_PROJECT=unset SLURM_NODEID=none",
        "rl", "--config", "countdown", "--num-processes", "2", "--accelerate-config", "zero3",
        "--output_dir", "/data/out dir", "--swanlab_mode", "offline", "--swanlab_project", "r1",
        "--max_steps", "5", "--learning_rate", "1e-6", "--seed", "3",
    ]  # fmt: skip


def test_entrypoint_single_gpu_sft_and_exit_code(tmp_path):
    env = fake_bin(tmp_path, grpo=RECORDER)
    env.update(GRPO_RECIPE="my.yaml", GRPO_COMMAND="sft", CUDA_VISIBLE_DEVICES="0", FAKE_EXIT="3")
    result = run_script("entrypoint.sh", env)
    assert result.returncode == 3
    assert calls(tmp_path) == [["SWANLAB_PROJECT=unset SLURM_NODEID=none", "sft", "--config", "my.yaml"]]


def test_entrypoint_gpu_count_from_cuda_visible_devices_and_chosen_config(tmp_path):
    env = fake_bin(tmp_path, grpo=RECORDER)
    env.update(GRPO_RECIPE="r.yaml", CUDA_VISIBLE_DEVICES="0,1,2", GRPO_ACCELERATE_CONFIG="zero3_offload")
    assert run_script("entrypoint.sh", env).returncode == 0
    assert calls(tmp_path)[0][1:] == [
        "rl", "--config", "r.yaml", "--num-processes", "3", "--accelerate-config", "zero3_offload",
    ]  # fmt: skip


def test_entrypoint_dry_run_and_bad_settings(tmp_path):
    env = fake_bin(tmp_path, grpo=RECORDER)
    env.update(GRPO_RECIPE="countdown", GRPO_NUM_GPUS="1", GRPO_DRY_RUN="1")
    result = run_script("entrypoint.sh", env, "--max_steps", "2")
    assert result.returncode == 0 and result.stdout.split() == [
        "grpo",
        "rl",
        "--config",
        "countdown",
        "--max_steps",
        "2",
    ]
    assert calls(tmp_path) == []
    for bad, message in (
        ({"GRPO_RECIPE": ""}, "GRPO_RECIPE is not set"),
        ({"GRPO_COMMAND": "eval"}, "use rl or sft"),
        ({"GRPO_NUM_GPUS": "two"}, "whole number"),
    ):
        result = run_script("entrypoint.sh", {**env, **bad})
        assert result.returncode == 2 and message in result.stderr


def test_train_countdown_launches_zero3_and_logs(tmp_path):
    env = fake_bin(
        tmp_path, python3=RECORDER, **{"nvidia-smi": "#!/bin/sh\necho 'GPU 0: A'\necho 'GPU 1: B'\n"}
    )
    env.update(SWANLAB_PROJECT="r1-zero", SWANLAB_MODE="local", LOG_DIR=str(tmp_path / "logs"), FAKE_EXIT="5")
    result = run_script("train_countdown.sh", env, "--max_steps", "10", cwd=tmp_path)
    assert result.returncode == 5  # the training's exit code, not tee's
    [call] = calls(tmp_path)
    assert call[1:] == [
        "-m", "grpo_cli.launch", "--config_file", str(CONFIGS / "zero3.yaml"),
        "--num_processes", "2", "-m", "grpo_cli", "rl", "--config", "countdown",
        "--swanlab_mode", "local", "--swanlab_project", "r1-zero",
        "--max_steps", "10",
    ]  # fmt: skip
    assert call[0].startswith("SWANLAB_PROJECT=unset")
    [log] = (tmp_path / "logs").glob("countdown-*.log")
    assert "grpo_cli.launch" in log.read_text()


def test_train_countdown_offload_config_and_no_gpu(tmp_path):
    env = fake_bin(tmp_path, python3=RECORDER, **{"nvidia-smi": "#!/bin/sh\nexit 9\n"})
    env.update(LOG_DIR=str(tmp_path / "logs"))
    result = run_script("train_countdown.sh", env)
    assert result.returncode == 2 and "no GPU found" in result.stderr
    env.update(NUM_GPUS="2", ACCELERATE_CONFIG="zero3_offload")
    assert run_script("train_countdown.sh", env).returncode == 0
    assert str(CONFIGS / "zero3_offload.yaml") in calls(tmp_path)[0]


# A launch that takes a moment to save on Ctrl-C and says so on its output, as the ranks of a run do.
SAVING_LAUNCH = """#!/usr/bin/env bash
trap 'sleep 1; echo "saved a checkpoint"; exit 130' INT
touch "$FAKE_LOG.ready"
while true; do sleep 0.1; done
"""


def test_train_countdown_keeps_logging_while_a_stopped_run_saves(tmp_path):
    """Ctrl-C reaches the script, the launch and tee alike: tee must outlive the launch, so that what the ranks
    print while they save reaches the log (and their writes do not fail on a closed pipe)."""
    env = fake_bin(tmp_path, python3=SAVING_LAUNCH)
    env.update(NUM_GPUS="2", LOG_DIR=str(tmp_path / "logs"))
    # SIGINT as a terminal has it: a test runner started in the background inherits it ignored, and bash cannot
    # trap a signal ignored when it starts
    in_terminal = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp('bash', sys.argv[1:])"
    proc = subprocess.Popen(
        [sys.executable, "-c", in_terminal, "bash", str(SCRIPTS / "train_countdown.sh")], env=env, cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not (tmp_path / "calls.log.ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    [log] = (tmp_path / "logs").glob("countdown-*.log")
    assert "saved a checkpoint" in log.read_text() and "saved a checkpoint" in stdout


FAKE_SRUN = """#!/usr/bin/env bash
# runs the task once per node, as srun does, with that node's SLURM_NODEID
while [[ "$1" == --* ]]; do shift; done
for node in $(seq 0 $((SLURM_NNODES - 1))); do SLURM_NODEID=$node "$@" || exit $?; done
"""
# many nodes: a script that stops reading early (head) would die of SIGPIPE under pipefail
FAKE_SCONTROL = "#!/bin/sh\necho node-a\necho node-b\nseq 3 20000 | sed s/^/node-/\n"


def test_multinode_slurm_gives_each_machine_its_rank(tmp_path):
    env = fake_bin(tmp_path, python3=RECORDER, srun=FAKE_SRUN, scontrol=FAKE_SCONTROL)
    env.update(
        SLURM_NNODES="2", SLURM_JOB_NODELIST="node-[a-b]", SLURM_SUBMIT_DIR=str(REPO), GPUS_PER_NODE="4"
    )
    env.update(SWANLAB_PROJECT="big")
    result = run_script("multinode.slurm", env, "--max_steps", "3")
    assert result.returncode == 0, result.stderr
    node0, node1 = calls(tmp_path)
    expected = [
        "-m", "grpo_cli.launch", "--config_file", str(CONFIGS / "zero3_multinode.yaml"),
        "--num_machines", "2", "--num_processes", "8", "--machine_rank", "{rank}",
        "--main_process_ip", "node-a", "--main_process_port", "29500",
        "-m", "grpo_cli", "rl", "--config", "countdown", "--swanlab_project", "big", "--max_steps", "3",
    ]  # fmt: skip
    assert node0[1:] == [a.format(rank=0) for a in expected]
    assert node1[1:] == [a.format(rank=1) for a in expected]
    assert node0[0] == "SWANLAB_PROJECT=unset SLURM_NODEID=0"


def test_multinode_slurm_exit_code(tmp_path):
    env = fake_bin(tmp_path, python3=RECORDER, srun=FAKE_SRUN, scontrol=FAKE_SCONTROL)
    env.update(SLURM_NNODES="2", SLURM_JOB_NODELIST="n", SLURM_SUBMIT_DIR=str(REPO), FAKE_EXIT="4")
    assert run_script("multinode.slurm", env).returncode == 4
    del env["SLURM_NNODES"]
    result = run_script("multinode.slurm", env)
    assert result.returncode != 0 and "sbatch" in result.stderr


SCRIPT_FILES = sorted(p.name for p in SCRIPTS.iterdir() if p.suffix in (".sh", ".slurm"))


@pytest.mark.parametrize("name", SCRIPT_FILES)
def test_script_syntax(name):
    assert subprocess.run(["bash", "-n", str(SCRIPTS / name)], check=False).returncode == 0
    assert os.access(SCRIPTS / name, os.X_OK)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
@pytest.mark.parametrize("name", SCRIPT_FILES)
def test_script_shellcheck(name):
    result = subprocess.run(["shellcheck", "-s", "bash", str(SCRIPTS / name)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def test_errors_name_the_rank_of_the_process(tmp_path):
    """In a run of several processes every process reports its errors with its rank."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_name_or_path: m\nlearnig_rate: 1\n")
    env = {**os.environ, "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}
    run = subprocess.run([sys.executable, "-m", "grpo_cli", "check", "-c", str(bad)], capture_output=True, text=True,
                         env=env, check=False)
    assert run.returncode == 2
    assert "[rank 1] " in run.stderr and "learnig_rate" in run.stderr
