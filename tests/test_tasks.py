"""Tasks: prompts and overrides, reference and malformed completions, generated data, dataset loading and splits."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from grpo_cli.arguments import TaskArguments
from grpo_cli.errors import UserError
from grpo_cli.tasks import (
    TASKS,
    chat_template_text,
    completion_text,
    dataset_source,
    for_prefill,
    get_task,
    load_task_dataset,
    prefill_of,
    sft_dataset,
    task_problems,
)
from grpo_cli.tasks.countdown import generate_rows, solve, write_generated
from grpo_cli.tasks.equation import check_equation
from grpo_cli.tasks.gsm8k import gold_answer

DATA = Path(__file__).parent / "data"


def is_correct(task, text: str, row: dict) -> bool:
    """Correct as `grpo eval`, the solved groups and `grpo report` judge it: the task's accuracy reward at its top."""
    from grpo_cli.rewards.scoring import Correctness

    columns = {key: [value] for key, value in row.items() if key != "prompt"}
    return Correctness.of(task.name, []).judge(None, [text], columns, {})[0]


def args(task: str, **keys) -> TaskArguments:
    return TaskArguments(task=task, **keys)


def test_registry_and_did_you_mean():
    assert set(TASKS) >= {"countdown", "gsm8k", "dapo_math"}
    assert get_task("gsm8k").answer_columns == ("answer",)
    with pytest.raises(UserError, match="did you mean 'countdown'"):
        get_task("countdwn")


# --- prompts -----------------------------------------------------------------------------------------------------


def test_countdown_prompt_has_system_user_and_the_r1_zero_prefill():
    task = get_task("countdown")
    messages = task.prompt({"nums": [44, 19, 35], "target": 98}, args("countdown"))
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert "[44, 19, 35]" in messages[1]["content"] and "98" in messages[1]["content"]
    assert "<answer>" in messages[1]["content"] and "exactly once" in messages[1]["content"]
    assert messages[2]["content"] == "Let me solve this step by step.\n<think>"


def test_prompt_overrides_from_the_recipe():
    task = get_task("gsm8k")
    row = {"question": "What is 2 + 2?", "answer": "#### 4", "topic": "sums"}
    plain = task.prompt(row, args("gsm8k", system_prompt="", prefill=""))
    assert plain == [{"role": "user", "content": "What is 2 + 2?"}]
    custom = task.prompt(row, args("gsm8k", system_prompt="Be brief.", prefill="<reasoning>\n"))
    assert (
        custom[0] == {"role": "system", "content": "Be brief."} and custom[-1]["content"] == "<reasoning>\n"
    )
    assert task.user_message(row, args("gsm8k", prompt_column="topic")) == "sums"
    templated = task.user_message(row, args("gsm8k", prompt_template="[{topic}] {question} {{braces}}"))
    assert templated == "[sums] What is 2 + 2? {braces}"
    with pytest.raises(UserError, match="prompt_template"):
        task.user_message(row, args("gsm8k", prompt_template="{missing}"))
    with pytest.raises(UserError, match="prompt_column 'nope'"):
        task.user_message(row, args("gsm8k", prompt_column="nope"))
    # A column that already holds a conversation is used as it is (the prefill still applies).
    chat_row = {**row, "chat": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
    assert task.prompt(chat_row, args("gsm8k", prompt_column="chat", prefill="<reasoning>")) == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "<reasoning>"},
    ]


def test_the_prefill_and_the_completion_text_of_every_shape():
    prompt = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>"}]
    assert prefill_of(prompt) == "<think>"
    assert prefill_of(prompt[:1]) == ""  # no assistant message, no prefill
    assert prefill_of("a plain prompt") == prefill_of(None) == ""
    assert completion_text([{"role": "assistant", "content": "a</think>"}]) == completion_text("a</think>") == "a</think>"
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert completion_text(parts) == "ab"
    assert completion_text(None) == ""


def test_chat_template_text():
    assert "<|im_start|>" in chat_template_text("chatml")
    assert chat_template_text("{{ messages }}") == "{{ messages }}"
    assert chat_template_text(None) is None
    with pytest.raises(UserError, match="not a file"):
        chat_template_text("no/such/template.jinja")


