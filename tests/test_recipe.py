"""The recipe loader and checks, on real YAML files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grpo_cli.errors import UserError
from grpo_cli.problems import listing
from grpo_cli.recipe import builtin_recipes, check_recipe, load_recipe, schema
from grpo_cli.recipe.load import read_recipe


def write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


GOOD = """
    # a small recipe
    model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct
    dtype: bfloat16
    task: countdown
    learning_rate: 1e-6
    per_device_train_batch_size: 4
    gradient_accumulation_steps: 2
    num_generations: 8
    max_steps: 10
    lora_target_modules: [q_proj, v_proj]
    env:
      GRPO_TEST_VARIABLE: "on"
"""


def test_values_types_and_locations(tmp_path):
    path = write(tmp_path, GOOD)
    recipe = load_recipe(str(path), [], "rl")
    # PyYAML reads `1e-6` as a string; the loader makes it the float the key expects.
    assert recipe.values["learning_rate"] == pytest.approx(1e-6)
    assert isinstance(recipe.values["learning_rate"], float)
    assert recipe.values["lora_target_modules"] == ["q_proj", "v_proj"]
    assert recipe.where("max_steps") == f"{path}:9"
    assert recipe.where("report_to") == "grpo default"
    assert recipe.values["output_dir"] == "outputs/recipe"
    assert recipe.env == {"GRPO_TEST_VARIABLE": "on"}
    assert recipe.task.task == "countdown"


def test_command_line_overrides_win(tmp_path):
    path = write(tmp_path, GOOD)
    recipe = load_recipe(
        str(path),
        ["--learning_rate", "3e-6", "--max_steps=20", "--use_peft", "--lora_target_modules", "k_proj", "o_proj",
         "--gradient_checkpointing", "false", "--reward_weights", "[1.0, 0.5]"],
        "rl",
    )
    assert recipe.values["learning_rate"] == pytest.approx(3e-6)
    assert recipe.values["max_steps"] == 20
    assert recipe.values["use_peft"] is True
    assert recipe.values["gradient_checkpointing"] is False
    assert recipe.values["lora_target_modules"] == ["k_proj", "o_proj"]
    assert recipe.values["reward_weights"] == [1.0, 0.5]
    assert recipe.where("max_steps") == "command line"


def test_an_override_that_the_recipes_other_keys_leave_unread_is_one_message_with_the_key_to_add(tmp_path):
    """A run would go on without it (train on generated rows, stop at max_steps, train every weight): said before
    anything loads. Given with the other key on the command line too, or beside it in the recipe file itself (the plan
    says which one the run reads), it loads."""
    cases = [  # recipe, command, override, why, the other key as the recipe has it, the fix
        ("demo/countdown-sft", "sft", ["--dataset_name", "rows.jsonl"], "the recipe generates its rows",
         "(`dataset_generate: 1600`, /", "add `--dataset_generate 0` to train on it"),
        ("countdown", "rl", ["--num_train_epochs", "2"], "the run stops at `max_steps`", "(`max_steps: 200`, /",
         "add `--max_steps -1` to train by epochs"),
        ("demo/countdown-sft", "sft", ["--lora_r", "8"], "the recipe trains every weight, with no LoRA adapter",
         "(`use_peft: false`, default)", "add `--use_peft true` to train one"),
    ]  # fmt: skip
    for recipe, command, overrides, why, other, fix in cases:
        with pytest.raises(UserError) as raised:
            load_recipe(recipe, overrides, command)
        [problem] = raised.value.problems
        assert problem.startswith(f"command line `{overrides[0]}`: not read: {why} {other}"), problem
        assert problem.endswith(f" - {fix}")
    both = [["--dataset_name", "rows.jsonl", "--dataset_generate", "0"], ["--num_train_epochs", "2", "--max_steps", "-1"],
            ["--lora_r", "8", "--use_peft", "true"]]  # fmt: skip
    for (recipe, command, *_), overrides in zip(cases, both):
        values = load_recipe(recipe, overrides, command).values
        assert all(values[key.removeprefix("--")] is not None for key in overrides[::2])
    in_file = write(tmp_path, GOOD + "    dataset_name: rows.jsonl\n    dataset_generate: 100\n")
    assert load_recipe(str(in_file), [], "rl").values["dataset_generate"] == 100
    assert load_recipe("countdown", ["--dataset_name", "rows.jsonl"], "rl").values["dataset_name"] == "rows.jsonl"
    assert load_recipe("countdown", ["--lora_r", "8"], "rl").values["lora_r"] == 8  # a recipe with use_peft: true


def test_all_problems_reported_at_once_with_lines(tmp_path):
    path = write(
        tmp_path,
        """
        model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct
        learnig_rate: 1e-6
        max_prompt_length: 256
        torch_dtype: bfloat16
        per_device_train_batch_size: four
        loss_type: ppo
        max_length: 512
        num_generations: 3
        """,
    )
    recipe, problems = read_recipe(str(path), ["--vllm_device", "cuda:1"], "rl")
    with pytest.raises(UserError) as err:
        check_recipe(recipe, 1, None, problems)
    text = "\n".join(err.value.problems)
    assert f"{path}:2: unknown key `learnig_rate` - did you mean `learning_rate`?" in text
    assert f"{path}:3: `max_prompt_length` was removed" in text
    assert f"{path}:4: `torch_dtype` was renamed to `dtype`" in text
    assert f"{path}:5: `per_device_train_batch_size` must be an integer" in text
    assert f"{path}:6: `loss_type` must be one of grpo" in text
    assert f"{path}:7: `max_length` is a `grpo sft` key" in text
    assert "`--vllm_device`: `vllm_device` was removed in TRL 1.x: use `use_vllm: true`" in text
    # batch 8 (TRL's default per-device batch) x 1 process x 1 step is not divisible by 3 generations
    assert f"{path}:8: the generation batch" in text and "not divisible by `num_generations` (3)" in text
    assert len(err.value.problems) == 8


@pytest.mark.parametrize("old,new", [("max_seq_length", "max_length"), ("use_liger_loss", "use_liger_kernel")])
def test_renamed_keys_say_what_replaced_them(tmp_path, old, new):
    path = write(tmp_path, f"model_name_or_path: m\n{old}: 1\n")
    _, found = read_recipe(str(path), [], "sft" if old == "max_seq_length" else "rl")
    problems = listing(found)
    assert len(problems) == 1 and f"`{new}" in problems[0] and problems[0].startswith(f"{path}:2: ")
    assert found[0].key == old and found[0].line == 2


def test_process_count_changes_divisibility(tmp_path):
    path = write(tmp_path, GOOD.replace("gradient_accumulation_steps: 2", "gradient_accumulation_steps: 1")
                 .replace("num_generations: 8", "num_generations: 6"))
    recipe = load_recipe(str(path), [], "rl")
    with pytest.raises(UserError, match=r"4 per device x 1 processes x 1 steps = 4\) is not divisible"):
        check_recipe(recipe, num_processes=1)
    plan = check_recipe(recipe, num_processes=3)  # 4 x 3 = 12, divisible by 6
    rows = dict(plan.rows)
    assert "4 per device x 3 processes x 1 accumulation = 12" in rows["effective batch"]


def test_activation_offloading_needs_gradient_checkpointing(tmp_path):
    path = write(tmp_path, GOOD + "    gradient_checkpointing: false\n    activation_offloading: true\n")
    recipe = load_recipe(str(path), [], "rl")
    with pytest.raises(UserError) as err:
        check_recipe(recipe)
    line = GOOD.count("\n")  # gradient_checkpointing's (the leading newline is stripped)
    assert err.value.problems == [
        (
            f"{path}:{line + 1}: `activation_offloading` moves the inputs that gradient checkpointing keeps, and "
            f"`gradient_checkpointing` is false ({path}:{line}) - set `gradient_checkpointing: true`, or drop "
            "`activation_offloading`"
        )
    ]
    check_recipe(load_recipe(str(path), ["--gradient_checkpointing", "true"], "rl"))


def test_unknown_rewards_weights_and_missing_files(tmp_path):
    path = write(
        tmp_path,
        """
        model_name_or_path: ./no/such/model
        task: countdown
        dataset_name: data/missing.jsonl
        reward_funcs: [countdown_format, countdown_equasion]
        reward_weights: [1.0]
        per_device_train_batch_size: 8
        num_generations: 8
        """,
    )
    recipe = load_recipe(str(path), [], "rl")
    with pytest.raises(UserError) as err:
        check_recipe(recipe)
    text = "\n".join(err.value.problems)
    assert f"{path}:1: `model_name_or_path`: no such file or folder: ./no/such/model" in text
    assert f"{path}:3: dataset_name: file or folder 'data/missing.jsonl' not found" in text
    assert "countdown_equasion" in text and "countdown_equation" in text  # did-you-mean
    assert f"{path}:5: 1 `reward_weights` for 2 rewards" in text


def test_unknown_task_and_bad_yaml(tmp_path):
    recipe = load_recipe(str(write(tmp_path, "model_name_or_path: m\ntask: sudoku\n")), [], "rl")
    with pytest.raises(UserError, match=r"recipe.yaml:2: unknown task 'sudoku'"):
        check_recipe(recipe)
    bad = write(tmp_path, "model_name_or_path: m\nlearning_rate: [1e-6\n", "bad.yaml")
    with pytest.raises(UserError, match=r"bad.yaml:\d+: not valid YAML"):
        load_recipe(str(bad), [], "rl")
    twice = write(tmp_path, "model_name_or_path: m\nseed: 1\nseed: 2\n", "twice.yaml")
    with pytest.raises(UserError, match=r"twice.yaml:3: `seed` is set twice \(first on line 2\)"):
        load_recipe(str(twice), [], "rl")


def test_builtin_recipes_pass_the_check():
    recipes = builtin_recipes()
    assert {"countdown", "gsm8k", "dapo-math", "dapo-math-sft"} <= set(recipes)
    for name, path in recipes.items():
        command = "sft" if name.endswith("sft") else "rl"
        plan = check_recipe(load_recipe(name, [], command))
        assert dict(plan.rows)["recipe"] == str(path)


def test_schema_snapshot_matches_installed_trl():
    """The snapshot that keeps `grpo check` fast must say what the installed TRL says."""
    assert json.loads(schema.SNAPSHOT.read_text()) == json.loads(json.dumps(schema.read_live()))


def test_check_cli_exit_codes_and_speed(tmp_path):
    bad = write(tmp_path, "model_name_or_path: m\nlearnig_rate: 1e-6\ntorch_dtype: bfloat16\nnum_generations: 3\n")
    run = subprocess.run([sys.executable, "-m", "grpo_cli", "check", "-c", str(bad)], capture_output=True, text=True, check=False)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert "learnig_rate" in run.stderr and "torch_dtype" in run.stderr and "num_generations" in run.stderr
    good = subprocess.run([sys.executable, "-m", "grpo_cli", "check", "-c", "countdown"], capture_output=True, text=True, check=False)
    assert good.returncode == 0, good.stderr
    # the plan on stdout (`grpo check -c countdown > plan.txt`), messages on stderr
    assert "Qwen/Qwen2.5-3B-Instruct" in good.stdout and "effective batch" in good.stdout


def test_help_does_not_import_torch():
    code = "import sys; from grpo_cli.cli import app; sys.argv=['grpo','--help']\n" \
           "try:\n    app()\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_every_commands_help_shows_each_paragraph_of_its_docstring_unbroken():
    """A paragraph of a command's docstring spread over two source lines reads as one in `grpo CMD --help` (the help
    reflows paragraphs as Markdown does), not broken mid-sentence where the source line ended."""
    import inspect

    from typer.testing import CliRunner

    from grpo_cli.cli import app

    def commands(group, prefix=()):
        for command in group.registered_commands:
            yield (*prefix, command.name or command.callback.__name__.replace("_", "-")), command.callback
        for sub in group.registered_groups:
            yield from commands(sub.typer_instance, (*prefix, sub.name))

    found = list(commands(app))
    assert len(found) > 10
    broken = []
    for words, callback in found:
        shown = CliRunner().invoke(app, [*words, "--help"], env={"COLUMNS": "400"}).output
        lines = {" ".join(line.split()) for line in shown.splitlines()}
        for para in (inspect.getdoc(callback) or "").split("\n\n"):
            if " ".join(para.replace("`", "").split()) not in lines:
                broken.append((" ".join(words), para))
    assert broken == []


def test_keys_list_cuts_long_help_at_a_word_and_a_search_shows_it_whole(monkeypatch, capsys):
    from grpo_cli.console import output
    from grpo_cli.recipe.show import print_keys

    monkeypatch.setattr(output, "width", 1000)
    print_keys("rl", "activation_offloading")
    whole = capsys.readouterr().out
    assert "activation_offloading" in whole and "(all of it with LoRA)." in whole
    print_keys("rl", None)
    listing = capsys.readouterr().out
    row = next(line for line in listing.splitlines() if "activation_offloading" in line)
    assert "backward passes (CUDA; ..." in row and "needs" not in row  # cut before a word, not in one


@pytest.mark.parametrize(
    "override, says",
    [
        (["--per_device_train_batch_size", "0"], "`per_device_train_batch_size` is 0: it must be a whole number"),
        (["--learning_rate", "-1e-5"], "`learning_rate` is -1e-05: it must be a finite number of at least 0"),
        (["--learning_rate", "nan"], "`learning_rate` is nan"),
        (["--temperature", "-1"], "`temperature` is -1.0: it must be a finite number above 0"),
        (["--save_steps", "2.5"], "`save_steps` is 2.5: it must be a whole number of steps, or a share"),
        (["--max_steps", "0"], "`max_steps` is 0: it must be a whole number above 0, or -1"),
        (["--reward_timeout", "-5"], "`reward_timeout` is -5.0: it must be a number of seconds above 0"),
        (["--stall_timeout", "-1"], "`stall_timeout` is -1.0: it must be a finite number of seconds of at least 0"),
    ],
)
def test_values_training_would_reject_are_refused_by_the_check(tmp_path, override, says):
    with pytest.raises(UserError) as err:
        check_recipe(load_recipe(str(write(tmp_path, GOOD)), override, "rl"))
    assert says in str(err.value) and "command line" in str(err.value)


def test_env_names_must_be_variable_names(tmp_path):
    path = write(tmp_path, GOOD.replace('GRPO_TEST_VARIABLE: "on"', '"A=B": "on"'))
    with pytest.raises(UserError, match=r"`env` name 'A=B' is not an environment variable name"):
        check_recipe(load_recipe(str(path), [], "rl"))


def test_output_folders_a_run_must_not_own(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "a-file").write_text("x")
    recipe = write(tmp_path, GOOD.replace("Qwen/Qwen2.5-0.5B-Instruct", str(model)))
    cases = {
        "/": "is a system folder",
        "/usr": "is a system folder",
        "~": "is your home folder",
        str(model): "is the model being trained from",
        str(tmp_path / "a-file"): "is an existing file",
        str(tmp_path / "a-file" / "run"): "which is a file",
        str(tmp_path / ("x" * 260)): "a folder name of 260 bytes (the limit is 255)",
    }
    for output, says in cases.items():
        with pytest.raises(UserError) as err:
            check_recipe(load_recipe(str(recipe), ["--output_dir", output], "rl"))
        assert says in str(err.value), output
    check_recipe(load_recipe(str(recipe), ["--output_dir", str(tmp_path / "runs" / "new")], "rl"))  # fine
    run = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "check", "-c", str(recipe), "--output_dir", "~"],
        capture_output=True, text=True, check=False,
    )
    assert run.returncode == 2 and "home folder" in run.stderr and "Traceback" not in run.stderr


def test_unreadable_recipes_get_one_message(tmp_path):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"model_name_or_path: m\n# caf\xe9\n")
    deep = tmp_path / "deep.yaml"
    deep.write_text("model_name_or_path: m\nenv:\n  A: " + "[" * 100_000 + "\n")
    cases = {
        str(latin): f"{latin}:2: not UTF-8 text (byte 0xe9)",
        str(deep): "nest",  # "nested too deeply", or libyaml's "exceeded maximum nesting depth" with its line
        str(tmp_path / ("r" * 260 + ".yaml")): "File name too long",
        str(tmp_path): "is a folder - give a recipe's YAML file",
    }
    for config, says in cases.items():
        run = subprocess.run(
            [sys.executable, "-m", "grpo_cli", "check", "-c", config], capture_output=True, text=True, check=False
        )
        assert run.returncode == 2, run.stderr
        assert says in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_env_values_must_be_strings_or_numbers(tmp_path):
    path = write(tmp_path, GOOD.replace('GRPO_TEST_VARIABLE: "on"', "A: null\n      B: [1, 2]\n      C: 3\n      D: true"))
    recipe, found = read_recipe(str(path), [], "rl")
    problems = listing(found)
    assert any("`env` A: null is not a value" in p for p in problems)
    assert any("`env` B: list is not a value" in p for p in problems)
    assert recipe.env == {"C": "3", "D": "true"}


def test_many_unknown_keys_are_counted_and_a_huge_file_is_refused_at_once(tmp_path):
    path = write(tmp_path, GOOD + "".join(f"    made_up_{i}: 1\n" for i in range(500)))
    _, found = read_recipe(str(path), [], "rl")
    problems = listing(found)
    assert len([p for p in problems if "unknown key `" in p]) == 20
    assert any(p.endswith("... and 480 more unknown keys") for p in problems)
    huge = tmp_path / "huge.yaml"
    huge.write_text("model_name_or_path: m\n" + "k: 1\n" * 400_000)
    with pytest.raises(UserError, match=r"MiB is not a recipe .* is it a dataset\?"):
        read_recipe(str(huge), [], "rl")


def test_a_relative_reward_file_beside_the_recipe_is_the_one_every_command_loads(tmp_path, monkeypatch):
    """check, rl and eval (`reward_funcs`) and the reward commands (`setup_from_recipe`) find the same file."""
    from grpo_cli.recipe import reward_funcs
    from grpo_cli.rewards.scoring import setup_from_recipe

    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "my_rewards.py").write_text("def short(completions, **kwargs):\n    return [1.0 for _ in completions]\n")
    path = recipes / "my.yaml"
    path.write_text("model_name_or_path: some/model\ndtype: bfloat16\nreward_funcs: [my_rewards.py:short]\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    recipe = load_recipe(str(path), [], "rl")
    check_recipe(recipe)  # no "file not found"
    expected = f"{(recipes / 'my_rewards.py').resolve()}:short"
    assert [f.process.reference for f in reward_funcs(recipe)] == [expected]
    assert [f.process.reference for f in setup_from_recipe(recipe).guards()] == [expected]
    # a file in the working directory of the same name comes first, for every command alike
    (elsewhere / "my_rewards.py").write_text("def short(completions, **kwargs):\n    return [0.0 for _ in completions]\n")
    here = f"{(elsewhere / 'my_rewards.py').resolve()}:short"
    assert [f.process.reference for f in reward_funcs(recipe)] == [here]
    assert [f.process.reference for f in setup_from_recipe(recipe).guards()] == [here]
    (elsewhere / "my_rewards.py").unlink()
    (recipes / "my_rewards.py").unlink()
    with pytest.raises(UserError, match="not found in the working directory or in the recipe's folder"):
        check_recipe(load_recipe(str(path), [], "rl"))


def test_check_prints_the_machines_defaults_with_where_they_came_from(tmp_path):
    """As training will run on a machine without a GPU (none visible, also on a GPU machine): bf16 off by the
    hardware's default, not TRL's true."""
    path = write(tmp_path, "model_name_or_path: m\ndtype: float32\nuse_liger_kernel: false\n")
    run = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "check", "-c", str(path), "--dataloader_pin_memory", "true"],
        capture_output=True, text=True, check=False,
        env={**os.environ, "COLUMNS": "200", "CUDA_VISIBLE_DEVICES": ""},
    )
    assert run.returncode == 0, run.stderr
    rows = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:4]]
            for line in run.stdout.splitlines() if line.count("│") >= 4}
    assert rows["bf16"] == ["false", "hardware default (no GPU)"]
    assert rows["dataloader_pin_memory"] == ["true", "command line"]
    assert rows["use_liger_kernel"] == ["false", "recipe.yaml:3"]
    assert rows["dtype"] == ["float32", "recipe.yaml:2"]
    assert rows["rollouts"] == ["TRL's generate (rollout_engine: trl)", "hardware default (no GPU)"]


def test_a_problem_is_located_by_its_key_not_its_text(tmp_path):
    from grpo_cli.problems import Problem
    from grpo_cli.recipe.check import _located

    path = write(tmp_path, "model_name_or_path: m\ntask: countdown\n")
    recipe = load_recipe(str(path), ["--seed", "3"], "rl")
    problems = [Problem(None, "task"), Problem("seed", "x"), Problem("task", "`seed` is mentioned here (key: seed)")]
    # listed in the file's line order, then the command line's, then the rest
    assert listing(_located(recipe, problems)) == [
        f"{path}:2: `seed` is mentioned here (key: seed)",
        "command line: x",
        "task",
    ]


def test_without_a_command_the_recipe_keys_choose_it(tmp_path):
    """`grpo check`, `grpo eval` and the reward commands read a recipe once and take the command its keys suggest."""
    assert load_recipe("demo/countdown-sft", [], None).command == "sft"
    assert load_recipe("demo/countdown-rl", [], None).command == "rl"
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("task: countdown\ndataset_text_field: text\npacking: true\n")
    loaded = load_recipe(str(recipe), [], None)
    assert loaded.command == "sft" and loaded.where("packing") == f"{recipe}:3"  # lines from the one parse


def test_the_plan_says_what_samples_the_rollouts_and_why_not_grpos_sampler(tmp_path):
    """One line in the plan: grpo's sampler (under ZeRO-3 with its gather), or TRL's generation with the reason."""
    from grpo_cli.recipe.check import rollout_path

    zero = {stage: {"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": stage}} for stage in (2, 3)}
    grpo = {"rollout_engine": "grpo"}
    assert rollout_path(grpo, None) == rollout_path(grpo, zero[2]) == "grpo's sampler"
    assert rollout_path(grpo, {"distributed_type": "MULTI_GPU"}) == "grpo's sampler"
    assert "gathered once per generation batch" in rollout_path(grpo, zero[3])
    assert "ds3_gather_for_generation is false" in rollout_path({**grpo, "ds3_gather_for_generation": False}, zero[3])
    assert rollout_path({**grpo, "ds3_gather_for_generation": False}, zero[2]) == "grpo's sampler"
    assert "FSDP shards the weights" in rollout_path(grpo, {"distributed_type": "FSDP"})
    assert "vLLM generates" in rollout_path({**grpo, "use_vllm": True}, None)
    assert "repetition_penalty" in rollout_path({**grpo, "repetition_penalty": 1.1}, None)
    assert rollout_path({"rollout_engine": "trl"}, zero[3]) == "TRL's generate (rollout_engine: trl)"

    path = write(tmp_path, "model_name_or_path: m\nrollout_engine: grpo\nds3_gather_for_generation: false\n")
    run = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "check", "-c", str(path), "--accelerate-config", "zero3"],
        capture_output=True, text=True, check=False, env={**os.environ, "COLUMNS": "250"},
    )
    assert run.returncode == 0, run.stderr
    line = next(line for line in run.stdout.splitlines() if "│ rollouts" in line)
    assert "TRL's generate: ds3_gather_for_generation is false" in line and "recipe.yaml:2" in line


def test_the_plan_says_whether_zero_advantage_completions_are_trained_and_why(tmp_path):
    from grpo_cli.recipe.check import micro_batch_line, zero_advantage_line
    from grpo_cli.recipe.hardware import LOSS_NORMALIZERS

    on = {"skip_zero_advantage": True, "beta": 0.0, "loss_type": "dapo", "gradient_accumulation_steps": 4,
          "per_device_train_batch_size": 16, "pack_micro_batches": True}  # fmt: skip
    # each loss type whose normalizer is known leaves them out; another is named
    assert {zero_advantage_line({**on, "loss_type": t}) for t in LOSS_NORMALIZERS} == {zero_advantage_line(on)}
    assert "loss_type 'other' is not one of grpo, sapo" in zero_advantage_line({**on, "loss_type": "other"})
    assert zero_advantage_line(on) == "completions left out of the forward/backward"
    assert zero_advantage_line({**on, "skip_zero_advantage": False}) == "completions trained (skip_zero_advantage: false)"
    assert zero_advantage_line({**on, "beta": 0.04}).startswith("completions trained: beta is 0.04: the KL penalty")
    assert "entropy bonus" in zero_advantage_line({**on, "entropy_coef": 0.01})
    assert "top_entropy_quantile" in zero_advantage_line({**on, "top_entropy_quantile": 0.2})

    # and how a step's micro-batches are laid out: packed where a loss allows and micro-batches can be left out
    packed = micro_batch_line(on)
    assert packed.startswith("up to 4 a step, filled longest first with as many completions as fit the tokens of 16")
    assert micro_batch_line({**on, "loss_type": "grpo", "beta": 0.04}) == packed  # rows move, KL or not
    assert micro_batch_line({**on, "gradient_accumulation_steps": 1}) == "one a step, of 16 completions"
    assert micro_batch_line({**on, "pack_micro_batches": False}) == (
        "up to 4 a step, of 16 completions; the emptied ones run no forward/backward"
    )
    zero3 = {"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 3}}
    assert micro_batch_line(on, zero3) == (
        "4 a step, of at most 16 completions, each one run (DeepSpeed runs every micro-batch's backward)"
    )
    assert "(FSDP runs every" in micro_batch_line(on, {"distributed_type": "FSDP"})
    assert micro_batch_line({**on, "loss_type": "bnpo"}) == (
        "4 a step, of 16 completions (bnpo divides by each micro-batch's tokens)"
    )
    assert "(the entropy bonus is a mean" in micro_batch_line({**on, "entropy_coef": 0.01})
    assert "steps_per_generation is not a multiple" in micro_batch_line({**on, "steps_per_generation": 6})
    assert micro_batch_line({**on, "steps_per_generation": 8}) == packed
    # with packed_forward, each prompt's completions together, each micro-batch without its padding
    assert micro_batch_line({**on, "packed_forward": True}) == packed.replace("longest first", "prompt by prompt") + (
        "; each without its padding, a prompt once for its completions there (packed_forward)"
    )
    assert micro_batch_line({**on, "pack_micro_batches": False, "skip_zero_advantage": False}) == (
        "4 a step, of 16 completions"
    )

    path = write(tmp_path, "model_name_or_path: m\nbeta: 0.04\n")
    run = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "check", "-c", str(path)],
        capture_output=True, text=True, check=False, env={**os.environ, "COLUMNS": "250"},
    )
    assert run.returncode == 0, run.stderr
    line = next(line for line in run.stdout.splitlines() if "│ zero advantage" in line)
    assert "completions trained: beta is 0.04: the KL penalty gives every completion a gradient" in line and "recipe.yaml:2" in line


NULL_KEYS = (
    "learning_rate", "per_device_train_batch_size", "num_generations", "task", "dataset_generate",
    "gradient_accumulation_steps", "max_steps", "seed", "temperature", "output_dir", "max_completion_length",
)  # fmt: skip


@pytest.mark.parametrize("key", NULL_KEYS)
def test_a_key_with_no_value_is_named_at_load_not_a_traceback_later(tmp_path, key):
    """`learning_rate:` alone is YAML's null: no run can use it where TRL needs a value."""
    path = write(tmp_path, f"model_name_or_path: m\n{key}:\n")
    with pytest.raises(UserError) as raised:
        load_recipe(str(path), [], "rl")
    (problem,) = raised.value.problems
    assert f"recipe.yaml:2: `{key}` has no value (null) - give " in problem


