"""Dynamic sampling (`dynamic_sampling: true`): real GRPO steps on the tiny model, with rewards that make some groups
score all their completions alike."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from test_train import tiny_run_keys

from grpo_cli.errors import UserError
from grpo_cli.recipe import check_recipe, load_recipe
from grpo_cli.train.progress import metrics_line

pytestmark = pytest.mark.slow

REWARDS = """
def texts(completions):
    return [c[-1]["content"] if isinstance(c, list) else c for c in completions]


def by_target(completions, target, **kwargs):
    # Every completion of an even target scores 1.0 (a flat group); odd targets score by length.
    return [1.0 if int(t) % 2 == 0 else float(len(x)) for t, x in zip(target, texts(completions))]


def never_flat(completions, **kwargs):
    return [len(x) + i / 1000 for i, x in enumerate(texts(completions))]


def always_flat(completions, **kwargs):
    return [1.0 for _ in completions]
"""


def recipe(
    tmp_path: Path, model: Path, reward: str, extra: str = "", name: str = "run", steps: int = 3, batch: int = 8
) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "ds_rewards.py").write_text(REWARDS)
    path = tmp_path / f"{name}.yaml"
    path.write_text(tiny_run_keys(model, tmp_path / name, max_steps=steps, save_steps=100, batch=batch) + textwrap.dedent(f"""
        reward_funcs: ["{tmp_path / 'ds_rewards.py'}:{reward}"]
        num_generations: 4
        max_completion_length: 8
        temperature: 1.0
        beta: 0.0
    """) + textwrap.dedent(extra))
    return path


def train(path: Path, monkeypatch) -> tuple[Path, list[dict]]:
    """Run `grpo rl` on the recipe; returns its folder and the batch each generation trained on."""
    from grpo_cli.train import rl

    trained: list[dict] = []

    class Recording(rl.RLTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            if self.model.training:
                trained.append({k: v.detach().cpu() if hasattr(v, "detach") else v for k, v in output.items()})
            return output

    monkeypatch.setattr(rl, "RLTrainer", Recording)
    return rl.run_rl(load_recipe(str(path), [], "rl")), trained


def history(out: Path) -> list[dict]:
    return [e for e in json.loads((out / "train_summary.json").read_text())["log_history"] if "loss" in e]


def numbers(out: Path) -> list[tuple]:
    """What each step trained to: its loss, gradient norm and reward."""
    return [(e["loss"], e["grad_norm"], e["reward"]) for e in history(out)]


def target_of(tokenizer, prompt_ids, prompt_mask) -> int:
    text = tokenizer.decode(prompt_ids[prompt_mask.bool()])
    return int(re.search(r"equals (\d+)", text).group(1))


def test_trained_groups_all_carry_signal_and_the_run_is_reproducible(tmp_path, tiny_model_dir, monkeypatch):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    path = recipe(tmp_path, tiny_model_dir, "by_target", "dynamic_sampling: true\n", steps=2)
    out, trained = train(path, monkeypatch)
    logs = history(out)
    assert json.loads((out / "train_summary.json").read_text())["global_step"] == 2 == len(trained) == len(logs)
    for batch in trained:
        assert batch["prompt_ids"].shape[0] == batch["completion_ids"].shape[0] == batch["advantages"].shape[0] == 8
        # every group of 4 has completions told apart, and comes from a prompt with an odd target
        assert (batch["advantages"].view(-1, 4).abs().amax(dim=1) > 1e-3).all()
        targets = [target_of(tokenizer, i, m) for i, m in zip(batch["prompt_ids"], batch["prompt_mask"])]
        assert all(t % 2 for t in targets), targets
        assert int(batch["num_items_in_batch"]) == int(batch["completion_mask"].sum())
        # padded to the longest kept row: prompts on the left, completions on the right
        assert batch["prompt_mask"][:, 0].any() and batch["completion_mask"][:, -1].any()
        assert (batch["prompt_mask"].cummax(dim=1).values == batch["prompt_mask"]).all()
        assert (batch["completion_mask"].flip(1).cummax(dim=1).values.flip(1) == batch["completion_mask"]).all()
    dropped = [e["dynamic_sampling/dropped_share"] for e in logs]
    rounds = [e["dynamic_sampling/rounds"] for e in logs]
    assert max(dropped) > 0 and all(0 <= share < 1 for share in dropped)
    assert sum(rounds) >= 1 and all(e["dynamic_sampling/filled_share"] == 0 for e in logs)
    # every scored batch is in the rollouts file, the refill rounds' too
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 8 * (2 + int(sum(rounds)))

    again, retrained = train(recipe(tmp_path, tiny_model_dir, "by_target", "dynamic_sampling: true\n", "again", 2),
                             monkeypatch)
    assert numbers(again) == numbers(out)
    assert all(a["completion_ids"].equal(b["completion_ids"]) for a, b in zip(trained, retrained))
    assert (again / "rollouts.jsonl").read_text() == (out / "rollouts.jsonl").read_text()


def test_with_no_flat_group_or_switched_off_the_steps_are_grpos_own(tmp_path, tiny_model_dir, monkeypatch):
    off, _ = train(recipe(tmp_path, tiny_model_dir, "never_flat", name="off", steps=2), monkeypatch)
    on, _ = train(recipe(tmp_path, tiny_model_dir, "never_flat", "dynamic_sampling: true\n", "on", 2), monkeypatch)
    assert numbers(on) == numbers(off)
    assert all(e["dynamic_sampling/dropped_share"] == 0 and e["dynamic_sampling/rounds"] == 0 for e in history(on))
    assert not any(key.startswith("dynamic_sampling/") for e in history(off) for key in e)


def test_a_batch_still_short_is_filled_and_said_once(tmp_path, tiny_model_dir, monkeypatch, capsys):
    extra = "dynamic_sampling: true\ndynamic_sampling_max_rounds: 1\n"
    path = recipe(tmp_path, tiny_model_dir, "always_flat", extra, steps=2)
    out, trained = train(path, monkeypatch)
    logs = history(out)
    assert len(logs) == len(trained) == 2 and all(batch["advantages"].shape[0] == 8 for batch in trained)
    assert all(e["dynamic_sampling/rounds"] == 1 and e["dynamic_sampling/filled_share"] == 1 for e in logs)
    assert all(e["dynamic_sampling/dropped_share"] == 1 for e in logs)
    assert capsys.readouterr().err.count("dynamic sampling: after 1 extra generation round,") == 1


def test_the_check_names_bad_dynamic_sampling_values(tmp_path):
    base = ["--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct", "--output_dir", str(tmp_path / "out"),
            "--dynamic_sampling", "true"]
    with pytest.raises(UserError, match=r"`dynamic_sampling_max_rounds` is 0: it must be a whole number of at least 1"):
        check_recipe(load_recipe(None, [*base, "--dynamic_sampling_max_rounds", "0"], "rl"))
    with pytest.raises(UserError, match=r"`num_generations` must be at least 2"):
        check_recipe(load_recipe(None, [*base, "--num_generations", "1"], "rl"))
    split = [*base, "--per_device_train_batch_size", "2", "--num_generations", "4"]
    with pytest.raises(UserError, match=r"each of the 2 processes holds 2 completions.*per_device_train_batch_size x "
                                        r"gradient_accumulation_steps a multiple of 4, or set `dynamic_sampling: false`"):
        check_recipe(load_recipe(None, split, "rl"), num_processes=2)
    check_recipe(load_recipe(None, [*base[:-2], "--per_device_train_batch_size", "2", "--num_generations", "4"], "rl"),
                 num_processes=2)  # without dynamic sampling a group may span two processes
    assert metrics_line(
        1, 2, {"reward": 1.0, "completions/clipped_ratio": 1.0, "dynamic_sampling/dropped_share": 0.25, "loss": 0.5}
    ) == "step 1/2 | reward 1.00 | clip 1.00 | dropped 0.25 | loss 0.5"
    plan = check_recipe(load_recipe(None, base, "rl"))
    rows = dict(plan.rows)
    assert rows["dynamic sampling"].endswith("refilled from fresh prompts, up to 3 extra generation rounds per batch")
