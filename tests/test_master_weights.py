"""Float32 master weights: a bfloat16 model's small updates are kept, exactly as a float32 optimizer makes them."""

from __future__ import annotations

import io
import json

import pytest
import torch
from test_train import recipe_file, train

from grpo_cli.errors import UserError
from grpo_cli.recipe import load_recipe
from grpo_cli.recipe.check import check_recipe
from grpo_cli.recipe.hardware import Hardware
from grpo_cli.train.master_weights import MASTER, MasterWeights, stochastic_round_

LR = 1e-5  # AdamW moves a weight by about this much a step: below half a bfloat16 unit of a weight of 0.005-0.025


def weights(seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand(64, 32, generator=generator) / 50 + 0.005, torch.rand(32, generator=generator) / 50 + 0.005]


def gradients(step: int) -> list[torch.Tensor]:
    """Of one sign, so the updates add up over the steps."""
    generator = torch.Generator().manual_seed(1000 + step)
    return [1 + torch.rand(64, 32, generator=generator), 1 + torch.rand(32, generator=generator)]


def bf16_parameters(seed: int = 0) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(w.to(torch.bfloat16)) for w in weights(seed)]


def steps(optimizer, params, first: int, last: int) -> None:
    for step in range(first, last):
        for p, g in zip(params, gradients(step)):
            p.grad = g.to(p.dtype)
        optimizer.step()
        optimizer.zero_grad()


def float32_reference(params_bf16, first: int, last: int, state=None):
    """The same steps in float32 from the bfloat16 weights, with the bfloat16 gradients: what master weights must
    reproduce exactly."""
    ref = [torch.nn.Parameter(p.detach().float()) for p in params_bf16]
    optimizer = torch.optim.AdamW(ref, lr=LR)
    for step in range(first, last):
        for p, g in zip(ref, gradients(step)):
            p.grad = g.to(torch.bfloat16).float()
        optimizer.step()
        optimizer.zero_grad()
    return ref, optimizer


