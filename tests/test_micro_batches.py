"""A step's micro-batches laid out again: completions whose advantage is zero left out of the forward and backward
(`skip_zero_advantage`) and the others packed by tokens (`pack_micro_batches`), with TRL's own loss on the tiny model
giving the same gradients, and real `grpo rl` runs."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from test_dynamic_sampling import history, recipe, train

from grpo_cli.recipe.hardware import LOSS_NORMALIZERS, micro_batch_layout
from grpo_cli.train.micro_batches import LOSS_SCALE, cannot_skip, regroup
from grpo_cli.train.progress import metrics_line


def micro_batch(vocab: int, advantages: list[float], seed: int = 0, lengths: list[int] | None = None) -> dict:
    """A micro-batch as GRPOTrainer trains on: prompts of 3-9 tokens padded on the left, completions of 1-12 tokens
    (or `lengths`) padded on the right (and to 16 columns, as a longer row elsewhere in the generation batch leaves
    them)."""
    g = torch.Generator().manual_seed(seed)
    rows = len(advantages)
    prompt_lengths = torch.randint(3, 10, (rows,), generator=g)
    completion_lengths = torch.randint(1, 13, (rows,), generator=g) if lengths is None else torch.tensor(lengths)
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


def generation_batch(
    vocab: int, advantages: list[float], micro_batches: int = 2, seed: int = 0, lengths: list[int] | None = None
) -> list[dict]:
    """A generation batch split into micro-batches of equal size, as GRPOTrainer splits it (`num_items_in_batch`,
    the whole batch's tokens, in each)."""
    whole = micro_batch(vocab, advantages, seed, lengths)
    whole["num_items_in_batch"] = whole["completion_mask"].sum()
    rows = len(advantages) // micro_batches
    return [{k: v if v.dim() == 0 else v[i * rows : (i + 1) * rows] for k, v in whole.items()}
            for i in range(micro_batches)]


def gradients(trainer, micro_batches: list[dict]) -> tuple[float, list[torch.Tensor]]:
    """A step's loss and gradients over `micro_batches` through TRL's own loss, each scaled by its `LOSS_SCALE`
    where it has one; a micro-batch without rows runs no forward or backward."""
    model = trainer.model
    trainer.current_gradient_accumulation_steps = len(micro_batches)  # what the training loop sets
    model.zero_grad()
    total = 0.0
    for inputs in micro_batches:
        inputs = dict(inputs)
        scale = inputs.pop(LOSS_SCALE, 1.0)
        if inputs["advantages"].numel() == 0:
            continue
        loss = trainer.compute_loss(model, inputs) * scale
        loss.backward()
        total += float(loss.detach())
    return total, [p.grad.clone() for p in model.parameters() if p.grad is not None]


def sizes(micro_batches: list[dict]) -> list[int]:
    return [batch["advantages"].size(0) for batch in micro_batches]


class MostRows:
    """What the other processes of a launch tell this one when it regroups (`regroup`'s `processes`): the most rows
    with signal any of them has in each step."""

    def __init__(self, most: int):
        self.most = most

    def reduce(self, counts, reduction):
        assert reduction == "max"
        return torch.maximum(counts, torch.full_like(counts, self.most))


ADVANTAGES = [0.0, 1.5, 0.0, -0.5, 0.0, 0.0, 2.0, -3.0, 0.0, 0.0, 1.0, 0.0, 0.0, -1.0, 0.0, 0.0]


@pytest.mark.parametrize("loss_type", sorted(LOSS_NORMALIZERS))
def test_the_regrouped_rows_give_the_gradient_of_every_row(tmp_path, tiny_grpo_trainer, loss_type):
    """TRL's `_compute_loss` of each loss type over one step of two micro-batches of 8 rows, 6 of them with signal:
    the regrouped micro-batches, scaled, give the loss and gradients of all the rows."""
    config = {"loss_type": loss_type, "beta": 0.0, "bf16": False}  # no bfloat16 autocast: the rounding below is the sums'
    if loss_type == "luspo":
        config["importance_sampling_level"] = "sequence"
    trainer = tiny_grpo_trainer(tmp_path, [lambda completions, **kw: [0.0] * len(completions)], **config)
    trainer.model.train()
    step = generation_batch(trainer.model.config.vocab_size, ADVANTAGES)
    # TRL's old log-probs are the current ones detached (one iteration), so make the ratio move: a step of its own
    for i, batch in enumerate(step):
        g = torch.Generator().manual_seed(i)
        batch["old_per_token_logps"] = -torch.rand(batch["completion_ids"].shape, generator=g)
    full_loss, full = gradients(trainer, step)
    group, _, _ = micro_batch_layout({"loss_type": loss_type, "gradient_accumulation_steps": 2}, None)
    regrouped, left_out = regroup(step, loss_type, group)
    # as another process with 10 rows of signal would make it: 4 zero-advantage rows more, the same gradient
    more, more_left_out = regroup(step, loss_type, group, processes=MostRows(10))
    if LOSS_NORMALIZERS[loss_type] == "tokens":  # bnpo: each micro-batch keeps its own rows
        assert sizes(regrouped) == [4, 2] and left_out == 10 / 16
        assert sizes(more) == [8, 8] and more_left_out == 0
    else:  # the 6 rows with signal in one micro-batch, the step's last; the other runs nothing
        assert sizes(regrouped) == [0, 6] and left_out == 10 / 16
        assert sizes(more) == [8, 2] and more_left_out == 6 / 16
        assert int(more[1]["advantages"].ne(0).sum()) + int(more[0]["advantages"].ne(0).sum()) == 6
    kept = regrouped[-1]
    # completions cut to the columns the kept rows use (padding only); prompts as they were, so no position moves
    assert kept["completion_mask"][:, -1].any() and kept["completion_ids"].shape[1] < 16
    assert kept["prompt_ids"].shape[1] == 12
    lengths = kept["completion_mask"].sum(dim=1)
    assert lengths.tolist() == sorted(lengths.tolist(), reverse=True)  # longest first
    regrouped_loss, grads = gradients(trainer, regrouped)
    more_loss, more_grads = gradients(trainer, more)
    assert regrouped_loss == pytest.approx(full_loss, rel=1e-6, abs=1e-9)
    assert more_loss == pytest.approx(full_loss, rel=1e-6, abs=1e-9)
    assert len(grads) == len(more_grads) == len(full)
    for a, b, c in zip(grads, more_grads, full):  # float32's rounding of sums added in another order
        atol = 1e-6 * float(c.abs().max())
        torch.testing.assert_close(a, c, rtol=1e-5, atol=atol)
        torch.testing.assert_close(b, c, rtol=1e-5, atol=atol)
    assert any(g.abs().max() > 0 for g in full)  # the comparison has something to compare


def test_a_step_without_signal_trains_its_shortest_row_in_its_last_micro_batch(tmp_path, tiny_grpo_trainer):
    trainer = tiny_grpo_trainer(tmp_path, [lambda completions, **kw: [0.0] * len(completions)], beta=0.0)
    trainer.model.train()
    step = generation_batch(trainer.model.config.vocab_size, [0.0] * 12, micro_batches=3, seed=3)
    lengths = torch.cat([batch["completion_mask"].sum(dim=1) for batch in step])
    regrouped, left_out = regroup(step, "dapo", group=3, pad_to_multiple_of=4)
    assert sizes(regrouped) == [0, 0, 1] and left_out == 11 / 12
    assert regrouped[2]["completion_ids"].shape == (1, -(-int(lengths.min()) // 4) * 4)
    loss, grads = gradients(trainer, regrouped)
    assert loss == 0.0 and grads and all(float(g.abs().max()) == 0.0 for g in grads)
    # DeepSpeed and FSDP: every micro-batch keeps a row, the shortest
    regrouped, left_out = regroup(step, "grpo", group=3, every_micro_batch=True)
    assert sizes(regrouped) == [1, 1, 1] and left_out == 9 / 12 and regrouped[0][LOSS_SCALE] == 1 / 4
    assert sorted(int(b["completion_mask"].sum()) for b in regrouped) == sorted(lengths.tolist())[:3]
    # two optimizer steps in one generation batch: each regrouped on its own
    two = generation_batch(trainer.model.config.vocab_size, ADVANTAGES, micro_batches=4)
    assert sizes(regroup(two, "grpo", group=2)[0]) == [0, 4, 0, 2]
    # with signal in every row, every micro-batch trains, its rows regrouped by length
    every = generation_batch(trainer.model.config.vocab_size, [1.0, -1.0] * 4, seed=4)
    regrouped, left_out = regroup(every, "dapo", group=2)
    assert sizes(regrouped) == [4, 4] and left_out == 0
    assert regrouped[0]["completion_mask"].sum(dim=1).min() >= regrouped[1]["completion_mask"].sum(dim=1).max()
    # a vision-language model's batch (its image inputs are not one per row) is trained whole
    with_images = [{**batch, "pixel_values": torch.zeros(3, 8)} for batch in step]
    assert regroup(with_images, "dapo", group=3) == (with_images, 0.0)


# Completion lengths of a step of 4 micro-batches of 4: one row at 16 tokens, the others short.
LENGTHS = [16, 3, 3, 3, 2, 2, 2, 2, 4, 4, 4, 4, 1, 1, 1, 1]


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_packed_micro_batches_fill_the_tokens_of_one_and_give_the_gradient_of_every_row(
    tmp_path, tiny_grpo_trainer, loss_type
):
    """Packed by tokens, a step of short completions fills fewer micro-batches, none holding more tokens than the one
    GRPOTrainer cut (4 rows x 12 prompt + 16 completion columns), and trains to the same loss and gradients."""
    trainer = tiny_grpo_trainer(tmp_path, [lambda completions, **kw: [0.0] * len(completions)],
                                loss_type=loss_type, beta=0.0, bf16=False)  # fmt: skip
    trainer.model.train()
    advantages = [1.0, -1.0, 0.5, -0.5] * 4
    step = generation_batch(trainer.model.config.vocab_size, advantages, micro_batches=4, lengths=LENGTHS)
    full_loss, full = gradients(trainer, step)
    packed, left_out = regroup(step, loss_type, 4, leave_out=False, pack=True)
    # longest first: 4 rows at 12 + 16 columns (112 tokens), 7 at 12 + 4 (112), the last 5 at 12 + 2 (70)
    assert sizes(packed) == [0, 4, 7, 5] and left_out == 0
    assert [b["completion_mask"].sum(dim=1).tolist() for b in packed[1:]] == [
        [16, 4, 4, 4], [4, 3, 3, 3, 2, 2, 2], [2, 1, 1, 1, 1]
    ]
    for batch in packed[1:]:
        assert batch["advantages"].size(0) * (12 + batch["completion_ids"].size(1)) <= 4 * (12 + 16)
    packed_loss, grads = gradients(trainer, packed)
    assert packed_loss == pytest.approx(full_loss, rel=1e-6, abs=1e-9)
    for a, c in zip(grads, full):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6 * float(c.abs().max()))
    # with the zero-advantage rows left out too: the 8 rows with signal in fewer micro-batches still
    half = generation_batch(trainer.model.config.vocab_size, [1.0, -1.0, 0.0, 0.0] * 4, micro_batches=4,
                            lengths=LENGTHS)  # fmt: skip
    packed, left_out = regroup(half, loss_type, 4, pack=True)
    assert sizes(packed)[:2] == [0, 0] and sum(sizes(packed)) == 8 and left_out == 0.5
    # not packed: micro-batches of 4 rows
    assert sizes(regroup(half, loss_type, 4)[0]) == [0, 0, 4, 4]


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


class Regrouped:
    """`grpo rl`'s trainer recording the rows of each micro-batch it regroups, one list per generation batch."""

    def __init__(self, monkeypatch):
        from grpo_cli.train import rl

        self.sizes: list[list[int]] = []
        self.packed: list[int | None] = []  # with `packed_forward`: the forwards packed before each regrouping
        sizes, packed = self.sizes, self.packed

        class Regrouping(rl.RLTrainer):
            def regroup(self, micro_batches):
                micro_batches = super().regroup(micro_batches)
                sizes.append([batch["advantages"].size(0) for batch in micro_batches])
                packed.append(self.packer.packed if self.packer is not None else None)
                return micro_batches

        self.trainer = Regrouping
        self.monkeypatch = monkeypatch

    def train(self, path):
        from grpo_cli.train import rl

        self.monkeypatch.setattr(rl, "RLTrainer", self.trainer)  # `train` records through a subclass of its own
        return train(path, self.monkeypatch)


@pytest.fixture(scope="module")
def short_completions_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model made to end its completions at lengths that vary (the random model alone runs each to the
    limit): every token's embedding gets 1 more in its first coordinate, which then dominates the last hidden state at
    every position, so the (tied) output weights add the same logit to every token there, and the end-of-text token's
    0.85 more makes it about one sampled token in seventy (TRL samples from the whole vocabulary: top_k 0)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        embeddings = model.get_input_embeddings().weight
        embeddings[:, 0] += 1.0
        embeddings[tokenizer.eos_token_id, 0] += 0.85
    out = tmp_path_factory.mktemp("short_completions_model")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.mark.slow
def test_a_run_packs_short_completions_into_fewer_micro_batches_and_learns_as_without(
    tmp_path, short_completions_model_dir, monkeypatch
):
    """Real `grpo rl` runs, four micro-batches of 2 a step, of completions up to 256 tokens that end at different
    lengths: packed by tokens, steps run fewer micro-batches of more rows and train to the same rewards, losses and
    gradient norms as TRL's micro-batches."""
    recorded = Regrouped(monkeypatch)

    def run(extra: str, name: str):
        path = recipe(tmp_path, short_completions_model_dir, "never_flat", extra, name, 2, batch=2)
        path.write_text(path.read_text().replace("max_completion_length: 8", "max_completion_length: 256"))
        return recorded.train(path)

    four = "gradient_accumulation_steps: 4\nbf16: false\n"
    packed, _ = run(four, "packed")
    plain, trained = run(four + "skip_zero_advantage: false\npack_micro_batches: false\n", "trl")
    lengths = [batch["completion_mask"].sum(dim=1).tolist() for batch in trained]
    assert any(len(set(step)) > 2 for step in lengths), lengths  # completions of several lengths
    packed_logs, plain_logs = history(packed), history(plain)
    assert len(packed_logs) == len(plain_logs) == 2
    for a, b in zip(packed_logs, plain_logs):
        assert a["reward"] == b["reward"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6, abs=1e-7)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-6, abs=1e-9)
    assert recorded.sizes[2:] == [[2, 2, 2, 2]] * 2  # TRL's
    assert all(sum(step) == 8 and step[-1] > 0 for step in recorded.sizes[:2])
    assert any(step[0] == 0 and max(step) > 2 for step in recorded.sizes[:2]), recorded.sizes
    assert [e["micro_batches_run"] for e in packed_logs] == [sum(map(bool, s)) for s in recorded.sizes[:2]]
    assert not any("micro_batches_run" in e for e in plain_logs)  # TRL's: all 4


@pytest.mark.slow
def test_a_run_leaves_flat_groups_out_and_learns_as_without(tmp_path, tiny_model_dir, monkeypatch):
    """Real `grpo rl` runs, two micro-batches of 4 a step, on rewards where every prompt with an even target is a
    flat group: the same rewards, losses and gradient norms step for step with and without `skip_zero_advantage`, a
    micro-batch left out where one holds every row with signal, and the share left out logged."""
    recorded = Regrouped(monkeypatch)
    two = "gradient_accumulation_steps: 2\nbf16: false\n"  # float32: bfloat16 autocast rounds each micro-batch
    on, trained = recorded.train(recipe(tmp_path, tiny_model_dir, "by_target", two, "on", 4, batch=4))
    as_trl = two + "skip_zero_advantage: false\npack_micro_batches: false\n"  # TRL's own micro-batches
    off, _ = recorded.train(recipe(tmp_path, tiny_model_dir, "by_target", as_trl, "off", 4, 4))
    # and each micro-batch without its padding, a prompt once for its completions there (`packed_forward`)
    packed, _ = recorded.train(recipe(tmp_path, tiny_model_dir, "by_target", two + "packed_forward: true\n", "pf", 4, 4))
    regrouped = recorded.sizes[:8]
    on_logs, off_logs, packed_logs = history(on), history(off), history(packed)
    assert len(on_logs) == len(off_logs) == len(packed_logs) == 4
    for a, b, c in zip(on_logs, off_logs, packed_logs):
        assert a["reward"] == b["reward"] == c["reward"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6, abs=1e-7)  # losses near 0: sums of +-advantages
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-6, abs=1e-9)
        assert c["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-7)
        assert c["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5, abs=1e-9)
    # every micro-batch it trained went through the packed forward (counted before each step's regrouping)
    assert recorded.packed[:8] == [None] * 8 and recorded.packed[9:] == [
        sum(map(bool, sizes_)) + before for sizes_, before in zip(recorded.sizes[8:11], recorded.packed[8:11])
    ]
    assert recorded.packed[-1] > 0
    signal = [int((batch["advantages"] != 0).sum()) for batch in trained]
    assert regrouped[4:] == [[4, 4]] * 4  # the run without the skip: as TRL splits them
    for sizes_, n in zip(regrouped[:4], signal):  # the rows with signal (at least one), the step's last one trained
        assert sum(sizes_) == max(n, 1) and sizes_[-1] > 0 and (sizes_[0] == 0 or n > 4)
    assert any(0 < n <= 4 for n in signal)  # the comparison covers a step with a micro-batch left out
    for logged, n in zip([e["frac_rows_skipped"] for e in on_logs], signal):
        assert logged == pytest.approx(1 - max(n, 1) / 8)
    assert not any("frac_rows_skipped" in e for e in off_logs)
    assert [e["micro_batches_run"] for e in on_logs] == [sum(map(bool, s)) for s in regrouped[:4]]
    assert f"skipped {on_logs[0]['frac_rows_skipped']:.2f}" in metrics_line(1, 4, on_logs[0])
    # the run's report has the share as a column, where it was logged
    for column in ("| skipped |", "| micro-batches |"):
        assert column in (on / "report.md").read_text() and column not in (off / "report.md").read_text()


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
