"""`skip_zero_advantage`: completions whose advantage is zero left out of the forward and backward, with TRL's own loss
on the tiny model giving the same gradients, and real `grpo rl` runs."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from test_dynamic_sampling import history, recipe, train

from grpo_cli.recipe.hardware import LOSS_NORMALIZERS
from grpo_cli.train.progress import metrics_line
from grpo_cli.train.zero_advantage import cannot_skip, kept_rows


def micro_batch(vocab: int, advantages: list[float], seed: int = 0) -> dict:
    """A micro-batch as GRPOTrainer trains on: prompts of 3-9 tokens padded on the left, completions of 1-12 tokens
    padded on the right (and to 16 columns, as a longer row elsewhere in the generation batch leaves them)."""
    g = torch.Generator().manual_seed(seed)
    rows = len(advantages)
    prompt_lengths = torch.randint(3, 10, (rows,), generator=g)
    completion_lengths = torch.randint(1, 13, (rows,), generator=g)
    prompt_mask = (torch.arange(12) >= 12 - prompt_lengths[:, None]).long()
    completion_mask = (torch.arange(16) < completion_lengths[:, None]).long()
    return {
        "prompt_ids": torch.randint(0, vocab, (rows, 12), generator=g) * prompt_mask,
        "prompt_mask": prompt_mask,
        "completion_ids": torch.randint(0, vocab, (rows, 16), generator=g) * completion_mask,
        "completion_mask": completion_mask,
        "advantages": torch.tensor(advantages),
        # the whole generation batch's tokens: twice this micro-batch's, as if it were one of two
        "num_items_in_batch": 2 * completion_mask.sum(),
    }


def gradients(trainer, inputs: dict, scale: float = 1.0) -> tuple[float, list[torch.Tensor]]:
    model = trainer.model
    trainer.current_gradient_accumulation_steps = 2  # what the training loop sets: one micro-batch of two
    model.zero_grad()
    loss = trainer.compute_loss(model, inputs) * scale
    loss.backward()
    return float(loss.detach()), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("loss_type", sorted(LOSS_NORMALIZERS))
def test_the_kept_rows_give_the_gradient_of_every_row(tmp_path, tiny_grpo_trainer, loss_type):
    """TRL's `_compute_loss` of each loss type: the kept rows, scaled, give the loss and gradients of all the rows."""
    config = {"loss_type": loss_type, "beta": 0.0}
    if loss_type == "luspo":
        config["importance_sampling_level"] = "sequence"
    trainer = tiny_grpo_trainer(tmp_path, [lambda completions, **kw: [0.0] * len(completions)], **config)
    trainer.model.train()
    inputs = micro_batch(trainer.model.config.vocab_size, [0.0, 1.5, 0.0, -0.5, 0.0, 0.0, 2.0, -3.0])
    # TRL's old log-probs are the current ones detached (one iteration), so make the ratio move: a step of its own
    inputs["old_per_token_logps"] = -torch.rand(inputs["completion_ids"].shape, generator=torch.Generator().manual_seed(1))
    full_loss, full = gradients(trainer, inputs)
    kept, scale, skipped = kept_rows(inputs, loss_type)
    assert skipped == 4 and kept["completion_ids"].shape[0] == 4
    # as another process keeping 6 rows would make it: two zero-advantage rows more, the same gradient
    more, more_scale, more_skipped = kept_rows(inputs, loss_type, at_least=6)
    assert more_skipped == 2 and more["advantages"].ne(0).sum() == 4
    more_loss, more_grads = gradients(trainer, more, more_scale)
    # completions cut to the columns the kept rows use (padding only); prompts as they were, so no position moves
    assert kept["completion_mask"][:, -1].any() and kept["completion_ids"].shape[1] < 16
    assert kept["prompt_ids"].equal(inputs["prompt_ids"][[1, 3, 6, 7]])
    assert int(kept["completion_mask"].sum()) == int(inputs["completion_mask"][[1, 3, 6, 7]].sum())
    kept_loss, grads = gradients(trainer, kept, scale)
    assert kept_loss == pytest.approx(full_loss, rel=1e-5, abs=1e-7)
    assert len(grads) == len(full)
    assert more_loss == pytest.approx(full_loss, rel=1e-5, abs=1e-7)
    for a, b, c in zip(grads, more_grads, full):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-8)
        torch.testing.assert_close(b, c, rtol=1e-5, atol=1e-8)
    assert any(g.abs().max() > 0 for g in full)  # the comparison has something to compare


