"""`grpo report` and the run's diagnosis: one real tiny GRPO run where no completion is rewarded and a reward fails on
every other completion, plus trainer_state.json files of log histories a tiny run cannot produce (KL rising, steps
slowing, entropy collapse, ...), read by the same reader."""

from __future__ import annotations

import contextlib
import io
import json
import struct
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from grpo_cli.diagnosis import FindingWatch, diagnose
from grpo_cli.errors import UserError
from grpo_cli.report import read_run, report_run, run_table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Scores 0 where it does not raise, and raises on every other completion it sees (its process keeps the count).
FLAKY_REWARD = """
SEEN = [0]

def flaky(completions, **kwargs):
    scores = []
    for _ in completions:
        SEEN[0] += 1
        if SEEN[0] % 2 == 0:
            raise ValueError("every other completion")
        scores.append(0.0)
    return scores
"""


@pytest.fixture(scope="module")
def unrewarded_run(tmp_path_factory, tiny_model_dir):
    """4 real GRPO steps of the tiny random model: it never writes the countdown format (nothing is rewarded) and
    `flaky` fails on every other completion; SwanLab logs offline. Returns (output folder, console text)."""
    from grpo_cli.recipe import load_recipe
    from grpo_cli.train.rl import run_rl

    root = tmp_path_factory.mktemp("unrewarded")
    (root / "flaky.py").write_text(FLAKY_REWARD)
    recipe = root / "rl.yaml"
    recipe.write_text(
        textwrap.dedent(
            f"""
            model_name_or_path: {tiny_model_dir}
            dtype: float32
            task: countdown
            dataset_generate: 24
            reward_funcs: [countdown_format, countdown_equation, "{root / 'flaky.py'}:flaky"]
            num_generations: 4
            per_device_train_batch_size: 4
            max_completion_length: 8
            beta: 0.04
            learning_rate: 1.0e-4
            max_steps: 4
            save_steps: 2
            seed: 3
            sample_every: 0
            swanlab: true
            swanlab_mode: offline
            output_dir: {root / 'run'}
            """
        )
    )
    text = io.StringIO()
    with contextlib.redirect_stderr(text):  # the shared console writes to sys.stderr as it is at print time
        out = run_rl(load_recipe(str(recipe), [], "rl"))
    return out, text.getvalue()


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC, "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def read_back(path: Path):
    import matplotlib.image

    return matplotlib.image.imread(str(path))


# ------------------------------------------------------------------------------------------------ the real run


def test_a_run_never_rewarded_gets_a_real_png_and_the_cold_start(unrewarded_run):
    out, console = unrewarded_run
    # Drawn at the end of `grpo rl`, and printed: the diagnosis names the cold start.
    assert (out / "report.png").is_file() and (out / "report.md").is_file()
    tail = console[console.index("report of") :]
    assert "never rewarded" in tail and "`grpo sft`" in tail
    report = report_run([out])
    data = report.picture.read_bytes()
    width, height = png_size(data)
    assert width >= 1000 and height >= 1000 and len(data) > 50_000
    pixels = read_back(report.picture)
    assert pixels.shape[:2] == (height, width) and pixels.std() > 0.05  # drawn, not blank
    run = read_run(out)
    from grpo_cli.report import _panels

    titles = [panel.title for panel in _panels([run])]
    for wanted in ("reward (weighted sum)", "reward: countdown_format", "reward: countdown_equation", "reward: flaky",
                   "accuracy (countdown_equation at its top score)", "completion length (tokens)", "clipped share",
                   "zero-variance groups", "entropy", "KL to the reference", "gradient norm", "learning rate",
                   "step time", "reward failures"):
        assert any(title.startswith(wanted) for title in titles), (wanted, titles)
    assert run.accuracy == {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0}  # from rollouts.jsonl: 16 completions per step
    (never,) = [f for f in report.findings[run.name] if f.name == "never_rewarded"]
    assert never.step == 1 and "grpo sft" in never.message and "--model_name_or_path" in never.message
    # Every group has one reward for all completions here, but that is the never-rewarded start: said once, as that.
    assert "zero_variance" not in [f.name for f in report.findings[run.name]]
    table = report.table.read_text()
    assert "never rewarded" in table and "| step | reward | countdown_format |" in table
    assert [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and
            line[2].isdigit()] == ["1", "2", "3", "4"]


