"""Checks that need several keys at once, and the plan a recipe resolves to. Nothing heavy is loaded."""

from __future__ import annotations

import importlib.util
import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from grpo_cli.arguments import TrackingArguments
from grpo_cli.errors import UserError
from grpo_cli.problems import Problem, listing
from grpo_cli.recipe.hardware import (
    generation_batch,
    micro_batch_layout,
    rollout_fallback,
    zero_advantage_trained,
)
from grpo_cli.recipe.load import Recipe


@dataclass
class Plan:
    """What a run of the recipe will do, as rows of (what, value) for people, and where each row's values came from
    (`sources`: what -> `file:line`, `command line`, `grpo default`, `hardware default (why)`, `default`)."""

    rows: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)


def reward_names(recipe: Recipe) -> list[str]:
    """The recipe's rewards: `reward_funcs`, or the task's defaults."""
    from grpo_cli.tasks import TASKS

    names = list(recipe.values.get("reward_funcs") or [])
    task = TASKS.get(recipe.task.task)
    return names or (list(task.default_rewards) if task else [])


def reward_funcs(recipe: Recipe) -> list:
    """The recipe's rewards as TRL-ready callables, each behind its guard: what `grpo rl` trains and `grpo eval`
    scores with (relative `file.py:function` paths from the working directory, else beside the recipe)."""
    from grpo_cli.rewards import build_reward_funcs

    return build_reward_funcs(reward_names(recipe), recipe.reward.reward_timeout, recipe.folder, recipe.resolved())


def _file_problems(recipe: Recipe) -> list[Problem]:
    from grpo_cli.models import is_local_path

    problems = []
    for key in ("model_name_or_path", "deepspeed", "resume_from_checkpoint"):
        value = recipe.values.get(key)
        if not isinstance(value, str) or not value:
            continue
        if key == "model_name_or_path" and not is_local_path(value):
            continue  # a Hub id or a short model name: checked when loaded
        if key == "resume_from_checkpoint" and value.lower() in ("true", "false"):
            continue
        if not Path(value).expanduser().exists():
            problems.append(Problem(key, f"`{key}`: no such file or folder: {value}"))
    return problems


# Folders a run never writes into (its output folder, checkpoints and logs would land among the system's files).
SYSTEM_FOLDERS = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr", "/var")
MAX_NAME_BYTES = 255  # one file or folder name, on the usual file systems


def _output_problems(recipe: Recipe) -> list[Problem]:
    """`output_dir` must be a folder a run can own: not a system or home folder, not a file or under one, not the
    model being trained from, writable, with names the file system takes."""
    text = _output_problem(recipe)
    return [Problem("output_dir", text)] if text else []


def _output_problem(recipe: Recipe) -> str | None:
    from grpo_cli.models import is_local_path

    value = recipe.values.get("output_dir")
    if not isinstance(value, str) or not value:
        return None
    where = f"`output_dir` {value}"
    path = Path(value).expanduser()
    long = [part for part in path.parts if len(part.encode()) > MAX_NAME_BYTES]
    if long:
        return f"{where}: a folder name of {len(long[0].encode())} bytes (the limit is {MAX_NAME_BYTES}) - shorten it"
    resolved = path.resolve()
    if str(resolved) in SYSTEM_FOLDERS or any(resolved.is_relative_to(root) for root in ("/proc", "/sys", "/dev")):
        return f"{where} is a system folder - name a folder of the run's own, e.g. outputs/{recipe.name}"
    if resolved == Path.home().resolve():
        home = "is your home folder: a run writes checkpoints, a model and logs into its output folder"
        return f"{where} {home} - name a folder of its own, e.g. outputs/{recipe.name}"
    model = recipe.values.get("model_name_or_path")
    if isinstance(model, str) and is_local_path(model) and Path(model).expanduser().resolve() == resolved:
        model_text = "is the model being trained from (`model_name_or_path`): the run would write over it"
        return f"{where} {model_text} - set another `output_dir`"
    for folder in [resolved, *resolved.parents]:
        if not folder.exists():
            continue
        if not folder.is_dir():
            what = "is an existing file" if folder == resolved else f"is under {folder}, which is a file"
            return f"{where} {what} - set `output_dir` to a folder"
        if not os.access(folder, os.W_OK | os.X_OK):
            return f"{where}: {folder} is not writable - choose a folder you can write to"
        return None
    return None