def test_a_micro_batch_without_signal_trains_its_shortest_row_to_zero_gradients(tmp_path, tiny_grpo_trainer):
    trainer = tiny_grpo_trainer(tmp_path, [lambda completions, **kw: [0.0] * len(completions)], beta=0.0)
    trainer.model.train()
    inputs = micro_batch(trainer.model.config.vocab_size, [0.0] * 6, seed=3)
    kept, scale, skipped = kept_rows(inputs, "dapo", pad_to_multiple_of=4)
    shortest = int(inputs["completion_mask"].sum(dim=1).min())
    assert skipped == 5 and kept["completion_ids"].shape == (1, -(-shortest // 4) * 4)
    loss, grads = gradients(trainer, kept, scale)
    assert loss == 0.0 and grads and all(float(g.abs().max()) == 0.0 for g in grads)
    # under several processes each keeps as many rows as the one with most: the shortest rows make up the count
    lengths = inputs["completion_mask"].sum(dim=1)
    kept, scale, skipped = kept_rows(inputs, "grpo", at_least=3)
    assert skipped == 3 and scale == 0.5
    assert sorted(kept["completion_mask"].sum(dim=1).tolist()) == sorted(lengths.tolist())[:3]
    # with signal in every row, the batch is handed on as it is
    every = micro_batch(trainer.model.config.vocab_size, [1.0, -1.0], seed=4)
    assert kept_rows(every, "dapo") == (every, 1.0, 0)
    # a vision-language model's batch (its image inputs are not one per row) is trained whole
    with_images = {**inputs, "pixel_values": torch.zeros(3, 8)}
    assert kept_rows(with_images, "dapo") == (with_images, 1.0, 0)


@pytest.mark.parametrize(
    "config, reason",
    [
        ({"beta": 0.04}, "beta is 0.04"),
        ({"beta": 0.0, "entropy_coef": 0.01}, "entropy bonus"),
        ({"beta": 0.0, "top_entropy_quantile": 0.2}, "top_entropy_quantile is below 1"),
        ({"beta": 0.0}, None),
    ],
)
def test_settings_that_give_every_completion_a_gradient_are_named(tmp_path, tiny_grpo_trainer, config, reason):
    trainer = tiny_grpo_trainer(tmp_path, [lambda completions, **kw: [0.0] * len(completions)], **config)
    said = cannot_skip(trainer)
    assert (said is None) if reason is None else (reason in said)


@pytest.mark.slow
def test_a_run_leaves_flat_groups_out_and_learns_as_without(tmp_path, tiny_model_dir, monkeypatch):
    """Real `grpo rl` runs on rewards where every prompt with an even target is a flat group: the same rewards, losses
    and gradient norms step for step with and without `skip_zero_advantage`, and the share left out logged."""
    on, trained = train(recipe(tmp_path, tiny_model_dir, "by_target", name="on", steps=3), monkeypatch)
    off, _ = train(recipe(tmp_path, tiny_model_dir, "by_target", "skip_zero_advantage: false\n", "off", 3),
                   monkeypatch)
    on_logs, off_logs = history(on), history(off)
    assert len(on_logs) == len(off_logs) == 3
    for a, b in zip(on_logs, off_logs):
        assert a["reward"] == b["reward"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4, abs=1e-6)
    flat_rows = [float((batch["advantages"] == 0).float().mean()) for batch in trained]
    assert max(flat_rows) > 0  # the comparison covers skipped rows
    # each logged share is the step's: micro-batches of 8 rows, one kept where all 8 are flat
    for logged, share in zip([e["frac_rows_skipped"] for e in on_logs], flat_rows):
        assert logged == pytest.approx(share - (1 / 8 if share == 1 else 0))
    assert not any("frac_rows_skipped" in e for e in off_logs)
    assert f"skipped {on_logs[0]['frac_rows_skipped']:.2f}" in metrics_line(1, 3, on_logs[0])
    # the run's report has the share as a column, where it was logged
    assert "| skipped |" in (on / "report.md").read_text() and "| skipped |" not in (off / "report.md").read_text()


@pytest.mark.slow
def test_a_run_with_a_kl_penalty_trains_every_completion_and_says_why(tmp_path, tiny_model_dir, monkeypatch, caplog):
    path = recipe(tmp_path, tiny_model_dir, "by_target", name="kl", steps=1)
    path.write_text(path.read_text().replace("beta: 0.0", "beta: 0.04"))
    with caplog.at_level(logging.WARNING, logger="grpo_cli.train.rl"):
        out, _ = train(path, monkeypatch)
    said = [r.getMessage() for r in caplog.records if "skip_zero_advantage" in r.getMessage()]
    reason = "beta is 0.04: the KL penalty gives every completion a gradient"
    assert said == [f"skip_zero_advantage: every completion goes through the forward and backward ({reason})"]
    assert not any("frac_rows_skipped" in e for e in json.loads((out / "train_summary.json").read_text())["log_history"])
