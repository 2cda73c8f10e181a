"""Rollouts without vLLM: sampling from the policy with a static KV cache, each decode step one CUDA graph replay.

TRL's own path calls `model.generate`, which launches every kernel of every layer from Python at each decode step:
tens of milliseconds per token on a small model whose weights the GPU reads in well under one. Here the cache is
allocated once per rollout and the one-token step of the whole batch is captured as a CUDA graph. The sampling is
TRL's: float32 logits, temperature, top-k, top-p, min-p, and a completion ends at its first EOS token, which it keeps.

`grpo rl` samples through it as TRL's `rollout_func` (grpo_cli/train/rollout_func.py), `grpo eval` directly; both
through a `Sampler`, built with its `EngineOptions`. GRPO samples several completions of each prompt: a prompt goes
through the prefill once, and its keys and values fill the cache rows of all its completions (each then drawn on its
own).

It reuses the model's own modules (norms, projections with any LoRA layers, MLP, rotary embedding), so only the
attention and the cache are ours; models of another shape, and set-ups it does not cover, go through TRL's path.
A decode step's attention goes through FlashAttention's variable-length kernel where PyTorch has it (each row and
key/value head one sequence that starts at the row's first real token, its query heads as that sequence's queries):
it reads each row's keys and values once and only as far as the row has come, and needs no mask for the left
padding, so one graph serves the whole rollout. Without it, PyTorch's scaled_dot_product_attention runs with a mask,
one graph per stretch of cache length (a step reads only the stretches in use).
"""

from __future__ import annotations

import inspect
import logging
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

from grpo_cli.engine.attention import flash_serves, flash_varlen
from grpo_cli.once import SayOnce

logger = logging.getLogger("grpo_cli.engine.rollout")

# Decoder-only families whose layers are: norm -> attention (q/k/v/o projections, rotary, optional q/k norms) ->
# residual -> norm -> MLP -> residual, with plain scaled dot-product attention over all earlier tokens.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
# Rotary embeddings computed from the positions alone (no update that depends on the data, which a graph can't hold).
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# Tokens of cache per decode graph on the SDPA path: a step attends over the stretches in use, not the whole cache.
KV_STRETCH = 256
ALL_DONE_CHECK_EVERY = 32  # decode steps between checks whether every completion has ended (a device sync)


@dataclass(frozen=True)
class EngineOptions:
    """What grpo's sampler may use: all of it by default; a benchmark turns one part off to time what it brings."""

    # each decode step one CUDA graph replay (else every kernel launched from Python)
    cuda_graphs: bool = True
    # decode attention through FlashAttention's variable-length kernel where it exists (else PyTorch's SDPA, masked)
    flash_decode: bool = True
    # a prompt that several rows share (GRPO's generations of one prompt) goes through the prefill once
    shared_prefill: bool = True
    # share of the GPU memory free at rollout time that one generation batch's cache and buffers may take; a larger
    # batch is sampled in parts that fit (each row is drawn on its own either way: the same sampling, more time)
    memory_share: float = 0.8


@dataclass
class Sampling:
    """How tokens are drawn from the logits (TRL's generation settings)."""

    temperature: float = 1.0
    top_k: int | None = 0
    top_p: float = 1.0
    min_p: float | None = None
    # the most likely token, the first of equals (generate's greedy decoding); no sampling
    greedy: bool = False


