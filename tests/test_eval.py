"""`grpo eval`: pass@k and the summary on literal samples, scoring with real rewards, and runs on tiny models."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from grpo_cli.errors import UserError
from grpo_cli.eval import ModelSpec, model_specs, pass_at_k, run_eval, score_completions, summarize

# The prefill holds a complete, well-formatted answer "3 * 5 + 7" (= 22): right for rows 0 and 2, wrong for row 1.
ROWS = [
    {"nums": [3, 5, 7], "target": 22},
    {"nums": [3, 5, 7], "target": 26},
    {"nums": [7, 3, 5], "target": 22},
]
PREFILL = "<think>easy</think>\n<answer>3 * 5 + 7</answer>"

# ------------------------------------------------------------------------------------------- pass@k, summary


def test_pass_at_k_on_literal_numbers():
    assert pass_at_k(5, 0, 1) == 0.0
    assert pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))  # 0.91666...
    assert pass_at_k(4, 1, 4) == 1.0  # n - c < k: every draw of k holds the correct one
    assert pass_at_k(1, 1, 1) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def _sample(index, sample, correct, formatted, fmt, eq, tokens):
    return {
        "index": index,
        "sample": sample,
        "correct": correct,
        "formatted": formatted,
        "rewards": {"format": fmt, "equation": eq},
        "completion_tokens": tokens,
    }


def test_summary_of_literal_samples():
    samples = [
        # prompt 0: first completion wrong, 1 of 3 correct
        _sample(0, 1, True, True, 1.0, 1.0, 10),
        _sample(0, 0, False, True, 1.0, 0.0, 20),
        _sample(0, 2, False, False, 0.0, None, 30),
        # prompt 5: first completion correct, 2 of 3 correct
        _sample(5, 0, True, True, 1.0, 1.0, 40),
        _sample(5, 1, True, False, 0.0, 1.0, 50),
        _sample(5, 2, False, False, 0.0, 0.0, 60),
    ]
    summary = summarize("m", samples, 3, skipped_prompts=2, reward_weights={"format": 0.5, "equation": 1.0})
    assert summary["model"] == "m"
    assert summary["accuracy"] == 0.5  # first completions: wrong, right
    assert summary["format_rate"] == pytest.approx(3 / 6)
    assert summary["pass_at_k"]["1"] == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert summary["pass_at_k"]["3"] == 1.0
    assert set(summary["pass_at_k"]) == {"1", "3"}
    assert summary["rewards"]["format"] == pytest.approx(3 / 6)
    assert summary["rewards"]["equation"] == pytest.approx(3 / 5)  # None left out
    # per completion: 1.5, 0.5, 0, 1.5, 1, 0 -> 4.5 / 6
    assert summary["reward_total"] == pytest.approx(4.5 / 6)
    assert summary["mean_completion_length"] == 35.0
    assert (summary["num_prompts"], summary["num_completions"], summary["skipped_prompts"]) == (2, 6, 2)


def test_score_completions_with_the_task_and_its_rewards():
    from grpo_cli.rewards import build_reward_funcs
    from grpo_cli.tasks import get_task

    task = get_task("countdown")
    row = {**ROWS[0], "prompt": task.prompt(ROWS[0])}  # default prefill "...step by step.\n<think>"
    completions = [
        " 3 * 5 = 15, 15 + 7 = 22</think>\n<answer>3 * 5 + 7</answer>",  # right and formatted
        " guess</think>\n<answer>3 + 5 + 7</answer>",  # formatted, wrong
        " 3 * 5 + 7</think> so <answer>3 * 5 + 7</answer> done",  # right, text after the answer
    ]
    funcs = build_reward_funcs(["countdown_format", "countdown_equation"], 2.0)
    scored = score_completions(task, funcs, [row] * 3, completions)
    assert [s["correct"] for s in scored] == [True, False, True]
    assert [s["formatted"] for s in scored] == [True, True, False]
    assert [s["rewards"] for s in scored] == [
        {"countdown_format": 1.0, "countdown_equation": 1.0},
        {"countdown_format": 1.0, "countdown_equation": 0.0},
        {"countdown_format": 0.0, "countdown_equation": 1.0},
    ]
    # a recipe without the accuracy reward: correct is still the task's accuracy reward at its top, scored apart
    without = score_completions(task, funcs[:1], [row] * 3, completions)
    assert [s["correct"] for s in without] == [True, False, True]
    assert [s["rewards"] for s in without] == [{"countdown_format": v} for v in (1.0, 1.0, 0.0)]


def test_eval_scores_length_rewards_from_the_completions_token_counts():
    from grpo_cli.rewards import build_reward_funcs
    from grpo_cli.tasks import get_task

    task = get_task("countdown")
    row = {**ROWS[0], "prompt": task.prompt(ROWS[0])}
    funcs = build_reward_funcs(["overlong_penalty"], 2.0, params={"max_completion_length": 64, "overlong_buffer": 16})
    scored = score_completions(task, funcs, [row] * 3, [" a", " b", " c"], [10, 56, 64])
    assert [s["rewards"]["overlong_penalty"] for s in scored] == [0.0, -0.5, -1.0]
    unscored = score_completions(task, funcs, [row], [" a"])  # no token counts: the reward does not apply
    assert unscored[0]["rewards"]["overlong_penalty"] is None


# ------------------------------------------------------------------------------------------- model specs


def test_model_specs(tiny_model_dir, tiny_adapter_dir):
    assert model_specs([], None, "recipe-model") == [ModelSpec("recipe-model", "recipe-model")]
    base, trained = model_specs([str(tiny_model_dir), str(tiny_adapter_dir)], None, None)
    assert base == ModelSpec(str(tiny_model_dir), str(tiny_model_dir))
    assert trained.adapter == str(tiny_adapter_dir) and trained.model == str(tiny_model_dir)
    (only,) = model_specs(["base-x"], str(tiny_adapter_dir), None)
    assert only.label == f"base-x + {tiny_adapter_dir.name}" and only.model == "base-x"
    run = tiny_model_dir.parent / "full-run"
    if not run.exists():
        shutil.copytree(tiny_model_dir, run / "checkpoint-3")
    (full,) = model_specs([str(run)], None, None)
    assert full == ModelSpec("full-run/checkpoint-3 (latest checkpoint, step 3)", str(run / "checkpoint-3"))
    # checkpoint-3 of two LoRA runs both called "run": each label says which folder it is
    twins = [tiny_adapter_dir.parent / side / "run" / "checkpoint-3" for side in ("a", "b")]
    for twin in twins:
        if not twin.exists():
            shutil.copytree(tiny_adapter_dir, twin)
    labels = [spec.label for spec in model_specs([str(t) for t in twins], None, None)]
    assert labels == [f"run/checkpoint-3 ({t})" for t in twins]
    with pytest.raises(UserError, match="--adapter goes with one --model"):
        model_specs(["a", "b"], str(tiny_adapter_dir), None)
    with pytest.raises(UserError, match="no model to evaluate"):
        model_specs([], None, None)


# ------------------------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def silent_model_dir(tmp_path_factory, tiny_model_dir) -> Path:
    """The tiny model with its final norm zeroed: all logits equal, so greedy decoding emits token 0
    (<|endoftext|>, a special token) every step and the decoded completion is empty."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.model.norm.weight.zero_()
    out = tmp_path_factory.mktemp("silent_model")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


