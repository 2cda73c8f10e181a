"""`flash_attention`: a padded batch's attention through FlashAttention's variable-length kernel, each row cut into
its left padding, its tokens and its right padding; every other call to SDPA as before. On the CPU: the cuts of the
masks transformers makes, the masks refused, the fallback said once; on a GPU: SDPA's logits and gradients."""

from __future__ import annotations

import contextlib
import logging

import pytest

from tests.test_rollout import tiny_model


def padded_batch(device="cpu"):
    """Three rows of 12: left padding of 2 then 10 tokens; 12 tokens; left padding of 1, 7 tokens, right padding
    of 4 (a prompt and a completion that ended early)."""
    import torch

    torch.manual_seed(1)
    ids = torch.randint(3, 300, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, :2] = 0
    mask[2, :1] = 0
    mask[2, 8:] = 0
    return ids.to(device), mask.to(device)


def masks_of(model, ids, mask) -> list:
    """The masks transformers hands its SDPA attention function in a forward of `model` (the function itself runs)."""
    from transformers.modeling_utils import AttentionInterface

    original, seen = AttentionInterface._global_mapping["sdpa"], []

    def recording(module, query, key, value, attention_mask, **kwargs):
        seen.append(attention_mask)
        return original(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface._global_mapping["sdpa"] = recording
    try:
        model(input_ids=ids, attention_mask=mask)
    finally:
        AttentionInterface._global_mapping["sdpa"] = original
    return seen


def test_the_cuts_of_transformers_padded_causal_mask_are_each_rows_padding_and_tokens():
    from grpo_cli.engine.attention import _cuts

    model = tiny_model("qwen2")
    ids, mask = padded_batch()
    seen = masks_of(model, ids, mask)
    assert len(seen) == 2 and seen[0] is seen[1]  # one mask for every layer of a forward
    cuts, why = _cuts(seen[0])
    assert why == "" and cuts.tolist() == [0, 2, 12, 12, 12, 24, 24, 25, 32, 36]
    assert masks_of(model, ids, None) == [None, None]  # no padding: SDPA's own causal FlashAttention


def test_masks_other_than_causal_over_one_stretch_a_row_are_left_to_sdpa():
    import torch

    from grpo_cli.engine.attention import _cuts

    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    holed = causal & torch.tensor([1, 1, 0, 1, 1, 1], dtype=torch.bool)  # a row whose tokens are two stretches
    packed = causal.clone()
    packed[3:, :3] = False  # two sequences packed in one row
    bidirectional = torch.ones(6, 6, dtype=torch.bool)
    for mask in (holed, packed, bidirectional):
        cuts, why = _cuts(mask[None, None])
        assert cuts is None and why == "a mask other than causal over one stretch of tokens per row"
    cuts, why = _cuts(causal[None, None])  # a whole row: one stretch, no padding
    assert why == "" and cuts.tolist() == [0, 0, 6, 6]


def test_on_the_cpu_flash_attention_leaves_every_call_to_sdpa_and_says_why_once(caplog):
    import torch
    from transformers.modeling_utils import AttentionInterface

    from grpo_cli.engine.attention import flash_attention

    model = tiny_model("llama")
    ids, mask = padded_batch()
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).logits
        original = AttentionInterface._global_mapping["sdpa"]
        with caplog.at_level(logging.WARNING, logger="grpo_cli.engine.attention"), flash_attention():
            inside = [model(input_ids=ids, attention_mask=mask).logits for _ in range(2)]
        assert AttentionInterface._global_mapping["sdpa"] is original
    assert all(torch.equal(logits, before) for logits in inside)
    said = "flash_attention: some attention runs through SDPA (no FlashAttention kernel for torch.float32 heads of 16 on cpu)"
    assert [r.getMessage() for r in caplog.records] == [said]


def test_flash_attention_is_a_gpu_default_of_rl_and_needs_a_gpu(tmp_path, tiny_model_dir):
    from grpo_cli.models import gpu_problems
    from grpo_cli.recipe.hardware import Hardware, hardware_defaults

    values = {"model_name_or_path": str(tiny_model_dir), "gradient_checkpointing": True}
    assert hardware_defaults("rl", values, Hardware(gpu=True))[0]["flash_attention"] == (True, "GPU")
    zero3 = hardware_defaults("rl", {**values, "deepspeed": "zero3.json"}, Hardware(gpu=True, sharded=True))[0]
    assert zero3["flash_attention"] == (True, "GPU") and "fused_lora" not in zero3
    assert "flash_attention" not in hardware_defaults("rl", values, Hardware(gpu=False))[0]
    assert "flash_attention" not in hardware_defaults("sft", values, Hardware(gpu=True))[0]
    problems = gpu_problems({}, {"flash_attention": True}, has_cuda=False)
    fix = "set flash_attention: false or run on a CUDA GPU"
    assert problems == [f"flash_attention: true runs a CUDA GPU's FlashAttention kernel - {fix}"]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_flash_attention_gives_sdpas_logits_and_gradients_on_a_padded_batch(kind, monkeypatch):
    """bf16 on a GPU: with `flash_attention` the padded batch's attention goes through FlashAttention's kernel, and
    the logits of every token and every parameter's gradient (a loss over the tokens, as GRPO's masks its
    completions) are float32's as closely as SDPA's (memory-efficient kernel) are; recomputed under gradient
    checkpointing too."""
    import torch

    from grpo_cli.engine import attention

    assert attention._flash_runs(torch.device("cuda"), torch.bfloat16, 16)  # its trial call, before the count
    calls = []
    kernel = attention.padded_flash_attention
    monkeypatch.setattr(attention, "padded_flash_attention", lambda *a: calls.append(1) or kernel(*a))
    torch.manual_seed(2)
    ids = torch.randint(3, 300, (12, 160), device="cuda")  # rows longer than the kernel's blocks
    mask = torch.ones_like(ids)
    for row in range(12):  # [left padding][prompt][completion][right padding], some rows without either padding
        mask[row, : row % 5 * 7] = 0
        mask[row, 160 - (row * 37) % 90 :] = 0 if row % 4 else 1
    tokens = mask.bool()

    def run(dtype, flash: bool):
        model = tiny_model(kind, max_position_embeddings=256).to("cuda", dtype).train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        with attention.cudnn_attention(False), attention.flash_attention() if flash else contextlib.nullcontext():
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            logps = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            read = tokens[:, :-1] & tokens[:, 1:]  # a token predicted from a token, as GRPO's completions are
            (-(logps * read).sum() / read.sum()).backward()
        grads = torch.cat([p.grad.float().flatten() for p in model.parameters()])
        return logits[tokens], grads

    exact = run(torch.float32, False)
    sdpa = run(torch.bfloat16, False)
    before = len(calls)
    flash = run(torch.bfloat16, True)
    assert before == 0 and len(calls) == 4  # two layers, forward and recomputation

    assert_as_close_to_float32(flash, sdpa, exact)
    assert torch.isfinite(flash[1]).all()


def assert_as_close_to_float32(side, baseline, exact) -> None:
    """`side`'s (logits, gradients) are within twice `baseline`'s distance of `exact`'s (float32), and a little:
    the logits' largest difference, the gradients' relative error."""

    def error(run):
        logits = (run[0] - exact[0]).abs().max().item()
        grads = ((run[1] - exact[1]).norm() / exact[1].norm()).item()
        return logits, grads

    (side_logits, side_grads), (base_logits, base_grads) = error(side), error(baseline)
    assert side_logits < 2 * base_logits + 0.02, (side_logits, base_logits)
    assert side_grads < 2 * base_grads + 0.01, (side_grads, base_grads)
