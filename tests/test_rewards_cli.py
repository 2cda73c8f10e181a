"""`grpo rewards list|score|test`, `grpo tasks` and `grpo data countdown` on the built-in recipes, offline."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_cli.arguments import TaskArguments
from grpo_cli.cli import app
from grpo_cli.errors import UserError
from grpo_cli.rewards.scoring import reward_setup, run_reward_test, score_file

DATA = Path(__file__).parent / "data"
RECIPE_DATA = {
    "countdown": "countdown",
    "gsm8k": "gsm8k",
    "dapo-math": "dapo_math",
}


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    if isinstance(result.exception, UserError):
        raise result.exception
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_listing_commands():
    listed = invoke("rewards", "list").output
    for name in ("countdown_equation", "gsm8k_xml_count", "dapo_answer"):
        assert name in listed
    only_gsm8k = invoke("rewards", "list", "--task", "gsm8k").output
    assert "gsm8k_int" in only_gsm8k and "dapo_answer" not in only_gsm8k
    assert "Jiayi-Pan/Countdown-Tasks-3to4" in invoke("tasks").output


def test_data_countdown_writes_solvable_tasks(tmp_path):
    out = tmp_path / "cd.jsonl"
    invoke("data", "countdown", "--num", "12", "--seed", "4", "--out", str(out), "--max-numbers", "3")
    rows = read_jsonl(out)
    assert len(rows) == 12 and all(len(r["nums"]) == 3 and r["solution"] for r in rows)


def test_commands_that_write_a_file_keep_an_existing_one_without_force(tmp_path):
    """`grpo data` and `grpo rewards score -o` refuse to replace a user's file, as `grpo merge` refuses a folder."""
    out = tmp_path / "mine.jsonl"
    out.write_text("precious\n")
    with pytest.raises(UserError, match="already exists - choose another path, or pass --force"):
        invoke("data", "countdown", "--num", "3", "--out", str(out))
    source = DATA / "countdown_completions.jsonl"
    with pytest.raises(UserError, match="--output .* already exists"):
        invoke("rewards", "score", "-c", "countdown", "-i", str(source), "-o", str(out))
    assert out.read_text() == "precious\n"
    invoke("data", "countdown", "--num", "3", "--out", str(out), "--force")
    assert len(read_jsonl(out)) == 3
    invoke("rewards", "score", "-c", "countdown", "-i", str(source), "-o", str(out), "--force")
    assert len(read_jsonl(out)) == len(read_jsonl(source))


@pytest.mark.parametrize("recipe", sorted(RECIPE_DATA))
def test_rewards_score_on_each_builtin_recipe(recipe, tmp_path):
    name = RECIPE_DATA[recipe]
    source = DATA / f"{name}_completions.jsonl"
    out = tmp_path / "scored.jsonl"
    invoke("rewards", "score", "-c", recipe, "-i", str(source), "-o", str(out))
    scored, original = read_jsonl(out), read_jsonl(source)
    assert len(scored) == len(original)
    names = [k for k in scored[0] if k not in original[0] and k != "reward"]
    assert names and all(name_.split("_")[0] in (name.split("_")[0]) for name_ in names)
    for line, before in zip(scored, original):
        assert {k: line[k] for k in before} == before  # the input comes back unchanged
        present = [line[n] for n in names if line[n] is not None]
        assert line["reward"] == pytest.approx(sum(present))  # weights are all 1 in the built-in recipes


def test_rewards_score_values_and_summary_for_countdown():
    setup = reward_setup(TaskArguments(task="countdown"))
    summary = score_file(setup, DATA / "countdown_completions.jsonl")
    lines = summary["lines"]
    assert [line["countdown_equation"] for line in lines] == [1.0, 1.0, 1.0, 1.0, 0, 0, 0, 0, 0, 1.0, 0]
    assert [line["countdown_format"] for line in lines] == [1.0, 1.0, 0, 0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0]
    by_name = {row["name"]: row for row in summary["rewards"]}
    assert by_name["countdown_equation"]["positive"] == 5 and by_name["countdown_equation"]["failures"] == 0
    assert summary["total"]["max"] == 2.0 and summary["total"]["min"] == 0.0


def test_rewards_score_prints_jsonl_to_stdout_without_output(tmp_path):
    result = CliRunner().invoke(
        app, ["rewards", "score", "-c", "gsm8k", "-i", str(DATA / "gsm8k_completions.jsonl")]
    )
    assert result.exit_code == 0
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 7 and lines[0]["reward"] == 4.0


