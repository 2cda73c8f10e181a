"""Which kernels the training forward/backward's attention runs on.

A GRPO batch is padded: each row is [left padding][prompt][completion][right padding]. Through transformers' SDPA
attention a padded batch carries an explicit mask, and with a mask torch's scaled_dot_product_attention cannot use
its FlashAttention kernel: on H100/H200 it takes the memory-efficient kernel (built for Ampere) or cuDNN's.
`flash_attention` instead runs FlashAttention's variable-length kernel over the padded batch as it lies, each row cut
into its left padding, its tokens and its right padding (three sequences, no copy of the batch): the tokens attend
causally to their own row's tokens only, as the mask says, and the padding only to padding (outputs the loss never
reads).

cuDNN's attention backward on H100/H200 (the default kernel there since torch 2.11) returns NaN query gradients when
the padded sequence length is 64 modulo 128 and a query row's logsumexp is under about -88.7: a row the mask lets see
no key at all (the left padding of a shorter prompt, which every GRPO batch has), or one whose scores are all far
below zero (pytorch/pytorch issue 196678). The forward pass and the key and value gradients stay finite, so the step's
loss looks healthy while every gradient below that layer is NaN. The memory-efficient and math kernels, which torch
picks when cuDNN's is off (`cudnn_attention`), compute the same attention without it.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

from grpo_cli.once import SayOnce

logger = logging.getLogger(__name__)

# Why `flash_attention` leaves a call to SDPA without saying so: nothing is lost there.
QUIET = ("no padding", "a KV cache")


@contextmanager
def cudnn_attention(enabled: bool):
    """Inside the block, scaled_dot_product_attention may (or may not) pick its cuDNN kernels; after it, as before."""
    import torch

    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(enabled)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


@contextmanager
def flash_attention():
    """While this lasts, transformers' SDPA attention runs a padded batch's causal self-attention through
    FlashAttention's variable-length kernel (`padded_flash_attention`) where it can; everything else (a KV cache,
    dropout, a sliding window, a mask other than causal over one stretch of tokens per row) goes to SDPA as before,
    and the first such call for each reason says so once (not for a cache or a batch without padding: `QUIET`)."""
    from transformers.modeling_utils import AttentionInterface

    original = AttentionInterface._global_mapping["sdpa"]
    layouts = _Layouts()
    said = SayOnce()

    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        reason = _not_flash(module, query, key, attention_mask, dropout, kwargs)
        if reason is None:
            cuts, reason = layouts.get(attention_mask)
            if cuts is not None:
                return padded_flash_attention(query, key, value, cuts, scaling), None
        if reason not in QUIET:
            said.warning(logger, reason, "flash_attention: some attention runs through SDPA (%s)", reason)
        return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)

    AttentionInterface._global_mapping["sdpa"] = forward
    try:
        yield
    finally:
        AttentionInterface._global_mapping["sdpa"] = original


_PACKED = {"entered": 0}  # how many `packed_attention` blocks are open


@contextmanager
def packed_attention():
    """While this lasts, transformers' SDPA attention serves the packed forward's calls (those that carry a plan,
    grpo_cli/engine/packed.py) over the packed sequence, and hands every other call on as before."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import AttentionInterface

    from grpo_cli.engine.packed import PLAN_KEY
    from grpo_cli.engine.packed import packed_attention as attend

    original = AttentionInterface._global_mapping["sdpa"]

    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        plan = kwargs.pop(PLAN_KEY, None)
        if plan is None:
            return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)

        def sdpa(q, k, v, mask, dropout, scaling):  # transformers' own, with the packed sequence's mask
            return sdpa_attention_forward(module, q, k, v, mask, dropout=dropout, scaling=scaling, **kwargs)[0]

        return attend(query, key, value, plan, scaling, dropout, sdpa), None

    AttentionInterface._global_mapping["sdpa"] = forward
    _PACKED["entered"] += 1
    try:
        yield
    finally:
        _PACKED["entered"] -= 1
        AttentionInterface._global_mapping["sdpa"] = original


def packed_attention_entered() -> bool:
    """Whether a `packed_attention` block is open: the packed forward's attention calls are served."""
    return _PACKED["entered"] > 0


def padded_flash_attention(query, key, value, cuts, scaling):
    """Causal attention of a padded batch (query [B, heads, L, dim], key and value [B, kv heads, L, dim]) whose row i
    is the sequences between `cuts[3 i]`, `cuts[3 i + 1]`, `cuts[3 i + 2]` and `cuts[3 i + 3]` of the flattened batch;
    the output as transformers' attention functions give it, [B, L, heads, dim]."""

    batch, heads, length, dim = query.shape
    q = query.transpose(1, 2).reshape(batch * length, heads, dim)
    k = key.transpose(1, 2).reshape(batch * length, key.shape[1], dim)
    v = value.transpose(1, 2).reshape(batch * length, value.shape[1], dim)
    return flash_varlen(q, k, v, cuts, cuts, length, length, scaling, causal=True).view(batch, length, heads, dim)


def flash_varlen(queries, keys, values, query_starts, key_starts, max_queries, max_keys, scale, causal=False, seen=None):
    """PyTorch's FlashAttention variable-length kernel: sequence i's queries are rows query_starts[i]:query_starts[i +
    1] of `queries` ([rows, heads, dim]), its keys and values the rows from key_starts[i] on (`seen[i]` of them where
    given, else up to key_starts[i + 1]); `causal`: each query sees the keys up to its own position. Differentiable
    without `seen`."""
    import torch

    return torch.ops.aten._flash_attention_forward(
        queries, keys, values, query_starts, key_starts, max_queries, max_keys, 0.0, causal, False, scale=scale,
        seqused_k=seen,
    )[0]  # fmt: skip