def cannot_serve(model) -> str | None:
    """Why grpo's sampler cannot run `model` (None: it can), the one answer training and `grpo eval` ask; a PEFT
    model is served as its base with the LoRA layers in place."""
    model = without_peft_wrapper(model)
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    core = getattr(model, "model", None)
    if core is None or not all(
        hasattr(core, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")
    ):
        return "the model does not have the usual embed_tokens / layers / norm / rotary_emb layout"
    if not hasattr(model, "lm_head"):
        return "the model has no lm_head"
    if getattr(config, "use_sliding_window", False) or (
        model_type == "mistral" and getattr(config, "sliding_window", None)
    ):
        return "sliding-window attention"
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        return "layers other than full attention"
    rope_type = getattr(core.rotary_emb, "rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        return f"rotary embedding type {rope_type!r}"
    attn = core.layers[0].self_attn
    if not all(hasattr(attn, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim")):
        return "attention without q/k/v/o projections"
    if _rope_function(attn) is None:
        return "no apply_rotary_pos_emb in the model's module"
    return None


def _rope_function(attn):
    return getattr(inspect.getmodule(type(attn)), "apply_rotary_pos_emb", None)


def _flash_decode_available(device, dtype, head_dim: int) -> bool:
    """Whether PyTorch's FlashAttention kernel can run the decode attention here (`flash_serves`): its
    variable-length entry with per-sequence key counts, and a first call on a few tokens that ran."""
    return flash_serves("decode", device, dtype, head_dim, _flash_decode_runs)


def _flash_decode_runs(device, dtype, head_dim: int) -> bool:
    import torch

    forward = getattr(torch.ops.aten, "_flash_attention_forward", None)
    if forward is None or "seqused_k" not in str(forward.default._schema):
        return False
    try:  # two sequences of one and two keys, one query each
        ones = torch.ones(4, 1, head_dim, device=device, dtype=dtype)
        starts = torch.tensor([0, 1, 2], device=device, dtype=torch.int32)
        seen = torch.tensor([1, 2], device=device, dtype=torch.int32)
        out = flash_varlen(ones[:2], ones, ones, starts, starts * 2, 1, 2, head_dim**-0.5, seen=seen)
        return bool(torch.allclose(out.float(), torch.ones_like(out, dtype=torch.float32)))
    except (RuntimeError, TypeError) as err:
        logger.info("decode attention through scaled_dot_product_attention: FlashAttention failed (%s)", err)
        return False


def foldable_adapters(linear) -> list[str] | None:
    """The active adapters of a PEFT LoRA layer whose update the fast paths compute (the decode steps' fold,
    `lora_factors`; `fused_lora` in training), or None where the layer is something else: a plain or quantized
    linear, a merged or disabled adapter, DoRA or another variant, an adapter with a bias.

    The rollout samples from base + adapter as PEFT's forward computes it in eval mode: adapter dropout, a training
    regularizer of the update, is not applied while sampling (vLLM's LoRA serving does not apply it either)."""
    import torch

    base = getattr(linear, "base_layer", None)
    if type(base) is not torch.nn.Linear or not hasattr(linear, "lora_A") or getattr(linear, "fan_in_fan_out", False):
        return None
    if getattr(linear, "merged", False) or getattr(linear, "disable_adapters", False):
        return None
    adapters = [name for name in linear.active_adapters if name in linear.lora_A]
    if not adapters or any(name in getattr(linear, "lora_variant", {}) for name in adapters):
        return None
    if any(linear.lora_B[name].bias is not None for name in adapters):
        return None
    return adapters


def lora_factors(linear):
    """A foldable LoRA layer's base `nn.Linear` and its adapters' update as two factors (A: [rank, in], B: [out,
    rank], the scaling folded into B; several adapters side by side); None where `foldable_adapters` says no."""
    import torch

    adapters = foldable_adapters(linear)
    if adapters is None:
        return None
    a = torch.cat([linear.lora_A[name].weight for name in adapters])
    b = torch.cat([linear.lora_B[name].weight * linear.scaling[name] for name in adapters], dim=1)
    return linear.base_layer, a, b


def _whole_linear(linear):
    """A projection's weight and bias as one `nn.Linear` computes them, with any foldable LoRA update merged into a
    new weight (computed in float32, rounded once), or None where it has neither form (quantized weights)."""
    import torch

    if type(linear) is torch.nn.Linear:
        return linear.weight, linear.bias
    factors = lora_factors(linear)
    if factors is None:
        return None
    base, a, b = factors
    merged = torch.addmm(base.weight.float(), b.float(), a.float()).to(base.weight.dtype)  # never in place
    return merged, base.bias


def _stackable_projections(attn):
    """The attention's q/k/v projections where they can be stacked into one matrix: plain `nn.Linear` layers or LoRA
    layers over them (`lora_factors`), all with a bias or all without (else None)."""
    import torch

    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    bases = [p.base_layer if foldable_adapters(p) is not None else p for p in projections]
    if any(type(p) is not torch.nn.Linear for p in bases) or len({p.bias is None for p in bases}) > 1:
        return None
    return bases


def _stacked_qkv(attn):
    """The q/k/v projections' weights and biases stacked into one matrix, any LoRA update merged in, so a layer makes
    one matrix product where it made three (a decode step's are small enough that each one's launch, not its reading,
    sets its time), or None where they cannot be stacked. A copy, made at each rollout: the weights change at every
    optimizer step."""
    import torch

    if _stackable_projections(attn) is None:
        return None
    whole = [_whole_linear(p) for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
    bias = None if whole[0][1] is None else torch.cat([b for _, b in whole])
    return torch.cat([w for w, _ in whole]), bias, [w.shape[0] for w, _ in whole]


class _FoldedLoRA:
    """A LoRA layer's product in a decode step: the base weight's, then the adapter's low-rank update added in place
    with its scaling folded into B, all in the weight's dtype: three kernels, where PEFT's forward launches about
    seven (the input cast to the adapter's float32, two products, the scaling, the sum, the cast back)."""

    def __init__(self, base, a, b):
        self.weight, self.bias = base.weight, base.bias
        self.a = a.to(base.weight.dtype)
        self.bt = b.t().to(base.weight.dtype)

    def __call__(self, x, low=None):
        """The layer's output for x; `low` is x's product with A where the caller made it already."""
        import torch

        out = torch.nn.functional.linear(x, self.weight, self.bias)
        if low is None:
            low = torch.nn.functional.linear(x, self.a)
        out.view(-1, out.shape[-1]).addmm_(low.reshape(-1, low.shape[-1]), self.bt)
        return out


class _FoldedGateUp:
    """The gate and up projections' products in a decode step where both are foldable LoRA layers: they share their
    input, so one product with both adapters' A stacked serves both updates (five kernels, where two `_FoldedLoRA`
    launch six; each product with A is too small for its reading to set its time)."""

    def __init__(self, gate: _FoldedLoRA, up: _FoldedLoRA):
        import torch

        self.gate, self.up = gate, up
        self.a, self.rank = torch.cat([gate.a, up.a]), gate.a.shape[0]

    def __call__(self, x):
        import torch

        low = torch.nn.functional.linear(x, self.a)
        return self.gate(x, low[..., : self.rank]), self.up(x, low[..., self.rank :])


def _decode_linear(linear):
    """What a decode step calls for one projection: `_FoldedLoRA` for a foldable LoRA layer, the module itself
    otherwise."""
    factors = lora_factors(linear)
    return linear if factors is None else _FoldedLoRA(*factors)


def _gate_up(gate_proj, up_proj):
    """What a decode step calls for the gate and up projections of one input: `_FoldedGateUp` where both are foldable
    LoRA layers, `_separate_gate_up` otherwise."""
    gate, up = lora_factors(gate_proj), lora_factors(up_proj)
    if gate is not None and up is not None:
        return _FoldedGateUp(_FoldedLoRA(*gate), _FoldedLoRA(*up))
    return _separate_gate_up(gate_proj, up_proj)


def _separate_gate_up(gate_proj, up_proj):
    """The gate and up projections each as `_decode_linear` makes it, as one call giving both."""
    gate, up = _decode_linear(gate_proj), _decode_linear(up_proj)
    return lambda x: (gate(x), up(x))


def _folded_linears(layer):
    """A layer's o projection, gate and up projections (one call giving both) and down projection for the decode steps,
    where any of them is a foldable LoRA layer and the MLP is the gated one of the supported families
    (act(gate(x)) * up(x) -> down), else None (the modules run)."""
    mlp = layer.mlp
    if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return None
    linears = (layer.self_attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    if all(foldable_adapters(linear) is None for linear in linears):
        return None
    return _decode_linear(layer.self_attn.o_proj), _gate_up(mlp.gate_proj, mlp.up_proj), _decode_linear(mlp.down_proj)


def _whole_bytes(parameter) -> int:
    """A parameter's bytes at its whole size (a DeepSpeed ZeRO-3 shard's `ds_numel`: the size once gathered)."""
    return getattr(parameter, "ds_numel", parameter.numel()) * parameter.element_size()


def stacked_qkv_bytes(model) -> int:
    """GPU memory the rollout's stacked q/k/v weights take (`_stacked_qkv`), besides the model's own."""
    total = 0
    for layer in model.model.layers:
        for p in _stackable_projections(layer.self_attn) or ():
            total += _whole_bytes(p.weight) + (_whole_bytes(p.bias) if p.bias is not None else 0)
    return total


def gathered_bytes(model) -> int:
    """GPU memory a rollout from a DeepSpeed ZeRO-3 model adds to its shards: each parameter not held whole on this
    process at its whole size (gathered for the rollout), and the stacked q/k/v weights made from them."""
    partitioned = [p for p in model.parameters() if hasattr(p, "ds_numel") and p.numel() < p.ds_numel]
    return sum(_whole_bytes(p) for p in partitioned) + stacked_qkv_bytes(model)


@contextmanager
def _adapter_dropout_off(model):
    """LoRA dropout off while sampling (`foldable_adapters`), back as it was after, for the layers the decode steps fold:
    the prefill runs their PEFT modules, which would apply it in training mode."""
    switched = [
        dropout
        for module in model.modules()
        if foldable_adapters(module) is not None
        for dropout in module.lora_dropout.values()
        if dropout.training
    ]
    for dropout in switched:
        dropout.train(False)
    try:
        yield
    finally:
        for dropout in switched:
            dropout.train(True)


def _has_active_dropout(model) -> bool:
    import torch

    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 and m.training for m in model.modules())


class _Decoder:
    """The model's forward over a preallocated KV cache, for a fixed batch of left-padded prompts."""

    def __init__(self, model, batch: int, max_len: int, pad_start, device, dtype, flash: bool):
        import torch

        core = model.model
        self.core, self.lm_head, self.layers = core, model.lm_head, list(core.layers)
        attn = self.layers[0].self_attn
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = attn.head_dim
        self.scaling = getattr(attn, "scaling", self.head_dim**-0.5)
        self.rope = _rope_function(attn)
        shape = (batch, self.kv_heads, max_len, self.head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in self.layers]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in self.layers]
        self.pad_start = pad_start.view(batch, 1, 1, 1)  # first real token of each left-padded row
        self.positions = torch.arange(max_len, device=device)
        self.qkv = [None] * len(self.layers)  # the stacked q/k/v weights, once `stack_projections` made them
        self.linears = [None] * len(self.layers)  # o, gate, up, down with LoRA folded (`stack_projections`)
        self.flash = flash and _flash_decode_available(device, dtype, self.head_dim)
        if self.flash:
            # One sequence per (row, key/value head) in the flattened cache, starting at the row's first real token
            # (the last boundary is the cache's end); its queries are that head's query heads.
            sequences = batch * self.kv_heads
            self.sequence_pad = pad_start.repeat_interleave(self.kv_heads).to(torch.int32)
            starts = torch.arange(sequences, device=device, dtype=torch.int32) * max_len + self.sequence_pad
            end = torch.tensor([sequences * max_len], device=device, dtype=torch.int32)
            self.key_starts = torch.cat([starts, end])
            groups = self.heads // self.kv_heads
            self.query_starts = torch.arange(sequences + 1, device=device, dtype=torch.int32) * groups
            self.keys_seen = torch.zeros(sequences, device=device, dtype=torch.int32)

    def forward(self, ids, positions, slots, mask, kv_len: int, rows=None):
        """Logits of the last token of each row, writing the chunk's keys/values at cache `slots`.

        ids, positions: [B, T]; slots: [T] cache indices; mask: [B, 1, T, kv_len] True where a query sees a key.
        A prefill (T > 1) attends over its own keys/values; `rows` ([cache rows]) names the input row whose keys and
        values each cache row gets (None: row i's own).
        """
        import torch

        batch, length = ids.shape
        h = self.core.embed_tokens(ids)
        cos, sin = self.core.rotary_emb(h, positions)
        groups = self.heads // self.kv_heads
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            if self.qkv[i] is None:
                q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
            else:
                weight, bias, sizes = self.qkv[i]
                q, k, v = torch.nn.functional.linear(x, weight, bias).split(sizes, dim=-1)
            q = q.view(batch, length, -1, self.head_dim)
            k = k.view(batch, length, -1, self.head_dim)
            v = v.view(batch, length, -1, self.head_dim)
            if hasattr(attn, "q_norm"):  # Qwen3
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self.rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            k, v = k.to(self.keys[i].dtype), v.transpose(1, 2).to(self.values[i].dtype)
            if length > 1:  # prefill: the fused kernel, without a [queries x keys] score tensor per head
                out = torch.nn.functional.scaled_dot_product_attention(
                    q,
                    k.repeat_interleave(groups, dim=1),
                    v.repeat_interleave(groups, dim=1),
                    attn_mask=mask,
                    scale=self.scaling,
                )
            if rows is not None:
                k, v = k.index_select(0, rows), v.index_select(0, rows)
            self.keys[i].index_copy_(2, slots, k)
            self.values[i].index_copy_(2, slots, v)
            del k, v  # in the cache now; with stacked projections, v would keep their whole output alive
            if length == 1:
                out = self._decode_attention(i, q, mask, kv_len)
            out = out.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim)
            if self.linears[i] is None:
                h = h + attn.o_proj(out)
                h = h + layer.mlp(layer.post_attention_layernorm(h))
                continue
            o_proj, gate_up, down_proj = self.linears[i]
            h = h + o_proj(out)
            gate, up = gate_up(layer.post_attention_layernorm(h))
            h = h + down_proj(layer.mlp.act_fn(gate) * up)
        return self.lm_head(self.core.norm(h[:, -1:, :]))[:, -1, :]

    def _decode_attention(self, i: int, q, mask, kv_len: int):
        """Layer i's attention for one new token per row (q: [B, heads, 1, dim]) over the cache."""
        import torch

        batch, groups = q.shape[0], self.heads // self.kv_heads
        if self.flash:
            return flash_varlen(
                q.reshape(-1, 1, self.head_dim),  # [row, kv head, group] -> one sequence's queries per head
                self.keys[i].view(-1, 1, self.head_dim),
                self.values[i].view(-1, 1, self.head_dim),
                self.query_starts,
                self.key_starts,
                groups,
                kv_len,
                self.scaling,
                seen=self.keys_seen,
            ).view(batch, self.heads, 1, self.head_dim)
        # One query per row, grouped by its key/value head ([batch, kv_heads, groups, dim]): the fused kernel reads
        # each key/value head once, never repeated, and the mask [batch, 1, 1, keys] holds for all.
        q = q.reshape(batch, self.kv_heads, groups, self.head_dim)
        keys, values = self.keys[i][:, :, :kv_len], self.values[i][:, :, :kv_len]
        out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling)
        return out.reshape(batch, self.heads, 1, self.head_dim)  # SDPA may return it strided

    def stack_projections(self) -> None:
        """Make the decode steps' q/k/v one matrix product per layer (`_stacked_qkv`), and their other projections'
        LoRA updates three kernels each (`_FoldedLoRA`; gate and up together, `_FoldedGateUp`). Called after the
        prefill, so the stacked copy and the prefill's activations are never held at once."""
        self.qkv = [_stacked_qkv(layer.self_attn) for layer in self.layers]
        self.linears = [_folded_linears(layer) for layer in self.layers]

    def prefill(self, ids, attention_mask, rows=None):
        """Run the prompts [U, P] through the model; the last position's logits of every cache row. `rows` ([B]) is
        the prompt of each cache row, where prompts repeat (None: U = B, one prompt per row)."""
        length = ids.shape[1]
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        pad_start = (length - attention_mask.sum(-1)).view(-1, 1, 1, 1)
        q = self.positions[:length].view(1, 1, length, 1)
        k = self.positions[:length].view(1, 1, 1, length)
        # A padding query attends to itself only, so no row is fully masked (which would give NaN keys/values).
        mask = ((k >= pad_start) & (k <= q)) | (k == q)
        logits = self.forward(ids, positions, self.positions[:length], mask, length, rows)
        return logits if rows is None else logits.index_select(0, rows)

    def step(self, ids, positions, slot, kv_len: int):
        """One decode step: ids/positions [B, 1] at cache index `slot` ([1]); attends over the first kv_len slots."""
        import torch

        if self.flash:  # each sequence's keys: from the row's first real token through this one
            torch.sub(slot + 1, self.sequence_pad, out=self.keys_seen)
            return self.forward(ids, positions, slot, None, kv_len)
        k = self.positions[:kv_len].view(1, 1, 1, kv_len)
        mask = (k >= self.pad_start) & (k <= slot.view(1, 1, 1, 1))
        return self.forward(ids, positions, slot, mask, kv_len)


_SIDE_STREAMS: dict = {}


def _side_stream(device):
    """The one stream per GPU that graph warm-ups and captures run on, for the whole process.

    cuBLAS keeps a workspace for every stream it has run on, for the life of the process: a fresh stream
    per capture left a new one behind at each rollout, so the memory held between steps grew run after run.
    """
    import torch

    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


def _release_side_workspace() -> None:
    """Free cuBLAS's workspaces once the graphs are gone (the main stream's comes back at its next matrix product):
    the side stream's would otherwise stay allocated through the policy's forward/backward, where the peak lies."""
    import torch

    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


class _GraphSteps:
    """Decode steps replayed from CUDA graphs (one per cache stretch on the SDPA path, one in all with FlashAttention),
    sharing static inputs and a memory pool."""

    def __init__(self, decoder: _Decoder, ids, positions, slot):
        import torch

        self.decoder, self.ids, self.positions, self.slot = decoder, ids, positions, slot
        self.graphs: dict[int, tuple] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def __call__(self, kv_len: int):
        import torch

        if kv_len not in self.graphs:
            side = _side_stream(self.ids.device)
            side.wait_stream(torch.cuda.current_stream())
            # warm-up outside the graph (allocator, cuBLAS handles); rewrites this slot
            with torch.cuda.stream(side):
                self.decoder.step(self.ids, self.positions, self.slot, kv_len)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=side):
                logits = self.decoder.step(self.ids, self.positions, self.slot, kv_len)
            self.graphs[kv_len] = (graph, logits)
        graph, logits = self.graphs[kv_len]
        graph.replay()
        return logits


def head_size(config) -> int:
    """The size of one attention head's vectors, from a decoder's config."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def cache_width(config) -> int:
    """Values one token keeps in one layer's KV cache: its keys and values, one vector per key/value head."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return 2 * kv_heads * head_size(config)


def row_bytes(model, prompt_len: int, max_new_tokens: int) -> int:
    """GPU memory one prompt's row of a rollout takes: its KV cache, logits buffers and prefill activations."""
    config = model.config
    attn = model.model.layers[0].self_attn
    dtype_bytes = model.model.embed_tokens.weight.element_size()
    max_len = prompt_len + max_new_tokens
    cache = config.num_hidden_layers * cache_width(config) * dtype_bytes * max_len
    device, dtype = model.lm_head.weight.device, model.model.embed_tokens.weight.dtype
    # each decode graph keeps its own logits output; one graph with FlashAttention
    graphs = 1 if _flash_decode_available(device, dtype, attn.head_dim) else -(-max_len // KV_STRETCH)
    # + the sampling's float32 temporaries (top-p sorts: values, int64 indices, cumulative sums, masks)
    logits = config.vocab_size * (dtype_bytes * (graphs + 1) + 4 * 8)
    width = (
        3 * config.intermediate_size + 4 * config.hidden_size + 3 * config.num_attention_heads * attn.head_dim
    )
    return cache + logits + prompt_len * width * dtype_bytes


def free_gpu_bytes(device, cached: bool = True) -> int:
    """Bytes this process can still allocate on `device`: free on the card, plus what torch caches unused (unless
    `cached` is False), within any per-process limit (`torch.cuda.set_per_process_memory_fraction`)."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    reserved, allocated = torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device)
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda _device: 1.0)(device)
    spare = reserved - allocated if cached else 0
    return int(max(0, min(free + spare, fraction * total - reserved + spare)))


def rows_that_fit(model, prompt_len: int, max_new_tokens: int, free_bytes: int, share: float) -> int:
    """How many prompts one rollout batch may hold in `share` of `free_bytes` (at least 1; a multiple of 8 from 8 up,
    for the matrix kernels)."""
    rows = int(share * free_bytes // row_bytes(model, prompt_len, max_new_tokens))
    return max(1, rows // 8 * 8 if rows >= 8 else rows)


def _token_probs(logits, sampling: Sampling):
    """float32 probabilities after temperature, top-k, top-p and min-p, as transformers' warpers apply them. Without
    warpers, one softmax pass straight from the logits' own dtype (no float32 copy of the logits first)."""
    import torch

    warped = (
        (sampling.temperature and sampling.temperature != 1.0)
        or sampling.top_k
        or (sampling.top_p is not None and sampling.top_p < 1.0)
        or sampling.min_p
    )
    if not warped:
        return torch.softmax(logits, dim=-1, dtype=torch.float32)
    scores = logits.float()
    if sampling.temperature and sampling.temperature != 1.0:
        scores = scores / sampling.temperature
    if sampling.top_k:
        kth = torch.topk(scores, min(sampling.top_k, scores.shape[-1]), dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p is not None and sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - sampling.top_p)
        remove[:, -1] = False  # keep at least the most likely token
        scores = scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    if sampling.min_p:
        probs = scores.softmax(dim=-1)
        floor = sampling.min_p * probs.max(dim=-1, keepdim=True).values
        scores = scores.masked_fill(probs < floor, float("-inf"))
    return torch.softmax(scores, dim=-1)


class NonFiniteProbabilities(RuntimeError):
    """A drawn token's probability was NaN or inf: the model's logits were not finite."""


def is_nonfinite_sampling(err: BaseException) -> bool:
    """Whether `err` says that sampling met non-finite probabilities: grpo's sampler's, or torch.multinomial's
    ("probability tensor contains either `inf`, `nan` or element < 0") under transformers' generate."""
    return isinstance(err, NonFiniteProbabilities) or "probability tensor contains" in str(err)


def _draw(probs):
    """One token per row from `probs`, the way `torch.multinomial` draws one sample (the argmax of p / q with
    q ~ Exp(1)): the same random numbers and the same tokens, without its check of the probabilities, a read back
    from the GPU at every decode step."""
    import torch

    ratio = torch.empty_like(probs).exponential_()
    return torch.div(probs, ratio, out=ratio).argmax(-1)


class Sampler:
    """grpo's static-cache sampler, built with its options. It keeps what it learns while sampling: which models'
    decode graphs were checked against the eager step (at each model's first replay), and whether graphs failed
    (`graphs_problem`: a capture the driver refused or a replay that differed; eager decode steps from then on)."""

    def __init__(self, options: EngineOptions | None = None):
        self.options = options or EngineOptions()
        self.graphs_problem: str | None = None
        self._checked: weakref.WeakSet = weakref.WeakSet()  # models whose first graph replay matched the eager step
        self._said = SayOnce()

    def sample(
        self,
        model,
        prompt_ids: list[list[int]],
        max_new_tokens: int,
        eos_token_ids: list[int],
        pad_token_id: int,
        sampling: Sampling | None = None,
        max_rows: int | None = None,
        check_finite: bool = True,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Sample one completion per prompt: token ids up to and including the first EOS, and each token's log-prob.

        The prompts are sampled in consecutive parts of at most `max_rows`; on a GPU, by default, of as many as fit
        in the memory free now (all of them when they fit). A token drawn from non-finite probabilities raises
        NonFiniteProbabilities (`check_finite=False`: the caller reads it from the log-probs).
        """
        if not prompt_ids:
            return [], []
        if max_rows is None and model.lm_head.weight.device.type == "cuda":
            max_rows = self._rows_free_memory_holds(model, prompt_ids, max_new_tokens)
        max_rows = max_rows or len(prompt_ids)
        completions, logprobs = [], []
        for start in range(0, len(prompt_ids), max_rows):
            part = self._sample_part(
                model, prompt_ids[start : start + max_rows], max_new_tokens, eos_token_ids, pad_token_id,
                sampling or Sampling(), check_finite,
            )
            completions += part[0]
            logprobs += part[1]
        return completions, logprobs

    def _rows_free_memory_holds(self, model, prompt_ids: list[list[int]], max_new_tokens: int) -> int:
        """Prompts one part may hold in the GPU memory free now, besides the stacked q/k/v weights (said once in the
        log when that is not all of them)."""
        import torch

        device, share = model.lm_head.weight.device, self.options.memory_share
        prompt_len = max(len(ids) for ids in prompt_ids)
        stacked = stacked_qkv_bytes(model)
        free = max(0, free_gpu_bytes(device) - stacked)
        rows = rows_that_fit(model, prompt_len, max_new_tokens, free, share)
        uncached_free = max(0, free_gpu_bytes(device, cached=False) - stacked)
        if rows_that_fit(model, prompt_len, max_new_tokens, uncached_free, share) < min(rows, len(prompt_ids)):
            # The batch counts on memory torch keeps cached from the last forward/backward, in blocks that may be too
            # small for the cache's tensors (a small card ran out there with a fifth of its memory in them): hand
            # them back first.
            torch.cuda.empty_cache()
        if rows < len(prompt_ids) and self._said.first("parts"):
            logger.info(
                "sampling %d completions in parts of %d: the cache of all of them at once would not fit in the "
                "%.1f GiB of GPU memory free (each completion is sampled as in one batch; parts take longer)",
                len(prompt_ids),
                rows,
                free / 2**30,
            )
        return rows

    def _sample_part(self, model, prompt_ids, max_new_tokens, eos_token_ids, pad_token_id, sampling, check_finite):
        """One batch of prompts, all rows at once."""
        import torch

        device = model.lm_head.weight.device
        ids, attention = _left_padded(prompt_ids, pad_token_id, device)
        eos = torch.tensor(sorted(set(eos_token_ids)), device=device)
        with torch.no_grad(), _adapter_dropout_off(model):
            tokens, logprobs, graphed = self._decode(
                model, prompt_ids, ids, attention, max_new_tokens, eos, pad_token_id, sampling
            )
        if graphed:  # the graphs and their cache are gone with `_decode`'s frame
            _release_side_workspace()
        # A NaN row of probabilities still yields a token (the argmax of NaN): its log-probability is what shows it.
        finite = torch.isfinite(logprobs).all(-1)
        if check_finite and not bool(finite.all()):
            raise NonFiniteProbabilities(
                f"{int((~finite).sum())} of {len(prompt_ids)} completions drew tokens from non-finite probabilities"
            )
        return _until_eos(tokens, logprobs, eos.cpu())

    def _decode(self, model, prompt_ids, ids, attention, max_new_tokens: int, eos, pad_token_id: int, sampling):
        """The prefill, then one token per row and step until every row has ended or `max_new_tokens`: the tokens
        and their log-probs ([rows, steps] on the CPU), and whether CUDA graphs ran the steps."""
        import torch

        device, dtype = ids.device, model.model.embed_tokens.weight.dtype
        batch, prompt_len = ids.shape
        max_len = prompt_len + max_new_tokens
        decoder = _Decoder(
            model, batch, max_len, prompt_len - attention.sum(-1), device, dtype, self.options.flash_decode
        )
        tokens = torch.full((batch, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        step_ids = torch.zeros((batch, 1), dtype=torch.long, device=device)
        step_positions = (attention.sum(-1, keepdim=True) - 1).clamp(min=0)
        slot = torch.full((1,), prompt_len - 1, dtype=torch.long, device=device)
        graphed = self.options.cuda_graphs and device.type == "cuda" and self.graphs_problem is None
        graphs = _GraphSteps(decoder, step_ids, step_positions, slot) if graphed else None
        check = graphed and model not in self._checked and not _has_active_dropout(model)
        logits = self._prefill(decoder, prompt_ids, ids, attention)
        decoder.stack_projections()
        produced = 0
        for t in range(max_new_tokens):
            probs = _token_probs(logits, sampling)
            token = logits.argmax(-1) if sampling.greedy else _draw(probs)
            token = torch.where(done, torch.full_like(token, pad_token_id), token)
            logprobs[:, t] = torch.where(done, 0.0, probs.gather(-1, token.unsqueeze(-1)).squeeze(-1).log())
            tokens[:, t] = token
            done |= torch.isin(token, eos)
            produced = t + 1
            if t + 1 == max_new_tokens or ((t + 1) % ALL_DONE_CHECK_EVERY == 0 and bool(done.all())):
                break
            step_ids.copy_(token.unsqueeze(-1))
            step_positions.add_(1)
            slot.add_(1)
            kv_len = max_len if decoder.flash else min(max_len, -(-(prompt_len + t + 1) // KV_STRETCH) * KV_STRETCH)
            if graphs is None:
                logits = decoder.step(step_ids, step_positions, slot, kv_len)
                continue
            logits = self._replay(graphs, model, kv_len, check)
            check = False
            if self.graphs_problem is not None:
                graphs = None
        return tokens[:, :produced].cpu(), logprobs[:, :produced].cpu(), graphed

    def _prefill(self, decoder: _Decoder, prompt_ids: list[list[int]], ids, attention):
        """The prompts through the model: each distinct prompt once (GRPO samples several completions of each; its
        keys and values fill the cache rows of all of them), or every row (`shared_prefill` off)."""
        import torch

        firsts, rows = distinct_rows([tuple(tokens) for tokens in prompt_ids])
        if not self.options.shared_prefill or len(firsts) == len(rows):
            return decoder.prefill(ids, attention)
        firsts, rows = torch.tensor(firsts, device=ids.device), torch.tensor(rows, device=ids.device)
        return decoder.prefill(ids[firsts], attention[firsts], rows)

    def _replay(self, graphs: _GraphSteps, model, kv_len: int, check: bool):
        """A decode step's logits from its graph; the eager step's where the capture fails or, at a model's first
        replay (`check`), where the replay differs from it (both set `graphs_problem`, said in the log)."""
        try:
            replayed = graphs(kv_len)
        except RuntimeError as err:  # a capture the CUDA driver refuses: decode eagerly from here on
            return self._graphs_failed(f"graph capture failed: {err}", graphs, kv_len)
        if not check:
            return replayed
        eager = graphs.decoder.step(graphs.ids, graphs.positions, graphs.slot, kv_len)
        scale = eager.float().abs().max().clamp(min=1e-6)
        error = float((replayed.float() - eager.float()).abs().max() / scale)
        self._checked.add(model)
        if error > 1e-2:
            self.graphs_problem = f"graph replay differs from the eager step by {error:.3g}"
            logger.warning("CUDA graph decoding disabled: %s", self.graphs_problem)
        return eager if self.graphs_problem else replayed

    def _graphs_failed(self, problem: str, graphs: _GraphSteps, kv_len: int):
        self.graphs_problem = problem
        logger.warning("CUDA graph decoding disabled: %s", problem)
        return graphs.decoder.step(graphs.ids, graphs.positions, graphs.slot, kv_len)


def _left_padded(prompt_ids: list[list[int]], pad_token_id: int, device):
    """The prompts as one left-padded batch of ids and its attention mask, on `device`."""
    import torch

    batch, prompt_len = len(prompt_ids), max(len(ids) for ids in prompt_ids)
    ids = torch.full((batch, prompt_len), pad_token_id, dtype=torch.long)
    attention = torch.zeros((batch, prompt_len), dtype=torch.long)
    for row, tokens in enumerate(prompt_ids):
        ids[row, prompt_len - len(tokens) :] = torch.tensor(tokens, dtype=torch.long)
        attention[row, prompt_len - len(tokens) :] = 1
    return ids.to(device), attention.to(device)


def _until_eos(tokens, logprobs, eos) -> tuple[list[list[int]], list[list[float]]]:
    """Each row's tokens and log-probs up to and including its first EOS token (all of them where there is none)."""
    import torch

    is_eos = torch.isin(tokens, eos)
    completions, completion_logprobs = [], []
    for row in range(tokens.shape[0]):
        hits = is_eos[row].nonzero()
        end = int(hits[0]) + 1 if len(hits) else tokens.shape[1]
        completions.append(tokens[row, :end].tolist())
        completion_logprobs.append(logprobs[row, :end].tolist())
    return completions, completion_logprobs


def without_peft_wrapper(model):
    """The model a PEFT wrapper holds, its LoRA layers in place (what the sampler runs); other models as they are."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def distinct_rows(keys: list) -> tuple[list[int], list[int]]:
    """The first row of each distinct key, in order, and each row's index among them (GRPO repeats every prompt
    `num_generations` times)."""
    index: dict = {}
    rows = [index.setdefault(key, len(index)) for key in keys]
    firsts = [0] * len(index)
    for row in reversed(range(len(rows))):
        firsts[rows[row]] = row
    return firsts, rows
