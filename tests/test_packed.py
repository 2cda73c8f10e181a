"""`packed_forward`: a micro-batch's training forward without its padding, each prompt once for the completions that
share it. On the CPU (SDPA with the packed sequence's mask): the same logits and gradients as the padded batch's, with
gradient checkpointing too; batches it cannot lay out run padded, said once."""

from __future__ import annotations

import logging

import pytest

from tests.test_rollout import tiny_model

PROMPT = 10  # prompt columns of the padded batch
COMPLETION = 8


def padded_batch(prompts: list[list[int]], completions: list[list[int]], width=PROMPT, length=COMPLETION):
    """TRL's layout: prompts padded on the left to `width` columns, completions on the right to `length`."""
    import torch

    rows = len(prompts)
    ids = torch.zeros(rows, width + length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, (prompt, completion) in enumerate(zip(prompts, completions)):
        ids[row, width - len(prompt) : width] = torch.tensor(prompt)
        mask[row, width - len(prompt) : width] = 1
        ids[row, width : width + len(completion)] = torch.tensor(completion)
        mask[row, width : width + len(completion)] = 1
    return ids, mask


def a_batch():
    """Two prompts of 6 and 9 tokens with three and two completions of 1-8 tokens, rows shuffled; and a third prompt
    alone."""
    first, second, third = [5, 9, 13, 17, 21, 25], [30, 31, 32, 33, 34, 35, 36, 37, 38], [40, 41, 42]
    prompts = [first, second, first, third, second, first]
    completions = [[50, 51, 52], [60] * 8, [70, 71, 72, 73, 74, 75, 76, 77], [80, 81], [90], [99, 98, 97, 96]]
    return padded_batch(prompts, completions)


def forward_and_grads(model, ids, mask, packed, checkpointing=False, width=PROMPT):
    """The logits of every token and every parameter's gradient of a loss over the completion tokens' log-probs."""
    import torch

    from grpo_cli.engine.attention import packed_attention
    from grpo_cli.engine.packed import PackedForward

    model.zero_grad()
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    packer = PackedForward(model) if packed else None
    completion = mask.bool() & (torch.arange(ids.shape[1], device=ids.device) >= width)
    with packed_attention():  # for the whole run: gradient checkpointing recomputes the attention in the backward
        if packer is None:
            logits = model(input_ids=ids, attention_mask=mask).logits
        else:
            with packer.prompts(width):
                logits = model(input_ids=ids, attention_mask=mask).logits
        logps = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        weights = torch.linspace(-1, 1, ids.shape[0], device=ids.device)[:, None]  # advantages of both signs
        (-(logps * weights * completion[:, 1:]).sum()).backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return logits[mask.bool()], grads, packer


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_packed_forward_gives_the_padded_batchs_logits_and_gradients(kind, checkpointing):
    import torch

    ids, mask = a_batch()
    model = tiny_model(kind, vocab_size=128)
    padded = forward_and_grads(model, ids, mask, packed=False, checkpointing=checkpointing)
    packed = forward_and_grads(tiny_model(kind, vocab_size=128), ids, mask, packed=True, checkpointing=checkpointing)
    assert packed[2].packed == 1
    assert torch.allclose(packed[0], padded[0], atol=1e-5, rtol=1e-4)
    assert torch.allclose(packed[1], padded[1], atol=1e-5, rtol=1e-4)


def test_the_plan_computes_each_prompt_once():
    from grpo_cli.engine.packed import plan

    ids, mask = a_batch()
    laid_out, why = plan(ids, mask, PROMPT)
    assert why == ""
    # three prompts (6 + 9 + 3 tokens) once each, and every completion token (3 + 8 + 8 + 2 + 1 + 4)
    assert laid_out.length == 18 + 26 < int(mask.sum())
    # sequences: the first prompt, its three completions, the second prompt, its two, the third prompt, its one
    assert laid_out.query_starts.tolist() == [0, 6, 9, 17, 21, 30, 38, 39, 42, 44]
    # a completion's keys are its prompt's and its own
    assert laid_out.key_starts.tolist() == [0, 6, 15, 29, 39, 48, 65, 75, 78, 83]
    # every token of every row gets a hidden state, from the packed position of the same token
    assert sorted(laid_out.dest.tolist()) == mask.flatten().nonzero().flatten().tolist()
    assert ids.flatten()[laid_out.dest].tolist() == ids.flatten()[laid_out.tokens[laid_out.src]].tolist()
    assert (laid_out.positions == laid_out.tokens % ids.shape[1]).all()


def test_a_batch_it_cannot_lay_out_runs_padded_and_says_so_once(caplog):
    import torch

    from grpo_cli.engine.attention import packed_attention
    from grpo_cli.engine.packed import PackedForward, plan

    ids, mask = a_batch()
    holed = mask.clone()
    holed[0, PROMPT + 1] = 0  # a hole inside a completion
    assert plan(ids, holed, PROMPT) == (None, "a row whose tokens are not one stretch from its prompt into its completion")
    model = tiny_model("llama", vocab_size=128).train()
    expected = model(input_ids=ids, attention_mask=holed).logits
    packer = PackedForward(model)
    with caplog.at_level(logging.WARNING), packed_attention(), packer.prompts(PROMPT):
        for _ in range(2):
            assert torch.equal(model(input_ids=ids, attention_mask=holed).logits, expected)
    assert packer.packed == 0
    said = [r.getMessage() for r in caplog.records if "packed_forward" in r.getMessage()]
    why = "a row whose tokens are not one stretch from its prompt into its completion"
    assert said == [f"packed_forward: a micro-batch ran padded ({why})"]


def test_forwards_other_than_a_micro_batchs_training_forward_are_left_alone():
    import torch

    from grpo_cli.engine.attention import packed_attention
    from grpo_cli.engine.packed import PackedForward

    ids, mask = a_batch()
    model = tiny_model("llama", vocab_size=128)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
    packer = PackedForward(model)
    with packed_attention(), torch.no_grad():
        assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, expected)  # outside `prompts`
        with packer.prompts(PROMPT):
            assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, expected)  # eval mode, no grad
    assert packer.packed == 0