_FLASH_CHECKS: dict = {}  # (use, device, dtype, head size) -> whether the kernel serves there


def flash_serves(use: str, device, dtype, head_dim: int, trial) -> bool:
    """Whether PyTorch's FlashAttention kernel serves `use` here: a CUDA GPU it was built for (Ampere or later), half
    precision, a head size it supports, flash SDPA not turned off, and `trial(device, dtype, head_dim)` (a first call
    on a few tokens) true; decided once per process for each use, GPU, dtype and head size."""
    import torch

    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return False
    if device.index is None:  # "cuda" and "cuda:0" are one GPU: one trial
        device = torch.device("cuda", torch.cuda.current_device())
    key = (use, str(device), dtype, head_dim)
    if key not in _FLASH_CHECKS:
        built = head_dim % 8 == 0 and head_dim <= 256 and torch.cuda.get_device_capability(device) >= (8, 0)
        _FLASH_CHECKS[key] = built and torch.backends.cuda.flash_sdp_enabled() and trial(device, dtype, head_dim)
    return _FLASH_CHECKS[key]


def _not_flash(module, query, key, attention_mask, dropout, kwargs) -> str | None:
    """Why this attention call cannot go through `padded_flash_attention` (None: it can, if its mask allows)."""
    import torch

    if query.shape[2] != key.shape[2] or query.shape[2] < 2:
        return "a KV cache"  # generation: SDPA's own kernels serve it
    if attention_mask is None:
        return "no padding"  # SDPA takes FlashAttention itself, causally
    if not _flash_runs(query.device, query.dtype, query.shape[-1]):
        return f"no FlashAttention kernel for {query.dtype} heads of {query.shape[-1]} on {query.device}"
    if dropout:
        return "attention dropout"
    if not getattr(module, "is_causal", False) or any(kwargs.get(k) is not None for k in ("sliding_window", "softcap", "s_aux")):
        return "not plain causal attention"
    if attention_mask.dtype != torch.bool or attention_mask.dim() != 4 or attention_mask.shape[1] != 1:
        return "a mask of another form"
    return None


class _Layouts:
    """The cuts of the last mask seen (each decoder layer of a forward, and its recomputation, gets the same mask
    tensor): checked once per mask, with one wait for the GPU."""

    def __init__(self):
        self._mask = None
        self._version = -1
        self._answer: tuple = (None, "")

    def get(self, mask):
        if mask is not self._mask or mask._version != self._version:
            self._mask, self._version = mask, mask._version  # held: no other tensor takes its place meanwhile
            self._answer = _cuts(mask)
        return self._answer


def _cuts(mask):
    """(cuts, "") for a mask [B, 1, L, L] that is causal over one stretch of tokens per row, as transformers makes it
    for a padded batch (every query sees the stretch's keys up to itself, no other key), where `cuts` holds each
    row's three sequences' boundaries in the flattened batch (int32, 3 B + 1); (None, why) for any other mask."""
    import torch

    rows, length = mask.shape[0], mask.shape[-1]
    keys = mask[:, 0, -1, :]  # the last query sees every key up to it: the row's tokens
    inside = keys.int()
    first = inside.argmax(dim=1)  # 0 for a row without tokens, whose one stretch is its padding
    count = inside.sum(dim=1)
    starts = inside[:, 1:] > inside[:, :-1]
    one_stretch = (starts.sum(dim=1) + inside[:, 0] <= 1).all()
    causal = torch.ones(length, length, dtype=torch.bool, device=mask.device).tril()
    expected = causal & keys[:, None, :]
    mismatch = (mask[:, 0] != expected).any()  # every query, padding too, sees the row's tokens up to it, no other
    if not bool(one_stretch & ~mismatch):
        return None, "a mask other than causal over one stretch of tokens per row"
    base = torch.arange(rows, device=mask.device) * length
    cuts = torch.stack([base, base + first, base + first + count], dim=1).flatten()
    end = torch.full((1,), rows * length, device=mask.device, dtype=cuts.dtype)
    return torch.cat([cuts, end]).to(torch.int32), ""


def _flash_runs(device, dtype, head_dim: int) -> bool:
    """Whether FlashAttention's variable-length kernel trains here (`flash_serves`, its trial made inside a forward:
    it saves nothing that gradient checkpointing counts)."""
    return flash_serves("training", device, dtype, head_dim, _flash_trial)


def _flash_trial(device, dtype, head_dim: int) -> bool:
    import torch

    try:  # two rows of four tokens, the first left-padded by one; two query heads on one key/value head
        with torch.no_grad(), torch.autocast("cuda", enabled=False):  # no tensor saved for any backward
            q = torch.randn(2, 2, 4, head_dim, device=device, dtype=dtype)
            kv = torch.randn(2, 1, 4, head_dim, device=device, dtype=dtype)
            cuts = torch.tensor([0, 1, 4, 4, 4, 8, 8], device=device, dtype=torch.int32)
            out = padded_flash_attention(q, kv, kv, cuts, head_dim**-0.5).transpose(1, 2).float()
            for row, start in ((0, 1), (1, 0)):  # each row's tokens against causal attention over them alone
                k = kv[row : row + 1, :, start:].float().expand(1, 2, 4 - start, head_dim)
                reference = torch.nn.functional.scaled_dot_product_attention(
                    q[row : row + 1, :, start:].float(), k, k, is_causal=True
                )
                if not torch.allclose(out[row : row + 1, :, start:], reference, atol=2e-2):
                    return False
        return True
    except (RuntimeError, TypeError) as err:
        logger.info("training attention through SDPA: FlashAttention failed (%s)", err)
        return False
