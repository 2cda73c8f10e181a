"""The reasoning_gym task and its rewards: generated rows, their JSONL round trip, scoring through reasoning-gym's own
scorers, the recipe check, `grpo data reasoning_gym`, `grpo rewards` and `grpo eval`."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("reasoning_gym")

from test_tasks import is_correct

from grpo_cli.arguments import TaskArguments
from grpo_cli.cli import app
from grpo_cli.errors import UserError
from grpo_cli.rewards import build_reward_funcs
from grpo_cli.rewards.reasoning_gym import (
    reasoning_gym_accuracy,
    reasoning_gym_format,
    reasoning_gym_score,
)
from grpo_cli.rewards.scoring import reward_setup, run_reward_test, score_file
from grpo_cli.tasks import get_task, load_task_dataset, task_problems
from grpo_cli.tasks.reasoning_gym import (
    from_json,
    generate_rows,
    name_problem,
    score,
    to_json,
    write_generated,
)

PREFILL = "Let me solve this step by step.\n<think>"


def args(**keys) -> TaskArguments:
    return TaskArguments(task="reasoning_gym", **keys)


def prompt_with_prefill() -> list[dict]:
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": PREFILL}]


def rewards_of(func, rows: list[dict], completions: list[str]) -> list[float]:
    """A reward's values, called as TRL calls it: the prompts, the completions, the rows' columns."""
    columns = {key: [row[key] for row in rows] for key in rows[0]}
    prompts = [prompt_with_prefill()] * len(rows)
    return func(prompts=prompts, completions=completions, prefill=[PREFILL] * len(rows), **columns)


# --- generation --------------------------------------------------------------------------------------------------


def test_generated_rows_are_reasoning_gyms_items_and_reproducible_by_seed():
    import reasoning_gym

    rows = generate_rows("chain_sum", 6, seed=3, config={"max_terms": 3})
    assert rows == generate_rows("chain_sum", 6, seed=3, config={"max_terms": 3})
    assert [r["question"] for r in rows] != [r["question"] for r in generate_rows("chain_sum", 6, seed=4)]
    items = reasoning_gym.create_dataset("chain_sum", size=6, seed=3, max_terms=3)
    assert [r["question"] for r in rows] == [items[i]["question"] for i in range(6)]
    assert {r["source_dataset"] for r in rows} == {"chain_sum"}
    assert {r["source_config"] for r in rows} == {'{"max_terms": 3}'}
    assert all(json.loads(json.dumps(row)) == row for row in rows)  # plain JSON, nothing else


def test_metadata_keeps_tuples_and_keys_that_plain_json_would_change():
    metadata = {
        "grid": ((1, 2), (3, 4)), "colors": {0: "red", 1: ["a", (5,)]}, "trap": {"__tuple__": [1]},
        "share": Fraction(3, 7),  # gsm_symbolic's metadata holds fractions
    }  # fmt: skip
    assert from_json(to_json(metadata)) == metadata
    assert json.loads(to_json({"plain": [1, 2]})) == {"plain": [1, 2]}


@pytest.mark.parametrize("name", ["gsm_symbolic", "basic_arithmetic", "rearc", "graph_color"])
def test_rows_round_trip_through_jsonl_and_still_score(name, tmp_path):
    """rearc compares tuple grids and graph_color keys its colouring by number: as plain JSON their rows would score
    a right answer 0.05, or not at all."""
    path = tmp_path / f"{name}.jsonl"
    written = write_generated(str(path), name, 3, seed=5)
    loaded = load_task_dataset(args(dataset_name=str(path)), "train")
    assert len(loaded) == 3
    for before, row in zip(written, loaded, strict=True):
        assert {key: row[key] for key in before} == before
        if row["answer"] is not None:
            assert score(row["answer"], row) == 1.0
            assert is_correct(get_task("reasoning_gym"), f"{PREFILL} ok</think>\n<answer>{row['answer']}</answer>", row)
    with pytest.raises(UserError, match="already exists"):
        write_generated(str(path), name, 3, seed=5)


def test_graph_color_scores_a_colouring_from_the_reloaded_row(tmp_path):
    (row,) = generate_rows("graph_color", 1, seed=2)
    metadata = from_json(row["metadata"])
    colors = metadata["possible_answer"]
    assert all(isinstance(vertex, int) for vertex in colors)  # JSON alone would make these keys strings
    assert score(json.dumps(colors), row) == 1.0


# --- rewards -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gsm_symbolic", "basic_arithmetic", "chain_sum"])
def test_accuracy_is_one_for_the_tagged_answer_and_zero_otherwise(name):
    rows = generate_rows(name, 2, seed=7)
    for row in rows:
        gold = row["answer"]
        wrong = str(int(float(gold)) + 1)
        completions = [
            f" {gold} it is.</think>\n<answer>{gold}</answer>",  # right
            f" close.</think>\n<answer> {gold} </answer>",  # right, spaced
            f" off by one.</think>\n<answer>{wrong}</answer>",  # wrong
            f" The answer is {gold}.",  # no tags
            "<answer></answer> ]]>< garbage \x00 </think>",  # garbage
            "",
        ]
        values = rewards_of(reasoning_gym_accuracy, [row] * len(completions), completions)
        assert values == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0], (name, row["question"])
        assert rewards_of(reasoning_gym_format, [row] * 2, completions[:1] + completions[3:4]) == [1.0, 0.0]


def test_the_score_reward_passes_reasoning_gyms_partial_credit_on():
    (gsm,) = generate_rows("gsm_symbolic", 1, seed=7)
    wrong = f" x</think>\n<answer>{float(gsm['answer']) + 1:g}</answer>"
    assert rewards_of(reasoning_gym_score, [gsm], [wrong]) == [0.01]  # its credit for a number at all
    (arithmetic,) = generate_rows("basic_arithmetic", 1, seed=7)
    padded = f" x</think>\n<answer>{arithmetic['answer']}0</answer>"  # wrong, holds the gold text
    (partial,) = rewards_of(reasoning_gym_score, [arithmetic], [padded])
    assert 0 < partial < 1 and rewards_of(reasoning_gym_accuracy, [arithmetic], [padded]) == [0.0]


def test_a_scorer_that_raises_scores_the_failure_value_and_the_run_goes_on():
    (row,) = generate_rows("gsm_symbolic", 1, seed=1)
    broken = {**row, "source_dataset": "no_such_dataset"}
    (guard,) = build_reward_funcs(["reasoning_gym_accuracy"], 2.0)
    try:
        assert guard.process is not None  # another library's scorer: a process of its own
        values = rewards_of(guard, [row, broken], [f" ok</think>\n<answer>{row['answer']}</answer>"] * 2)
    finally:
        guard.close()
    assert values == [1.0, 0.0] and guard.failures == 1


# --- refusals and the recipe check -------------------------------------------------------------------------------


def test_datasets_whose_scorer_evaluates_text_are_refused():
    assert name_problem("gsm_symbolic") is None
    assert "eval()" in name_problem("n_queens")
    countdown = name_problem("countdown")
    assert "parse_expr()" in countdown and "task: countdown" in countdown
    assert "did you mean 'gsm_symbolic'" in name_problem("gsm_symbolc")
    with pytest.raises(UserError, match="not supported"):
        generate_rows("spiral_matrix", 2, seed=0)


def test_task_problems_name_the_key():
    def problems(**keys):
        return [(p.key, p.message) for p in task_problems(args(**keys))]

    assert problems(dataset_generate=5, dataset_generate_name="gsm_symbolic") == []
    assert [key for key, _ in problems(dataset_name="missing.jsonl")] == ["dataset_name"]  # not found, nothing else
    ((key, message),) = problems()
    assert key == "dataset_generate" and "no dataset of its own" in message
    ((key, message),) = problems(dataset_generate=5)
    assert key == "dataset_generate_name"
    ((key, message),) = problems(dataset_generate=5, dataset_generate_name="chain_sum",
                                 dataset_generate_config={"min_terms": "two"})  # fmt: skip
    assert key == "dataset_generate_config" and "'min_terms' of 'chain_sum' must be int" in message
    ((key, message),) = problems(dataset_generate=5, dataset_generate_name="chain_sum", dataset_generate_config={"seed": 1})
    assert key == "dataset_generate_config" and "set dataset_seed" in message
    (other,) = task_problems(TaskArguments(task="countdown", dataset_generate_name="x"))
    assert other.key == "dataset_generate_name"
    assert other.message == (
        "dataset_generate_name is read by tasks dapo_math, gsm8k and reasoning_gym only, and the task is countdown - "
        "drop it"
    )


# --- reasoning-gym as the data of the gsm8k and dapo_math tasks ---------------------------------------------------


def test_gsm8k_generates_gsm_symbolic_rows_with_their_worked_solutions():
    task = get_task("gsm8k")
    keys = {"task": "gsm8k", "dataset_generate": 40, "dataset_seed": 1}
    rows = load_task_dataset(TaskArguments(**keys), "train")
    assert len(rows) == 40 and rows[0]["prompt"][0]["content"] == task.default_system_prompt
    assert all(row["answer"].count("####") == 1 for row in rows)
    for row in rows:  # the worked solution is a cold start's completion; the rewards' verdicts agree with the gold
        completion = task.sft_completion(row)
        assert completion is not None and is_correct(task, completion, row) and task.is_formatted(completion)
        assert not is_correct(task, task.malformed_completions(row)[0], row)
    assert [r["question"] for r in rows] == [r["question"] for r in load_task_dataset(TaskArguments(**keys), "train")]


def test_gsm8k_refuses_a_dataset_whose_answers_are_not_whole_numbers():
    keys = {"task": "gsm8k", "dataset_generate": 20, "dataset_generate_name": "coin_flip"}
    assert task_problems(TaskArguments(**keys)) == []  # known dataset: the answers show only when generated
    with pytest.raises(UserError, match="coin_flip' answers 18 of 20 rows with other than a whole number .e.g. '0.3125'"):
        load_task_dataset(TaskArguments(**keys), "train")


def test_dapo_math_generates_exact_fractions_that_its_answer_reward_compares():
    from grpo_cli.rewards.dapo_math import dapo_answer
    from grpo_cli.tasks.dapo_math import REASONING_END, SOLUTION_END, SOLUTION_START

    keys = {"task": "dapo_math", "dataset_generate": 60, "dataset_generate_name": "coin_flip", "dataset_seed": 2,
            "dataset_generate_config": {"max_trials": 6}}
    rows = list(load_task_dataset(TaskArguments(**keys), "train"))
    for row in rows:  # the exact probability, counted here, where reasoning-gym's answer is a rounded decimal
        kind, k, n = re.fullmatch(r"What is the probability of getting (exactly|at least) (\d+) heads in (\d+) fair coin "
                                  r"flips\?", row["problem"]).groups()  # fmt: skip
        ways = sum(math.comb(int(n), h) for h in range(int(k), int(n) + 1 if kind == "at least" else int(k) + 1))
        exact = Fraction(ways, 2 ** int(n))
        assert row["solution"] == (str(exact) if exact.denominator == 1 else f"\\frac{{{exact.numerator}}}{{{exact.denominator}}}")
    row = next(row for row in rows if row["solution"].startswith("\\frac"))
    value = Fraction(*map(int, re.findall(r"\d+", row["solution"])))

    def reward(answer: str) -> float:
        text = f"Count the outcomes.{REASONING_END}{SOLUTION_START}{answer}{SOLUTION_END}"
        prompt = [{"role": "user", "content": row["problem"]}, {"role": "assistant", "content": "<start_working_out>"}]
        return dapo_answer(prompts=[prompt], completions=[[{"role": "assistant", "content": text}]],
                           solution=[row["solution"]])[0]  # fmt: skip

    as_decimal = str(value.numerator / value.denominator)  # exact: the denominator is a power of two
    assert reward(row["solution"]) == reward(as_decimal) == reward(str(value)) > reward(str(value + 1))
    ((key, message),) = [(p.key, p.message) for p in task_problems(TaskArguments(task="dapo_math", dataset_generate=5))]
    assert key == "dataset_generate_name" and "e.g. coin_flip" in message


def check(tmp_path: Path, recipe: str, *before: str) -> subprocess.CompletedProcess:
    path = tmp_path / "recipe.yaml"
    path.write_text(textwrap.dedent(recipe).lstrip())
    code = ["-c", "\n".join([*before, "from grpo_cli.cli import main", "main()"])] if before else ["-m", "grpo_cli"]
    return subprocess.run(
        [sys.executable, *code, "check", "-c", str(path)], capture_output=True, text=True, check=False, cwd=tmp_path
    )


RECIPE = """
    model_name_or_path: m
    task: reasoning_gym
    dataset_generate: 100
    dataset_generate_name: {name}
    dataset_generate_config: {config}
