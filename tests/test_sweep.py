"""A sweep of hostile inputs through `grpo`'s own entry point: each is one clear message (or a clean success), the
exit code the README promises, never a traceback, and nothing of the user's replaced.

Each case: the files it writes into a fresh folder, the command line, the exit code and a text the output must hold.
A new class of mistake found later belongs here as one more row.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
ROW = '{"nums": [1, 2, 3], "target": 6}\n'
ALIAS_BOMB = "model_name_or_path: m\n" + "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" if i else "l0: &l0 [x, x, x, x, x, x, x, x, x]\n"
    for i in range(9)
)
EXITS_AT_IMPORT = "import sys\nsys.exit(0)\ndef r(completions, **kw):\n    return [0.0] * len(completions)\n"

# id: (files, command, exit code, text in the output)
CASES = {
    "null learning_rate": (
        {"r.yaml": "model_name_or_path: m\nlearning_rate:\n"},
        ["check", "-c", "r.yaml"], 2, "`learning_rate` has no value (null)",
    ),
    "negative top_k": ({"r.yaml": "model_name_or_path: m\ntop_k: -5\n"}, ["check", "-c", "r.yaml"], 2, "`top_k` is -5"),
    "seed beyond 2^32": (
        {"r.yaml": "model_name_or_path: m\n"}, ["check", "-c", "r.yaml", "--seed", str(2**70)], 2, "`seed` is",
    ),
    "empty output_dir": ({"r.yaml": "model_name_or_path: m\noutput_dir: ''\n"}, ["check", "-c", "r.yaml"], 2,
                         "`output_dir`"),
    "YAML mapping without a space": (
        {"r.yaml": "model_name_or_path: m\ngradient_checkpointing_kwargs: {use_reentrant:true}\n"},
        ["check", "-c", "r.yaml"], 2, "YAML needs a space after the colon",
    ),
    "YAML alias bomb": ({"r.yaml": ALIAS_BOMB}, ["check", "-c", "r.yaml"], 2, "expand to more than"),
    "unknown command to check": ({}, ["check", "-c", "countdown", "--command", "foo"], 2,
                                 "is not a training command"),
    "markup in paths": (
        {"r[/].yaml": "model_name_or_path: m\noutput_dir: 'out[/]x'\n"}, ["check", "-c", "r[/].yaml"], 0, "out[/]x",
    ),
    "10^12 generated tasks": ({}, ["data", "countdown", "-n", str(10**12), "--out", "d.jsonl"], 2,
                              "must be at most 1,000,000"),
    "data over a user's file": ({"mine.jsonl": "precious\n"}, ["data", "countdown", "-n", "3", "--out", "mine.jsonl"],
                                2, "already exists - choose another path, or pass --force"),
    "scores over a user's file": (
        {"mine.jsonl": "precious\n"},
        ["rewards", "score", "-c", "countdown", "-i", str(DATA / "countdown_completions.jsonl"), "-o", "mine.jsonl"],
        2, "already exists - choose another path, or pass --force",
    ),
    "U+2028 inside a JSON string": (
        {"c.jsonl": '{"nums": [1, 2, 3], "target": 6, "completion": "a\u2028b</think><answer>1+2+3</answer>"}\n'},
        ["rewards", "score", "-c", "countdown", "-i", "c.jsonl"], 0, '"reward"',
    ),
    "a reward module that exits at import": (
        {"bye.py": EXITS_AT_IMPORT, "c.jsonl": '{"nums": [1, 2, 3], "target": 6, "completion": "x"}\n'},
        ["rewards", "score", "-c", "countdown", "-i", "c.jsonl", "--reward_funcs", "bye.py:r", "--reward_weights", "1"], 2,
        "exited (code 0) before it finished",
    ),
    "a null dataset line": (
        {"d.jsonl": ROW * 3 + "null\n"},
        ["rewards", "test", "-c", "countdown", "--dataset_name", "d.jsonl", "--dataset_generate", "0"], 2,
        "line 4: a JSON null, not an object",
    ),
    "a target that is no number": (
        {"d.jsonl": ROW * 3 + '{"nums": [1, 2], "target": "x"}\n'},
        ["rewards", "test", "-c", "countdown", "--dataset_name", "d.jsonl", "--dataset_generate", "0",
         "--dataset_test_size", "0"], 2, "'target' must be a whole number",
    ),
    "a NaN temperature to eval": ({}, ["eval", "-c", "demo/countdown-rl", "--model", "m", "--temperature", "nan"], 2,
                                  "--temperature must be a finite number above 0"),
    "the training key num_generations to eval": (
        {}, ["eval", "-c", "demo/countdown-rl", "--model", "m", "--num_generations", "8"], 2,
        "sample k completions per prompt with --num-generations K",
    ),
    "a report of garbage logs": (
        {"run/train_summary.json": "[1, 2, 3]"}, ["report", "run"], 2, "not the object the trainer writes",
    ),
    "a report of garbage rollouts": (
        {"run/train_summary.json": '{"global_step": 1, "log_history": [5, {"step": 1, "reward": 0.5}]}',
         "run/rollouts.jsonl": "garbage\n[1]\n7\n"},
        ["report", "run"], 0, "wrote",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_input(case, tmp_path):
    files, command, code, says = CASES[case]
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    before = {name: (tmp_path / name).read_bytes() for name in files}
    env = {**os.environ, "COLUMNS": "200", "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, "-m", "grpo_cli", *command], cwd=tmp_path, capture_output=True, text=True,
                         check=False, env=env, timeout=300)  # fmt: skip
    output = run.stdout + run.stderr
    assert "Traceback" not in output, output[-3000:]
    assert run.returncode == code, output[-3000:]
    assert says in output.replace("\n", " ") or says in output, output[-3000:]
    if code == 2:  # a refused command changed none of the files it was given
        assert {name: (tmp_path / name).read_bytes() for name in files} == before
