"""Defaults that depend on the machine: decided once, as the recipe is loaded for a command, so that `grpo check`
prints the values training will use and `recipe.yaml` records them.

Each is set only where the recipe (file or command line) left the key unset, and remembers why:
`hardware default (no GPU)`. The measurements behind the GPU ones are in docs/performance.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any

from grpo_cli.errors import UserError
from grpo_cli.recipe import schema

STATIC = "static"
# Device nodes a CUDA (or ROCm) driver needs on Linux: without any of them torch cannot see a GPU, and `grpo check`
# need not import torch to learn so.
GPU_DEVICE_PATHS = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/dxg", "/dev/kfd")


@dataclass(frozen=True)
class Hardware:
    """What a run of the recipe will have: a CUDA GPU or not, its processes, whether the launcher shards the weights
    (DeepSpeed, FSDP), whether liger-kernel is installed. `training` False (`grpo eval`, the reward commands): only
    the rollout's settings matter, and the model's config is not read."""

    gpu: bool
    processes: int = 1
    sharded: bool = False
    liger: bool = False
    training: bool = True
    cpu_bf16: bool = False  # the CPU computes bfloat16 natively (AVX512-BF16 or AMX): bf16 autocast speeds it up


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU has AVX512-BF16 or AMX-BF16, where bfloat16 autocast is faster than float32 (without them
    bf16 matrix products are emulated: several times slower)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            flags = next((line for line in info if line.startswith("flags")), "")
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def has_cuda() -> bool:
    """`torch.cuda.is_available()`, without importing torch on a Linux machine that has no GPU driver."""
    if sys.platform == "linux" and not any(os.path.exists(path) for path in GPU_DEVICE_PATHS):
        return False
    import torch

    return torch.cuda.is_available()


def detect_hardware(
    processes: int | None = None, accelerate_config: dict | None = None, training: bool = True
) -> Hardware:
    """This machine, for a run of `processes` (default: the launcher's WORLD_SIZE) under `accelerate_config`
    (default: what `accelerate launch` told this process)."""
    from grpo_cli.launch import accelerate_config_from_env, world_size

    config = accelerate_config if accelerate_config is not None else accelerate_config_from_env() or {}
    kind = str(config.get("distributed_type", "")).upper()
    return Hardware(
        gpu=has_cuda(),
        processes=processes if processes is not None else world_size(),
        sharded=kind in ("DEEPSPEED", "FSDP") or os.environ.get("ACCELERATE_USE_FSDP") == "true",
        liger=importlib.util.find_spec("liger_kernel") is not None,
        training=training,
        cpu_bf16=cpu_has_fast_bf16(),
    )


def rollout_engine(values: dict, hardware: Hardware) -> tuple[str, str]:
    """`rollout_engine` where the recipe leaves it unset, and why: grpo's sampler with CUDA-graph decode steps on a
    GPU (grpo_cli/engine/rollout.py); on the CPU TRL's own `generate`, which is faster there. A recipe's own
    `cache_implementation` other than `static` (TRL's key, for its `generate`) keeps TRL's generate, as it did before
    `rollout_engine` existed."""
    if not hardware.gpu or values.get("use_cpu"):
        return "trl", "no GPU"
    cache = values.get("cache_implementation")
    if cache not in (None, STATIC):
        return "trl", f"cache_implementation: {cache}"
    return "grpo", "GPU"


def wants_master_weights(values: dict, hardware: Hardware) -> bool:
    """Whether the optimizer would update bfloat16 weights in place (grpo_cli/train/master_weights.py): full
    fine-tuning of a model loaded in bfloat16 (or `auto`: the checkpoint's own dtype, most often bfloat16), without
    DeepSpeed (its optimizer keeps float32 copies) or FSDP."""
    full = not values.get("use_peft")
    return full and not shards_weights(values, hardware) and values.get("dtype") in ("bfloat16", "auto")


def shards_weights(values: dict, hardware: Hardware) -> bool:
    """Whether DeepSpeed or FSDP hold the run's weights: under the launcher's config or the recipe's own key."""
    return bool(hardware.sharded or values.get("deepspeed") or values.get("fsdp"))


def quantized(values: dict) -> bool:
    """Whether the run loads k-bit (bitsandbytes) weights."""
    return bool(values.get("load_in_4bit") or values.get("load_in_8bit"))


def fuses_lora(values: dict, hardware: Hardware) -> bool:
    """Whether a LoRA run computes its adapters through `fused_lora` by default: where its weights are whole on its
    GPU (`loads_onto_gpu`; ZeRO-3's and quantized layers run PEFT's own forward; under ZeRO-1/2 and FSDP it is not
    measured)."""
    return bool(values.get("use_peft")) and loads_onto_gpu(values, hardware)


def loads_onto_gpu(values: dict, hardware: Hardware) -> bool:
    """Whether a training run loads its weights straight onto its process's GPU, in the one allocation transformers'
    loader makes for them: the trainer's move of weights loaded on the CPU puts each in a block of its own rounded
    size, held as long as the run lasts (docs/performance.md, "Under DeepSpeed, with LoRA, at 3B and 7B"). Not where
    DeepSpeed or FSDP place the weights, nor for k-bit weights (loaded onto the GPU anyway, `models.model_kwargs`)."""
    return hardware.gpu and not (values.get("use_cpu") or shards_weights(values, hardware) or quantized(values))


def rollout_fallback(values: dict, sharding: str | None) -> str | None:
    """Why a run asking for grpo's sampler (`rollout_engine: grpo`) samples through TRL's generation instead, from its
    keys and how the launcher holds the weights (`sharding`: None, "zero1", "zero2", "zero3" or "fsdp"); None where
    grpo's sampler serves it. The model's own reasons (its architecture) are known once it is loaded."""
    if values.get("use_vllm"):
        return "use_vllm: vLLM generates"
    if values.get("use_transformers_continuous_batching"):
        return "use_transformers_continuous_batching: transformers' continuous batching generates"
    if sharding == "fsdp" or values.get("fsdp"):
        return "FSDP shards the weights (grpo's sampler serves one process, DDP and DeepSpeed ZeRO-1/2/3)"
    if sharding == "zero3" and values.get("ds3_gather_for_generation") is False:
        return "ds3_gather_for_generation is false (grpo's sampler gathers the ZeRO-3 weights once per generation batch)"
    if values.get("generation_kwargs"):
        return "generation_kwargs are set (grpo's sampler knows temperature, top_k, top_p and min_p)"
    if values.get("repetition_penalty") not in (None, 1.0):
        return "repetition_penalty is set (grpo's sampler has none)"
    return None


# What each of TRL's loss types divides a micro-batch's summed token losses by, for those whose loss is a sum of one
# term per completion times its advantage: "rows" (the micro-batch's row count), "tokens" (its completion tokens), or
# None (the whole generation batch's tokens, the same for every micro-batch). grpo_cli/train/micro_batches.py scales
# a loss over fewer rows by it.
LOSS_NORMALIZERS = {
    "grpo": "rows",
    "sapo": "rows",
    "luspo": "rows",
    "dr_grpo": "rows",
    "bnpo": "tokens",
    "dapo": None,
    "cispo": None,
    "vespo": None,
}


def zero_advantage_trained(values: dict) -> str | None:
    """Why a run's completions whose advantage is zero have a gradient and are trained (`skip_zero_advantage`,
    grpo_cli/train/micro_batches.py), from its keys; None where they have none and are left out of the
    forward/backward. A model with a router loss (mixtures of experts) is known once it is loaded."""
    if values.get("beta"):
        return f"beta is {values['beta']:g}: the KL penalty gives every completion a gradient"
    if values.get("entropy_coef") or values.get("use_adaptive_entropy"):
        return "the entropy bonus (entropy_coef) gives every completion a gradient"
    if values.get("top_entropy_quantile", 1.0) < 1.0:
        return "top_entropy_quantile is below 1: its mask is taken over every completion of the micro-batch"
    if values.get("loss_type") not in LOSS_NORMALIZERS:
        return f"loss_type {values.get('loss_type')!r} is not one of {', '.join(LOSS_NORMALIZERS)}"
    return None


def micro_batch_layout(values: dict, engine: str | None) -> tuple[int, bool, str | None]:
    """How `grpo rl` may lay out the completions a step trains (grpo_cli/train/micro_batches.py): how many
    micro-batches' completions are regrouped together (the step's, or 1: each micro-batch's own), whether every
    micro-batch keeps one, and why the step's micro-batches are not packed and the emptied ones still run (None:
    they are packed and run no forward/backward). `engine`: "DeepSpeed", "FSDP" or None (one process, DDP). A model
    with a router loss (mixtures of experts) is known once it is loaded."""
    accumulation = values.get("gradient_accumulation_steps") or 1
    loss_type = values.get("loss_type")
    if loss_type not in LOSS_NORMALIZERS:
        return 1, True, f"loss_type {loss_type!r} is not one of {', '.join(LOSS_NORMALIZERS)}"
    if LOSS_NORMALIZERS[loss_type] == "tokens":
        return 1, True, f"{loss_type} divides by each micro-batch's tokens"
    if values.get("entropy_coef") or values.get("use_adaptive_entropy"):
        return 1, True, "the entropy bonus is a mean over each micro-batch's tokens"
    if values.get("top_entropy_quantile", 1.0) < 1.0:
        return 1, True, "top_entropy_quantile's mask is taken over each micro-batch"
    if (values.get("steps_per_generation") or accumulation) % accumulation:
        return 1, True, "steps_per_generation is not a multiple of gradient_accumulation_steps"
    if engine:
        return accumulation, True, f"{engine} runs every micro-batch's backward"
    return accumulation, False, None


def hardware_defaults(
    command: str, values: dict, hardware: Hardware, env: dict | None = None
) -> tuple[dict[str, tuple[Any, str]], list[str]]:
    """key -> (value, why) for the machine's defaults of the keys `values` leaves unset, and notes for the plan.

    - No GPU: bf16 off (TRL turns bf16 mixed precision on by default: a CPU cannot run it; with `use_cpu` it is on
      where the CPU has AVX512-BF16, else it is emulated and several times slower), no pinned memory (it is
      for copies to a GPU; torch warns without one), and with several processes `use_cpu` (else each trains alone).
    - Which engine samples `grpo rl`'s rollouts (`rollout_engine`: grpo's on a GPU, TRL's on the CPU).
    - Float32 master weights for full fine-tuning of bfloat16 weights without DeepSpeed (`wants_master_weights`).
    - A GPU: for `grpo rl`, the forward/backward's attention through FlashAttention's variable-length kernel
      (`flash_attention`, under DeepSpeed too), liger-kernel's fused RMSNorm, rotary and SwiGLU
      kernels where installed (GRPO steps measured faster at every micro-batch size tried), LoRA layers through
      `fused_lora` where their weights are whole (`fuses_lora`),
      `activation_offloading` with `lean_lm_head` where the forward/backward rather than the rollout sets the peak
      (`training_sets_the_peak`), and `packed_forward` where the estimate says it shortens the step
      (`packing_pays`). Not under DeepSpeed or FSDP, which manage the memory of sharded weights.
    """
    keys = schema.keys(command)
    chosen: dict[str, tuple[Any, str]] = {}
    notes: list[str] = []

    def default(key: str, value: Any, why: str) -> None:
        if key in keys and key not in values:
            chosen[key] = (value, why)

    default("rollout_engine", *rollout_engine(values, hardware))
    if hardware.training and wants_master_weights(values, hardware):
        default("master_weights", True, "full fine-tuning of bfloat16 weights")
    if not hardware.gpu:
        if hardware.cpu_bf16 and values.get("use_cpu") is True:  # transformers' CPU bf16 needs use_cpu
            default("bf16", True, "no GPU, the CPU has AVX512-BF16")
        else:
            default("bf16", False, "no GPU")
        default("dataloader_pin_memory", False, "no GPU")
        if hardware.processes > 1:
            default("use_cpu", True, f"no GPU, {hardware.processes} processes")
        return chosen, notes
    if command != "rl" or not hardware.training:
        return chosen, notes
    default("flash_attention", True, "GPU")  # the attention does not depend on how the weights are held
    if values.get("deepspeed"):
        return chosen, notes
    why = packs = None
    if not (hardware.sharded or values.get("fsdp")) and values.get("model_name_or_path"):
        left_off = "activation_offloading and packed_forward are left off"
        try:
            config = model_text_config(values, env or {})
        except UserError as err:
            notes.append(f"{left_off}: {err}")
        except Exception as err:  # noqa: BLE001 - a config transformers cannot read: the run's loading says why
            notes.append(f"{left_off}: the model's config could not be read ({err})")
        else:
            why = training_sets_the_peak(values, hardware, config)
            packs = packing_pays(values, hardware.processes, _shape(config))
    if packs:
        default("packed_forward", True, packs)
    if why:
        # LoRA does not train the LM head: nothing for the lean backward to save
        for key in ("activation_offloading",) if values.get("use_peft") else ("activation_offloading", "lean_lm_head"):
            default(key, True, why)
    if fuses_lora(values, hardware):
        default("fused_lora", True, "GPU, LoRA")
    if "use_liger_kernel" not in values:
        if hardware.liger:
            default("use_liger_kernel", True, "GPU, liger-kernel installed")
        else:
            notes.append(
                "liger-kernel is not installed: `pip install 'grpo-cli[liger]'` makes GRPO steps faster on a GPU "
                "(fused norm, rotary and SwiGLU kernels)"
            )
    return chosen, notes


def generation_batch(values: dict, num_processes: int) -> int:
    """Completions generated at once, as GRPOConfig derives it for this many processes."""
    if values.get("generation_batch_size") is not None:
        return values["generation_batch_size"]
    steps = values.get("steps_per_generation") or values.get("gradient_accumulation_steps")
    return values.get("per_device_train_batch_size") * num_processes * steps


def model_text_config(values: dict, env: dict):
    """The recipe's model's config (its text part for multimodal ones) from `grpo_cli.models.model_config`: nothing
    loaded, converted or downloaded but config.json (a local folder, a prepared demo model, or the Hub), under the
    recipe's `env:` (a Hub mirror, a cache folder); one that cannot be read is a UserError."""
    from grpo_cli.models import model_config

    name = str(values.get("model_name_or_path") or "")
    with _environment(env, values.get("model_source")):
        config = model_config(name, values.get("model_revision"), bool(values.get("trust_remote_code")))
    return getattr(config, "text_config", None) or config


def _shape(config):
    """The estimate's shape of a decoder's config; None for a config without its sizes."""
    from grpo_cli.engine.estimate import ModelShape

    shape = ModelShape.of(config)
    return shape if shape.complete else None


def _with_rl_defaults(values: dict) -> dict:
    """`values` with every `grpo rl` key it leaves unset at its schema default."""
    return {**{key: spec.get("default") for key, spec in schema.keys("rl").items()}, **values}


# The prompt `packing_pays` assumes: the short end of Countdown's and GSM8K's chat prompts (100-250 tokens), since
# the shorter the prompt the less `packed_forward` saves, and a default must not make a step longer.
PACKING_PROMPT_TOKENS = 128


def packing_pays(values: dict, processes: int, shape) -> str | None:
    """Why `packed_forward` should shorten this run's steps on a GPU (None where it likely would not): in `grpo
    check`'s estimate (grpo_cli.engine.estimate), the forward/backward's tokens it saves, each prompt computed once for
    the completions that share it in a micro-batch, outweigh what laying out each micro-batch costs in every layer.
    Large models with micro-batches holding several completions of a prompt gain; small ones, whose micro-batches are
    bound by their kernels' launches, lose. Its GPU attention is FlashAttention's through transformers' SDPA
    interface: not where `flash_attention` or another attention implementation is asked for."""
    if shape is None or values.get("flash_attention") is False or values.get("attn_implementation") not in (None, "sdpa"):
        return None  # (`flash_attention` unset: on, the GPU default)
    fused = values["fused_lora"] if "fused_lora" in values else fuses_lora(values, Hardware(gpu=True))
    values = _with_rl_defaults(values)
    from dataclasses import replace

    from grpo_cli.engine.estimate import CARDS, RunShape, estimate

    run = RunShape(
        micro_batch=values["per_device_train_batch_size"],
        rollout_rows=generation_batch(values, processes) // processes,
        prompt_tokens=PACKING_PROMPT_TOKENS,
        completion_tokens=values["max_completion_length"],
        lora_rank=(values.get("lora_r") or 16) if values.get("use_peft") else 0,
        fused_lora=bool(fused),
        gradient_checkpointing=bool(values.get("gradient_checkpointing")),
        flash_attention=True,
        generations=values["num_generations"],
    )
    card = CARDS["H100-80GB"]  # the card its cost was measured on; slower cards gain more from fewer tokens
    padded = estimate(shape, run, card).train_s
    saved = padded - estimate(shape, replace(run, packed_forward=True), card).train_s
    if saved < 0.02 * padded:  # within the estimate's error: not worth another path
        return None
    return f"GPU: {saved / padded:.0%} less forward/backward a step in grpo check's estimate"


def training_sets_the_peak(values: dict, hardware: Hardware, config) -> str | None:
    """Why offloading layer inputs should lower this run's peak (None where it likely would not): gradient
    checkpointing is on and a micro-batch's layer inputs are a large share of the rollout's KV cache (half of it
    with full fine-tuning, whose weight gradients add to the forward/backward's side; all of it with LoRA), from the
    model's `config`."""
    values = _with_rl_defaults(values)
    if not values.get("gradient_checkpointing"):
        return None
    from grpo_cli.engine.offload import layer_input_share

    try:
        rows = generation_batch(values, hardware.processes) // hardware.processes
        share = layer_input_share(config, values["per_device_train_batch_size"], rows)
    except (AttributeError, TypeError, ZeroDivisionError):  # a config without the sizes: nothing to decide from
        return None
    if share < (1.0 if values.get("use_peft") else 0.5):
        return None
    return f"GPU: a micro-batch's layer inputs are {share:.2f}x the rollout's KV cache"


@contextlib.contextmanager
def _environment(env: dict, model_source: str | None):
    """The recipe's `env:` and `model_source` in the environment for a while, as a run will have them."""
    from grpo_cli.hub import SOURCE_VARIABLE

    changes = {**env, **({SOURCE_VARIABLE: model_source} if model_source else {})}
    before = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