"""


def test_check_names_an_unknown_dataset_and_a_bad_config_key_with_exit_2(tmp_path):
    unknown = check(tmp_path, RECIPE.format(name="gsm_symbolc", config="{}"))
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    assert "recipe.yaml:4: dataset_generate_name: unknown reasoning-gym dataset 'gsm_symbolc'" in unknown.stderr
    assert "did you mean 'gsm_symbolic'" in unknown.stderr
    bad = check(tmp_path, RECIPE.format(name="chain_sum", config="{max_term: 3}"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "recipe.yaml:5: dataset_generate_config: 'chain_sum' has no config key 'max_term'" in bad.stderr
    assert "did you mean 'max_terms'" in bad.stderr


def test_check_without_the_package_says_how_to_install_it(tmp_path):
    run = check(tmp_path, RECIPE.format(name="gsm_symbolic", config="{}"), "import sys",
                "sys.modules['reasoning_gym'] = None")  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "reasoning-gym package, which is not installed - pip install 'grpo-cli[gym]'" in run.stderr


# --- commands ----------------------------------------------------------------------------------------------------


def test_grpo_data_writes_the_rows_and_lists_the_datasets(tmp_path):
    out = tmp_path / "sums.jsonl"
    command = ["data", "reasoning_gym", "chain_sum", "-n", "4", "--seed", "2", "--config", "max_terms=3", "-o", str(out)]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == generate_rows("chain_sum", 4, seed=2, config={"max_terms": 3})
    listed = CliRunner().invoke(app, ["data", "reasoning_gym"], env={"COLUMNS": "200"})
    assert "gsm_symbolic" in listed.output and "not supported" in listed.output


def test_rewards_test_and_score_on_generated_rows(tmp_path):
    setup = reward_setup(args(dataset_generate=3, dataset_generate_name="gsm_symbolic"), timeout=2.0)
    report = run_reward_test(setup, num_rows=3)
    assert report.problems == [] and len(report.cases) == 3 * 6
    rows = generate_rows("gsm_symbolic", 2, seed=0)
    lines = [{**rows[0], "completion": f" ok</think>\n<answer>{rows[0]['answer']}</answer>"},
             {**rows[1], "completion": " no idea</think>\n<answer>-1</answer>"}]  # fmt: skip
    path = tmp_path / "completions.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    scored = score_file(setup, path, tmp_path / "scored.jsonl")["lines"]
    assert [(s["reasoning_gym_format"], s["reasoning_gym_accuracy"]) for s in scored] == [(1.0, 1.0), (1.0, 0.0)]


def test_eval_scores_the_task(tmp_path, tiny_model_dir):
    """A random tiny model writes a few tokens after a prefill that already holds the first row's answer."""
    from grpo_cli.eval import run_eval

    rows = generate_rows("gsm_symbolic", 3, seed=0)
    assert len({r["answer"] for r in rows}) == 3
    recipe = tmp_path / "recipe.yaml"
    prefill = f"<think>sum</think>\n<answer>{rows[0]['answer']}</answer>"
    recipe.write_text(
        f"model_name_or_path: {tiny_model_dir}\ndtype: float32\ntask: reasoning_gym\ndataset_generate: 3\n"
        f"dataset_generate_name: gsm_symbolic\ndataset_test_split: train\nprefill: {json.dumps(prefill)}\n"
        f"max_completion_length: 2\noutput_dir: {tmp_path / 'run'}\n"
    )
    run_eval(str(recipe), models=[str(tiny_model_dir)], output=str(tmp_path / "ev"))
    samples = [json.loads(line) for line in (tmp_path / "ev" / "samples.jsonl").read_text().splitlines()]
    assert [(s["index"], s["correct"]) for s in samples] == [(0, True), (1, False), (2, False)]
    assert [s["rewards"]["reasoning_gym_accuracy"] for s in samples] == [1.0, 0.0, 0.0]