def test_a_null_model_is_one_problem_and_the_check_exits_2(tmp_path):
    path = write(tmp_path, "model_name_or_path:\nlearning_rate:\n")
    run = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "check", "-c", str(path)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.count("model_name_or_path") == 1 and "`learning_rate` has no value (null)" in run.stderr
    assert load_recipe(str(write(tmp_path, "model_name_or_path: m\nmin_p:\n")), [], "rl").values["min_p"] is None


def test_paths_and_values_are_printed_as_text_never_as_markup(tmp_path):
    """Square brackets in a recipe's path, its values and a written file's path are data, not Rich markup."""
    folder = tmp_path / "r["
    folder.mkdir()
    path = write(folder, "model_name_or_path: m\noutput_dir: 'out[/]x'\n", name="].yaml")
    env = {**os.environ, "COLUMNS": "200"}
    check = [sys.executable, "-m", "grpo_cli", "check", "-c", str(path), "--dataset_name", "x[train]"]
    run = subprocess.run(check, capture_output=True, text=True, check=False, env=env)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "x[train] [train]" in run.stdout and "out[/]x" in run.stdout and "Plan: ]" in run.stdout
    data = [sys.executable, "-m", "grpo_cli", "data", "countdown", "-n", "4", "--out", str(tmp_path / "d[/].jsonl")]
    run = subprocess.run(data, capture_output=True, text=True, check=False, env=env)
    assert run.returncode == 0 and "d[/].jsonl" in run.stderr, run.stderr[-2000:]
    assert len((tmp_path / "d[" / "].jsonl").read_text().splitlines()) == 4


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    """Ten lines whose aliases expand to 10^10 values: refused before they are built, in a fraction of a second."""
    lines = ["model_name_or_path: m", 'a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    path = write(tmp_path, "\n".join(lines) + "\n")
    run = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "check", "-c", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 2 and "expand to more than 100,000 values" in run.stderr
    aliased = write(tmp_path, "model_name_or_path: m\nlora_target_modules: &t [q_proj, v_proj]\n", name="ok.yaml")
    assert load_recipe(str(aliased), [], "rl").values["lora_target_modules"] == ["q_proj", "v_proj"]


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["--top_k", "-5"], "top_k"), (["--seed", "-1"], "seed"), (["--seed", str(2**70)], "seed"),
        (["--repetition_penalty", "0"], "repetition_penalty"), (["--min_p", "2"], "min_p"),
        (["--steps_per_generation", "0"], "steps_per_generation"), (["--num_iterations", "0"], "num_iterations"),
        (["--use_peft", "true", "--lora_r", "0"], "lora_r"), (["--output_dir", ""], "output_dir"),
        (["--max_steps", "-1", "--num_train_epochs", "0"], "num_train_epochs"),
    ],
)  # fmt: skip
def test_values_training_would_reject_are_named_at_check(tmp_path, overrides, key):
    from grpo_cli.recipe import check_recipe

    path = write(tmp_path, "model_name_or_path: m\n")
    with pytest.raises(UserError) as raised:
        check_recipe(load_recipe(str(path), overrides, "rl"))
    assert any(f"`{key}`" in problem for problem in raised.value.problems), raised.value.problems