# --- reference and malformed completions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task_name", "row"),
    [
        ("countdown", {"nums": [44, 19, 35], "target": 98}),
        ("countdown", {"nums": [3, 5, 7], "target": 22, "solution": "3 * 5 + 7 = 22"}),
        ("gsm8k", {"question": "q", "answer": "Half of 144 is 144 / 2 = <<144/2=72>>72.\n#### 72"}),
        (
            "dapo_math",
            {
                "problem": "q",
                "generated_solution": "<think>\n1/4 + 1/4\n</think>\nSo 1/2.",
                "expected_answer": "\\frac{1}{2}",
            },
        ),
        ("dapo_math", {"prompt": "q", "solution": "34"}),
    ],
)
def test_reference_completions_are_formatted_and_correct_and_malformed_ones_are_not_both(task_name, row):
    task = get_task(task_name)
    row = task.normalize(row)
    text = task.default_prefill + task.reference_completion(row)
    assert task.is_formatted(text) and is_correct(task, text, row), text
    for malformed in task.malformed_completions(row):
        text = task.default_prefill + malformed
        assert not (task.is_formatted(text) and is_correct(task, text, row)), malformed


def test_countdown_sft_reasoning_shows_the_steps():
    completion = get_task("countdown").sft_completion(
        {"nums": [100, 2, 5], "target": 10, "solution": "100 / (2 * 5)"}
    )
    assert "2 * 5 = 10" in completion and "100 / 10 = 10" in completion
    assert completion.endswith("</think>\n<answer>100 / (2 * 5)</answer>")


def test_gsm8k_gold_and_sft_text():
    assert gold_answer("work\n#### 1,234") == "1234" and gold_answer(72) == "72"
    completion = get_task("gsm8k").sft_completion({"answer": "3 * 4 = <<3*4=12>>12 dollars.\n#### 12"})
    assert completion == "<reasoning>\n3 * 4 = 12 dollars.\n</reasoning>\n<answer>\n12\n</answer>\n"
    assert get_task("gsm8k").sft_completion({"answer": "12"}) is None  # no worked solution


def test_dapo_rows_of_both_styles_normalize_to_problem_and_solution():
    task = get_task("dapo_math")
    assert task.normalize({"prompt": "Find x.", "solution": "3"}) == {
        "prompt": "Find x.",
        "solution": "3",
        "problem": "Find x.",
    }
    openmath = task.normalize({"problem": "Find x.", "generated_solution": "s", "expected_answer": "3"})
    assert openmath["solution"] == "3"
    assert task.sft_completion(openmath) == "s<end_working_out><SOLUTION>3</SOLUTION>"
    assert task.sft_completion({"prompt": "Find x.", "solution": "3"}) is None


def test_for_prefill_rebases_reference_text_onto_another_prefill():
    task = get_task("countdown")
    completion = " steps</think>\n<answer>1 + 2</answer>"
    assert for_prefill(task, completion, task.default_prefill) == completion
    assert for_prefill(task, completion, "") == task.default_prefill + completion
    assert for_prefill(task, completion, "<think>") == completion  # not a prefix: kept as is


# --- countdown data ----------------------------------------------------------------------------------------------


def test_generated_countdown_rows_are_solvable_distinct_and_reproducible():
    rows = generate_rows(300, seed=7)
    assert rows == generate_rows(300, seed=7) and rows != generate_rows(300, seed=8)
    assert len({(tuple(sorted(r["nums"])), r["target"]) for r in rows}) == 300
    for row in rows:
        assert 3 <= len(row["nums"]) <= 4 and 1 <= row["target"] <= 100
        assert all(1 <= n <= 99 for n in row["nums"])
        assert check_equation(row["solution"], row["nums"], row["target"]) is None
    wide = generate_rows(20, seed=1, min_numbers=5, max_numbers=6, max_number=20, max_target=50)
    assert all(5 <= len(r["nums"]) <= 6 and r["target"] <= 50 for r in wide)
    with pytest.raises(UserError):
        generate_rows(0, seed=1)


def test_write_generated_writes_jsonl_atomically(tmp_path):
    out = tmp_path / "sub" / "cd.jsonl"
    rows = write_generated(str(out), 5, seed=2)
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    assert [p.name for p in out.parent.iterdir()] == ["cd.jsonl"]  # no temp file left
    with pytest.raises(UserError, match=".jsonl"):
        write_generated(str(tmp_path / "cd.parquet"), 5, seed=2)


