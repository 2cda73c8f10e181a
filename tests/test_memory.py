"""Running out of GPU memory: real CPU runs that run out where a GPU would, one message with this recipe's fixes.

The out-of-memory error is raised where torch raises it, from inside the model's forward (a forward hook) or the
optimizer's step (torch's step hook); everything around it is the real run.
"""

from __future__ import annotations

import pytest

from grpo_cli.errors import UserError
from grpo_cli.train.run import TrainingRun
from tests.test_train import recipe_file, train

pytestmark = pytest.mark.slow

OOM_TEXT = "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 79.19 GiB"


def run_out_of_memory(monkeypatch, tmp_path, model, command, extra, when):
    """Train `command` and raise torch's OutOfMemoryError from the model's forward whenever `when()` is true."""
    import torch

    load_model = TrainingRun.load_model

    def load_then_hook(run):
        model = load_model(run)

        def forward_hook(module, args):
            if when():
                raise torch.OutOfMemoryError(OOM_TEXT)

        model.register_forward_pre_hook(forward_hook)
        return model

    monkeypatch.setattr(TrainingRun, "load_model", load_then_hook)
    with pytest.raises(UserError) as caught:
        train(recipe_file(tmp_path, model, command, extra), command)
    [problem] = caught.value.problems
    return problem


def test_out_of_memory_while_generating(monkeypatch, tmp_path, tiny_model_dir):
    import torch

    problem = run_out_of_memory(
        monkeypatch,
        tmp_path,
        tiny_model_dir,
        "rl",
        "gradient_accumulation_steps: 2\n",
        when=lambda: not torch.is_grad_enabled(),
    )
    assert problem.startswith("out of GPU memory while generating completions (tried to allocate 2.50 GiB)")
    # 4 per micro-batch x 2 accumulation steps = 8 completions per generation, 4 per prompt: halving stays whole
    yaml = tmp_path / "rl.yaml"
    assert (
        f"each process generates 8 completions at once (per_device_train_batch_size 4 x steps_per_generation 2, "
        f"{yaml}:11, {yaml}:19), up to 12 tokens each. To fit:" in problem
    )
    assert "`steps_per_generation: 1` generates them in batches of 4" in problem
    assert f"`max_completion_length: 6` ({yaml}:17)" in problem  # where the key is set
    assert "No checkpoint was saved" in problem


def test_out_of_memory_in_the_backward_names_the_micro_batch_and_the_checkpoint(
    monkeypatch, tmp_path, tiny_model_dir
):
    import torch

    calls = {"training forwards": 0}

    def in_training_after_the_first_step():
        if not torch.is_grad_enabled():
            return False
        calls["training forwards"] += 1
        return calls["training forwards"] > 1  # the first step trains and saves checkpoint-1

    problem = run_out_of_memory(
        monkeypatch,
        tmp_path,
        tiny_model_dir,
        "rl",
        "gradient_checkpointing: false\n",
        when=in_training_after_the_first_step,
    )
    assert problem.startswith("out of GPU memory in the policy's forward/backward")
    assert "`per_device_train_batch_size: 2` with `gradient_accumulation_steps: 2`" in problem
    assert "`gradient_checkpointing: true`" in problem and "`use_peft: true`" in problem
    assert "`activation_offloading: true`" in problem and "`lean_lm_head: true`" in problem
    assert f"resume from {tmp_path / 'rl' / 'checkpoint-1'}" in problem
    assert (tmp_path / "rl" / "checkpoint-1" / "trainer_state.json").is_file()  # the saved step stays usable


def test_out_of_memory_in_the_optimizer_step(tmp_path, tiny_model_dir):
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    def optimizer_hook(optimizer, args, kwargs):
        raise torch.OutOfMemoryError(OOM_TEXT)

    handle = register_optimizer_step_pre_hook(optimizer_hook)
    try:
        with pytest.raises(UserError) as caught:
            train(recipe_file(tmp_path, tiny_model_dir, "sft"), "sft")
    finally:
        handle.remove()
    [problem] = caught.value.problems
    assert problem.startswith("out of GPU memory in the optimizer step")
    assert "`optim: adamw_8bit`" in problem and "`use_peft: true`" in problem and "zero3" in problem
    assert "activation_offloading" not in problem  # activations are gone by the optimizer step
    assert "lean_lm_head" not in problem


def test_lora_forward_backward_advice_leaves_out_the_lm_head():
    from grpo_cli.recipe import load_recipe
    from grpo_cli.train.memory_fixes import memory_fixes

    full = memory_fixes(load_recipe(None, [], "rl"), "forward/backward")
    lora = memory_fixes(load_recipe(None, ["--use_peft", "true"], "rl"), "forward/backward")
    assert any("lean_lm_head" in fix for fix in full)
    assert not any("lean_lm_head" in fix for fix in lora)  # LoRA trains no LM head
    assert any("activation_offloading" in fix for fix in lora)


def test_advice_for_full_fine_tuning_names_the_master_weights_price():
    from grpo_cli.recipe import load_recipe
    from grpo_cli.train.memory_fixes import memory_fixes

    full = memory_fixes(load_recipe(None, ["--dtype", "bfloat16"], "rl"), "optimizer")
    lora = memory_fixes(load_recipe(None, ["--dtype", "bfloat16", "--use_peft", "true"], "rl"), "optimizer")
    [fix] = [fix for fix in full if "master_weights" in fix]
    assert fix.startswith("`master_weights: false`") and "loses most updates" in fix
    assert not any("master_weights" in fix for fix in lora)  # LoRA's adapters train in float32


def test_other_errors_pass_through(monkeypatch, tmp_path, tiny_model_dir):
    load_model = TrainingRun.load_model

    def load_then_fail(run):
        load_model(run)
        raise RuntimeError("something else")

    monkeypatch.setattr(TrainingRun, "load_model", load_then_fail)
    with pytest.raises(RuntimeError, match="something else"):
        train(recipe_file(tmp_path, tiny_model_dir, "sft"), "sft")