def test_rewards_score_names_bad_lines(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        "\n".join(
            [
                json.dumps({"nums": [1, 2], "target": 3, "completion": "ok"}),
                "{not json",
                json.dumps({"nums": [1, 2], "completion": "no target"}),
                json.dumps({"nums": "1 2", "target": 3, "completion": "nums as text"}),
                json.dumps({"nums": [1, 2], "target": 3.5, "completion": "fractional target"}),
                json.dumps({"nums": [1, 2], "target": 3, "completion": 42}),
                json.dumps([1, 2, 3]),
            ]
        )
        + "\n"
    )
    with pytest.raises(UserError) as error:
        invoke("rewards", "score", "-c", "countdown", "-i", str(bad))
    problems = "\n".join(error.value.problems)
    for expected in (
        "line 2: not JSON",
        "line 3: missing column 'target'",
        "line 4: 'nums' must be a non-empty list",
        "line 5: 'target' must be a whole number",
        "line 6: 'completion' must be a string",
        "line 7: must be a JSON object",
    ):
        assert expected in problems
    assert "line 1" not in problems


def test_bad_input_exits_with_code_2_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"answer": "#### 3", "completion": "3"}\nnot json\n')
    result = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "rewards", "score", "-c", "gsm8k", "-i", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "line 2: not JSON" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("recipe", "data"),
    [
        ("countdown", "countdown.jsonl"),
        ("gsm8k", "gsm8k.jsonl"),
        ("dapo-math", "dapo_math.jsonl"),
        ("dapo-math-sft", "dapo_math_sft.jsonl"),
    ],
)
def test_rewards_test_passes_on_each_builtin_recipe(recipe, data):
    output = invoke("rewards", "test", "-c", recipe, "--rows", "3", "--dataset_name", str(DATA / data)).output
    assert "completions scored as expected" in output


def test_rewards_test_on_generated_countdown_data():
    report = run_reward_test(reward_setup(TaskArguments(task="countdown", dataset_generate=4)), num_rows=4)
    assert report.problems == [] and len(report.cases) == 4 * 6
    assert all(c.total == 2.0 for c in report.cases if c.kind == "reference")


def test_rewards_test_skips_rows_without_a_reference_answer():
    args = TaskArguments(task="countdown", dataset_name=str(DATA / "countdown.jsonl"))
    report = run_reward_test(reward_setup(args), num_rows=12)
    assert report.skipped_rows == 1 and report.problems == []  # [15, 60, 4] -> 19 needs 15 + 4 only


def test_rewards_test_fails_loudly_on_a_reward_set_that_rewards_malformed_output(tmp_path):
    rewards_file = tmp_path / "my_rewards.py"
    rewards_file.write_text(
        textwrap.dedent(
            """
            from grpo_cli.rewards import reward
            from grpo_cli.tasks import completion_text

            def likes_chatter(prompts, completions, prefill, **kwargs):
                return [5.0 if (p + completion_text(c)).endswith("helps!") else 0.0 for p, c in zip(prefill, completions)]

            @reward(name="stingy", low=0.0, high=1.0)
            def stingy(prompts, completions, **kwargs):
                return [0.5 for c in completions]
            """
        )
    )
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        textwrap.dedent(
            f"""
            model_name_or_path: smollm2-135m-instruct
            task: countdown
            dataset_generate: 3
            reward_funcs: [countdown_equation, {rewards_file}:likes_chatter, {rewards_file}:stingy]
            """
        )
    )
    with pytest.raises(UserError) as error:
        invoke("rewards", "test", "-c", str(recipe), "--rows", "2")
    problems = "\n".join(error.value.problems)
    assert "malformed 4 completion" in problems and "Hope that helps!" in problems  # trailing text wins
    assert "gets 0.5 from stingy, below its top score 1" in problems


def test_a_jsonl_string_may_hold_any_line_separator_but_newline(tmp_path):
    """U+2028, U+2029 and U+0085 inside a JSON string are valid JSON (model outputs hold them): lines end at \\n."""
    text = " A\u2028B\u0085C\u2029.</think>\n<answer>44 + 19 + 35</answer>"
    row = {"nums": [44, 19, 35], "target": 98, "completion": text}
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(row, ensure_ascii=False) + "\n" + json.dumps(row, ensure_ascii=False) + "\n")
    summary = score_file(reward_setup(TaskArguments(task="countdown")), path)
    assert [line["completion"] for line in summary["lines"]] == [text, text]
    assert all(line["countdown_equation"] == 1.0 for line in summary["lines"])


def test_a_full_disk_is_one_message_for_the_commands_that_write_a_file(tmp_path):
    from conftest import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "small", "size=64k") as disk:  # 16 pages: 15 of filler, 1 of the user's file
        (disk / "filler").write_bytes(b"x" * 60 * 1024)
        (disk / "kept.jsonl").write_text("mine\n")
        with pytest.raises(UserError, match=r"out of disk space writing .*d.jsonl .*: nothing was written"):
            invoke("data", "countdown", "--num", "200", "--out", str(disk / "d.jsonl"))
        rows = DATA / "countdown_completions.jsonl"
        with pytest.raises(UserError, match=r"out of disk space writing .*kept.jsonl .*: .*kept.jsonl is as it was"):
            invoke("rewards", "score", "-c", "countdown", "-i", str(rows), "-o", str(disk / "kept.jsonl"), "--force")
        assert (disk / "kept.jsonl").read_text() == "mine\n"
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "kept.jsonl"]
