"""Activation offloading moves each checkpointed layer's input out and back without changing a gradient."""

from __future__ import annotations

import pytest

from grpo_cli.engine.offload import LayerInputOffload
from tests.test_rollout import tiny_model


def gradients(model, input_ids, offload: LayerInputOffload | None = None) -> dict:
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    if offload is not None:
        offload.remove()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("reentrant", [False, True])
def test_offloaded_layer_inputs_give_the_same_gradients(reentrant):
    import torch

    model = tiny_model("qwen2", num_hidden_layers=3).train()
    model.gradient_checkpointing_enable({"use_reentrant": reentrant})
    input_ids = torch.randint(0, 300, (4, 24), generator=torch.Generator().manual_seed(0))
    plain = gradients(model, input_ids)

    offload = LayerInputOffload(model, min_bytes=0)
    assert len(offload.stacks) == 1 and len(offload.stacks[0].layers) == 3
    moved = gradients(model, input_ids, offload)

    assert offload.offloaded == 3  # one input per layer: nothing the checkpoint recomputes, no loss tensors
    assert not offload._waiting  # every one came back
    assert moved.keys() == plain.keys()
    for name in plain:
        assert torch.equal(moved[name], plain[name]), name


@pytest.mark.parametrize("reentrant", [False, True])
def test_offloading_under_lora_gives_the_same_adapter_gradients(reentrant):
    """LoRA (where `grpo rl` may turn offloading on by default): the frozen base's layer inputs move, the adapters'
    gradients stay bit for bit."""
    import torch
    from peft import LoraConfig, get_peft_model

    base = tiny_model("qwen2", num_hidden_layers=3)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():  # a trained adapter: gradients reach every LoRA matrix
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.1)
    model.train()
    model.gradient_checkpointing_enable({"use_reentrant": reentrant})
    model.enable_input_require_grads()  # what TRL and transformers do for PEFT with checkpointing
    input_ids = torch.randint(0, 300, (4, 24), generator=torch.Generator().manual_seed(0))
    plain = gradients(model, input_ids)

    offload = LayerInputOffload(model, min_bytes=0)
    moved = gradients(model, input_ids, offload)

    assert offload.offloaded == 3 and not offload._waiting
    assert plain and all("lora_" in name for name in plain)
    assert moved.keys() == plain.keys()
    for name in plain:
        assert torch.equal(moved[name], plain[name]), name


def test_micro_batches_that_grow_and_shrink_keep_one_buffer_per_layer():
    """Micro-batches of other sizes (padded lengths, rows left out by `skip_zero_advantage`): a larger layer input
    takes the place of a buffer too small, so the buffers held stay one per layer in flight."""
    import torch

    model = tiny_model("qwen2", num_hidden_layers=3, hidden_size=256).train()
    model.gradient_checkpointing_enable({"use_reentrant": False})
    offload = LayerInputOffload(model, min_bytes=0)
    for rows in (1, 4, 2, 7, 1, 7):  # a row's layer input: 512 x 256 float32 numbers, 0.5 MiB
        input_ids = torch.randint(0, 300, (rows, 512), generator=torch.Generator().manual_seed(rows))
        model.zero_grad(set_to_none=True)
        model(input_ids=input_ids, labels=input_ids).loss.backward()
        assert offload.buffers - offload.released == len(offload._free) == 3, rows
    # buffers of 1, 3 and 4 MiB: new ones for 1, 4 and 7 rows, each set letting the one before go
    assert offload.offloaded == 6 * 3 and offload.buffers == 3 * 3 and offload.released == 3 * 2


def test_nothing_moves_without_checkpointing_or_gradients():
    import torch

    model = tiny_model("qwen2").train()
    offload = LayerInputOffload(model, min_bytes=0)
    input_ids = torch.randint(0, 300, (2, 8))
    model(input_ids=input_ids, labels=input_ids).loss.backward()  # no checkpointing: the layers keep their own
    model.gradient_checkpointing_enable({"use_reentrant": False})
    with torch.no_grad():
        model(input_ids=input_ids)
    assert offload.offloaded == 0


def test_small_inputs_stay_in_place():
    import torch

    model = tiny_model("qwen2").train()
    model.gradient_checkpointing_enable({"use_reentrant": False})
    offload = LayerInputOffload(model)  # 1 MiB: far above 2 x 8 x 64 floats
    input_ids = torch.randint(0, 300, (2, 8))
    model(input_ids=input_ids, labels=input_ids).loss.backward()
    assert offload.offloaded == 0


@pytest.mark.gpu
def test_offloading_lowers_the_peak_on_the_gpu_with_the_same_gradients():
    """A stack whose layer inputs outweigh what one layer's recompute needs (24 layers, a narrow MLP)."""
    import torch

    model = tiny_model("qwen2", num_hidden_layers=24, hidden_size=256, intermediate_size=256).to("cuda").train()
    model.gradient_checkpointing_enable({"use_reentrant": False})
    input_ids = torch.randint(0, 300, (64, 512), device="cuda")
    layer_input = 64 * 512 * 256 * 4

    def run(offload):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        grads = gradients(model, input_ids, offload)
        torch.cuda.synchronize()
        return grads, torch.cuda.max_memory_allocated()

    run(None)  # warm-up: cuBLAS workspaces
    plain, plain_peak = run(None)
    offload = LayerInputOffload(model)
    moved, moved_peak = run(offload)
    assert offload.offloaded == 24
    assert moved_peak <= plain_peak - 12 * layer_input, (plain_peak, moved_peak)
    for name in plain:  # CUDA's embedding backward sums in no fixed order
        torch.testing.assert_close(moved[name], plain[name], rtol=1e-5, atol=1e-9, msg=name)


def test_a_grpo_step_with_offloading_trains_the_same_weights(tmp_path, tiny_grpo_trainer, tiny_model_dir):
    """Through TRL's GRPOTrainer (its chunked LM head, loss and checkpointing): the same seed gives the same model."""
    import torch

    def reward(completions, **_):
        return [float(len(c[0]["content"]) % 3) for c in completions]

    def train(name: str, offload: bool) -> tuple[dict, int]:
        trainer = tiny_grpo_trainer(
            tmp_path / name, [reward], gradient_checkpointing=True, seed=1,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
        hooks = LayerInputOffload(trainer.model, min_bytes=0) if offload else None
        trainer.train()
        weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        return weights, (hooks.offloaded, hooks.buffers) if hooks else None

    plain, _ = train("plain", False)
    moved, (count, buffers) = train("offload", True)
    assert count == 2 * 2  # two steps, one micro-batch each, two layers
    assert buffers == 2  # the second step reused the first step's buffers
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert any(not torch.equal(plain[name], start[name]) for name in start)  # the steps did train
    for name in plain:
        assert torch.equal(moved[name], plain[name]), name