def test_a_reward_failing_on_every_other_completion_is_named(unrewarded_run):
    out, _ = unrewarded_run
    (failing,) = [f for f in read_run(out).findings() if f.name.startswith("reward_failing")]
    assert failing.name == "reward_failing:flaky" and failing.step == 1
    assert "reward flaky failing: it failed on 50% of completions (raised or returned a non-number" in failing.message
    assert "--reward_timeout" not in failing.message  # it raised: no timeout among its failures


def test_a_reward_running_past_its_timeout_is_said_to_time_out(tmp_path):
    slow = {"rewards/judge/failed_frac": 0.5, "rewards/judge/timed_out_frac": 0.5}
    found = findings_of(tmp_path, [log(s, **(slow if s > 2 else {})) for s in range(1, 8)], reward_timeout=0.5)
    assert list(found) == ["reward_failing:judge"] and found["reward_failing:judge"].step == 3
    message = found["reward_failing:judge"].message
    assert "reward judge timing out: it ran past reward_timeout on 50% of completions" in message
    assert "--reward_timeout 2, now 0.5 s" in message


def test_live_findings_print_once_when_they_first_hold_and_go_to_swanlab(unrewarded_run):
    out, console = unrewarded_run
    live = console[: console.index("done:")]
    lines = [line for line in live.splitlines() if "never rewarded" in line]
    assert len(lines) == 1 and lines[0].startswith("step 1: never rewarded")
    assert live.index("step 3/4") < live.index("never rewarded") < live.index("step 4/4")  # when it first held
    assert sum("reward flaky failing" in line for line in live.splitlines()) == 1
    (run_dir,) = (out / "swanlog").glob("run-*")
    texts = [path.read_text() for path in (run_dir / "media").rglob("*.txt")]
    assert any(text.startswith("step 1: never rewarded") for text in texts)
    assert any("reward flaky failing" in text for text in texts)


def test_a_checkpoint_is_reported_from_its_own_state(unrewarded_run, tmp_path):
    out, _ = unrewarded_run
    report = report_run([out / "checkpoint-2"], output=str(tmp_path / "ck"))
    run = read_run(out / "checkpoint-2")
    assert run.steps == 2 and run.source == out / "checkpoint-2" / "trainer_state.json"
    assert sorted(run.accuracy) == [1, 2]  # rollouts of later steps left out
    assert report.picture == tmp_path / "ck" / "report.png" and png_size(report.picture.read_bytes())