def _steps_or_share(value) -> bool:
    return _finite_at_least(0.0, above=True)(value) and (value < 1 or float(value).is_integer())


def _int_at_least(low: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _finite_at_least(low: float, above: bool = False):
    return lambda v: isinstance(v, (int, float)) and math.isfinite(v) and (v > low if above else v >= low)


# Values TRL or transformers would reject deep inside a run (or misread), checked before anything loads:
# key -> (test, what the value must be).
VALUE_RULES = {
    "per_device_train_batch_size": (_int_at_least(1), "a whole number of at least 1"),
    "gradient_accumulation_steps": (_int_at_least(1), "a whole number of at least 1"),
    "num_generations": (_int_at_least(1), "a whole number of at least 1"),
    "max_completion_length": (_int_at_least(1), "a whole number of at least 1"),
    "learning_rate": (_finite_at_least(0.0), "a finite number of at least 0"),
    "max_grad_norm": (_finite_at_least(0.0), "a finite number of at least 0 (0: no clipping)"),
    "temperature": (_finite_at_least(0.0, above=True), "a finite number above 0"),
    "reward_timeout": (_finite_at_least(0.0, above=True), "a number of seconds above 0"),
    "overlong_buffer": (_int_at_least(1), "a whole number of tokens of at least 1"),
    "nonfinite_patience": (_int_at_least(0), "a whole number of at least 0 (0: never stop)"),
    "stall_timeout": (_finite_at_least(0.0), "a finite number of seconds of at least 0 (0: never)"),
    "dynamic_sampling_max_rounds": (_int_at_least(1), "a whole number of at least 1"),
    "max_steps": (
        lambda v: isinstance(v, int) and (v > 0 or v == -1),
        "a whole number above 0, or -1 for `num_train_epochs`",
    ),
    "top_k": (_int_at_least(0), "a whole number of at least 0 (0: no top-k)"),
    "top_p": (lambda v: _finite_at_least(0.0, above=True)(v) and v <= 1, "a number above 0 and at most 1"),
    "min_p": (lambda v: _finite_at_least(0.0)(v) and v <= 1, "a number from 0 to 1"),
    "repetition_penalty": (_finite_at_least(0.0, above=True), "a finite number above 0 (1: none)"),
    # numpy's and torch's seeding take 0 to 2^32 - 1
    "seed": (lambda v: _int_at_least(0)(v) and v < 2**32, "a whole number from 0 to 4294967295"),
    "steps_per_generation": (_int_at_least(1), "a whole number of at least 1"),
    "generation_batch_size": (_int_at_least(1), "a whole number of at least 1"),
    "num_iterations": (_int_at_least(1), "a whole number of at least 1"),
    "lora_r": (_int_at_least(1), "a whole number of at least 1"),
    "lora_alpha": (_int_at_least(1), "a whole number of at least 1"),
    "lora_dropout": (lambda v: _finite_at_least(0.0)(v) and v < 1, "a number from 0 up to (not including) 1"),
    "max_length": (_int_at_least(1), "a whole number of tokens of at least 1"),
    "weight_decay": (_finite_at_least(0.0), "a finite number of at least 0"),
    "beta": (_finite_at_least(0.0), "a finite number of at least 0 (0: no KL term)"),
    "epsilon": (_finite_at_least(0.0), "a finite number of at least 0"),
    "epsilon_high": (_finite_at_least(0.0), "a finite number of at least 0"),
    "num_train_epochs": (_finite_at_least(0.0), "a finite number of at least 0"),
    "output_dir": (lambda v: isinstance(v, str) and v.strip() != "", "a folder path (it is empty)"),
    # below 1 a share of the run's steps, else a number of steps
    "save_steps": (lambda v: _steps_or_share(v), "a whole number of steps, or a share of the run below 1"),
    "logging_steps": (lambda v: _steps_or_share(v), "a whole number of steps, or a share of the run below 1"),
}
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The keyword arguments torch.utils.checkpoint takes from `gradient_checkpointing_kwargs`, and their values.
CHECKPOINT_KWARGS = {
    "use_reentrant": (lambda v: isinstance(v, bool), "true or false"),
    "preserve_rng_state": (lambda v: isinstance(v, bool), "true or false"),
    "debug": (lambda v: isinstance(v, bool), "true or false"),
    "early_stop": (lambda v: isinstance(v, bool), "true or false"),
    "determinism_check": (lambda v: v in ("default", "none"), "default or none"),
}


def _checkpoint_kwargs_problem(value) -> str | None:
    """What is wrong with a `gradient_checkpointing_kwargs` value (None: nothing), as torch's checkpoint would say it
    at the first forward pass."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return f"`gradient_checkpointing_kwargs` is {value!r}: it must be a mapping, e.g. {{use_reentrant: true}}"
    for key, item in value.items():
        if key not in CHECKPOINT_KWARGS:
            hint = (
                " (YAML needs a space after the colon: {use_reentrant: true})"
                if isinstance(key, str) and ":" in key
                else ""
            )
            return (
                f"`gradient_checkpointing_kwargs` has the key {key!r}{hint}: torch's checkpoint takes "
                f"{', '.join(CHECKPOINT_KWARGS)}"
            )
        test, must = CHECKPOINT_KWARGS[key]
        if not test(item):
            return f"`gradient_checkpointing_kwargs` has {key}: {item!r}: it must be {must}"
    return None


def _value_problems(recipe: Recipe) -> list[Problem]:
    problems = []
    for key, (test, must) in VALUE_RULES.items():
        if key in recipe.values and recipe.values[key] is not None and not test(recipe.values[key]):
            problems.append(Problem(key, f"`{key}` is {recipe.values[key]!r}: it must be {must}"))
    resolved = recipe.resolved()
    if resolved.get("max_steps") == -1 and resolved.get("num_train_epochs") == 0:
        problems.append(Problem(
            "num_train_epochs",
            "`num_train_epochs` is 0 and `max_steps` -1 (train by epochs): the run would train no step - set "
            "`max_steps` or `num_train_epochs` above 0",
        ))
    if recipe.command == "sft" and recipe.values.get("packed_forward"):
        problems.append(Problem(
            "packed_forward",
            "`packed_forward` lays out GRPO's prompts and completions: it is for `grpo rl`, and `grpo sft` has "
            "no use for it - drop it from this recipe",
        ))
    checkpoint_problem = _checkpoint_kwargs_problem(recipe.values.get("gradient_checkpointing_kwargs"))
    if checkpoint_problem:
        problems.append(Problem("gradient_checkpointing_kwargs", checkpoint_problem))
    model = resolved.get("model_name_or_path")
    if isinstance(model, str) and Path(model).expanduser().is_file():
        problems.append(Problem(
            "model_name_or_path",
            f"`model_name_or_path` {model} is a file - give the model's folder (the one holding config.json), a "
            "Hub id or a demo model's name",
        ))
    buffer, limit = recipe.values.get("overlong_buffer"), resolved.get("max_completion_length")
    if _int_at_least(1)(buffer) and _int_at_least(1)(limit) and buffer > limit:
        problems.append(Problem(
            "overlong_buffer",
            f"`overlong_buffer` is {buffer}: it must be at most `max_completion_length` ({limit}), the limit the "
            "penalty ramps down to",
        ))
    for name in recipe.env:
        if not ENV_NAME.match(name):
            problems.append(Problem(
                None,
                f"`env` name {name!r} is not an environment variable name (letters, digits and _, not starting with "
                "a digit)",
                str(recipe.path or "recipe"),
            ))
    return problems


def machine_warnings(recipe: Recipe) -> list[str]:
    """What this machine cannot run of the recipe (keys that need a CUDA GPU, on a machine without one), said in the
    plan: `grpo check` previews a recipe for any machine, and `grpo rl`/`grpo sft` stop on these before loading. And
    what it would run slowly: 16-bit weights on a CPU that emulates their matrix products."""
    from grpo_cli.models import gpu_problems

    if recipe.hardware is None or recipe.hardware.gpu:
        return []
    problems = gpu_problems(recipe.values, recipe.values, has_cuda=False)
    found = [f"this machine has no CUDA GPU: a run here would stop on {problem}" for problem in problems]
    dtype = recipe.values.get("dtype")
    if dtype in ("bfloat16", "float16") and not recipe.hardware.cpu_bf16:
        found.append(
            f"dtype: {dtype} on a CPU without AVX512-BF16: its matrix products are emulated, several times slower "
            "than in float32 - `--dtype float32` for a run on this machine"
        )
    return found


def _located(recipe: Recipe, problems: list[Problem]) -> list[Problem]:
    """Each problem about a key placed where the key was set (`default` where it was left unset)."""
    return [
        replace(p, where=recipe.where(p.key), line=recipe.lines.get(p.key)) if p.key is not None else p
        for p in problems
    ]


def _batch_problems(recipe: Recipe, num_processes: int) -> list[Problem]:
    values = recipe.resolved()
    problems = []
    num_generations = values.get("num_generations")
    key = "num_generations" if "num_generations" in recipe.values else "per_device_train_batch_size"
    if num_generations < 2:
        problems.append(Problem("num_generations", "`num_generations` must be at least 2 (GRPO compares "
                                "completions of the same prompt)"))
    if values.get("generation_batch_size") is not None and values.get("steps_per_generation") is not None:
        problems.append(Problem("steps_per_generation", "set `generation_batch_size` or `steps_per_generation`, not both"))
        return problems
    per_device = values.get("per_device_train_batch_size")
    gen_batch = generation_batch(values, num_processes)
    if gen_batch % (per_device * num_processes):
        problems.append(Problem(
            "generation_batch_size",
            f"`generation_batch_size` ({gen_batch}) must be divisible by "
            f"per_device_train_batch_size x processes ({per_device} x {num_processes})",
        ))
    if num_generations >= 2 and gen_batch % num_generations:
        problems.append(Problem(
            key,
            f"the generation batch ({_batch_formula(values, num_processes)} = {gen_batch}) is not divisible "
            f"by `num_generations` ({num_generations}) - make per_device_train_batch_size x processes x "
            f"gradient_accumulation_steps a multiple of {num_generations}",
        ))
    elif num_generations >= 2 and values.get("dynamic_sampling") and (gen_batch // num_processes) % num_generations:
        # Each process keeps or drops the groups it holds: a group split between two processes could be neither.
        problems.append(Problem(
            "dynamic_sampling",
            f"`dynamic_sampling` keeps or drops whole groups on each process, and "
            f"each of the {num_processes} processes holds {gen_batch // num_processes} completions of the generation "
            f"batch, not a multiple of `num_generations` ({num_generations}) - make {_per_process_formula(values)} "
            f"a multiple of {num_generations}, or set `dynamic_sampling: false`",
        ))
    return problems


def _batch_formula(values: dict, num_processes: int) -> str:
    if values.get("generation_batch_size") is not None:
        return "generation_batch_size"
    steps = values.get("steps_per_generation") or values.get("gradient_accumulation_steps")
    return f"{values.get('per_device_train_batch_size')} per device x {num_processes} processes x {steps} steps"


def _per_process_formula(values: dict) -> str:
    if values.get("generation_batch_size") is not None:
        return "generation_batch_size / processes"
    steps = "steps_per_generation" if values.get("steps_per_generation") else "gradient_accumulation_steps"
    return f"per_device_train_batch_size x {steps}"


def _reward_problems(recipe: Recipe) -> list[Problem]:
    from grpo_cli.rewards import reward_names_problems
    from grpo_cli.tasks import TASKS

    names = reward_names(recipe)
    problems = [Problem("reward_funcs", p) for p in reward_names_problems(names, recipe.folder)]
    weights = recipe.values.get("reward_weights")
    if weights is not None and len(weights) != len(names):
        problems.append(Problem(
            "reward_weights",
            f"{len(weights)} `reward_weights` for {len(names)} rewards ({', '.join(names)}) - give one weight per reward",
        ))
    if not names and recipe.task.task in TASKS:
        problems.append(Problem("reward_funcs", "no rewards - list some in `reward_funcs`"))
    return problems


def check_recipe(
    recipe: Recipe, num_processes: int = 1, accelerate_config: dict | None = None, problems: list[Problem] | None = None
) -> Plan:
    """Check what a single key can't tell; raise UserError with every problem (and the loader's lines given), or
    return the plan."""
    from grpo_cli.hub import source_problems
    from grpo_cli.tasks import task_problems

    found = _file_problems(recipe) + task_problems(recipe.task) + source_problems(recipe.values.get("model_source"))
    values = _value_problems(recipe)
    found += values + _output_problems(recipe)
    # the arithmetic below needs these keys' values
    batch_ok = not {p.key for p in values} & {"per_device_train_batch_size", "num_generations", "gradient_accumulation_steps"}
    named = any(p.key == "model_name_or_path" for p in problems or [])  # the loader's problem with its value
    if "model_name_or_path" not in recipe.values and not named:
        missing = "`model_name_or_path` is missing - name a model to train"
        found.append(Problem(None, missing, str(recipe.path or "recipe")))
    launcher_shards = recipe.hardware is not None and recipe.hardware.sharded
    if recipe.values.get("master_weights") and (recipe.values.get("deepspeed") or recipe.values.get("fsdp") or launcher_shards):
        found.append(Problem(
            "master_weights",
            "`master_weights` is for a run without DeepSpeed or FSDP: DeepSpeed's optimizer keeps float32 copies of "
            "the weights itself, and FSDP shards them - drop `master_weights`",
        ))
    if recipe.values.get("fused_lora") and not recipe.values.get("use_peft"):
        found.append(Problem(
            "fused_lora",
            "`fused_lora` computes the LoRA layers of a run, and this run trains none (`use_peft` is off) - drop "
            "`fused_lora`, or set `use_peft: true`",
        ))
    if recipe.values.get("master_weights_rounding") == "stochastic" and not recipe.values.get("master_weights"):
        found.append(Problem(
            "master_weights_rounding",
            "`master_weights_rounding` rounds the float32 master weights into the model, and this run keeps none "
            "(`master_weights` is on only for full fine-tuning of bfloat16 weights without DeepSpeed or FSDP) - "
            "drop `master_weights_rounding`, or set `master_weights: true`",
        ))
    if recipe.command == "rl":
        found += _batch_problems(recipe, num_processes) if batch_ok else []
        found += _reward_problems(recipe)
        if recipe.memory.activation_offloading and recipe.values.get("gradient_checkpointing") is False:
            found.append(Problem(
                "activation_offloading",
                "`activation_offloading` moves the inputs that gradient checkpointing keeps, and "
                f"`gradient_checkpointing` is false ({recipe.where('gradient_checkpointing')}) - set "
                "`gradient_checkpointing: true`, or drop `activation_offloading`",
            ))
    problems = list(problems or []) + _located(recipe, found)
    if problems:
        raise UserError(*listing(problems))
    return build_plan(recipe, num_processes, accelerate_config)


# Keys whose defaults depend on the machine (`grpo_cli.recipe.hardware`): the plan shows each with where it came from.
MACHINE_KEYS = (
    "bf16", "use_cpu", "dataloader_pin_memory", "use_liger_kernel", "fused_lora", "flash_attention", "packed_forward",
    "activation_offloading", "lean_lm_head", "master_weights",
)
# The keys behind each row of the plan, for its `from` column.
ROW_KEYS = {
    "model": ("model_name_or_path", "use_peft", "load_in_4bit"),
    "dtype": ("dtype",),
    "task": ("task",),
    "dataset": ("dataset_generate", "dataset_generate_name", "dataset_generate_config", "dataset_name", "max_samples"),
    "rewards": ("reward_funcs", "reward_weights"),
    "effective batch": ("per_device_train_batch_size", "gradient_accumulation_steps"),
    "generations": ("num_generations", "max_completion_length"),
    "rollouts": ("rollout_engine",),
    "algorithm": ("loss_type", "beta", "learning_rate", "lr_scheduler_type"),
    "zero advantage": ("skip_zero_advantage", "beta", "loss_type"),
    "micro-batches": ("pack_micro_batches", "per_device_train_batch_size", "gradient_accumulation_steps", "packed_forward"),
    "dynamic sampling": ("dynamic_sampling", "dynamic_sampling_max_rounds"),
    "sequence length": ("max_length",),
    "steps": ("max_steps", "num_train_epochs"),
    "checkpoints": ("save_steps", "save_total_limit"),
    "tracking": ("swanlab", "swanlab_mode", "swanlab_project"),
    "output": ("output_dir",),
}


def sources(recipe: Recipe, keys: tuple[str, ...]) -> str:
    """Where the keys' values came from, for people: the recipe file's lines together (`countdown.yaml:6,7`), then
    the other sources, each once; `default` only where no key was set otherwise."""
    lines, others = [], []
    for key in keys:
        where = recipe.where(key)
        if key in recipe.lines:
            lines.append(recipe.lines[key])
        elif where != "default" and where not in others:
            others.append(where)
    named = [f"{recipe.path.name}:{','.join(map(str, sorted(set(lines))))}"] if lines else []
    return ", ".join(named + others) or "default"


def _shown(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def zero_advantage_line(values: dict) -> str:
    """What the run does with completions whose advantage is zero, in one line (grpo_cli/train/micro_batches.py)."""
    if not values.get("skip_zero_advantage"):
        return "completions trained (skip_zero_advantage: false)"
    reason = zero_advantage_trained(values)
    return f"completions trained: {reason}" if reason else "completions left out of the forward/backward"


def micro_batch_line(values: dict, accelerate_config: dict | None = None) -> str:
    """How a step's completions are laid out in micro-batches, in one line (grpo_cli/train/micro_batches.py), and
    with `packed_forward`, how each is trained (grpo_cli/engine/packed.py)."""
    line = _micro_batches(values, accelerate_config)
    if values.get("packed_forward"):
        line += "; each without its padding, a prompt once for its completions there (packed_forward)"
    return line


def _micro_batches(values: dict, accelerate_config: dict | None) -> str:
    rows = values.get("per_device_train_batch_size")
    accumulation = values.get("gradient_accumulation_steps") or 1
    if accumulation == 1:
        return f"one a step, of {rows} completions"
    sharded = sharding(accelerate_config)
    engine = None if sharded is None else "FSDP" if sharded == "fsdp" else "DeepSpeed"
    group, _, why = micro_batch_layout(values, engine)
    pack = values.get("pack_micro_batches")
    leave_out = values.get("skip_zero_advantage") and not zero_advantage_trained(values)
    emptied = "the emptied ones run no forward/backward"
    if why is None and pack:
        order = "prompt by prompt" if values.get("packed_forward") else "longest first"
        return (f"up to {accumulation} a step, filled {order} with as many completions as fit the tokens of "
                f"{rows} at the step's longest; {emptied}")
    if why is None:
        return f"up to {accumulation} a step, of {rows} completions; {emptied}" if leave_out else \
            f"{accumulation} a step, of {rows} completions"
    if group > 1 and leave_out:
        return f"{accumulation} a step, of at most {rows} completions, each one run ({why})"
    return f"{accumulation} a step, of {rows} completions" + (f" ({why})" if pack else "")


def sharding(accelerate_config: dict | None) -> str | None:
    """How an accelerate config shards the model: "fsdp", "zero1" to "zero3" (DeepSpeed), or None."""
    from grpo_cli.launch import zero_stage

    if str((accelerate_config or {}).get("distributed_type", "")).upper() == "FSDP":
        return "fsdp"
    stage = zero_stage(accelerate_config)
    return None if stage is None else f"zero{stage}"


def rollout_path(values: dict, accelerate_config: dict | None) -> str:
    """What samples the run's completions, in one line: grpo's sampler, or TRL's generation and why."""
    if values.get("rollout_engine") != "grpo":
        return "TRL's generate (rollout_engine: trl)" + (" with vLLM" if values.get("use_vllm") else "")
    sharded = sharding(accelerate_config)
    reason = rollout_fallback(values, sharded)
    if reason:
        return f"TRL's generate: {reason}"
    if sharded == "zero3":
        return "grpo's sampler, the ZeRO-3 weights gathered once per generation batch (a whole copy per GPU while it samples)"
    return "grpo's sampler"


