"""Distributed launch: how many processes a run has, re-launching `grpo` through `accelerate launch`, and the
recipe/accelerate-config combinations known to fail under DeepSpeed.

Nothing here imports torch or accelerate at import time: `grpo check` and `grpo --help` stay fast. Ranks and world
size come from the environment variables that accelerate and torchrun set for every process they start.

`python -m grpo_cli.launch ARGS` is `accelerate launch ARGS` for a run that must survive a stop signal: the ranks
get the signal and `STOP_GRACE_S` to finish the step and save, and a run stopped by signal N ends with exit code
128 + N (`launcher_main`).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from grpo_cli.errors import UserError

NUM_PROCESSES_OPTION = "--num-processes"
ACCELERATE_CONFIG_OPTION = "--accelerate-config"

# How long torchrun waits for its ranks after it passed a stop signal on to them, before it kills them (its own
# default is 30 s): long enough for a large model's step and checkpoint. A value already in the environment is kept.
STOP_GRACE_VARIABLE = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
STOP_GRACE_S = 600

# Set by `accelerate launch` (simple, multi-GPU and DeepSpeed launchers) or torchrun in every process they
# start. Other ACCELERATE_* variables are left out on purpose: people export ACCELERATE_LOG_LEVEL.
LAUNCHER_VARIABLES = (
    "LOCAL_RANK",
    "WORLD_SIZE",
    "ACCELERATE_USE_CPU",
    "ACCELERATE_DYNAMO_BACKEND",
    "ACCELERATE_USE_DEEPSPEED",
)


# --- shipped accelerate configs -----------------------------------------------------------------------------


def shipped_accelerate_configs() -> dict[str, Path]:
    """The accelerate configs grpo ships, by name (`zero3`, `ddp`, ...), from a wheel or a source checkout."""
    package = Path(__file__).resolve().parent
    found: dict[str, Path] = {}
    for root in (package / "_configs" / "accelerate", package.parent / "configs" / "accelerate"):
        if root.is_dir():
            for path in sorted(root.glob("*.yaml")):
                found.setdefault(path.stem, path)
    return found


def accelerate_config_path(name_or_path: str) -> Path:
    """An accelerate config file: a path, or the name of a shipped one (`zero3`, `zero3_offload`, ...)."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path.resolve()
    shipped = shipped_accelerate_configs()
    name = name_or_path.removesuffix(".yaml")
    if name in shipped:
        return shipped[name]
    raise UserError(
        f"{ACCELERATE_CONFIG_OPTION}: no such file: {name_or_path} - give an accelerate config file or "
        f"one of the shipped names: {', '.join(shipped) or '(none found)'}"
    )


def load_accelerate_config(name_or_path: str | None) -> dict | None:
    """The accelerate config as a dict: from the file given, else from the launcher's environment."""
    if not name_or_path:
        return accelerate_config_from_env()
    path = accelerate_config_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML ({err}) - fix the syntax") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: an accelerate config is a YAML mapping - make one with `accelerate config`")
    return data


def accelerate_config_from_env(environ: dict[str, str] | None = None) -> dict | None:
    """What `accelerate launch` told this process of its config, shaped like the file (None if not launched).

    Lets a run started with `accelerate launch --config_file zero3.yaml -m grpo_cli ...` check its recipe
    against the config without being given the file.
    """
    env = os.environ if environ is None else environ
    if not is_launched(env):
        return None
    world_size = env.get("WORLD_SIZE", "1")
    config: dict = {"num_processes": int(world_size) if world_size.isdigit() else 1}
    if env.get("ACCELERATE_MIXED_PRECISION"):
        config["mixed_precision"] = env["ACCELERATE_MIXED_PRECISION"]
    if env.get("ACCELERATE_USE_DEEPSPEED", "").lower() != "true":
        config["distributed_type"] = "MULTI_GPU" if config["num_processes"] > 1 else "NO"
        return config
    config["distributed_type"] = "DEEPSPEED"
    stage = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    deepspeed: dict = {"zero_stage": int(stage) if stage.isdigit() else 2}
    for key in ("offload_optimizer_device", "offload_param_device"):
        variable = f"ACCELERATE_DEEPSPEED_{key.upper()}"
        if variable in env:
            deepspeed[key] = env[variable]
    for key, variable in (
        ("zero3_init_flag", "ACCELERATE_DEEPSPEED_ZERO3_INIT"),
        ("zero3_save_16bit_model", "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL"),
    ):
        if variable in env:
            deepspeed[key] = env[variable].lower() == "true"
    for key in ("gradient_accumulation_steps", "gradient_clipping"):
        value = env.get(f"ACCELERATE_{key.upper()}", "auto")
        if value != "auto":
            deepspeed[key] = value
    config["deepspeed_config"] = deepspeed
    return config


