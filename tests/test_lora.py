"""`fused_lora`: LoRA layers computed by `LoRALinear` give PEFT's outputs and gradients."""

from __future__ import annotations

import logging

import pytest
import torch

from grpo_cli.engine.lora import LoRALinear, fused_lora
from grpo_cli.errors import UserError
from grpo_cli.recipe import check_recipe, load_recipe
from grpo_cli.recipe.hardware import Hardware

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora_model(model_dir, dropout: float = 0.0, dtype=torch.float32, **config):
    """The tiny model with LoRA on every projection, B random (PEFT starts it at zero: no update to compare)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=TARGETS, **config))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    return model


def loss_and_grads(model, ids):
    model.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def token_ids(model, rows: int = 3, length: int = 17):
    return torch.randint(0, model.config.vocab_size, (rows, length), generator=torch.Generator().manual_seed(1))


def test_a_lora_model_fused_has_pefts_loss_and_gradients_and_the_switch_is_undone(tiny_model_dir):
    from peft.tuners.lora import layer as lora_layer

    model = lora_model(tiny_model_dir)
    ids = token_ids(model)
    peft_loss, peft_grads = loss_and_grads(model, ids)
    original = lora_layer.Linear.forward
    with fused_lora():
        out = model.base_model.model.model.layers[0].self_attn.q_proj(torch.randn(2, 64, requires_grad=True))
        assert "LoRALinear" in out.grad_fn.name()
        fused_loss, fused_grads = loss_and_grads(model, ids)
    assert lora_layer.Linear.forward is original
    assert torch.allclose(fused_loss, peft_loss, rtol=1e-6)
    assert fused_grads.keys() == peft_grads.keys() and len(fused_grads) == 2 * len(TARGETS) * 2  # A and B, 2 layers
    for name, grad in peft_grads.items():
        assert torch.allclose(fused_grads[name], grad, rtol=1e-4, atol=1e-7), name
    with fused_lora(), model.disable_adapter():  # TRL's reference model: the base alone
        disabled = model(input_ids=ids).logits
    with model.disable_adapter():
        assert torch.equal(disabled, model(input_ids=ids).logits)


def test_dropout_applies_its_mask_to_the_update_forward_and_backward():
    torch.manual_seed(0)
    x = torch.randn(5, 7, 12, requires_grad=True)
    weight, bias = torch.randn(10, 12), torch.randn(10, requires_grad=True)
    a, b = torch.randn(4, 12, requires_grad=True), torch.randn(10, 4, requires_grad=True)
    mask = torch.rand(5, 7, 12) > 0.25
    out = LoRALinear.apply(x, weight, bias, a, b, 2.0, mask, 0.75)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, bias, a, b), grad)
    reference = torch.nn.functional.linear(x, weight, bias) + 2.0 * (x * mask / 0.75) @ a.t() @ b.t()
    expected = torch.autograd.grad(reference, (x, bias, a, b), grad)
    assert torch.allclose(out, reference, atol=1e-5)
    for g, e in zip(got, expected, strict=True):
        assert torch.allclose(g, e, rtol=1e-4, atol=1e-5)


def test_with_dropout_gradient_checkpointing_recomputes_the_same_masks(tiny_model_dir):
    model = lora_model(tiny_model_dir, dropout=0.3)
    model.train()
    ids = token_ids(model)
    with fused_lora():
        torch.manual_seed(5)
        loss, grads = loss_and_grads(model, ids)
        model.gradient_checkpointing_enable({"use_reentrant": False})
        model.enable_input_require_grads()
        torch.manual_seed(5)
        checkpointed_loss, checkpointed = loss_and_grads(model, ids)
        torch.manual_seed(6)
        other_loss, _ = loss_and_grads(model, ids)
    assert torch.allclose(checkpointed_loss, loss, rtol=1e-6) and not torch.allclose(other_loss, loss, rtol=1e-6)
    for name, grad in grads.items():
        assert torch.allclose(checkpointed[name], grad, rtol=1e-4, atol=1e-7), name


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_in_bfloat16_it_stays_close_to_peft_under_autocast(tiny_model_dir, device):
    model = lora_model(tiny_model_dir, dtype=torch.bfloat16).to(device)
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
    ids = token_ids(model).to(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        peft_loss, peft_grads = loss_and_grads(model, ids)
        with fused_lora():
            fused_loss, fused_grads = loss_and_grads(model, ids)
    assert torch.allclose(fused_loss.float(), peft_loss.float(), rtol=1e-2)
    for name, grad in peft_grads.items():
        assert fused_grads[name].dtype == torch.float32
        cosine = torch.nn.functional.cosine_similarity(fused_grads[name].flatten(), grad.flatten(), dim=0)
        assert cosine > 0.99, (name, cosine)


def test_a_layer_it_cannot_compute_runs_pefts_forward_and_is_said_once(tiny_model_dir, caplog):
    model = lora_model(tiny_model_dir, use_dora=True)
    ids = token_ids(model)
    expected = model(input_ids=ids).logits
    with caplog.at_level(logging.WARNING, logger="grpo_cli.engine.lora"), fused_lora():
        got = model(input_ids=ids).logits
        model(input_ids=ids)
    assert torch.equal(got, expected)
    said = [r.getMessage() for r in caplog.records if r.name == "grpo_cli.engine.lora"]
    reason = "DoRA, another LoRA variant, an adapter bias or a quantized base layer"
    assert said == [f"fused_lora: some LoRA layers run PEFT's own forward ({reason})"]


def test_the_check_refuses_fused_lora_without_lora(tmp_path):
    def recipe(*args):
        return load_recipe(None, ["--output_dir", str(tmp_path), "--fused_lora", "true", *args], "rl", Hardware(gpu=False))

    with pytest.raises(UserError, match="`fused_lora` computes the LoRA layers of a run"):
        check_recipe(recipe())
    try:
        check_recipe(recipe("--use_peft", "true"))
    except UserError as err:  # the recipe names no model
        assert not any("fused_lora" in problem for problem in err.problems), err.problems


@pytest.mark.slow
def test_a_grpo_run_with_fused_lora_trains_as_the_run_without(tmp_path, tiny_model_dir, monkeypatch):
    import json

    from test_train import recipe_file, train

    calls = []
    apply = LoRALinear.apply
    monkeypatch.setattr(LoRALinear, "apply", lambda *args: calls.append(args[0].requires_grad) or apply(*args))

    def logged(fused: bool) -> list[dict]:
        extra = f"use_peft: true\nlora_r: 4\nlora_dropout: 0.0\nfused_lora: {str(fused).lower()}\n"
        out = train(recipe_file(tmp_path / str(fused), tiny_model_dir, "rl", extra), "rl", ["--max_steps", "3"])
        history = json.loads((out / "train_summary.json").read_text())["log_history"]
        return [entry for entry in history if "loss" in entry]

    fused = logged(True)
    assert True in calls and False in calls  # the training forward and the rollouts' went through it
    calls.clear()
    plain = logged(False)
    assert not calls
    assert [e["step"] for e in fused] == [e["step"] for e in plain] == [1, 2, 3]
    for f, p in zip(fused, plain, strict=True):
        assert f["reward"] == p["reward"]  # the same completions, scored alike
        assert f["loss"] == pytest.approx(p["loss"], rel=1e-4, abs=1e-6)
        assert f["grad_norm"] == pytest.approx(p["grad_norm"], rel=1e-3)