def test_solver_finds_an_equation_using_every_number():
    equation = solve([13, 17, 4, 2], 64)
    assert equation is not None and check_equation(equation, [13, 17, 4, 2], 64) is None
    assert solve([15, 60, 4], 19) is None  # 15 + 4 would leave 60 unused
    assert solve([1, 2, 3, 4, 5], 15) is None  # more numbers than the solver searches


# --- datasets ----------------------------------------------------------------------------------------------------


def test_local_jsonl_gets_a_prompt_column():
    data = load_task_dataset(args("countdown", dataset_name=str(DATA / "countdown.jsonl")), "train")
    assert len(data) == 12 and data[0]["prompt"][-1]["role"] == "assistant"
    assert data[0]["nums"] == [44, 19, 35] and "[44, 19, 35]" in data[0]["prompt"][1]["content"]


def test_dapo_prompt_text_is_kept_as_problem_when_the_prompt_column_becomes_messages():
    data = load_task_dataset(args("dapo_math", dataset_name=str(DATA / "dapo_math.jsonl")), "train")
    row = data[0]
    assert row["problem"] == "Find the sum of all positive divisors of 28."
    assert row["prompt"][1] == {"role": "user", "content": row["problem"]}
    assert row["prompt"][-1] == {"role": "assistant", "content": "<start_working_out>"}


def test_the_test_split_is_carved_identically_and_never_trained_on():
    keys = {"dataset_generate": 60, "dataset_seed": 5, "dataset_test_size": 0.25}
    train = load_task_dataset(args("countdown", **keys), "train")
    test = load_task_dataset(args("countdown", **keys), "test")
    again = load_task_dataset(args("countdown", **keys), "test")

    def as_keys(data):
        return {(tuple(r["nums"]), r["target"]) for r in data}

    assert len(train) == 45 and len(test) == 15 and as_keys(test) == as_keys(again)
    assert not as_keys(train) & as_keys(test)
    capped = load_task_dataset(args("countdown", max_samples=10, **keys), "train", seed=1)
    assert len(capped) == 10 and as_keys(capped) <= as_keys(train)
    whole_count = load_task_dataset(
        args("countdown", dataset_generate=60, dataset_seed=5, dataset_test_size=10), "test"
    )
    assert len(whole_count) == 10


def test_generated_problems_have_the_recipes_count_of_numbers():
    keys = {"dataset_generate": 40, "dataset_seed": 2, "dataset_test_size": 0}
    default = load_task_dataset(args("countdown", **keys), "train")
    assert {len(r["nums"]) for r in default} == {3, 4}
    three = load_task_dataset(args("countdown", dataset_generate_numbers=[3, 3], **keys), "train")
    assert {len(r["nums"]) for r in three} == {3}
    assert all(check_equation(r["solution"], r["nums"], r["target"]) is None for r in three)
    assert dataset_source(args("countdown", dataset_generate_numbers=[3, 3], **keys)) == (
        "40 generated countdown tasks of 3 numbers (seed 2)"
    )
    for wrong in ([5, 3], [1, 2], [3], [3, 7]):
        (problem,) = task_problems(args("countdown", dataset_generate_numbers=wrong, **keys))
        assert problem.key == "dataset_generate_numbers" and str(wrong) in problem.message


def test_a_folder_with_split_files_and_a_parquet_file(tmp_path):
    folder = tmp_path / "gsm"
    folder.mkdir()
    lines = (DATA / "gsm8k.jsonl").read_text().splitlines()
    (folder / "train.jsonl").write_text("\n".join(lines[:6]) + "\n")
    (folder / "test.jsonl").write_text("\n".join(lines[6:]) + "\n")
    assert len(load_task_dataset(args("gsm8k", dataset_name=str(folder)), "test")) == 2
    assert len(load_task_dataset(args("gsm8k", dataset_name=str(folder)), "train")) == 6

    import datasets

    parquet = tmp_path / "rows.parquet"
    datasets.Dataset.from_list([json.loads(line) for line in lines]).to_parquet(str(parquet))
    data = load_task_dataset(args("gsm8k", dataset_name=str(parquet), dataset_train_split="main"), "main")
    assert len(data) == 8 and data[0]["prompt"][-1]["role"] == "user"