# --- processes and ranks ------------------------------------------------------------------------------------


def num_processes(accelerate_config: str | None, cli_value: int | None) -> int:
    """How many training processes the run has, in all (every machine together).

    The explicit CLI value wins; then the accelerate config file's `num_processes` (in accelerate this is
    already the total over all machines: each machine starts num_processes / num_machines, so it is not
    multiplied by num_machines); then WORLD_SIZE, which accelerate and torchrun set in each process; else 1.
    """
    if cli_value is not None:
        if cli_value < 1:
            raise UserError(f"{NUM_PROCESSES_OPTION} {cli_value}: give 1 or more processes (one per GPU)")
        return cli_value
    world_size = _env_int("WORLD_SIZE")
    if accelerate_config:
        config = load_accelerate_config(accelerate_config) or {}
        value = config.get("num_processes")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        if world_size is None and str(config.get("distributed_type", "NO")).upper() != "NO":
            raise UserError(
                f"{accelerate_config}: `num_processes` is not set (or -1) - add `num_processes: N` (GPUs on "
                f"all machines together) to the file, or pass {NUM_PROCESSES_OPTION} N"
            )
    return world_size if world_size is not None else 1


def _env_int(name: str) -> int | None:
    text = os.environ.get(name, "")
    if not text:
        return None
    if not text.isdigit():
        raise UserError(f"environment variable {name}={text!r} is not a whole number - fix or unset it")
    return int(text)


def is_launched(environ: dict[str, str] | None = None) -> bool:
    """True in a process started by `accelerate launch` or torchrun, which must never re-launch itself."""
    env = os.environ if environ is None else environ
    return any(name in env for name in LAUNCHER_VARIABLES)


def should_relaunch(cli_num_processes: int | None, accelerate_config: str | None) -> bool:
    """True when `--num-processes` or `--accelerate-config` was given and this process is not launched."""
    return (cli_num_processes is not None or bool(accelerate_config)) and not is_launched()


def process_rank() -> int:
    """This process's global rank (0 when not distributed)."""
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def world_size() -> int:
    """How many processes this run has, from WORLD_SIZE, which accelerate and torchrun set (1 when not launched)."""
    value = os.environ.get("WORLD_SIZE", "")
    return int(value) if value.isdigit() else 1


def is_main_process() -> bool:
    """True in the one process that prints, writes the rollouts file and talks to SwanLab."""
    return process_rank() == 0


def rank_prefix() -> str:
    """`[rank N] ` in a run of several processes, so each process's errors say which one it is; else ''."""
    rank = process_rank()
    return f"[rank {rank}] " if rank > 0 or world_size() > 1 else ""


# --- re-launch through accelerate ---------------------------------------------------------------------------


def strip_launch_options(argv: list[str]) -> list[str]:
    """argv without `--num-processes N` / `--accelerate-config F`, in `--opt value` or `--opt=value` form."""
    own = (NUM_PROCESSES_OPTION, ACCELERATE_CONFIG_OPTION)
    kept: list[str] = []
    skip_next = False
    for index, arg in enumerate(argv):
        if skip_next:
            skip_next = False
            continue
        if arg == "--":  # everything after belongs to someone else
            kept.extend(argv[index:])
            break
        if arg in own:
            skip_next = True
            continue
        if any(arg.startswith(option + "=") for option in own):
            continue
        kept.append(arg)
    return kept


def accelerate_launcher() -> list[str]:
    """`accelerate launch` run by this interpreter (works in a virtual environment that is not activated), through
    `launcher_main`."""
    return [sys.executable, "-m", "grpo_cli.launch"]