def test_trls_loss_through_the_packed_forward_gives_the_padded_batchs_gradients(tmp_path, tiny_grpo_trainer):
    """TRL's own `_compute_loss` (its LM head and log-probs, `dapo`) over a step of 16 completions of 4 prompts, in
    two micro-batches: regrouped with each prompt's completions together and trained through the packed forward, the
    loss and gradients of the padded micro-batches. (The loss types' scaling of regrouped rows is
    tests/test_micro_batches.py's; the packed forward gives the same logits whatever the loss.)"""
    loss_type = "dapo"
    import torch

    from grpo_cli.engine.attention import packed_attention
    from grpo_cli.engine.packed import PackedForward
    from grpo_cli.train.micro_batches import LOSS_SCALE, regroup
    from tests.test_micro_batches import ADVANTAGES, generation_batch, gradients

    reward = [lambda completions, **kw: [0.0] * len(completions)]
    trainer = tiny_grpo_trainer(tmp_path, reward, loss_type=loss_type, beta=0.0, bf16=False)
    trainer.model.train()
    step = generation_batch(trainer.model.config.vocab_size, [a or 0.5 for a in ADVANTAGES])
    for i, batch in enumerate(step):  # four prompts, each with four completions, two in each micro-batch
        for key in ("prompt_ids", "prompt_mask"):
            batch[key] = step[0][key][[0, 1, 2, 3, 0, 1, 2, 3]].clone()
        batch["old_per_token_logps"] = -torch.rand(batch["completion_ids"].shape, generator=torch.Generator().manual_seed(i))
    full_loss, full = gradients(trainer, step)

    regrouped, _ = regroup(step, loss_type, 2, leave_out=False, pack=True, by_prompt=True)
    prompts = [tuple(row) for batch in regrouped for row in batch["prompt_ids"].tolist()]
    runs = [p for i, p in enumerate(prompts) if i == 0 or prompts[i - 1] != p]
    assert len(runs) == len(set(prompts)) == 4  # each prompt's completions next to each other
    packer = PackedForward(trainer.model)
    model, total = trainer.model, 0.0
    trainer.current_gradient_accumulation_steps = len(regrouped)
    model.zero_grad()
    with packed_attention():
        for inputs in regrouped:
            inputs = dict(inputs)
            scale = inputs.pop(LOSS_SCALE)
            with packer.prompts(inputs["prompt_ids"].size(1)):
                loss = trainer.compute_loss(model, inputs) * scale
            loss.backward()
            total += float(loss.detach())
    assert packer.packed == len(regrouped)
    assert total == pytest.approx(full_loss, rel=1e-5, abs=1e-7)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) == len(full) and any(g.abs().max() > 0 for g in full)
    for a, b in zip(grads, full):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6 * float(b.abs().max()))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_on_a_gpu_the_packed_forward_is_as_close_to_float32_as_the_padded_one(kind):
    """bf16 on a GPU, through FlashAttention's variable-length kernel (prompts' keys gathered before each
    completion's): the logits of every token and every gradient are float32's as closely as the padded batch's
    (SDPA), with gradient checkpointing; 12 rows of 4 prompts longer than the kernel's blocks."""
    import torch

    from grpo_cli.engine import packed as packed_module
    from tests.test_attention import assert_as_close_to_float32

    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 300, (int(n),), generator=g).tolist() for n in (37, 64, 50, 21)]
    rows = [i % 4 for i in range(12)]
    completions = [torch.randint(3, 300, (int(n),), generator=g).tolist() for n in torch.randint(1, 160, (12,), generator=g)]
    ids, mask = padded_batch([prompts[r] for r in rows], completions, width=64, length=160)
    ids, mask = ids.cuda(), mask.cuda()
    tokens = mask.bool()

    def run(dtype, packed):
        model = tiny_model(kind, max_position_embeddings=256).to("cuda", dtype)
        logits, grads, packer = forward_and_grads(model, ids, mask, packed, checkpointing=True, width=64)
        return logits.float(), grads.float(), packer

    flashes = []
    plan = packed_module.plan

    def recorded(*args, **kwargs):
        out = plan(*args, **kwargs)
        flashes.append(out[0].flash)
        return out

    packed_module.plan = recorded
    try:
        exact = run(torch.float32, False)
        padded = run(torch.bfloat16, False)
        packed = run(torch.bfloat16, True)
    finally:
        packed_module.plan = plan
    assert packed[2].packed == 1 and flashes == [True]

    assert_as_close_to_float32(packed, padded, exact)
    assert int(tokens.sum()) == packed[0].shape[0]