def test_dataset_problems_are_user_errors_naming_the_column_or_file(tmp_path):
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text('{"question": "q", "solution": "1"}\n')
    with pytest.raises(
        UserError, match=r"lacks the column\(s\) answer .*wrong.jsonl|wrong.jsonl lacks the column"
    ):
        load_task_dataset(args("gsm8k", dataset_name=str(wrong)), "train")
    bad_type = tmp_path / "bad.jsonl"
    bad_type.write_text('{"nums": "1 2 3", "target": 6}\n')
    with pytest.raises(UserError, match="'nums' must be a non-empty list"):
        load_task_dataset(args("countdown", dataset_name=str(bad_type)), "train")
    with pytest.raises(UserError, match="not found"):
        load_task_dataset(args("countdown", dataset_name=str(tmp_path / "absent.jsonl")), "train")
    with pytest.raises(UserError, match="has no split 'test'.*dataset_test_size"):
        load_task_dataset(args("countdown", dataset_name=str(DATA / "countdown.jsonl")), "test")
    with pytest.raises(UserError, match="leaves no training rows"):
        load_task_dataset(
            args("countdown", dataset_name=str(DATA / "countdown.jsonl"), dataset_test_size=500), "train"
        )


def cache_hub_dataset(cache: Path, repo_id: str, config: str, rows: Path) -> None:
    """Puts `rows` where datasets keeps a Hub dataset it has prepared (<cache>/<namespace>___<name>/<config>/<version>/
    <hash>), built by datasets' own JSON builder."""
    import shutil

    import datasets
    from datasets.packaged_modules.json.json import Json

    namespace, name = repo_id.split("/")
    files = datasets.data_files.DataFilesDict.from_patterns({"train": [str(rows)]})
    Json(cache_dir=str(cache / "build"), dataset_name=name, config_name=config, data_files=files,
         hash="0" * 16).download_and_prepare()  # fmt: skip
    [built] = (cache / "build" / name).glob(f"{config}-*")
    (cache / f"{namespace}___{name}").mkdir(parents=True)
    shutil.move(built, cache / f"{namespace}___{name}" / config)


def test_a_hub_dataset_where_the_hub_cannot_be_reached_is_its_cached_copy_or_one_message(
    tmp_path, unreachable_hub, capsys
):
    """No minute of retries: one connection attempt, then one message with the ways out, or the copy datasets
    prepared before, loaded in its offline mode (and said so)."""
    import time

    import datasets.config

    offline = datasets.config.HF_HUB_OFFLINE
    started = time.monotonic()
    with pytest.raises(UserError) as raised:
        load_task_dataset(args("gsm8k"), "train")
    assert time.monotonic() - started < 10
    [problem] = raised.value.problems
    assert problem.startswith("dataset_name: cannot load 'openai/gsm8k': the Hugging Face Hub (http://127.0.0.1:9)")
    assert "not in the datasets cache" in problem and "dataset_name: path/to/file.jsonl" in problem
    assert "HF_ENDPOINT" in problem and "model_source: modelscope" in problem
    cache_hub_dataset(tmp_path / "datasets", "openai/gsm8k", "main", DATA / "gsm8k.jsonl")
    started = time.monotonic()
    rows = load_task_dataset(args("gsm8k"), "train")
    assert time.monotonic() - started < 10
    assert len(rows) == len((DATA / "gsm8k.jsonl").read_text().splitlines())
    assert rows[0]["question"] == json.loads((DATA / "gsm8k.jsonl").read_text().splitlines()[0])["question"]
    assert "loading openai/gsm8k from the datasets cache" in capsys.readouterr().err
    assert datasets.config.HF_HUB_OFFLINE == offline  # datasets' offline mode for that load only


def test_a_bad_jsonl_line_and_an_empty_split_file_are_named(tmp_path):
    good = '{"nums": [1, 2, 3], "target": 6}\n'
    broken = tmp_path / "broken.jsonl"
    broken.write_text(good * 10 + '{"nums": [1, 2, 3], target: 6}\n')
    with pytest.raises(UserError, match=r"broken.jsonl: line 11: not JSON \(Expecting property name"):
        load_task_dataset(args("countdown", dataset_name=str(broken)), "train")
    folder = tmp_path / "splits"
    folder.mkdir()
    (folder / "train.jsonl").write_text(good * 4)
    (folder / "test.jsonl").write_text("")
    with pytest.raises(UserError, match=r"test.jsonl is empty - each data file of a folder is a split"):
        load_task_dataset(args("countdown", dataset_name=str(folder)), "test")