def relaunch_command(argv: list[str], num_processes: int, accelerate_config: str | None) -> list[str]:
    """The `accelerate launch ... -m grpo_cli <argv>` command that runs this `grpo` command on N processes."""
    config = load_accelerate_config(accelerate_config) if accelerate_config else None
    _check_gpu_count(num_processes, accelerate_config, config)
    cmd = accelerate_launcher()
    if accelerate_config:
        cmd += ["--config_file", str(accelerate_config_path(accelerate_config))]
    elif num_processes > 1:
        cmd += ["--multi_gpu"]  # no config file: one process per GPU with DDP
    cmd += ["--num_processes", str(num_processes), "-m", "grpo_cli", *strip_launch_options(argv)]
    return cmd


def gpu_count() -> int | None:
    """GPUs this machine shows (CUDA_VISIBLE_DEVICES, else `nvidia-smi -L`), or None when it cannot tell."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return len([d for d in visible.split(",") if d.strip()])
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(line.startswith("GPU ") for line in listing.stdout.splitlines()) or None


def _check_gpu_count(num_processes: int, accelerate_config: str | None, config: dict | None) -> None:
    """One process per GPU: more processes than this machine's GPUs crash at start, so say so first."""
    machines = (config or {}).get("num_machines", 1)
    if (config or {}).get("use_cpu") or (isinstance(machines, int) and machines > 1):
        return  # CPU processes, or a total over several machines
    gpus = gpu_count()
    if gpus is not None and num_processes > gpus:
        where = (
            f" (without {NUM_PROCESSES_OPTION}, {accelerate_config}'s num_processes)"
            if accelerate_config
            else ""
        )
        raise UserError(
            f"{num_processes} processes{where} but this machine has {gpus} GPU(s) - pass "
            f"{NUM_PROCESSES_OPTION} {gpus}: one process per GPU"
        )


