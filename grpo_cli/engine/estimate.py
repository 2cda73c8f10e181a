"""A GRPO step's peak GPU memory and time per process, predicted from the model's config and the run's shape, before
anything loads.

The peak is the larger of two moments of a step. While sampling: what persists between steps (weights, optimizer
state), the rollout's KV cache and logits buffers, the stacked q/k/v copy and, under ZeRO-3, the gathered weights.
In the forward/backward: what persists, the gradients, the checkpointed layer inputs (none on the GPU with
activation offloading), and the larger of the LM head's logits for a micro-batch (and their gradient) and one layer's
recomputed activations (PEFT's LoRA layers keep float32 copies of their inputs and a dropout mask besides;
`fused_lora` keeps them in bf16). The constants below were fitted to peaks torch measured
(`torch.cuda.max_memory_allocated`) on an H200 and an H100 with `benchmarks/grpo_bench.py` (docs/performance.md has
the table); step times scale the same way with the card's memory bandwidth and bf16 speed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 2**30
# Bytes per token of one layer's recomputed activations, per unit of hidden and intermediate size (bf16 tensors:
# norms, q/k/v/o, attention, gate/up/act/product), and what LoRA adds per unit of a targeted projection's input size
# (the float32 copy of the input PEFT casts to, dropout's mask and output).
LAYER_HIDDEN_BYTES = 16
LAYER_INTERMEDIATE_BYTES = 8
LORA_INPUT_BYTES = 9
# Bytes per (micro-batch token x vocabulary entry) in the loss: the completion logits and their gradient, bf16.
LOGIT_BYTES = 1
# Bytes per (rollout row x vocabulary entry) of the sampler's logits buffers and sampling temporaries.
ROLLOUT_LOGIT_BYTES = 18
ZERO3_OVERHEAD = 1 * GIB  # DeepSpeed ZeRO-3's buffers (prefetch, reduce buckets) besides the partitions
# Decode step: reading the weights and the cache at this share of the card's bandwidth, plus a fixed time per layer
# (kernel launches in the CUDA graph; more with LoRA's extra products).
DECODE_BANDWIDTH_SHARE = 0.65
DECODE_LAYER_S = 95e-6
DECODE_LORA_LAYER_S = 45e-6
# Forward/backward at this share of the card's dense bf16 speed; under ZeRO-3 each layer's weights are fetched in
# the forward, the recomputation and the backward, which takes about as long again.
TRAIN_FLOPS_SHARE = 0.45
TRAIN_TOKEN_LAYER_S = 0.23e-6  # the elementwise kernels' time per token and layer, whatever the matrix sizes
# The host's time to launch one layer's kernels for one micro-batch (its forward, recomputation and backward): a
# micro-batch takes at least this long a layer however few its tokens, where the GPU waits on the launches.
TRAIN_LAUNCH_LAYER_S = 7.8e-3
# What LoRA adds to that per layer and micro-batch, for its projections on every linear layer (PEFT's modules launch
# their kernels from Python one by one); in proportion for fewer.
TRAIN_LORA_LAYER_S = 6e-3
# Bytes moved per token and per element of a targeted projection's input, in the forward, its recomputation and the
# backward, that `fused_lora` saves (PEFT's float32 copies of the inputs and their gradients) and that an adapter
# without dropout saves (the dropped copy, its mask, their gradient), at the decode steps' share of the bandwidth.
LORA_FLOAT32_BYTES = 20
LORA_DROPOUT_BYTES = 40
ZERO3_TRAIN_FACTOR = 2.2
# The forward/backward's attention through FlashAttention's variable-length kernel (`flash_attention`) instead of
# SDPA's memory-efficient kernel with a padding mask, which the constants above were fitted through: the seconds it
# saves, per causal attention FLOP of one forward pass, in units of the card's dense bf16 time (fitted to the 3B and
# 7B A/B at 1024 tokens on one H100: 1.97 and 2.39 s).
FLASH_ATTENTION_SAVING = 70.0
# Fitted at 1024 tokens only, where it takes 17% (7B) and 25% (3B) off the forward/backward: at other lengths it takes
# a quarter at most (the constants above grow linearly with the tokens, the attention's FLOPs quadratically).
FLASH_ATTENTION_MAX_SHARE = 0.25
# `packed_forward`: a micro-batch's forward/backward without its padding, each prompt computed once for the
# completions that share it, trains fewer tokens; each layer of each micro-batch then costs this much more (laying the
# batch out, gathering each completion's prompt keys), fitted to the A/Bs at 3B/1024, 7B/512 and 7B/1024 on one H100.
PACKED_LAYER_S = 1.5e-3

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Projections that read the same input tensor.
SHARED_INPUT = {"q_proj": "attention", "k_proj": "attention", "v_proj": "attention", "gate_proj": "mlp", "up_proj": "mlp"}


@dataclass(frozen=True)
class Card:
    """A GPU as the estimate needs it: its memory, bandwidth and dense bf16 speed."""

    name: str
    memory_gib: float
    bandwidth_gb_s: float = 3350.0
    bf16_tflops: float = 989.0


# Cards by the names `grpo check --gpu` takes (memory as the driver reports it, about 2-3% under the label).
CARDS = {
    "H200": Card("H200", 139.8, 4800, 989),
    "H100-80GB": Card("H100-80GB", 79.2, 3350, 989),
    "H100-PCIe": Card("H100-PCIe", 79.2, 2000, 756),
    "A100-80GB": Card("A100-80GB", 79.2, 2039, 312),
    "A100-40GB": Card("A100-40GB", 39.4, 1555, 312),
    "L40S": Card("L40S", 44.4, 864, 362),
    "A10G": Card("A10G", 22.0, 600, 125),
    "RTX-4090": Card("RTX-4090", 23.6, 1008, 165),
    "RTX-3090": Card("RTX-3090", 23.6, 936, 71),
}


@dataclass(frozen=True)
class ModelShape:
    """What the estimate reads of a decoder-only model's config."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = True
    qkv_bias: bool = False

    @classmethod
    def of(cls, config) -> ModelShape:
        """From a transformers config (its text part for multimodal ones) or a dict of config.json's keys."""
        get = config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default)
        text = get("text_config")
        if text is not None:
            return cls.of(text)
        heads = get("num_attention_heads")
        hidden = get("hidden_size")
        return cls(
            hidden=hidden,
            layers=get("num_hidden_layers"),
            heads=heads,
            kv_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim") or (hidden // heads if hidden and heads else None),
            intermediate=get("intermediate_size"),
            vocab=get("vocab_size"),
            tied=bool(get("tie_word_embeddings", True)),
            qkv_bias=get("model_type") == "qwen2" or bool(get("attention_bias", False)),
        )

    @property
    def complete(self) -> bool:
        """Whether the config gave every size the estimate reads."""
        return None not in (self.hidden, self.layers, self.heads, self.head_dim, self.intermediate, self.vocab)

    def projection_sizes(self) -> dict[str, tuple[int, int]]:
        """(inputs, outputs) of each linear projection in a layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def parameters(self) -> int:
        sizes = self.projection_sizes()
        layer = sum(a * b for a, b in sizes.values()) + 2 * self.hidden
        if self.qkv_bias:
            layer += sizes["q_proj"][1] + 2 * sizes["k_proj"][1]
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * layer + embeddings + self.hidden

    def cache_width(self) -> int:
        """Values one token keeps in one layer's KV cache."""
        return 2 * self.kv_heads * self.head_dim