def test_null_lines_bytes_that_are_not_utf8_and_values_of_another_kind_are_named(tmp_path):
    good = '{"nums": [1, 2, 3], "target": 6}\n'
    for name, content, says in [
        ("null.jsonl", good + "null\n", r"null.jsonl: line 2: a JSON null, not an object"),
        ("array.jsonl", good + "[1, 2]\n", r"array.jsonl: line 2: a JSON array, not an object"),
        ("bytes.jsonl", good.encode() + b'{"nums": [1, 2], "target": "\xff"}\n', r"line 2: not UTF-8 text \(byte 0xff"),
        ("mixed.jsonl", good + '{"nums": [1, 2], "target": "x"}\n', r"mixed.jsonl: the row .*'target': 'x'.*: 'target' must be a whole number, got"),
    ]:
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(UserError, match=says):
            load_task_dataset(args("countdown", dataset_name=str(path), dataset_test_size=0), "train")


def test_task_problems_for_the_recipe_check():
    assert task_problems(args("countdown")) == []
    unknown = task_problems(args("gsm8kk"))[0]
    assert unknown.key == "task" and "did you mean" in unknown.message
    problems = task_problems(
        args(
            "gsm8k",
            prompt_column="q",
            prompt_template="{q}",
            dataset_generate=5,
            dataset_name="x/missing.jsonl",
        )
    )
    text = "\n".join(problem.message for problem in problems)
    assert "keep one of them" in text  # and gsm8k generates (reasoning-gym's gsm_symbolic): dataset_name is not read
    assert {problem.key for problem in problems} == {"prompt_column"}
    missing = task_problems(args("gsm8k", dataset_name="./nope.jsonl"))[0]
    assert missing.key == "dataset_name" and "not found" in missing.message


def test_sft_dataset_holds_conversations_ending_with_prefill_plus_solution():
    data = sft_dataset(args("dapo_math", dataset_name=str(DATA / "dapo_math_sft.jsonl")), "train")
    assert len(data) == 4  # the row without a generated solution is dropped
    messages = data[0]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[-1]["content"].startswith("<start_working_out>The divisors of 28")
    assert messages[-1]["content"].endswith("<SOLUTION>56</SOLUTION>")
    countdown = sft_dataset(
        args("countdown", dataset_name=str(DATA / "countdown.jsonl"), prefill=""), "train"
    )
    assert len(countdown) == 11  # one row has no solution using every number
    assert countdown[0]["messages"][-1]["content"].startswith("Let me solve this step by step.\n<think>")
    with pytest.raises(UserError, match="none of the 8 rows"):
        sft_dataset(args("dapo_math", dataset_name=str(DATA / "dapo_math.jsonl")), "train")


def test_sft_dataset_with_generated_rows_respects_the_prefill_override():
    keys = args("countdown", dataset_generate=3, prefill="<think>")
    data = sft_dataset(keys, "train")
    assistant = data[0]["messages"][-1]["content"]
    assert assistant.startswith("<think> I need to reach") and assistant.count("<think>") == 1
    assert get_task("countdown").is_formatted(assistant)
    assert replace(keys, prefill=None).prefill is None  # the arguments are not modified


def test_a_generation_it_cannot_finish_is_refused_at_once(tmp_path):
    """`grpo data countdown -n 10^12` would run for days: refused with the limit, as `dataset_generate` is."""
    import subprocess
    import sys

    out = tmp_path / "big.jsonl"
    cmd = [sys.executable, "-m", "grpo_cli", "data", "countdown", "-n", str(10**12), "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2 and "at most 1,000,000" in run.stderr and not out.exists()
    from grpo_cli.arguments import TaskArguments
    from grpo_cli.tasks import task_problems

    (problem,) = task_problems(TaskArguments(dataset_generate=10**7))
    assert problem.key == "dataset_generate" and "at most 1,000,000" in problem.message
