"""Output paths are checked before any work: a command that cannot write its result says so at once (exit code 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import mounted_tmpfs

from grpo_cli.atomic import check_writable, json_text, old_folder_name, replace_folder
from grpo_cli.errors import UserError

DATA = Path(__file__).parent / "data"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "grpo_cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)


def test_check_writable_names_what_is_wrong(tmp_path):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-folder").mkdir()
    with pytest.raises(UserError, match="--out .*a-folder is a folder - give a file path"):
        check_writable(tmp_path / "a-folder", "--out")
    with pytest.raises(UserError, match="--output .*a-file is a file - give a folder path"):
        check_writable(tmp_path / "a-file", "--output", folder=True)
    with pytest.raises(UserError, match="which is a file"):
        check_writable(tmp_path / "a-file" / "x.jsonl", "--out")
    check_writable(tmp_path / "new" / "deeper" / "x.jsonl", "--out")  # missing folders are made later


def test_replace_folder_swaps_a_finished_folder_in(tmp_path):
    target, staging = tmp_path / "model", tmp_path / ".model.tmp"
    staging.mkdir()
    (staging / "weights").write_text("new")
    replace_folder(staging, target)  # no folder there yet
    assert (target / "weights").read_text() == "new" and not staging.exists()

    staging.mkdir()
    (staging / "weights").write_text("newer")
    (target / "stale").write_text("from the old folder")
    replace_folder(staging, target)
    assert sorted(p.name for p in target.iterdir()) == ["weights"]  # the old folder went whole, not merged
    assert (target / "weights").read_text() == "newer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing parked beside it
    assert not old_folder_name(target).exists()


def test_strict_json_writes_nan_and_inf_as_null():
    assert json_text({"a": float("nan"), "b": [1.0, float("inf")], "c": (float("-inf"),)}) == (
        '{"a": null, "b": [1.0, null], "c": [null]}'
    )


def test_commands_refuse_an_output_they_cannot_write_before_working(tmp_path, tiny_model_dir):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-folder").mkdir()
    scored = run_cli("rewards", "score", "-c", "countdown", "-i", str(DATA / "countdown_completions.jsonl"),
                     "-o", str(tmp_path / "a-folder"))
    data = run_cli("data", "countdown", "--num", "4", "--out", str(tmp_path / "a-file" / "cd.jsonl"))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model_name_or_path: {tiny_model_dir}\ndtype: float32\ntask: countdown\ndataset_generate: 20\n"
                      "dataset_test_size: 4\n")
    evaluated = run_cli("eval", "-c", str(recipe), "--limit", "2", "-o", str(tmp_path / "a-file"))
    for proc, says in ((scored, "is a folder"), (data, "which is a file"), (evaluated, "is a file")):
        assert proc.returncode == 2, proc.stderr
        assert says in proc.stderr and "Traceback" not in proc.stderr
    assert "loading" not in evaluated.stderr.lower()  # refused before any model was loaded


def test_a_read_only_output_is_refused(tmp_path, tiny_model_dir, tiny_adapter_dir):
    with mounted_tmpfs(tmp_path / "locked", "ro,size=1m") as locked:
        merged = run_cli("merge", "--adapter", str(tiny_adapter_dir), "--base", str(tiny_model_dir),
                         "--output", str(locked / "merged"))
        data = run_cli("data", "countdown", "--num", "4", "--out", str(locked / "cd.jsonl"))
    for proc in (merged, data):
        assert proc.returncode == 2, proc.stderr
        assert "is not writable" in proc.stderr and "Traceback" not in proc.stderr


def test_written_files_are_as_readable_as_the_umask_says(tmp_path):
    import os

    from grpo_cli.atomic import write_text

    before = os.umask(0o022)
    try:
        write_text(tmp_path / "a.json", "{}")
        os.umask(0o077)
        write_text(tmp_path / "b.json", "{}")
    finally:
        os.umask(before)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644  # tempfile alone leaves 0600
    assert (tmp_path / "b.json").stat().st_mode & 0o777 == 0o600