def test_nan_values_and_a_model_that_is_a_file_are_named_at_check(tmp_path):
    from grpo_cli.recipe import check_recipe

    path = write(tmp_path, "model_name_or_path: m\nweight_decay: .nan\nbeta: .inf\n")
    with pytest.raises(UserError) as raised:
        check_recipe(load_recipe(str(path), [], "rl"))
    assert [p.split(": ")[1].split(" ")[0] for p in raised.value.problems] == ["`weight_decay`", "`beta`"]
    with pytest.raises(UserError, match="is a file - give the model's folder"):
        check_recipe(load_recipe(str(path), ["--model_name_or_path", str(path), "--weight_decay", "0", "--beta", "0"]))
    sft = write(tmp_path, "model_name_or_path: m\nmax_length: 0\n", name="sft.yaml")
    with pytest.raises(UserError, match="`max_length` is 0"):
        check_recipe(load_recipe(str(sft), [], "sft"))


def test_gradient_checkpointing_kwargs_are_judged_as_torch_checkpoint_takes_them(tmp_path):
    from grpo_cli.recipe import check_recipe

    path = write(tmp_path, "model_name_or_path: m\n")
    for given, says in [
        ("{use_reentrant:true}", "YAML needs a space after the colon"),
        ("{use_reentrant: 1}", "use_reentrant: 1: it must be true or false"),
        ("{reentrant: true}", "torch's checkpoint takes use_reentrant"),
        ("true", "it must be a mapping"),
    ]:
        with pytest.raises(UserError) as raised:
            check_recipe(load_recipe(str(path), ["--gradient_checkpointing_kwargs", given], "rl"))
        assert any(says in problem for problem in raised.value.problems), (given, raised.value.problems)
    kept = load_recipe(str(path), ["--gradient_checkpointing_kwargs", "{use_reentrant: true}"], "rl")
    check_recipe(kept)
    assert kept.values["gradient_checkpointing_kwargs"] == {"use_reentrant": True}