@pytest.fixture
def recipe(tmp_path, tiny_model_dir) -> Path:
    rows = tmp_path / "countdown.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    path = tmp_path / "recipe.yaml"
    path.write_text(
        f"model_name_or_path: {tiny_model_dir}\n"
        "dtype: float32\n"
        "task: countdown\n"
        f"dataset_name: {rows}\n"
        "dataset_test_split: train\n"
        f"prefill: {json.dumps(PREFILL)}\n"
        "max_completion_length: 4\n"
        "seed: 3\n"
        f"output_dir: {tmp_path / 'run'}\n"
    )
    return path


def _read(out: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((out / "summary.json").read_text())
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return summary, samples


def test_eval_writes_summary_and_samples_with_hand_computed_metrics(recipe, silent_model_dir, tmp_path):
    run_eval(str(recipe), models=[str(silent_model_dir)], output=str(tmp_path / "ev"))
    summary, samples = _read(tmp_path / "ev")
    (model,) = summary["models"]
    assert model == {
        "model": str(silent_model_dir),
        "accuracy": pytest.approx(2 / 3),
        "format_rate": 1.0,
        "pass_at_k": {"1": pytest.approx(2 / 3)},
        "rewards": {"countdown_format": 1.0, "countdown_equation": pytest.approx(2 / 3)},
        "reward_total": pytest.approx(5 / 3),
        "mean_completion_length": 4.0,  # never an end-of-sequence token: max_completion_length tokens each
        "num_prompts": 3,
        "num_completions": 3,
        "skipped_prompts": 0,
        "engine": "transformers generate",  # the CPU; on a GPU grpo's static-cache sampler
    }
    assert summary["settings"]["decoding"] == "greedy" and summary["settings"]["split"] == "train"
    assert [(s["index"], s["sample"], s["correct"], s["completion"]) for s in samples] == [
        (0, 0, True, ""),
        (1, 0, False, ""),
        (2, 0, True, ""),
    ]
    assert samples[1]["rewards"] == {"countdown_format": 1.0, "countdown_equation": 0.0}
    assert samples[0]["prompt"].endswith("<|im_start|>assistant\n" + PREFILL)

    run_eval(str(recipe), models=[str(silent_model_dir)], limit=2, output=str(tmp_path / "ev2"))
    (model,) = _read(tmp_path / "ev2")[0]["models"]
    assert (model["num_prompts"], model["accuracy"]) == (2, 0.5)


def test_eval_compares_models_with_sampling_deterministically(
    recipe, tiny_model_dir, tiny_adapter_dir, tmp_path
):
    models = [str(tiny_model_dir), str(tiny_adapter_dir)]
    first = run_eval(str(recipe), models=models, num_generations=3, batch_size=2, output=str(tmp_path / "a"))
    summary, samples = _read(tmp_path / "a")
    assert summary == json.loads(json.dumps(first))
    assert [m["model"] for m in summary["models"]] == [str(tiny_model_dir), tiny_adapter_dir.name]
    for model in summary["models"]:
        mine = [s for s in samples if s["model"] == model["model"]]
        assert (model["num_prompts"], model["num_completions"], len(mine)) == (3, 9, 9)
        assert set(model["pass_at_k"]) == {"1", "3"}
        firsts = [s["correct"] for s in mine if s["sample"] == 0]
        assert model["accuracy"] == pytest.approx(sum(firsts) / 3)
        assert model["format_rate"] == pytest.approx(sum(s["formatted"] for s in mine) / 9)
    # Sampling: random tokens after the prefill; the untouched prefill answer decides correctness.
    assert summary["models"][0]["pass_at_k"]["3"] == pytest.approx(2 / 3)
    run_eval(str(recipe), models=models, num_generations=3, batch_size=2, output=str(tmp_path / "b"))
    assert (tmp_path / "a" / "samples.jsonl").read_text() == (tmp_path / "b" / "samples.jsonl").read_text()


def test_long_prompts_are_skipped_and_counted(recipe, silent_model_dir, tmp_path):
    rows = [*ROWS, {"nums": list(range(1, 600)), "target": 5}]  # ~1800 tokens: more than the 1024 context
    long_rows = tmp_path / "long.jsonl"
    long_rows.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_eval(
        str(recipe),
        [f"--dataset_name={long_rows}"],
        models=[str(silent_model_dir)],
        max_new_tokens=8,
        output=str(tmp_path / "ev"),
    )
    (model,) = result["models"]
    assert (model["num_prompts"], model["skipped_prompts"], model["accuracy"]) == (3, 1, pytest.approx(2 / 3))
    with pytest.raises(UserError, match="exceed the context"):
        run_eval(
            str(recipe), models=[str(silent_model_dir)], max_new_tokens=1020, output=str(tmp_path / "ev2")
        )


def test_bad_split_options_and_empty_data_are_user_errors(recipe, silent_model_dir, tmp_path):
    with pytest.raises(UserError, match="no split 'nope'"):
        run_eval(str(recipe), models=[str(silent_model_dir)], split="nope")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(UserError, match="empty"):
        run_eval(str(recipe), ["--dataset_name", str(empty)], models=[str(silent_model_dir)])
    with pytest.raises(UserError) as err:
        run_eval(str(recipe), limit=0, num_generations=0)
    assert len(err.value.problems) == 2
    assert not (tmp_path / "run").exists()  # nothing written on errors


def test_eval_command_with_recipe_overrides(recipe, silent_model_dir, tiny_adapter_dir, tmp_path):
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    out = tmp_path / "cli"
    args = [
        "eval",
        "-c",
        str(recipe),
        "--model",
        str(silent_model_dir),
        "--model",
        str(tiny_adapter_dir),
        "--limit",
        "2",
        "--output",
        str(out),
        "--max_completion_length",
        "3",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary, samples = _read(out)
    assert [m["num_prompts"] for m in summary["models"]] == [2, 2]
    assert summary["settings"]["max_new_tokens"] == 3
    assert len(samples) == 4


@pytest.mark.gpu
def test_eval_on_gpu_in_bfloat16(recipe, silent_model_dir, tiny_adapter_dir, tmp_path):
    import torch

    torch.cuda.reset_peak_memory_stats()
    result = run_eval(
        str(recipe),
        ["--dtype", "bfloat16"],
        models=[str(silent_model_dir), str(tiny_adapter_dir)],
        num_generations=2,
        output=str(tmp_path / "ev"),
    )
    assert torch.cuda.max_memory_allocated() > 0
    silent, adapted = result["models"]
    assert (silent["accuracy"], silent["num_completions"]) == (pytest.approx(2 / 3), 6)
    assert adapted["num_prompts"] == 3 and set(adapted["pass_at_k"]) == {"1", "2"}
    assert silent["engine"] == adapted["engine"] == "grpo static-cache sampler"  # LoRA layers in place


def test_eval_out_of_memory_is_one_message_with_smaller_batches(
    recipe, tiny_model_dir, tmp_path, monkeypatch
):
    """Running out of GPU memory in generate (raised from the model's forward, where torch raises it)."""
    import torch

    from grpo_cli import models
    from grpo_cli.errors import UserError

    load_model = models.load_model

    def load_then_hook(*args, **kwargs):
        model = load_model(*args, **kwargs)

        def out_of_memory(module, inputs):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.20 GiB.")

        model.register_forward_pre_hook(out_of_memory)
        return model

    monkeypatch.setattr(models, "load_model", load_then_hook)
    with pytest.raises(UserError) as caught:
        run_eval(
            str(recipe),
            models=[str(tiny_model_dir)],
            num_generations=2,
            batch_size=4,
            output=str(tmp_path / "o"),
        )
    [problem] = caught.value.problems
    assert problem.startswith(f"out of GPU memory evaluating {tiny_model_dir} (tried to allocate 1.20 GiB)")
    assert "4 prompts x 2 completions at once, up to 4 tokens each" in problem
    assert "`--batch-size 2`" in problem and "`--max-new-tokens 2`" in problem
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_grpos_sampler_gives_what_generate_gives(tiny_model_dir, silent_model_dir):
    """On a GPU, eval samples with the static-cache sampler that samples training's rollouts; on the CPU it uses
    generate. Both engines, run here on the CPU: the same greedy completions and token counts, K samples per prompt
    in generate's order."""
    from transformers import AutoModelForCausalLM

    from grpo_cli import eval as evaluation
    from grpo_cli.models import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert evaluation.rollout_model(model) is None  # the CPU keeps generate
    prompts = [tokenizer(text)["input_ids"] for text in ("Reach 24 with 3 8 1", "Hi", "Count to ten, slowly")]
    eos = [tokenizer.eos_token_id]
    advanced = []

    def settings(k: int):
        return evaluation.EvalSettings(
            split="test",
            limit=None,
            num_generations=k,
            temperature=1.0,
            top_p=1.0,
            batch_size=None,
            max_new_tokens=9,
            seed=0,
        )

    greedy = settings(1)
    ours = evaluation._sample_static(model, tokenizer, prompts, greedy, 2, eos, advanced.append)
    theirs = evaluation._generate_batches(
        model, model.generation_config, tokenizer, prompts, greedy, 2, eos, print
    )
    assert ours == theirs and advanced == [2, 1]
    assert len({text for [(text, _)] in ours}) > 1  # the prompts lead to different completions
    # Greedy among equal logits takes the first token, as generate does: the silent model's empty completions.
    silent = AutoModelForCausalLM.from_pretrained(silent_model_dir).eval()
    empty = evaluation._sample_static(silent, tokenizer, prompts, greedy, 2, [0], lambda n: None)
    assert empty == [[("", 1)]] * 3
    sampled = evaluation._sample_static(model, tokenizer, prompts, settings(3), 2, eos, lambda n: None)
    assert [len(group) for group in sampled] == [3, 3, 3]
    assert all(1 <= length <= 9 for group in sampled for _, length in group)


def test_eval_samples_as_training_does_not_with_the_models_generation_defaults(
    recipe, tiny_model_dir, tmp_path
):
    """A model's generation_config.json (Qwen2.5-Instruct ships repetition_penalty 1.05, top_k 20) is not applied:
    training samples with the recipe's keys only, and eval must score what training would see."""
    from transformers import GenerationConfig

    plain = tmp_path / "plain"
    shutil.copytree(tiny_model_dir, plain)
    opinionated = tmp_path / "opinionated"
    shutil.copytree(tiny_model_dir, opinionated)
    config = GenerationConfig.from_pretrained(tiny_model_dir)
    config.update(do_sample=True, repetition_penalty=3.0, top_k=1, temperature=0.1, top_p=0.5)
    config.save_pretrained(opinionated)
    recipe.write_text(recipe.read_text().replace("max_completion_length: 4", "max_completion_length: 12"))
    for k in (1, 3):  # greedy, then sampling with the same seed
        run_eval(
            str(recipe),
            models=[str(plain), str(opinionated)],
            num_generations=k,
            output=str(tmp_path / f"e{k}"),
        )
        _, samples = _read(tmp_path / f"e{k}")
        by_model = {}
        for s in samples:
            by_model.setdefault(s["model"], []).append(s["completion"])
        assert by_model[str(plain)] == by_model[str(opinionated)]


def test_a_model_whose_embedding_is_smaller_than_its_tokenizer_is_one_message(recipe, demo_tokenizer_dir, tmp_path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    short = tmp_path / "short"
    config = LlamaConfig(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(short)
    AutoTokenizer.from_pretrained(demo_tokenizer_dir).save_pretrained(short)
    with pytest.raises(UserError, match=r"its embedding has 1000 rows and its tokenizer 49152 tokens"):
        run_eval(str(recipe), models=[str(short)], limit=1, output=str(tmp_path / "ev"))