def test_grpo_data_recipe_writes_the_generated_rows_a_recipe_then_trains_on_with_the_same_split(tmp_path):
    out = tmp_path / "gsm.jsonl"
    keys = ["--dataset_generate", "30", "--dataset_test_size", "5", "--dataset_seed", "3"]
    result = CliRunner().invoke(app, ["data", "recipe", "-c", "gsm8k", "-o", str(out), *keys])
    assert result.exit_code == 0, result.output
    assert "wrote 30 rows" in result.output and "gsm_symbolic" in result.output
    generated = TaskArguments(task="gsm8k", dataset_generate=30, dataset_test_size=5, dataset_seed=3)
    loaded = TaskArguments(task="gsm8k", dataset_name=str(out), dataset_test_size=5, dataset_seed=3)
    for split in ("train", "test"):
        assert list(load_task_dataset(generated, split)) == list(load_task_dataset(loaded, split))
    def grpo(*command):
        return subprocess.run([sys.executable, "-m", "grpo_cli", *command], capture_output=True, text=True, check=False)

    again = grpo("data", "recipe", "-c", "gsm8k", "-o", str(out), *keys)
    assert again.returncode == 2 and "pass --force to replace it" in again.stderr and "Traceback" not in again.stderr
    nothing = grpo("data", "recipe", "-c", "gsm8k", "-o", str(tmp_path / "x.jsonl"))
    assert nothing.returncode == 2 and "generates none - set dataset_generate: N" in nothing.stderr
    assert not (tmp_path / "x.jsonl").exists()
