"""The lean LM-head backward gives TRL's gradients: same tiles, same kernels, same sums in the same order."""

from __future__ import annotations

import pytest
import torch
from trl.kernels import chunked_logprob as trl_kernels
from trl.trainer import utils as trl_utils

from grpo_cli.engine import lm_head
from grpo_cli.engine.lm_head import LeanChunkedLogProb


def _gradients(function, dtype, *, bias: bool, entropy_grad: bool, tokens: int = 11):
    generator = torch.Generator().manual_seed(0)
    vocab, width = 37, 16
    hidden = torch.randn(tokens, width, generator=generator).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, width, generator=generator) * 0.5).to(dtype).requires_grad_()
    head_bias = torch.randn(vocab, generator=generator).to(dtype).requires_grad_() if bias else None
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    log_probs, entropy, *_ = function.apply(
        hidden, weight, head_bias, targets, 0.7, 8, None, 1.0, ("log_probs", "entropy")
    )
    loss = (log_probs * torch.linspace(-1, 1, tokens)).sum()
    if entropy_grad:
        loss = loss + 0.3 * entropy.sum()
    loss.backward()
    return [t.grad for t in (hidden, weight, head_bias) if t is not None], log_probs.detach()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_lean_backward_matches_trl(monkeypatch, dtype, bias, entropy_grad):
    # Small chunks, so both the vocabulary (37 in chunks of 8) and the tokens (11 in chunks of 4) take several tiles
    monkeypatch.setattr(trl_kernels, "TOKEN_CHUNK_SIZE", 4)
    expected, expected_log_probs = _gradients(
        trl_kernels.ChunkedLogProbFunction, dtype, bias=bias, entropy_grad=entropy_grad
    )
    got, log_probs = _gradients(LeanChunkedLogProb, dtype, bias=bias, entropy_grad=entropy_grad)
    assert torch.equal(log_probs, expected_log_probs)
    for mine, theirs in zip(got, expected, strict=True):
        assert mine.dtype == theirs.dtype
        assert torch.equal(mine, theirs)
    assert got[1].abs().sum() > 0


def test_no_scored_token_gives_zero_gradients():
    got, _ = _gradients(LeanChunkedLogProb, torch.bfloat16, bias=True, entropy_grad=False, tokens=0)
    assert all(grad is not None and not grad.any() for grad in got[1:])


def test_fused_head_of_a_real_model_uses_it(monkeypatch, tiny_model_dir):
    """Through TRL's fused head on a real (tiny) model: the lean backward runs and the gradients are TRL's."""
    from transformers import AutoModelForCausalLM

    calls = []

    class Counted(LeanChunkedLogProb):
        @staticmethod
        def backward(ctx, *grads):
            calls.append(1)
            return LeanChunkedLogProb.backward(ctx, *grads)

    def head_gradient(function):
        monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", function)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        trl_utils.add_fused_lm_head(model)
        ids = torch.arange(3, 3 + 2 * 9).reshape(2, 9)
        out = model(input_ids=ids, labels=ids, fused_lm_head=True)
        out.loss.backward()
        return model.get_output_embeddings().weight.grad

    expected = head_gradient(trl_kernels.ChunkedLogProbFunction)
    got = head_gradient(Counted)
    assert calls == [1]
    assert torch.equal(got, expected)


def test_the_lean_lm_head_swaps_trls_function_for_its_block_only(monkeypatch):
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", trl_kernels.ChunkedLogProbFunction)
    with lm_head.lean_lm_head():
        assert trl_utils._ChunkedLogProbFunction is LeanChunkedLogProb
    assert trl_utils._ChunkedLogProbFunction is trl_kernels.ChunkedLogProbFunction