def run_relaunch(cmd: list[str]) -> int:
    """Print the exact command on stderr, run it, and return its exit code (128 + N when killed by signal N).

    Ctrl-C in a terminal already reaches the launcher (same foreground process group), so it is not sent
    twice: torchrun cleans its workers up on the first one. SIGINT or SIGTERM sent to this process alone
    (kill, a container runtime, a scheduler) is passed on once, and we wait for the launcher to stop.
    """
    from grpo_cli.console import console

    console.print(f"launching: {shlex.join(cmd)}", markup=False, highlight=False, soft_wrap=True)
    process = subprocess.Popen(cmd)
    forwarded: set[int] = set()

    def forward(signum: int, _frame=None) -> None:
        if process.poll() is None and signum not in forwarded:
            forwarded.add(signum)
            process.send_signal(signum)

    previous_term = signal.signal(signal.SIGTERM, forward)
    terminal = _in_terminal_foreground()
    try:
        while True:
            try:
                code = process.wait()
                break
            except KeyboardInterrupt:
                if not terminal:
                    forward(signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    return 128 - code if code < 0 else code


def _in_terminal_foreground() -> bool:
    """True when this process is in its terminal's foreground group, where Ctrl-C reaches every process."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY)
    except OSError:
        return False  # no controlling terminal: a SIGINT came from kill, and only to us
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


# --- known-bad combinations ---------------------------------------------------------------------------------


def zero_stage(accelerate_config: dict | None) -> int | None:
    """The DeepSpeed ZeRO stage of an accelerate config, or None when it does not use DeepSpeed."""
    if not accelerate_config or str(accelerate_config.get("distributed_type", "")).upper() != "DEEPSPEED":
        return None
    deepspeed = accelerate_config.get("deepspeed_config") or {}
    try:
        return int(deepspeed.get("zero_stage", 2))  # accelerate's default stage
    except (TypeError, ValueError):
        return None


def recipe_precision(recipe_values: dict) -> str:
    """'fp16', 'bf16' or 'no': the mixed precision a recipe trains in (TRL's bf16 is on unless fp16 is)."""
    if recipe_values.get("fp16"):
        return "fp16"
    bf16 = recipe_values.get("bf16")
    return "bf16" if bf16 or bf16 is None else "no"


def launch_warnings(recipe_values: dict, accelerate_config: dict | None) -> list[str]:
    """Recipe/accelerate-config combinations known to fail, or to do something else than the recipe says."""
    if not accelerate_config:
        return []
    v = recipe_values
    stage = zero_stage(accelerate_config)
    deepspeed = accelerate_config.get("deepspeed_config") or {}
    warnings: list[str] = []

    checkpointing = v.get("gradient_checkpointing_kwargs")
    reentrant = checkpointing.get("use_reentrant") if isinstance(checkpointing, dict) else None
    # TRL 1.16 makes it reentrant itself (left out, the recipe is right everywhere: DDP takes the non-reentrant default)
    if stage == 3 and v.get("use_peft") and v.get("gradient_checkpointing", True) and reentrant is False:
        warnings.append(
            "use_peft with DeepSpeed ZeRO-3 and gradient_checkpointing needs reentrant checkpointing, and TRL 1.16 "
            "uses it whatever the recipe says - drop `use_reentrant: false` from `gradient_checkpointing_kwargs` "
            "or set it to true"
        )
    # transformers asks DDP to look for unused parameters when the model is a PEFT model, and reentrant
    # checkpointing then fires each LoRA weight's hook twice: the first backward stops (seen with 2 processes).
    ddp = str(accelerate_config.get("distributed_type", "")).upper() == "MULTI_GPU"
    if (
        ddp
        and v.get("use_peft")
        and v.get("gradient_checkpointing", True)
        and reentrant is True
        and v.get("ddp_find_unused_parameters") is not False
    ):
        warnings.append(
            "use_peft with DDP and `use_reentrant: true` stops at the first backward (\"Expected to mark a variable "
            "ready only once\") - set `ddp_find_unused_parameters: false` in the recipe, or drop `use_reentrant: "
            "true` (only ZeRO-3 needs it)"
        )

    if stage == 3 and v.get("use_vllm"):
        if v.get("ds3_gather_for_generation", True) is False:
            warnings.append(
                "use_vllm with ZeRO-3 needs the weights gathered to load them into vLLM, but "
                "ds3_gather_for_generation is false - set `ds3_gather_for_generation: true` or "
                "`use_vllm: false`"
            )
        elif v.get("vllm_mode", "colocate") == "colocate" and not v.get("vllm_enable_sleep_mode"):
            warnings.append(
                "vllm_mode colocate with ZeRO-3 keeps a full vLLM copy of the model on every GPU next to "
                "the ZeRO-3 shards and gathers all weights at each sync - set `vllm_enable_sleep_mode: true` "
                "and a low `vllm_gpu_memory_utilization`, or run `trl vllm-serve` and use `vllm_mode: server`"
            )

    if stage == 3 and v.get("load_in_8bit"):
        warnings.append(
            "load_in_8bit does not work with ZeRO-3 (DeepSpeed cannot shard 8-bit weights) - use "
            "`load_in_4bit: true` with `bnb_4bit_quant_storage: bfloat16`, or the zero2 / ddp config"
        )
    if stage == 3 and v.get("load_in_4bit"):
        dtype = v.get("dtype") or "float32"
        storage = v.get("bnb_4bit_quant_storage")
        if storage is None or storage != dtype:
            warnings.append(
                f"load_in_4bit with ZeRO-3 needs the 4-bit weights stored in the model's dtype so DeepSpeed "
                f"can shard them (dtype: {dtype}, bnb_4bit_quant_storage: {storage}) - set "
                f"`dtype: bfloat16` and `bnb_4bit_quant_storage: bfloat16`"
            )

    # transformers lets the recipe's bf16/fp16 win over the launcher's mixed_precision; a recipe with neither
    # silently trains in the launcher's precision (checked with a DeepSpeed plugin built as accelerate does).
    launcher = accelerate_config.get("mixed_precision")
    launcher = "no" if launcher in (None, False) else str(launcher).lower()
    precision = recipe_precision(v)
    say = {"bf16": "`bf16: true`", "fp16": "`fp16: true` and `bf16: false`"}.get(launcher, f"`{launcher}`")
    if launcher != "no" and precision == "no":
        warnings.append(
            f"the recipe turns bf16 and fp16 off but the accelerate config says mixed_precision: {launcher}, "
            f"so the run trains in {launcher} - set `mixed_precision: no` in the accelerate config to train "
            f"in fp32, or {say} in the recipe to say so"
        )
    elif launcher != "no" and precision != launcher:
        warnings.append(
            f"the recipe trains in {precision} but the accelerate config says mixed_precision: {launcher} "
            f"(the recipe's {precision} is used) - make them agree: `mixed_precision: {precision}` in the "
            f"accelerate config, or {say} in the recipe"
        )

    # DeepSpeed stops when a value set in its config differs from the trainer's (HfTrainerDeepSpeedConfig).
    for key, recipe_key, recipe_value in (
        (
            "gradient_accumulation_steps",
            "gradient_accumulation_steps",
            v.get("gradient_accumulation_steps", 1),
        ),
        ("gradient_clipping", "max_grad_norm", v.get("max_grad_norm", 1.0)),
    ):
        value = deepspeed.get(key) if stage is not None else None
        if value not in (None, "auto") and not _same_number(value, recipe_value):
            warnings.append(
                f"the accelerate config sets {key}: {value} but the recipe's {recipe_key} is {recipe_value} "
                f"(DeepSpeed stops on the mismatch) - remove {key} from the accelerate config; the recipe's "
                f"value is used"
            )

    if stage == 3 and not deepspeed.get("zero3_save_16bit_model"):
        warnings.append(
            "ZeRO-3 without zero3_save_16bit_model saves only sharded DeepSpeed checkpoints, not a usable "
            "model - set `zero3_save_16bit_model: true` under deepspeed_config (the shipped zero3 configs do)"
        )
    return warnings


def _same_number(a: object, b: object) -> bool:
    try:
        return float(a) == float(b)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


# --- the launcher process ----------------------------------------------------------------------------------


class _KeepSigterm:
    """The `signal` module as accelerate's one-process launcher sees it, minus its SIGTERM handler: that one (accelerate
    1.15) terminates the run's whole process tree and kills it 5 s later, so a run still finishing its step or saving
    would lose its checkpoint. The handler `launcher_main` set stays in force."""

    def __getattr__(self, name: str):
        return getattr(signal, name)

    @staticmethod
    def signal(signum, handler):
        if signum == signal.SIGTERM:
            return signal.getsignal(signum)
        return signal.signal(signum, handler)


def launcher_main() -> int:
    """`accelerate launch` with `sys.argv[1:]`, ending as its run ends: exit code 128 + N for a run stopped by signal N.

    Several processes: torchrun passes a stop on to its ranks, waits `STOP_GRACE_S` for them (unless the environment
    sets its own grace), then raises its SignalException, whose traceback would read as a crash. One process:
    accelerate's launcher waits for its child and would die of the signal itself, leaving the child unsignalled (a
    SIGTERM meant for the run) or still saving after the launch has ended; here it passes the signal on and goes on
    waiting, and the child's exit code is the launch's.
    """
    os.environ.setdefault(STOP_GRACE_VARIABLE, str(STOP_GRACE_S))
    import psutil

    def pass_on(signum: int, _frame=None) -> None:
        children = psutil.Process().children()
        if not children:
            sys.exit(128 + signum)  # nothing started yet
        for child in children:
            try:
                child.send_signal(signum)
            except psutil.Error:
                pass  # it has just ended

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, pass_on)  # torchrun sets its own handlers when it starts its ranks
    import accelerate.commands.launch as accelerate_launch

    accelerate_launch.signal = _KeepSigterm()
    from torch.distributed.elastic.multiprocessing import SignalException

    try:
        accelerate_launch.main()
    except SignalException as stop:
        return 128 + int(stop.sigval)
    except subprocess.CalledProcessError as ended:  # the one-process launcher's report of a non-zero exit code
        return ended.returncode if ended.returncode > 0 else 128 - ended.returncode
    return 0


if __name__ == "__main__":
    sys.exit(launcher_main())