def checkpoint(params, optimizer) -> dict:
    """The weights and the optimizer's state, saved and loaded back as a checkpoint does."""
    buffer = io.BytesIO()
    torch.save({"weights": [p.detach() for p in params], "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    return torch.load(buffer)


def copies_of(master_weights: MasterWeights) -> dict:
    """The model's parameter -> its float32 copy."""
    return {param: master for master, param in master_weights.model_params.items()}


def test_bfloat16_weights_lose_small_updates_and_master_weights_keep_them_exactly():
    plain = bf16_parameters()
    start = [p.detach().clone() for p in plain]
    steps(torch.optim.AdamW(plain, lr=LR), plain, 0, 20)
    unchanged = sum((p == s).sum().item() for p, s in zip(plain, start)) / sum(p.numel() for p in plain)
    assert unchanged == 1.0  # 20 updates of about 1e-5 each, each rounded away

    kept = bf16_parameters()
    optimizer = torch.optim.AdamW(kept, lr=LR)
    copies = copies_of(MasterWeights(optimizer, "nearest"))
    steps(optimizer, kept, 0, 20)
    reference, ref_optimizer = float32_reference(bf16_parameters(), 0, 20)
    for p, ref in zip(kept, reference):
        assert p.dtype == torch.bfloat16 and p.grad is None
        master = copies[p]
        assert optimizer.state[master][MASTER] is master
        assert master.dtype == torch.float32 and torch.equal(master, ref.detach())
        assert torch.equal(p.detach(), ref.detach().to(torch.bfloat16))
        assert optimizer.state[master]["exp_avg_sq"].dtype == torch.float32
        assert torch.equal(optimizer.state[master]["exp_avg_sq"], ref_optimizer.state[ref]["exp_avg_sq"])
    changed = sum((p != s).sum().item() for p, s in zip(kept, start)) / sum(p.numel() for p in kept)
    assert changed > 0.5  # the float32 copies carried the updates across bfloat16 units


def test_master_weights_resume_from_a_checkpoint_in_float32():
    params = bf16_parameters()
    optimizer = torch.optim.AdamW(params, lr=LR)
    copies = copies_of(MasterWeights(optimizer, "nearest"))
    steps(optimizer, params, 0, 5)
    saved = checkpoint(params, optimizer)
    resumed = [torch.nn.Parameter(w) for w in saved["weights"]]
    again = torch.optim.AdamW(resumed, lr=LR)
    resumed_copies = copies_of(MasterWeights(again, "nearest"))
    for p, q in zip(params, resumed):  # made from the rounded weights, before the state is loaded
        assert not torch.equal(resumed_copies[q], copies[p])
    again.load_state_dict(saved["optimizer"])
    for p, q in zip(params, resumed):  # the saved copies, in float32, are the ones stepped from here
        master = resumed_copies[q]
        assert again.state[master][MASTER] is master and torch.equal(master, copies[p])
        assert master.dtype == again.state[master]["exp_avg"].dtype == torch.float32
    steps(optimizer, params, 5, 10)
    steps(again, resumed, 5, 10)
    for p, q in zip(params, resumed):
        assert torch.equal(copies[p], resumed_copies[q])
        assert torch.equal(p.detach(), q.detach())


def test_a_skipped_step_leaves_weights_copies_and_state_alone():
    params = bf16_parameters()
    optimizer = torch.optim.AdamW(params, lr=LR)
    copies = copies_of(MasterWeights(optimizer))
    steps(optimizer, params, 0, 2)
    before = [(p.detach().clone(), copies[p].clone(), optimizer.state[copies[p]]["exp_avg"].clone()) for p in params]
    optimizer.step()  # the step guard drops every gradient of a non-finite step
    for p, (weight, master, moment) in zip(params, before):
        assert torch.equal(p.detach(), weight) and torch.equal(copies[p], master)
        assert torch.equal(optimizer.state[copies[p]]["exp_avg"], moment)


def test_stochastic_rounding_keeps_a_value_on_average_and_the_grid_exactly():
    low = torch.tensor([0.0123, -0.0123, 3.5]).to(torch.bfloat16)
    up = (low.view(torch.int16) + 1).view(torch.bfloat16)  # the next bfloat16 number away from zero
    value = low.float() + 0.3 * (up.float() - low.float())  # 30% of the way to the next one
    draws = 200_000
    out = torch.empty(draws, 3, dtype=torch.bfloat16).t()  # not contiguous: written through a copy
    stochastic_round_(out, value[:, None].expand(3, draws), torch.Generator().manual_seed(0))
    assert set(out.unique().tolist()) == set(low.tolist()) | set(up.tolist())
    share_up = (out == up[:, None]).float().mean(dim=1)
    assert torch.allclose(share_up, torch.full((3,), 0.3), atol=0.01)
    assert torch.allclose(out.float().mean(dim=1), value, rtol=1e-4)
    on_grid = torch.empty(3, dtype=torch.bfloat16)
    stochastic_round_(on_grid, low.float(), torch.Generator().manual_seed(1))
    assert torch.equal(on_grid, low)


def test_stochastic_rounding_shows_small_updates_at_once_and_resumes_alike():
    nearest = bf16_parameters()
    start = [p.detach().clone() for p in nearest]
    optimizer = torch.optim.AdamW(nearest, lr=LR)
    MasterWeights(optimizer, "nearest")
    steps(optimizer, nearest, 0, 1)
    assert all(torch.equal(p.detach(), s) for p, s in zip(nearest, start))  # one update of 1e-5: rounded away

    params = bf16_parameters()
    optimizer = torch.optim.AdamW(params, lr=LR)
    copies = copies_of(MasterWeights(optimizer, "stochastic", seed=3))
    steps(optimizer, params, 0, 1)
    moved = [(p.detach().float() - s.float()) for p, s in zip(params, start)]
    meant = [copies[p] - s.float() for p, s in zip(params, start)]
    assert sum((m != 0).sum().item() for m in moved) > 0.05 * sum(m.numel() for m in moved)
    # on average the weights moved as their copies did
    assert torch.allclose(torch.cat([m.flatten() for m in moved]).mean(), torch.cat([m.flatten() for m in meant]).mean(),
                          rtol=0.1)

    steps(optimizer, params, 1, 5)
    saved = checkpoint(params, optimizer)
    resumed = [torch.nn.Parameter(w) for w in saved["weights"]]
    again = torch.optim.AdamW(resumed, lr=LR)
    MasterWeights(again, "stochastic", seed=3)
    again.load_state_dict(saved["optimizer"])
    steps(optimizer, params, 5, 10)
    steps(again, resumed, 5, 10)
    assert all(torch.equal(p.detach(), q.detach()) for p, q in zip(params, resumed))  # the same draws
    other = bf16_parameters()
    other_optimizer = torch.optim.AdamW(other, lr=LR)
    MasterWeights(other_optimizer, "stochastic", seed=4)
    steps(other_optimizer, other, 0, 10)
    assert not all(torch.equal(p.detach(), q.detach()) for p, q in zip(params, other))  # the seed decides them


def test_full_finetuning_of_bfloat16_weights_gets_master_weights_by_default(tmp_path):
    def recipe(*args, hardware=None):
        return load_recipe(None, ["--output_dir", str(tmp_path), *args], "rl", hardware or Hardware(gpu=False))

    full = recipe("--dtype", "bfloat16")
    assert full.values["master_weights"] is True
    assert full.resolved()["master_weights_rounding"] == "stochastic"
    assert full.where("master_weights") == "hardware default (full fine-tuning of bfloat16 weights)"
    assert recipe("--dtype", "auto").values["master_weights"] is True
    assert load_recipe(None, ["--dtype", "bfloat16"], "sft", Hardware(gpu=False)).values["master_weights"] is True
    for leaves_it in (
        ["--dtype", "float32"],
        [],  # TRL's float32
        ["--dtype", "bfloat16", "--use_peft", "true"],  # the adapters train in float32
        ["--dtype", "bfloat16", "--deepspeed", "configs/deepspeed/zero3.json"],  # DeepSpeed keeps copies itself
        ["--dtype", "bfloat16", "--master_weights", "false"],
    ):
        assert not recipe(*leaves_it).values.get("master_weights"), leaves_it
    assert "master_weights" not in recipe("--dtype", "bfloat16", hardware=Hardware(gpu=False, sharded=True)).values
    with pytest.raises(UserError, match="DeepSpeed's optimizer keeps float32 copies"):
        check_recipe(recipe("--dtype", "bfloat16", "--master_weights", "true", "--deepspeed", "x.json"))
    with pytest.raises(UserError, match="`master_weights_rounding` rounds the float32 master weights"):
        check_recipe(recipe("--dtype", "bfloat16", "--use_peft", "true", "--master_weights_rounding", "stochastic"))
    try:
        check_recipe(recipe("--dtype", "bfloat16", "--master_weights_rounding", "stochastic"))
    except UserError as err:  # the recipe names no model
        assert not any("master_weights_rounding" in problem for problem in err.problems), err.problems


@pytest.mark.slow
def test_a_bfloat16_grpo_run_steps_float32_copies_and_resumes_them(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file

    path = recipe_file(tmp_path, tiny_model_dir, "rl", "beta: 0.0\n")  # stochastic rounding, the default
    out = train(path, "rl", ["--dtype", "bfloat16"])
    assert "master_weights: true" in (out / "recipe.yaml").read_text()
    optimizer = torch.load(out / "checkpoint-2" / "optimizer.pt", weights_only=True)
    masters = [s[MASTER] for s in optimizer["state"].values()]
    saved = load_file(str(out / "checkpoint-2" / "model.safetensors"))
    assert masters and len(masters) == len(optimizer["state"])  # every trained tensor has its copy
    assert {m.dtype for m in masters} == {torch.float32}
    assert {w.dtype for w in saved.values()} == {torch.bfloat16}
    train(path, "rl", ["--dtype", "bfloat16", "--max_steps", "3"])  # resumes the copies
    resumed = torch.load(out / "checkpoint-3" / "optimizer.pt", weights_only=True)
    assert {s[MASTER].dtype for s in resumed["state"].values()} == {torch.float32}


@pytest.mark.gpu
@pytest.mark.slow
def test_a_bfloat16_full_finetuning_on_the_gpu_trains_through_grpos_sampler(tmp_path, tiny_model_dir):
    """The sampler's CUDA graphs read the weights' storage: the rounded copies land in it, step after step."""
    from safetensors.torch import load_file

    path = recipe_file(tmp_path, tiny_model_dir, "rl", "beta: 0.0\n")
    out = train(path, "rl", ["--dtype", "bfloat16", "--max_steps", "3", "--save_steps", "3"])
    recipe = (out / "recipe.yaml").read_text()
    assert "master_weights: true" in recipe and "rollout_engine: grpo" in recipe
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["global_step"] == 3 and not summary["non_finite_steps"]
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    assert any(not torch.equal(before[k].to(torch.bfloat16), after[k]) for k in before if k in after)
