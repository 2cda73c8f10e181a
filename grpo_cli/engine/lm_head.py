"""The LM head's backward pass in less memory.

TRL scores the policy's tokens through a chunked LM head: no `(tokens, vocabulary)` logits tensor, only tiles of
4096 tokens x 32768 vocabulary columns. Its backward, though, walks the tiles token chunk by token chunk, so it
keeps the head's whole weight gradient in float32 until the end (vocabulary x hidden: 0.51 GiB for a Qwen2.5-0.5B
shape, 0.87 GiB for 1.5B) and converts it to the weight's dtype while both are alive. That happens at the start of
the backward, when every checkpointed layer output is still held.

`LeanChunkedLogProb` runs the same tiles through TRL's own kernels in the other order, vocabulary chunk outer and
token chunk inner, so each chunk's weight gradient is summed in float32 in a buffer of one chunk and written once
into a gradient of the weight's dtype. The sums are the same sums in the same order: the gradients equal TRL's
bit for bit on the CPU (`tests/test_lm_head.py`); only what is held at once changes.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from trl.kernels import chunked_logprob as trl_kernels
from trl.trainer import utils as trl_utils

from grpo_cli import trl_private


class LeanChunkedLogProb(trl_kernels.ChunkedLogProbFunction):
    """TRL's `ChunkedLogProbFunction` (same forward) with a backward that holds one vocabulary chunk's gradient."""

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy, *_):  # type: ignore[override]
        hidden, weight, bias, targets, log_z, entropy = ctx.saved_tensors
        dtype = ctx.compute_dtype
        chunk = ctx.chunk_size
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        n_tokens, token_chunk = hidden.shape[0], trl_kernels.TOKEN_CHUNK_SIZE
        triton = trl_private.kernels_use_triton(hidden.device)
        with trl_utils.maybe_gather_lm_head_ctx(weight, bias):
            vocab = weight.shape[0]
            fp32 = {"device": hidden.device, "dtype": torch.float32}
            grad_hidden = torch.zeros(hidden.shape, **fp32) if needs_hidden else None
            grad_weight = torch.empty_like(weight) if needs_weight else None
            grad_bias = torch.zeros(bias.shape, **fp32) if needs_bias else None
            # float32 weights are summed in place; others in one chunk's float32 buffer
            summed = None
            if needs_weight and weight.dtype != torch.float32:
                summed = torch.empty((min(chunk, vocab), weight.shape[1]), **fp32)
            tiles = torch.empty((min(n_tokens, token_chunk), chunk), device=hidden.device, dtype=dtype)
            grad_logprobs = grad_logprobs.float().contiguous() if grad_logprobs is not None else None
            grad_entropy = grad_entropy.float().contiguous() if grad_entropy is not None else None

            for start in range(0, vocab, chunk):
                end = min(start + chunk, vocab)
                w_chunk = weight[start:end].to(dtype)
                if needs_weight:
                    weight_sum = grad_weight[start:end] if summed is None else summed[: end - start]
                    weight_sum.zero_()
                for token_start in range(0, n_tokens, token_chunk):
                    token_end = min(token_start + token_chunk, n_tokens)
                    n = token_end - token_start
                    hidden_chunk = hidden[token_start:token_end].to(dtype)
                    tile = tiles[:n, : end - start]
                    torch.mm(hidden_chunk, w_chunk.t(), out=tile)
                    if bias is not None:
                        tile.add_(bias[start:end].to(dtype))
                    fold = trl_private.backward_fold(triton, n, end - start)
                    fold(
                        tile,
                        tile.stride(0),
                        targets[token_start:token_end],
                        log_z[token_start:token_end],
                        entropy[token_start:token_end],
                        grad_logprobs[token_start:token_end] if grad_logprobs is not None else log_z,
                        grad_entropy[token_start:token_end] if grad_entropy is not None else log_z,
                        start,
                        end - start,
                        HAS_LOGPROB_GRAD=grad_logprobs is not None,
                        HAS_ENTROPY_GRAD=grad_entropy is not None,
                        BLOCK_SIZE=trl_private.kernel_block_size(),
                        **ctx.kernel_args,
                    )
                    if grad_hidden is not None:
                        trl_private.addmm_fp32(grad_hidden[token_start:token_end], tile, w_chunk)
                    if needs_weight:
                        trl_private.addmm_fp32(weight_sum, tile.t(), hidden_chunk)
                    if grad_bias is not None:
                        grad_bias[start:end] += tile.sum(dim=0, dtype=torch.float32)
                if summed is not None:
                    grad_weight[start:end].copy_(weight_sum)

        return (
            grad_hidden.to(hidden.dtype) if grad_hidden is not None else None,
            grad_weight,
            grad_bias.to(bias.dtype) if grad_bias is not None else None,
            *(None,) * 6,
        )


@contextmanager
def lean_lm_head():
    """Inside the block, TRL's fused LM head (every GRPOTrainer's policy forward in this process) runs
    `LeanChunkedLogProb`; after it, what it ran before."""
    before = trl_private.chunked_logprob()
    trl_private.use_chunked_logprob(LeanChunkedLogProb)
    try:
        yield
    finally:
        trl_private.use_chunked_logprob(before)