def test_the_table_says_how_many_groups_are_solved_in_every_completion(tmp_path):
    """Zero-variance groups are solved or failed alike in `frac_reward_zero_std`; the rollouts tell them apart."""
    folder = write_state(tmp_path / "run", [log(1, frac_reward_zero_std=0.5), log(2, frac_reward_zero_std=1.0)])
    rows = []
    # step 1: A solved by both completions, B by one; step 2: A by none, B by both
    for done, prompt, equation in [(0, "A", 1.0), (0, "A", 1.0), (0, "B", 1.0), (0, "B", 0.0),
                                   (1, "A", 0.0), (1, "A", 0.0), (1, "B", 1.0), (1, "B", 1.0)]:
        rewards = {"countdown_format": 1.0, "countdown_equation": equation}
        rows.append({"step": done, "prompt": prompt, "completion": "x", "rewards": rewards, "advantage": 0.0})
    (folder / "rollouts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    run = read_run(folder)
    assert run.accuracy == {1: 0.75, 2: 0.5} and run.solved == {1: 0.5, 2: 0.5}
    header, _, first, second = [line for line in run_table(run) if line.startswith("|")]
    cells = dict(zip(header.split("|"), first.split("|"), strict=True))
    assert cells[" solved groups "].strip() == "50%" and cells[" zero-std groups "].strip() == "50%"
    assert dict(zip(header.split("|"), second.split("|"), strict=True))[" accuracy "].strip() == "50%"


def test_the_command_and_its_bad_input(unrewarded_run, tmp_path):
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    out, _ = unrewarded_run
    result = CliRunner().invoke(app, ["report", str(out), "--output", str(tmp_path / "cli")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cli" / "report.png").is_file()
    (tmp_path / "empty").mkdir()
    for args, message in (
        ([str(tmp_path / "missing")], "does not exist - give a run's output folder"),
        ([str(tmp_path / "empty")], "holds no training logs"),
        ([str(out), str(out), str(out)], "takes one or two folders"),
    ):
        with pytest.raises(UserError, match=message):
            report_run(args)
    # Through `grpo`'s entry point: one line, exit code 2, no traceback.
    import subprocess

    done = subprocess.run([sys.executable, "-m", "grpo_cli", "report", str(tmp_path / "empty")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error:") and "holds no training logs" in done.stderr


def test_garbage_logs_and_rollouts_are_skipped_not_a_traceback(tmp_path):
    """Lines of rollouts.jsonl and log entries that are JSON but not a row (a list, a number) are not rows."""
    run = tmp_path / "garbage"
    run.mkdir()
    (run / "rollouts.jsonl").write_text('garbage\n[1, 2]\n7\n{"step": "x", "rewards": []}\n')
    history = [5, [1], {"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.25}]
    (run / "train_summary.json").write_text(json.dumps({"global_step": 2, "log_history": history}))
    (run / "recipe.yaml").write_text("task: countdown\n")
    report_run([str(run)])
    assert (run / "report.png").is_file()
    (run / "train_summary.json").write_text("[1, 2, 3]")
    with pytest.raises(UserError, match="train_summary.json: a JSON list, not the object the trainer writes"):
        report_run([str(run)])


def test_two_runs_on_the_same_axes(unrewarded_run, tmp_path):
    out, _ = unrewarded_run
    change = write_state(tmp_path / "change", healthy_logs(12))
    report = report_run([out, change])
    assert report.picture == change / "report-vs-run.png"
    assert png_size(report.picture.read_bytes())[0] >= 1000
    assert set(report.findings) == {"run", "change"}
    assert report.findings["change"] == []  # a healthy run: nothing to say
    table = report.table.read_text()
    assert "## run" in table and "## change" in table and "Nothing found" in table


def test_eval_results_are_drawn_side_by_side(unrewarded_run, tiny_model_dir, tmp_path):
    from grpo_cli.eval import run_eval

    out, _ = unrewarded_run
    eval_dir = tmp_path / "eval"
    run_eval(str(out / "recipe.yaml"), [], models=[str(tiny_model_dir), str(out)], split="train", limit=2, max_new_tokens=4,
             output=str(eval_dir))
    report = report_run([eval_dir])
    assert report.picture == eval_dir / "report.png"
    pixels = read_back(report.picture)
    assert pixels.shape[1] >= 800
    table = report.table.read_text()
    for metric in ("| accuracy |", "| format rate |", "| pass@1 |", "| mean completion tokens |"):
        assert metric in table
    assert str(tiny_model_dir) in table and "run" in table.splitlines()[4]
    with pytest.raises(UserError, match="not one of each"):
        report_run([eval_dir, out])


def sft_run(tiny_model_dir: Path, out: Path) -> tuple[Path, str]:
    """2 real SFT steps of the tiny model on generated Countdown solutions; returns (output folder, console text)."""
    from grpo_cli.recipe import load_recipe
    from grpo_cli.train.sft import run_sft

    recipe = out.parent / f"{out.name}.yaml"
    recipe.write_text(
        f"model_name_or_path: {tiny_model_dir}\ndtype: float32\ntask: countdown\ndataset_generate: 8\n"
        f"max_length: 128\nper_device_train_batch_size: 2\nmax_steps: 2\nsave_steps: 2\noutput_dir: {out}\n"
    )
    text = io.StringIO()
    with contextlib.redirect_stderr(text):
        folder = run_sft(load_recipe(str(recipe), [], "sft"))
    return folder, text.getvalue()


def test_grpo_sft_reports_too_and_a_report_that_fails_never_fails_the_run(tiny_model_dir, tmp_path):
    out, console = sft_run(tiny_model_dir, tmp_path / "sft")
    assert png_size((out / "report.png").read_bytes())[0] >= 1000
    table = (out / "report.md").read_text()
    assert "| step | loss | token acc |" in table and "report of sft: 2 steps" in console
    # A folder in the way of report.png: the run still ends saved, with a one-line warning.
    broken = tmp_path / "broken"
    (broken / "report.png").mkdir(parents=True)
    (broken / "report.png" / "x").write_text("x")
    (broken / "recipe.yaml").write_text("{}\n")  # a grpo run's folder, so the run may write into it
    out, console = sft_run(tiny_model_dir, broken)
    assert (out / "model.safetensors").is_file()
    (warning,) = [line for line in console.splitlines() if "no report drawn" in line]
    assert warning.startswith("warning: no report drawn (IsADirectoryError") and "the run is saved" in warning


# ------------------------------------------------------------------------------------------------ written histories


def write_state(folder: Path, logs: list[dict], recipe: dict | None = None) -> Path:
    """A run folder holding a checkpoint's trainer_state.json (as transformers writes it: NaN as NaN) and recipe.yaml."""
    checkpoint = folder / f"checkpoint-{len(logs)}"
    checkpoint.mkdir(parents=True)
    history = [dict(entry, step=step) for step, entry in enumerate(logs, 1)]
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": len(logs), "log_history": history}))
    values = {"learning_rate": 1.0e-6, "beta": 0.04, "num_generations": 8, "max_completion_length": 256,
              "temperature": 1.0, "task": "countdown", **(recipe or {})}
    (folder / "recipe.yaml").write_text(yaml.safe_dump(values))
    return folder


def log(step: int, **values) -> dict:
    """A GRPO log entry of a run that learns: reward rising, groups telling completions apart."""
    entry = {
        "loss": 0.001, "grad_norm": 0.5, "learning_rate": 1e-6, "reward": 0.2 + 0.03 * step, "reward_std": 0.3,
        "frac_reward_zero_std": 0.1, "completions/mean_length": 100.0, "completions/clipped_ratio": 0.02,
        "entropy": 0.6, "kl": 0.001 * step, "step_time": 2.0, "rewards/countdown_format/failed_frac": 0.0,
    }
    entry.update(values)
    return entry


def healthy_logs(n: int) -> list[dict]:
    return [log(step) for step in range(1, n + 1)]


def findings_of(tmp_path: Path, logs: list[dict], **recipe) -> dict:
    recipe = {"per_device_train_batch_size": 64, **recipe}  # 8 groups of 8 completions a step
    return {f.name: f for f in read_run(write_state(tmp_path / "run", logs, recipe)).findings()}


def test_shares_of_groups_wait_for_enough_groups(tmp_path):
    """With the demo's batch (8 completions, 4 a prompt: 2 groups a step) a share of groups needs 8 steps."""
    flat = [log(s, frac_reward_zero_std=1.0, entropy=0.001) for s in range(1, 9)]
    demo = {"per_device_train_batch_size": 8, "num_generations": 4}
    assert findings_of(tmp_path / "short", flat[:7], **demo) == {}
    found = findings_of(tmp_path / "enough", flat, **demo)
    assert sorted(found) == ["entropy_collapse", "zero_variance"] and found["zero_variance"].step == 1


def test_a_healthy_run_has_no_findings(tmp_path):
    assert findings_of(tmp_path, healthy_logs(30)) == {}


def test_kl_rising_fast_names_the_step_and_beta(tmp_path):
    kls = [0.001, 0.002, 0.002, 0.003, 0.02, 0.05, 0.12, 0.3, 0.6, 0.9]
    found = findings_of(tmp_path, [log(s, kl=kl) for s, kl in enumerate(kls, 1)])
    assert list(found) == ["kl_rising"]
    assert found["kl_rising"].step == 3  # 0.002 -> 0.12 over steps 3-7: first held at step 7
    assert "from 0.002 to 0.12 over steps 3-7" in found["kl_rising"].message
    assert "--beta 0.08, now 0.04" in found["kl_rising"].message
    assert "--learning_rate 5.0e-07, now 1.0e-06" in found["kl_rising"].message


def test_steps_slowing_says_whether_completions_grew(tmp_path):
    times = [5.0] + [2.0] * 8 + [3.5, 3.6, 3.8]
    found = findings_of(tmp_path, [log(s, step_time=t) for s, t in enumerate(times, 1)])
    assert list(found) == ["steps_slowing"] and found["steps_slowing"].step == 10
    assert "1.8x as long" in found["steps_slowing"].message and "completions no longer" in found["steps_slowing"].message
    grew = [log(s, step_time=t, **{"completions/mean_length": 100.0 if t < 3 else 200.0})
            for s, t in enumerate(times, 1)]
    message = findings_of(tmp_path / "grew", grew)["steps_slowing"].message
    assert "completions grew from 100 to 200 tokens" in message and "--max_completion_length 200, now 256" in message


def test_steps_slow_for_more_work_are_no_finding(tmp_path):
    """`make demo`'s run: a step that trains every completion (none left out as a flat group) or whose longest
    completion hits the limit takes twice as long; its steps are no slower for the work they do."""
    def demo(step, time, longest, skipped):
        return log(step, step_time=time, frac_rows_skipped=skipped, **{"completions/max_length": longest,
                                                                       "completions/mean_length": 64.0})
    steps = [(15.4, 93, 0.875), (11.1, 63, 0.875), (28.1, 128, 0.5), (13.7, 65, 0.5), (11.7, 74, 0.875),
             (24.6, 128, 0.5), (13.9, 59, 0.5), (25.7, 79, 0.0)]
    assert "steps_slowing" not in findings_of(tmp_path / "demo", [demo(s, *v) for s, v in enumerate(steps, 1)])
    # three times as long for the same work: something else slows them
    slower = steps[:5] + [(45.0, 70, 0.5), (44.0, 70, 0.5), (46.0, 70, 0.0)]
    found = findings_of(tmp_path / "slower", [demo(s, *v) for s, v in enumerate(slower, 1)])
    message = found["steps_slowing"].message
    assert "3.3x as long" in message and "per step), more than their work explains (trained tokens 2.1x)" in message
    assert "something besides the model slows them" in message


def test_entropy_collapse_begins_where_it_stays_low(tmp_path):
    entropies = [0.6, 0.01, 0.01, 0.5, 0.015, 0.01, 0.005, 0.004]
    found = findings_of(tmp_path, [log(s, entropy=e) for s, e in enumerate(entropies, 1)])
    assert list(found) == ["entropy_collapse"] and found["entropy_collapse"].step == 5
    assert "--temperature 1.2, now 1" in found["entropy_collapse"].message


def test_reward_flat_while_groups_differ_asks_for_a_higher_learning_rate(tmp_path):
    flat = [log(s, reward=0.5 + (0.04 if s % 2 else -0.04)) for s in range(1, 56)]
    found = findings_of(tmp_path, flat, learning_rate=2e-6)
    assert list(found) == ["reward_flat"] and found["reward_flat"].step == 1
    assert "reward flat at 0.500" in found["reward_flat"].message and "--learning_rate 4.0e-06" in found[
        "reward_flat"].message


def test_most_groups_zero_variance(tmp_path):
    logs = [log(s, frac_reward_zero_std=0.1 if s < 4 else 0.8) for s in range(1, 10)]
    found = findings_of(tmp_path, logs)
    assert list(found) == ["zero_variance"] and found["zero_variance"].step == 4
    assert "80% of groups" in found["zero_variance"].message and "--num_generations 16, now 8" in found[
        "zero_variance"].message


def test_zero_variance_says_which_way_the_prompts_are_off_where_solved_groups_are_logged(tmp_path):
    """Groups without variance are solved (every completion right: harder prompts) or failed alike (easier ones);
    `frac_groups_solved` in the logs says which, over the logs where the finding first held."""
    solved = [log(s, frac_reward_zero_std=0.1 if s < 4 else 0.8, frac_groups_solved=0.0 if s < 4 else 0.7)
              for s in range(1, 10)]
    message = findings_of(tmp_path, solved)["zero_variance"].message
    assert "harder prompts: 70% of groups got every completion right" in message and "easier" not in message
    failed = [log(s, frac_reward_zero_std=0.1 if s < 4 else 0.8, frac_groups_solved=0.1) for s in range(1, 10)]
    message = findings_of(tmp_path / "failed", failed)["zero_variance"].message
    assert "easier prompts, or a cold start on the task first: only 10% of groups" in message and "harder" not in message
    # without the key (a task with no reward for correct answers) the advice names both directions
    assert "harder if it solves them all, easier if none" in findings_of(
        tmp_path / "unknown", [log(s, frac_reward_zero_std=0.8) for s in range(1, 5)])["zero_variance"].message


def test_with_dynamic_sampling_only_the_groups_trained_on_count(tmp_path):
    """Dynamic sampling drops the groups without variance: most scored groups having none is its work, not a
    finding; the dropped groups that still had to fill the batch are."""
    dropped = [log(s, frac_reward_zero_std=0.8, **{"dynamic_sampling/filled_share": 0.0}) for s in range(1, 10)]
    assert findings_of(tmp_path, dropped, dynamic_sampling=True) == {}
    filled = [log(s, frac_reward_zero_std=0.9, **{"dynamic_sampling/filled_share": 0.1 if s < 5 else 0.6})
              for s in range(1, 10)]
    found = findings_of(tmp_path / "filled", filled, dynamic_sampling=True, dynamic_sampling_max_rounds=2)
    assert list(found) == ["zero_variance"] and found["zero_variance"].step == 5
    message = found["zero_variance"].message
    assert "60% of the groups trained on" in message and "--dynamic_sampling_max_rounds 4, now 2" in message


def test_truncation_high_and_length_collapse(tmp_path):
    cut = [log(s, **{"completions/clipped_ratio": 0.45}) for s in range(1, 6)]
    found = findings_of(tmp_path, cut)
    assert list(found) == ["truncation_high"] and found["truncation_high"].step == 1
    assert "45% of completions" in found["truncation_high"].message
    assert "--max_completion_length 512, now 256" in found["truncation_high"].message
    collapsed = healthy_logs(4) + [log(s, reward=0.0, reward_std=0.0, frac_reward_zero_std=1.0,
                                       **{"completions/clipped_ratio": 1.0}) for s in range(5, 9)]
    found = findings_of(tmp_path / "collapse", collapsed)
    assert found["length_collapse"].step == 5 and "best 0.320 at step 4" in found["length_collapse"].message
    assert "never_rewarded" not in found  # rewarded before: not a cold-start problem


def test_non_finite_steps_are_found_and_marked(tmp_path):
    logs = healthy_logs(6)
    logs[2]["grad_norm"] = float("nan")  # json.dumps writes NaN, as transformers does in trainer_state.json
    folder = write_state(tmp_path / "run", logs)
    assert "NaN" in (folder / "checkpoint-6" / "trainer_state.json").read_text()
    run = read_run(folder)
    (finding,) = run.findings()
    assert finding.name == "nonfinite" and finding.step == 3
    assert "gradient norm" in finding.message and "--max_grad_norm" in finding.message
    report = report_run([folder])
    assert "| 3 |" in report.table.read_text() and "non-finite |" in report.table.read_text()
    # train_summary.json writes NaN as null (strict JSON): the same step is found from it.
    summary = {"log_history": [dict(e, step=s) for s, e in enumerate(logs, 1)], "non_finite_steps": []}
    summary["log_history"][2]["grad_norm"] = None
    (folder / "train_summary.json").write_text(json.dumps(summary))
    assert [f.step for f in read_run(folder).findings()] == [3]


def test_a_long_table_has_one_row_per_n_steps(tmp_path):
    report = report_run([write_state(tmp_path / "run", healthy_logs(120))])
    rows = [line for line in report.table.read_text().splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 24 and rows[0].startswith("| 5 |") and rows[-1].startswith("| 120 |")
    assert "One row per 5 steps" in report.table.read_text()


def test_the_watch_says_each_finding_once_with_the_step_it_began():
    watch = FindingWatch({"learning_rate": 1e-6})
    said = []
    logs = [{"reward": 0.5, "reward_std": 0.2, "completions/clipped_ratio": 0.1, "entropy": 0.3}] * 2
    logs += [{"reward": 0.0, "reward_std": 0.0, "completions/clipped_ratio": 1.0, "entropy": 0.3}] * 5
    for step, entry in enumerate(logs, 1):
        said += [(step, f) for f in watch.update(step, entry)]
    names = [(step, f.name, f.step) for step, f in said]
    assert (5, "length_collapse", 3) in names and (5, "truncation_high", 3) in names and len(names) == 2
    assert "best 0.500 at step 1" in {f.name: f.message for _, f in said}["length_collapse"]
    # Entropy near zero for three logs in a row; a healthy log in between resets the count.
    watch = FindingWatch()
    entropies = [0.3, 0.01, 0.01, 0.2, 0.005, 0.004, 0.003, 0.002]
    said = [f for step, e in enumerate(entropies, 1) for f in watch.update(step, {"entropy": e})]
    assert [(f.name, f.step) for f in said] == [("entropy_collapse", 5)]
    # The closing log and evaluation logs are not steps.
    assert watch.update(9, {"train_runtime": 10.0}) == [] and watch.update(9, {"eval_loss": 1.0}) == []
    assert diagnose(watch.history) == [said[0]]