def test_each_sequences_keys_are_those_its_mask_lets_its_last_query_see():
    """What FlashAttention is handed on a GPU (each sequence's keys, gathered) against the mask the CPU's path uses,
    with a completion without a token and a prompt without one among the rows."""
    from grpo_cli.engine.packed import plan

    ids, mask = padded_batch([[5, 6, 7], [5, 6, 7], [], [8, 9]], [[20, 21], [], [30, 31, 32], [40]])
    laid_out, why = plan(ids, mask, PROMPT)
    assert why == ""
    allowed = laid_out.mask()
    starts, key_starts = laid_out.query_starts.tolist(), laid_out.key_starts.tolist()
    assert len(starts) == len(key_starts) == 6  # five sequences with a token: two prompts, three completions
    for i in range(len(starts) - 1):
        last = starts[i + 1] - 1
        keys = laid_out.keys[key_starts[i] : key_starts[i + 1]].tolist()
        assert keys == allowed[last].nonzero().flatten().tolist()
        assert laid_out.max_keys >= len(keys) and laid_out.max_queries >= starts[i + 1] - starts[i]


def test_an_sft_recipe_with_packed_forward_is_refused(tmp_path):
    from grpo_cli.errors import UserError
    from grpo_cli.recipe.check import check_recipe
    from grpo_cli.recipe.load import load_recipe

    base = ["--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct", "--output_dir", str(tmp_path / "out")]
    with pytest.raises(UserError, match=r"`packed_forward` lays out GRPO's prompts and completions: it is for `grpo rl`"):
        check_recipe(load_recipe(None, [*base, "--packed_forward", "true"], "sft"))
    check_recipe(load_recipe(None, [*base, "--packed_forward", "true", "--task", "countdown"], "rl"))