@dataclass(frozen=True)
class RunShape:
    """What a GRPO step does on one process."""

    micro_batch: int  # completions per forward/backward (per_device_train_batch_size)
    rollout_rows: int  # completions sampled at once (the generation batch on this process)
    prompt_tokens: int
    completion_tokens: int
    weight_bytes: int = 2  # bf16; 4 for float32
    lora_rank: int = 0  # 0: full fine-tuning
    lora_modules: tuple[str, ...] = LINEAR_NAMES
    lora_dropout: bool = True
    fused_lora: bool = False  # `fused_lora`: the LoRA layers keep bf16 inputs, not PEFT's float32 copies
    gradient_checkpointing: bool = True
    activation_offloading: bool = False
    flash_attention: bool = False  # `flash_attention`: the forward/backward's attention through FlashAttention
    packed_forward: bool = False  # `packed_forward`: each prompt trained once for its completions in a micro-batch
    generations: int = 8  # completions per prompt (num_generations)
    zero_stage: int = 0  # DeepSpeed ZeRO stage; 0 without DeepSpeed
    processes: int = 1
    grpo_sampler: bool = True  # False: TRL's generate (no stacked copy, no CUDA graphs)
    master_weights: bool = False  # float32 copies of 16-bit weights for the optimizer (without DeepSpeed)