def test_keys_that_need_a_gpu_are_said_in_the_plan_on_a_machine_without_one(tmp_path):
    """`grpo check` previews a recipe for any machine: on one without a CUDA GPU its plan says what a run here would
    stop on (the run itself stops on it before loading anything)."""
    from grpo_cli.recipe import check_recipe
    from grpo_cli.recipe.hardware import Hardware

    path = write(tmp_path, "model_name_or_path: m\n")
    cpu, gpu = Hardware(gpu=False), Hardware(gpu=True, training=False)  # no model config read
    for key in ("fp16", "load_in_4bit", "use_vllm", "use_liger_kernel", "bf16"):
        plan = check_recipe(load_recipe(str(path), [f"--{key}", "true"], "rl", hardware=cpu))
        said = [w for w in plan.warnings if w.startswith(f"this machine has no CUDA GPU: a run here would stop on {key}")]
        assert len(said) == 1, plan.warnings
        assert not check_recipe(load_recipe(str(path), [f"--{key}", "true"], "rl", hardware=gpu)).warnings
    assert not check_recipe(load_recipe(str(path), ["--bf16", "true", "--use_cpu", "true"], "rl", hardware=cpu)).warnings
    bf16_weights = check_recipe(load_recipe(str(path), ["--dtype", "bfloat16"], "rl", hardware=cpu)).warnings
    emulated = ("dtype: bfloat16 on a CPU without AVX512-BF16: its matrix products are emulated, several times slower "
                "than in float32 - `--dtype float32` for a run on this machine")  # fmt: skip
    assert bf16_weights == [emulated]
    fast = Hardware(gpu=False, cpu_bf16=True)
    assert not check_recipe(load_recipe(str(path), ["--dtype", "bfloat16"], "rl", hardware=fast)).warnings
    sft = write(tmp_path, "model_name_or_path: m\nbf16: true\n", name="sft.yaml")
    [warning] = check_recipe(load_recipe(str(sft), [], "sft", hardware=cpu)).warnings
    assert "bf16: true (mixed precision) needs a GPU with bfloat16 - set bf16: false, or use_cpu: true" in warning


