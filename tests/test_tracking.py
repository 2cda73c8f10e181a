"""SwanLab tracking: when it is on, its settings traps, and a real tiny GRPO run logged offline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from grpo_cli.arguments import TrackingArguments
from grpo_cli.errors import UserError
from grpo_cli.recipe.check import tracking_problems
from grpo_cli.train.tracking import swanlab_callback, swanlab_project


@pytest.fixture
def no_swanlab_login(monkeypatch, tmp_path):
    """No API key anywhere swanlab looks: env, ./.env, ./.swanlab/.netrc, the user's SwanLab folder."""
    monkeypatch.delenv("SWANLAB_API_KEY", raising=False)
    monkeypatch.setenv("SWANLAB_ROOT", str(tmp_path / "swanlab-home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_off_or_disabled_means_no_callback(tmp_path):
    assert swanlab_callback(TrackingArguments(swanlab=False), str(tmp_path), "run", {}) is None
    disabled = TrackingArguments(swanlab=True, swanlab_mode="disabled")
    assert swanlab_callback(disabled, str(tmp_path), "run", {}) is None


def test_swanlab_project_env_crashes_swanlab_and_is_taken_out(monkeypatch):
    import swanlab

    monkeypatch.setenv("SWANLAB_PROJECT", "from-env")
    with pytest.raises(Exception, match="project"):
        swanlab.Settings()  # the trap in swanlab 0.10.3: the variable is parsed as the nested `project` settings
    assert swanlab_project(TrackingArguments(swanlab=True)) == "from-env"
    assert "SWANLAB_PROJECT" not in os.environ
    swanlab.Settings()
    monkeypatch.setenv("SWANLAB_PROJECT", "from-env")
    assert swanlab_project(TrackingArguments(swanlab=True, swanlab_project="mine")) == "mine"
    assert "SWANLAB_PROJECT" not in os.environ


def test_cloud_without_api_key_is_a_user_error_before_training(no_swanlab_login, monkeypatch):
    cloud = TrackingArguments(swanlab=True, swanlab_mode="cloud")
    monkeypatch.setenv("SWANLAB_PROJECT", "from-env")  # must not crash the key lookup
    with pytest.raises(UserError) as caught:
        swanlab_callback(cloud, str(no_swanlab_login / "out"), "run", {})
    (problem,) = caught.value.problems
    assert "SWANLAB_API_KEY" in problem and "swanlab_mode: local/offline" in problem
    assert tracking_problems(TrackingArguments(swanlab=True, swanlab_mode="offline")) == []


def test_cloud_with_an_api_key_from_env_or_dotenv(no_swanlab_login, monkeypatch):
    from transformers import TrainerCallback

    cloud = TrackingArguments(swanlab=True, swanlab_mode="cloud")
    (no_swanlab_login / ".env").write_text("SWANLAB_API_KEY=abcdefghijklmnopqrstu\n")
    assert tracking_problems(cloud) == []
    (no_swanlab_login / ".env").unlink()
    assert tracking_problems(cloud) != []
    monkeypatch.setenv("SWANLAB_API_KEY", "abcdefghijklmnopqrstu")
    callback = swanlab_callback(cloud, str(no_swanlab_login / "out"), "run", {})
    assert isinstance(callback, TrainerCallback)  # nothing contacted yet: the run starts at train begin


def test_local_mode_needs_the_dashboard_package(tmp_path):
    import importlib.util

    if importlib.util.find_spec("swanboard") is not None:
        pytest.skip("swanboard is installed")
    local = TrackingArguments(swanlab=True, swanlab_mode="local")
    with pytest.raises(UserError, match=r"swanlab\[dashboard\].*offline"):
        swanlab_callback(local, str(tmp_path), "run", {})


def test_only_the_main_process_starts_a_run(tmp_path):
    import swanlab
    from transformers import TrainerControl, TrainerState, TrainingArguments

    offline = TrackingArguments(swanlab=True, swanlab_mode="offline")
    callback = swanlab_callback(offline, str(tmp_path), "run", {"seed": 1})
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    worker = TrainerState(is_world_process_zero=False)
    callback.on_train_begin(args, worker, TrainerControl())
    callback.on_log(args, worker, TrainerControl(), logs={"reward": 1.0})
    callback.on_train_end(args, worker, TrainerControl())
    assert not swanlab.has_run()
    assert not (tmp_path / "swanlog").exists()


def format_reward(completions, **kwargs):
    return [1.0 if "a" in c[0]["content"] else 0.0 for c in completions]


def test_tiny_grpo_run_logged_offline(tiny_grpo_trainer, tmp_path, monkeypatch, capsys):
    from grpo_cli.train.progress import RunConsole, remove_default_printers

    monkeypatch.setenv("SWANLAB_PROJECT", "project-from-env")
    output_dir = tmp_path / "my-run"
    trainer = tiny_grpo_trainer(output_dir, [format_reward], learning_rate=1e-6)
    tracking = TrackingArguments(swanlab=True, swanlab_mode="offline", sample_every=1, sample_count=2)
    recipe = {"task": "countdown", "seed": 7, "reward_funcs": ["format_reward"], "learning_rate": 0.123}
    tracker = swanlab_callback(tracking, str(output_dir), None, recipe)
    run_console = RunConsole(tracking)
    for callback in (run_console, tracker):
        callback.bind(trainer)
        trainer.add_callback(callback)
    remove_default_printers(trainer)
    trainer.train()
    err = capsys.readouterr().err

    logdir = output_dir / "swanlog"
    assert f"swanlab (offline): logging to {logdir}" in err
    assert "step 2/2 | reward " in err
    (run_dir,) = logdir.glob("run-*")
    data = next(run_dir.glob("*.swanlab")).read_bytes()
    for key in (b"train/reward", b"train/rewards/format_reward/mean", b"train/completions/mean_length"):
        assert key in data, key
    # The project comes from the env var, the experiment's name from the output folder.
    assert b"project-from-env" in data and b"my-run" in data
    assert b"samples/completions" in data
    texts = sorted(Path(run_dir, "media").rglob("*.txt"))
    assert len(texts) == 4 and all("COMPLETION:" in t.read_text() for t in texts)  # 2 samples x 2 steps
    config = yaml.safe_load((run_dir / "files" / "config.yaml").read_text())
    assert config["task"]["value"] == "countdown" and config["seed"]["value"] == 7
    assert config["learning_rate"]["value"] == 0.123  # the recipe wins over TrainingArguments' copy
    import swanlab

    assert not swanlab.has_run()  # finished at train end