def build_plan(recipe: Recipe, num_processes: int, accelerate_config: dict | None) -> Plan:
    from grpo_cli.launch import launch_warnings

    v = recipe.resolved()
    task = recipe.task
    per_device = v["per_device_train_batch_size"]
    accumulation = v["gradient_accumulation_steps"]
    if task.dataset_generate:
        from grpo_cli.tasks import dataset_source

        dataset = dataset_source(task)
        if task.dataset_name:  # set beside it: say which one the run reads
            dataset += f"; dataset_name {task.dataset_name} is not read (dataset_generate: 0 reads it)"
    else:
        from grpo_cli.tasks import TASKS

        default = TASKS[task.task].default_dataset if task.task in TASKS else "?"
        dataset = f"{task.dataset_name or default} [{task.dataset_train_split}]"
    if task.max_samples:
        dataset += f", first {task.max_samples} rows"
    from grpo_cli.hub import model_source

    model = v["model_name_or_path"] or "?"
    if (recipe.values.get("model_source") or model_source()) == "modelscope":
        model += "  (Hub ids from ModelScope)"
    if v.get("use_peft"):
        model += f"  (LoRA r={v.get('lora_r')}, alpha={v.get('lora_alpha')})"
    if v.get("load_in_4bit"):
        model += "  (4-bit, QLoRA)"
    rows = [
        ("command", f"grpo {recipe.command}"),
        ("recipe", str(recipe.path) if recipe.path else "(command line only)"),
        ("model", model),
        ("dtype", v["dtype"] or "float32 (not set: TRL's default)"),
        ("task", task.task),
        ("dataset", dataset),
    ]
    total = per_device * num_processes * accumulation
    batch = f"{per_device} per device x {num_processes} processes x {accumulation} accumulation = {total}"
    lr = f"{v.get('learning_rate'):g} ({v.get('lr_scheduler_type')})"
    if recipe.command == "rl":
        names = reward_names(recipe)
        weights = v.get("reward_weights") or [1.0] * len(names)
        rows.append(("rewards", ", ".join(f"{n} x {w:g}" for n, w in zip(names, weights))))
        gen_batch = generation_batch(v, num_processes)
        num_generations = v.get("num_generations")
        prompts = gen_batch // num_generations
        rows += [
            ("effective batch", f"{batch} completions per optimizer step"),
            ("generations", f"{num_generations} per prompt, {prompts} prompts per generation batch of {gen_batch}, up to "
             + f"{v.get('max_completion_length')} tokens"),
            ("rollouts", rollout_path(v, accelerate_config)),
            ("algorithm", f"loss {v.get('loss_type')}, beta {v.get('beta')}, lr {lr}"),
            ("zero advantage", zero_advantage_line(v)),
            ("micro-batches", micro_batch_line(v, accelerate_config)),
        ]
        if v.get("dynamic_sampling"):
            rounds = v.get("dynamic_sampling_max_rounds")
            refill = f"groups whose completions all score the same are refilled from fresh prompts, up to {rounds}"
            rows.append(("dynamic sampling", f"{refill} extra generation rounds per batch"))
    else:
        rows += [
            ("effective batch", f"{batch} sequences per optimizer step"),
            ("sequence length", str(v["max_length"])),
            ("algorithm", f"lr {lr}"),
        ]
    max_steps = v["max_steps"]
    rows.append(("steps", str(max_steps) if max_steps and max_steps > 0 else f"{v.get('num_train_epochs'):g} epochs"))
    rows.append(("checkpoints", f"every {v.get('save_steps'):g} steps, keep {v.get('save_total_limit')}"))
    if recipe.tracking.swanlab:
        rows.append(("tracking", f"SwanLab ({recipe.tracking.swanlab_mode}), project {recipe.tracking.swanlab_project}"))
    rows.append(("output", str(v["output_dir"])))
    plan_sources = {what: sources(recipe, ROW_KEYS[what]) for what, _ in rows if what in ROW_KEYS}
    for key in MACHINE_KEYS:
        if key in v:
            rows.append((key, _shown(v[key])))
            plan_sources[key] = sources(recipe, (key,))

    warnings = list(recipe.warnings) + launch_warnings(v, accelerate_config) + tracking_problems(recipe.tracking)
    warnings += machine_warnings(recipe)
    return Plan(rows=rows, warnings=warnings, sources=plan_sources)