def test_packed_forward_is_a_gpu_default_where_the_estimate_says_it_shortens_the_step(tmp_path):
    """At the 7B shape with LoRA and micro-batches of 8 (a prompt's completions in each), the prompts it computes once
    outweigh what laying out each micro-batch costs; at 0.5B, whose micro-batches are bound by their launches, they do
    not. Never where the recipe turns FlashAttention or the packing off, asks for another attention, under DeepSpeed,
    on the CPU, or for `grpo sft`; `grpo check`'s estimate counts it as the run will have it."""
    from grpo_cli.engine.estimate import CARDS, ModelShape, RunShape, estimate, trained_tokens
    from grpo_cli.recipe.hardware import Hardware, hardware_defaults
    from grpo_cli.recipe.load import load_recipe
    from grpo_cli.recipe.memory import run_shape
    from tests.test_estimate import QWEN_05B, QWEN_7B, local_model_recipe

    for name, config in (("7b", QWEN_7B), ("05b", QWEN_05B)):
        (tmp_path / name).mkdir()
        local_model_recipe(tmp_path / name, config, "")  # its model folder: config.json only
    big, small = str(tmp_path / "7b" / "model"), str(tmp_path / "05b" / "model")
    lora = {"use_peft": True, "lora_r": 16, "gradient_checkpointing": True, "per_device_train_batch_size": 8,
            "gradient_accumulation_steps": 16, "num_generations": 8, "max_completion_length": 1024}  # fmt: skip
    gpu = Hardware(gpu=True)
    chosen, notes = hardware_defaults("rl", {**lora, "model_name_or_path": big}, gpu)
    assert chosen["packed_forward"][0] is True, notes
    assert chosen["packed_forward"][1].startswith("GPU: ") and "less forward/backward a step" in chosen["packed_forward"][1]
    assert "packed_forward" not in hardware_defaults("rl", {**lora, "model_name_or_path": small}, gpu)[0]
    for turned_off in ({"flash_attention": False}, {"attn_implementation": "eager"}, {"packed_forward": False},
                       {"deepspeed": "zero3.json"}):  # fmt: skip
        assert "packed_forward" not in hardware_defaults("rl", {**lora, "model_name_or_path": big, **turned_off}, gpu)[0]
    assert "packed_forward" not in hardware_defaults("rl", {**lora, "model_name_or_path": big}, Hardware(gpu=False))[0]
    assert "packed_forward" not in hardware_defaults("sft", {**lora, "model_name_or_path": big}, gpu)[0]

    # the estimate: fewer tokens, each prompt once for the completions of it in a micro-batch, at a cost per layer
    run = RunShape(micro_batch=8, rollout_rows=128, prompt_tokens=128, completion_tokens=1024, lora_rank=16,
                   fused_lora=True, flash_attention=True)  # fmt: skip
    packed = RunShape(**{**run.__dict__, "packed_forward": True})
    assert trained_tokens(run) == 1152 and trained_tokens(packed) == 1024 + 128 / 8
    for config, faster in ((QWEN_7B, True), (QWEN_05B, False)):
        shape = ModelShape.of(config)
        padded_s, packed_s = (estimate(shape, r, CARDS["H100-80GB"]).train_s for r in (run, packed))
        assert (packed_s < padded_s) is faster, (config["hidden_size"], padded_s, packed_s)

    # `grpo check` predicts the run as a GPU will resolve it, whatever machine checks it
    recipe_args = [f"--{key}={value}" for key, value in {**lora, "model_name_or_path": big, "task": "countdown"}.items()]
    cpu_loaded = load_recipe(None, recipe_args, "rl", hardware=Hardware(gpu=False))
    assert run_shape(cpu_loaded, 1, None, ModelShape.of(QWEN_7B)).packed_forward is True
    off = load_recipe(None, [*recipe_args, "--packed_forward=false"], "rl", hardware=Hardware(gpu=False))
    assert run_shape(off, 1, None, ModelShape.of(QWEN_7B)).packed_forward is False
    small_recipe = load_recipe(None, [*recipe_args, f"--model_name_or_path={small}"], "rl", hardware=Hardware(gpu=False))
    assert run_shape(small_recipe, 1, None, ModelShape.of(QWEN_05B)).packed_forward is False