@dataclass
class Estimate:
    """Predicted bytes of each part at the peak of each moment, and the step's seconds."""

    sampling: dict[str, int] = field(default_factory=dict)
    training: dict[str, int] = field(default_factory=dict)
    generation_s: float = 0.0
    train_s: float = 0.0

    @property
    def peak(self) -> int:
        return max(sum(self.sampling.values()), sum(self.training.values()))

    @property
    def peak_moment(self) -> str:
        return "sampling" if sum(self.sampling.values()) >= sum(self.training.values()) else "forward/backward"

    @property
    def parts(self) -> dict[str, int]:
        """The parts of the moment that sets the peak."""
        return self.sampling if self.peak_moment == "sampling" else self.training

    @property
    def step_s(self) -> float:
        return self.generation_s + self.train_s


def lora_parameters(shape: ModelShape, run: RunShape) -> int:
    sizes = shape.projection_sizes()
    return shape.layers * sum(run.lora_rank * (a + b) for name, (a, b) in sizes.items() if name in run.lora_modules)


def estimate(shape: ModelShape, run: RunShape, card: Card | None = None) -> Estimate:
    """The peak GPU memory of one process of a GRPO step, split by part, and (on `card`) its time."""
    wb, n = run.weight_bytes, max(1, run.processes)
    params = shape.parameters()
    adapter = lora_parameters(shape, run) if run.lora_rank else 0
    persistent: dict[str, int] = {}
    if run.zero_stage == 3:
        persistent["weights"] = params * wb // n + 16 * adapter
        persistent["optimizer state"] = (0 if adapter else 12 * params // n) + ZERO3_OVERHEAD
        persistent["gradients"] = 0 if adapter else 2 * params // n  # DeepSpeed's float32 partition, kept
    elif run.zero_stage in (1, 2):
        persistent["weights"] = params * wb + 16 * adapter
        persistent["optimizer state"] = 0 if adapter else 12 * params // n  # float32 master weights + Adam
    else:
        persistent["weights"] = params * wb + 4 * adapter  # LoRA's adapters in float32
        if adapter:
            persistent["optimizer state"] = 8 * adapter
        elif run.master_weights:  # float32 copies and Adam's float32 moments
            persistent["optimizer state"] = 12 * params
        else:
            persistent["optimizer state"] = 2 * params * wb  # Adam in the weights' dtype

    tokens = run.prompt_tokens + run.completion_tokens
    sampling = dict(persistent)
    sampling["KV cache"] = run.rollout_rows * shape.layers * shape.cache_width() * wb * tokens
    sampling["sampling buffers"] = run.rollout_rows * shape.vocab * ROLLOUT_LOGIT_BYTES
    if run.grpo_sampler:
        q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        stacked = shape.layers * shape.hidden * (q + 2 * kv) * wb
        sampling["stacked q/k/v"] = stacked
        if run.zero_stage == 3:
            sampling["gathered weights"] = params * wb - persistent["weights"] + 16 * adapter + stacked

    training = dict(persistent)
    if not adapter:
        training["gradients"] = training.get("gradients", 0) + params * wb * (2 if run.zero_stage in (1, 2) else 1)
    micro_tokens = run.micro_batch * tokens
    if run.gradient_checkpointing:
        stored_layers = 2 if run.activation_offloading else shape.layers
        training["layer inputs"] = micro_tokens * shape.hidden * wb * stored_layers
        per_layer = 1
    else:
        per_layer = shape.layers
    layer = micro_tokens * (LAYER_HIDDEN_BYTES * shape.hidden + LAYER_INTERMEDIATE_BYTES * shape.intermediate)
    if adapter:
        targeted = _lora_inputs(shape, run)
        inputs = sum(targeted.values())
        if not run.fused_lora:
            layer += micro_tokens * inputs * (LORA_INPUT_BYTES if run.lora_dropout else 4)
        elif run.lora_dropout:  # each projection's dropped bf16 input and its one-byte mask
            layer += micro_tokens * inputs * (wb + 1)
        else:  # the bf16 input itself, once for the projections that share it (q/k/v, gate/up)
            shared = {SHARED_INPUT.get(name, name): size for name, size in targeted.items()}
            layer += micro_tokens * sum(shared.values()) * wb
    logits = run.micro_batch * run.completion_tokens * shape.vocab * LOGIT_BYTES
    training["activations"] = max(layer * per_layer, logits + (layer * (per_layer - 1)))
    result = Estimate(sampling, training)
    if card is not None:
        result.generation_s, result.train_s = _seconds(shape, run, card, params, adapter)
    return result


def trained_tokens(run: RunShape) -> float:
    """The tokens a completion's row puts through the forward/backward: its prompt and completion padded to the
    longest; with `packed_forward`, its completion and its share of a prompt computed once for the completions of
    that prompt in its micro-batch."""
    if not run.packed_forward:
        return run.prompt_tokens + run.completion_tokens
    return run.completion_tokens + run.prompt_tokens / max(1, min(run.micro_batch, run.generations))


def _lora_inputs(shape: ModelShape, run: RunShape) -> dict[str, int]:
    """The input size of each projection LoRA targets in a layer."""
    sizes = shape.projection_sizes()
    return {name: sizes[name][0] for name in run.lora_modules if name in sizes}


def _seconds(shape: ModelShape, run: RunShape, card: Card, params: int, adapter: int) -> tuple[float, float]:
    wb = run.weight_bytes
    tokens = run.prompt_tokens + run.completion_tokens
    # a decode step reads the weights and, on average, half of the cache written by the end
    read = params * wb + run.rollout_rows * shape.layers * shape.cache_width() * wb * (run.prompt_tokens + tokens) / 2
    per_layer = DECODE_LAYER_S + (DECODE_LORA_LAYER_S if adapter else 0.0)
    if run.grpo_sampler:
        decode = read / (card.bandwidth_gb_s * 1e9 * DECODE_BANDWIDTH_SHARE) + shape.layers * per_layer
    else:  # TRL's generate launches every kernel from Python
        decode = read / (card.bandwidth_gb_s * 1e9 * DECODE_BANDWIDTH_SHARE) + shape.layers * 1.6e-3
    generation = decode * run.completion_tokens
    # forward 2, backward 4 (2 with LoRA: no weight gradients of the base), recomputation 2 per parameter and token
    factor = 2 + (2 if adapter else 4) + (2 if run.gradient_checkpointing else 0)
    trained = trained_tokens(run)
    flops = factor * params * run.rollout_rows * trained
    train = flops / (card.bf16_tflops * 1e12 * TRAIN_FLOPS_SHARE)
    train += run.rollout_rows * trained * shape.layers * TRAIN_TOKEN_LAYER_S
    micro_batches = -(-run.rollout_rows // max(1, run.micro_batch))
    train = micro_batches * max(train / micro_batches, shape.layers * TRAIN_LAUNCH_LAYER_S)
    if adapter:  # each LoRA projection's own kernels, launched one by one from Python in every micro-batch
        targeted = _lora_inputs(shape, run)
        train += micro_batches * shape.layers * TRAIN_LORA_LAYER_S * len(targeted) / len(LINEAR_NAMES)
        saved = (LORA_FLOAT32_BYTES if run.fused_lora else 0) + (0 if run.lora_dropout else LORA_DROPOUT_BYTES)
        elements = run.rollout_rows * trained * shape.layers * sum(targeted.values())
        train -= elements * saved / (card.bandwidth_gb_s * 1e9 * DECODE_BANDWIDTH_SHARE)
    if run.packed_forward:
        train += micro_batches * shape.layers * PACKED_LAYER_S
    train *= ZERO3_TRAIN_FACTOR if run.zero_stage == 3 else 1
    if run.flash_attention:  # a causal forward: two products of each row's tokens with the earlier ones, per head
        attention = 2 * run.rollout_rows * tokens**2 * shape.heads * shape.head_dim * shape.layers
        train -= min(FLASH_ATTENTION_SAVING * attention / (card.bf16_tflops * 1e12), FLASH_ATTENTION_MAX_SHARE * train)
    return generation, train