def test_lists_and_tables_go_to_stdout_whole_keys_at_80_columns():
    env = {**os.environ, "COLUMNS": "80"}
    keys = subprocess.run([sys.executable, "-m", "grpo_cli", "recipes", "keys", "rl"], capture_output=True, text=True,
                          check=False, env=env)  # fmt: skip
    assert keys.returncode == 0, keys.stderr
    lines = [line for line in keys.stdout.splitlines() if "lora_target_modules" in line]
    assert lines and all(len(line) <= 80 for line in keys.stdout.splitlines())
    assert "use_transformers_continuous_batching" in keys.stdout
    for command in (["recipes", "list"], ["tasks"], ["rewards", "list"]):
        run = subprocess.run([sys.executable, "-m", "grpo_cli", *command], capture_output=True, text=True, check=False)
        assert run.returncode == 0 and "│" in run.stdout and "│" not in run.stderr, (command, run.stderr)


def test_check_names_an_unknown_command():
    run = subprocess.run([sys.executable, "-m", "grpo_cli", "check", "-c", "countdown", "--command", "foo"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "--command foo is not a training command - use rl or sft" in run.stderr


def test_the_plan_says_a_dataset_name_beside_generated_rows_is_not_read(tmp_path):
    from grpo_cli.recipe import check_recipe

    path = write(tmp_path, "model_name_or_path: m\ndataset_name: mine.jsonl\ndataset_generate: 40\n")
    rows = dict(check_recipe(load_recipe(str(path), [], "rl")).rows)
    assert rows["dataset"].startswith("40 generated countdown tasks")
    assert "dataset_name mine.jsonl is not read (dataset_generate: 0 reads it)" in rows["dataset"]


def test_bf16_on_the_cpu_is_the_machines_where_the_recipe_leaves_it_unset(tmp_path):
    from grpo_cli.recipe.hardware import Hardware

    path = write(tmp_path, "model_name_or_path: m\nuse_cpu: true\n")
    fast = load_recipe(str(path), [], "rl", hardware=Hardware(gpu=False, cpu_bf16=True))
    assert fast.values["bf16"] is True and fast.where("bf16") == "hardware default (no GPU, the CPU has AVX512-BF16)"
    slow = load_recipe(str(path), [], "rl", hardware=Hardware(gpu=False))  # bf16 emulated: several times slower
    assert slow.values["bf16"] is False and slow.where("bf16") == "hardware default (no GPU)"
    assert load_recipe(str(path), ["--bf16", "true"], "rl", hardware=Hardware(gpu=False)).values["bf16"] is True


def test_reading_a_recipe_for_a_gpu_prepares_and_downloads_nothing(tmp_path, monkeypatch, tiny_model_dir):
    """The machine's defaults read the model's config.json only where it already is (a local folder, a prepared demo
    model, the Hub's config file): a demo model not prepared yet stays so, and the plan says why offloading was not
    decided."""
    from grpo_cli.recipe.hardware import Hardware, hardware_defaults

    monkeypatch.setenv("GRPO_CACHE", str(tmp_path / "cache"))
    gpu = Hardware(gpu=True)
    values = {"model_name_or_path": "smollm2-135m-instruct", "gradient_checkpointing": True,
              "per_device_train_batch_size": 64, "num_generations": 8}  # fmt: skip
    chosen, notes = hardware_defaults("rl", values, gpu)
    assert not (tmp_path / "cache").exists() and "activation_offloading" not in chosen
    assert ("activation_offloading and packed_forward are left off: the demo model smollm2-135m-instruct is not "
            "prepared yet - `grpo models prepare smollm2-135m-instruct` converts it") in notes  # fmt: skip
    chosen, notes = hardware_defaults("rl", {**values, "model_name_or_path": str(tiny_model_dir)}, gpu)
    assert chosen["activation_offloading"][0] is True and not [n for n in notes if "left off" in n]