# --- tracking -------------------------------------------------------------------------------------------------


def tracking_problems(tracking: TrackingArguments) -> list[str]:
    """What stops SwanLab from starting with these settings (checked before any model is loaded)."""
    if not tracking.swanlab:
        return []
    if tracking.swanlab_mode == "cloud" and not _has_api_key():
        problem = (
            "swanlab_mode: cloud needs a SwanLab API key and none is set - set SWANLAB_API_KEY "
            "(or run `swanlab login`) or use swanlab_mode: local/offline"
        )
        return [problem]
    if tracking.swanlab_mode == "local" and importlib.util.find_spec("swanboard") is None:
        problem = (
            "swanlab_mode: local needs SwanLab's dashboard package - pip install 'swanlab[dashboard]', "
            "or use swanlab_mode: offline (and `swanlab sync` the run later)"
        )
        return [problem]
    return []


def _has_api_key() -> bool:
    """An API key in SWANLAB_API_KEY, a .env file, or a saved `swanlab login`."""
    if os.environ.get("SWANLAB_API_KEY"):
        return True
    import swanlab

    project = os.environ.pop("SWANLAB_PROJECT", None)  # swanlab's settings cannot be read while it is set
    try:
        return bool(swanlab.Settings().api_key)
    finally:
        if project is not None:
            os.environ["SWANLAB_PROJECT"] = project
