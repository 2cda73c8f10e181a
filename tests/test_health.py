"""The step guard on real GRPO and SFT steps of a tiny model: non-finite steps are skipped, counted and named, a
run of them stops with exit code 2 and leaves its last checkpoint resumable, and NaN weights are refused."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_train import recipe_file, state, train

from grpo_cli.errors import UserError
from grpo_cli.train.stall import FROZEN_AFTER_CHECKS, StallWatch

pytestmark = pytest.mark.slow

# A reward that turns infinite after INF_AFTER calls (one call per generation batch), for a real non-finite step.
FLAKY_REWARD = """
import os
CALLS = [0]

def flaky(completions, **kwargs):
    CALLS[0] += 1
    after = int(os.environ.get("INF_AFTER", "0"))
    texts = [c[-1]["content"] for c in completions]
    if after and CALLS[0] > after:
        return [float("inf")] * len(texts)
    return [sum(ch in "aeiou" for ch in t) / max(1, len(t)) for t in texts]
"""


def flaky_recipe(tmp_path: Path, model: Path, extra: str = "") -> Path:
    path = recipe_file(tmp_path, model, "rl", extra)
    (tmp_path / "flaky.py").write_text(FLAKY_REWARD)
    text = path.read_text().replace(
        f'"{tmp_path / "my_rewards.py"}:vowel_share"', f'"{tmp_path / "flaky.py"}:flaky"'
    )
    path.write_text(text)
    return path


def poisoned_backward(monkeypatch, bad_calls: set[int]) -> list[str]:
    """Make the real backward pass of the listed micro-batches (1-based) put NaN into one weight's gradient: the
    first trainable weight of a decoder layer, whose name the returned list holds once the model is loaded."""
    import torch

    from grpo_cli.train.run import TrainingRun

    load = TrainingRun.load_model
    calls = [0]
    poisoned: list[str] = []

    def load_with_hook(self):
        model = load(self)
        name, weight = next((n, p) for n, p in model.named_parameters() if p.requires_grad and ".layers." in n)
        poisoned.append(name)

        def hook(grad):
            calls[0] += 1
            return grad * torch.nan if calls[0] in bad_calls else grad

        weight.register_hook(hook)
        return model

    monkeypatch.setattr(TrainingRun, "load_model", load_with_hook)
    return poisoned


def trainable_tensors(out: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as weights:
        return len(list(weights.keys()))


def losses_and_rewards(out: Path) -> list[tuple]:
    history = json.loads((out / "train_summary.json").read_text())["log_history"]
    return [(e["step"], e.get("loss"), e.get("reward"), e.get("grad_norm")) for e in history if "reward" in e]


def test_a_nan_gradient_is_skipped_counted_and_leaves_the_weights_alone(tmp_path, tiny_model_dir, monkeypatch):
    from safetensors.torch import load_file

    poisoned = poisoned_backward(monkeypatch, {2})
    path = recipe_file(tmp_path, tiny_model_dir, "rl", "beta: 0.0\n")
    out = train(path, "rl", ["--max_steps", "3"])
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["skipped_steps"] == 1
    # The one gradient that was NaN before clipping (which makes them all NaN) is named.
    gradients = {"non_finite": 1, "of": trainable_tensors(out), "first": poisoned[0], "last": poisoned[0]}
    assert summary["non_finite_steps"] == [{"step": 2, "non_finite": ["gradient norm"], "gradients": gradients}]
    assert summary["global_step"] == 3 and summary["stopped"] is None
    # Step 2 applied nothing: its checkpoint holds step 1's weights; step 3 trained on.
    one, two = load_file(str(out / "checkpoint-1" / "model.safetensors")), None
    two = load_file(str(out / "checkpoint-2" / "model.safetensors"))
    three = load_file(str(out / "model.safetensors"))
    assert all((one[k] == two[k]).all() for k in one)
    assert any(not (two[k] == three[k]).all() for k in two)
    assert all(bool(t.isfinite().all()) for t in three.values())
    # Strict JSON although the logged grad_norm of step 2 was NaN.
    assert "NaN" not in (out / "train_summary.json").read_text()


def test_nan_gradients_in_a_row_stop_with_the_keys_that_usually_help(tmp_path, tiny_model_dir, monkeypatch):
    from grpo_cli.train.health import NonFiniteStop

    poisoned_backward(monkeypatch, {2, 3, 4})
    path = recipe_file(tmp_path, tiny_model_dir, "rl", "beta: 0.01\ncudnn_attention: true\n")
    with pytest.raises(NonFiniteStop) as stop:
        train(path, "rl", ["--max_steps", "6"])
    text = str(stop.value)
    assert "--cudnn_attention false (now true)" in text
    assert "training stopped at step 4: 3 steps in a row (2, 3, 4) had non-finite values (gradient norm)" in text
    assert f"The last healthy checkpoint is {tmp_path / 'rl' / 'checkpoint-3'}" in text  # none saved at the stop
    assert "--learning_rate 5.0e-04 (now 1.0e-03)" in text and "--max_grad_norm 0.5 (now 1)" in text
    assert "--beta 0 (now 0.01)" in text
    assert not (tmp_path / "rl" / "model.safetensors").exists()


def test_training_keeps_torch_off_its_cudnn_attention_unless_the_recipe_lets_it(tmp_path, tiny_model_dir):
    """Both commands: a run turns scaled_dot_product_attention's cuDNN kernels off (their backward makes NaN query
    gradients on padded batches of some lengths), `cudnn_attention: true` leaves them on, and the process has them as
    before once the run is over."""
    import torch

    from grpo_cli.recipe import load_recipe
    from grpo_cli.train.run import TrainingRun

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        for command in ("rl", "sft"):
            path = recipe_file(tmp_path / command, tiny_model_dir, command)
            torch.backends.cuda.enable_cudnn_sdp(True)
            run = TrainingRun(load_recipe(str(path), [], command))
            assert not torch.backends.cuda.cudnn_sdp_enabled()
            run.close()
            assert torch.backends.cuda.cudnn_sdp_enabled()
            torch.backends.cuda.enable_cudnn_sdp(False)
            run = TrainingRun(load_recipe(str(path), ["--cudnn_attention", "true"], command), overwrite=True)
            assert torch.backends.cuda.cudnn_sdp_enabled()
            run.close()
            assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def test_the_guard_does_not_change_a_healthy_run(tmp_path, tiny_model_dir):
    three = ["--max_steps", "3"]
    on = train(recipe_file(tmp_path / "on", tiny_model_dir, "rl", "beta: 0.0\n"), "rl", three)
    off = train(recipe_file(tmp_path / "off", tiny_model_dir, "rl", "beta: 0.0\nnonfinite_guard: false\n"), "rl", three)
    assert losses_and_rewards(on) == losses_and_rewards(off)
    assert len(losses_and_rewards(on)) == 3
    assert json.loads((on / "train_summary.json").read_text())["skipped_steps"] == 0


def test_non_finite_steps_in_a_row_stop_the_run_with_exit_2_and_a_resumable_checkpoint(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    """NaN gradients from step 3 on: steps 3-5 are skipped, `grpo rl` stops at step 5 with exit code 2 and one
    message; checkpoint-4 (saved on a skipped step, so step 2's weights) is intact, no final model is written, and
    the same command resumes from it."""
    from grpo_cli.cli import main

    poisoned_backward(monkeypatch, {3, 4, 5, 6, 7, 8})
    path = recipe_file(tmp_path, tiny_model_dir, "rl", "beta: 0.0\n")
    command = ["grpo", "rl", "-c", str(path), "--max_steps", "8", "--save_steps", "2"]
    monkeypatch.setattr(sys, "argv", command)
    with pytest.raises(SystemExit) as exit_:
        main()
    text = capsys.readouterr().err
    assert exit_.value.code == 2, text
    assert "Traceback" not in text
    for step in (3, 4, 5):
        assert f"step {step}: non-finite gradient norm - update skipped" in text
    assert f"non-finite gradients in 1 of {trainable_tensors(tmp_path / 'rl' / 'checkpoint-2')} tensors: " in text
    assert "training stopped at step 5: 3 steps in a row (3, 4, 5) had non-finite values (gradient norm)" in text
    out = tmp_path / "rl"
    assert f"The last healthy checkpoint is {out / 'checkpoint-4'}" in text
    assert "--learning_rate" in text and "done:" not in text
    assert not (out / "model.safetensors").exists()  # no final model
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    summary = json.loads((out / "train_summary.json").read_text())
    assert [b["step"] for b in summary["non_finite_steps"]] == [3, 4, 5] and summary["stopped"]
    monkeypatch.undo()  # healthy again: the same command resumes from checkpoint-4
    resumed = train(path, "rl", ["--max_steps", "5", "--save_steps", "2"])
    assert state(resumed / "checkpoint-5")["global_step"] == 5
    assert (resumed / "model.safetensors").is_file()


def test_a_reward_returning_inf_is_its_failure_not_a_skipped_step(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("INF_AFTER", "1")
    out = train(flaky_recipe(tmp_path, tiny_model_dir, "use_peft: true\nlora_r: 4\n"), "rl", ["--max_steps", "3"])
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["skipped_steps"] == 0
    failed = [e["rewards/flaky/failed_frac"] for e in summary["log_history"] if "rewards/flaky/failed_frac" in e]
    assert failed == [0.0, 1.0, 1.0]


def test_sft_skips_a_nan_gradient(tmp_path, tiny_model_dir, monkeypatch):
    """Without clipping (`max_grad_norm: 0`) too, the guard reads the gradients as the backward left them."""
    poisoned = poisoned_backward(monkeypatch, {1})
    out = train(recipe_file(tmp_path, tiny_model_dir, "sft", "max_grad_norm: 0\n"), "sft")
    summary = json.loads((out / "train_summary.json").read_text())
    (bad,) = summary["non_finite_steps"]
    assert bad["step"] == 1 and bad["non_finite"] == ["gradient norm"]
    assert bad["gradients"]["non_finite"] == 1 and bad["gradients"]["first"] == poisoned[0]


@pytest.fixture(scope="module")
def nan_model_dir(tmp_path_factory, tiny_model_dir) -> Path:
    """The tiny model with one NaN in one weight: what a diverged run leaves behind."""
    import shutil

    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("nan_model")
    shutil.copytree(tiny_model_dir, out, dirs_exist_ok=True)
    weights = load_file(str(out / "model.safetensors"))
    name = sorted(weights)[3]  # a layer's weight, past the embeddings
    weights[name][0, 0] = float("nan")
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def run_cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "grpo_cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)


def test_rl_sft_and_eval_refuse_a_model_with_nan_weights(tmp_path, nan_model_dir):
    for command in ("rl", "sft"):
        path = recipe_file(tmp_path / command, nan_model_dir, command)
        with pytest.raises(UserError, match=r"holds non-finite weights \(NaN or inf\), first in model\."):
            train(path, command)
    recipe = recipe_file(tmp_path / "eval", nan_model_dir, "rl", "dataset_test_size: 4\n")
    proc = run_cli("eval", "-c", str(recipe), "--model", str(nan_model_dir), "--limit", "2", "-o", str(tmp_path / "e"))
    assert proc.returncode == 2, proc.stderr
    assert "non-finite weights" in proc.stderr and "Traceback" not in proc.stderr


def test_merge_refuses_an_adapter_with_nan_weights(tmp_path, tiny_model_dir, tiny_adapter_dir):
    import shutil

    from safetensors.torch import load_file, save_file

    adapter = tmp_path / "adapter"
    shutil.copytree(tiny_adapter_dir, adapter)
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    name = min(k for k in weights if "lora_B" in k)
    weights[name].fill_(float("inf"))
    save_file(weights, str(adapter / "adapter_model.safetensors"), metadata={"format": "pt"})
    proc = run_cli("merge", "--adapter", str(adapter), "--base", str(tiny_model_dir), "--output", str(tmp_path / "m"))
    assert proc.returncode == 2, proc.stderr
    assert "non-finite weights" in proc.stderr and "lora_B" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "m").exists()


def test_resuming_a_checkpoint_with_nan_weights_is_refused(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file, save_file

    path = recipe_file(tmp_path, tiny_model_dir, "rl", "use_peft: true\nlora_r: 4\n")
    out = train(path, "rl")
    weights_file = out / "checkpoint-2" / "adapter_model.safetensors"
    weights = load_file(str(weights_file))
    weights[min(weights)].fill_(float("nan"))
    save_file(weights, str(weights_file), metadata={"format": "pt"})
    with pytest.raises(UserError, match="checkpoint resumed at step 2 .* holds non-finite weights"):
        train(path, "rl", ["--max_steps", "3"])


def test_a_rollout_drawn_from_nan_probabilities_is_a_skipped_step(tmp_path, tiny_grpo_trainer):
    """grpo's own sampler (as on a GPU, here without CUDA graphs) on weights gone NaN: the step is named by its first
    non-finite number, the rollout's token probabilities, and applies no update."""
    import torch

    from grpo_cli.engine import Sampler
    from grpo_cli.train.health import StepGuard
    from grpo_cli.train.rollout_func import StaticCacheRollout

    trainer = tiny_grpo_trainer(tmp_path, [lambda completions, **kw: [float(len(c)) for c in completions]])
    trainer.rollout_func = StaticCacheRollout(Sampler())
    guard = StepGuard(patience=0, output_dir=tmp_path)
    guard.bind(trainer)
    trainer.step_guard = guard
    trainer.add_callback(guard)
    with torch.no_grad():
        trainer.model.model.norm.weight.fill_(float("nan"))
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert [bad.step for bad in guard.skipped] == [1, 2]
    assert all(bad.what[0] == "rollout probabilities" for bad in guard.skipped)
    after = dict(trainer.model.named_parameters())
    assert all(torch.equal(before[name], after[name].detach()) or before[name].isnan().any() for name in before)


SLOW_REWARD = """
import time

def slow(completions, **kwargs):
    time.sleep(3)
    return [0.0] * len(completions)
"""


def test_a_step_that_does_not_end_leaves_every_threads_stack(tmp_path, tiny_model_dir, capsys):
    """stall_timeout 1 with a 3-second reward: the stacks are written while the step waits (naming the reward's wait
    in the main thread), the console says where, and the run itself finishes; a run without a stall leaves no file."""
    path = recipe_file(tmp_path, tiny_model_dir, "rl", "beta: 0.0\nstall_timeout: 1\n")
    (tmp_path / "slow.py").write_text(SLOW_REWARD)
    mine, slow = f'"{tmp_path / "my_rewards.py"}:vowel_share"', f'"{tmp_path / "slow.py"}:slow"'
    path.write_text(path.read_text().replace(mine, slow))
    out = train(path, "rl", ["--max_steps", "1"])
    stacks = (out / "stall-stacks.txt").read_text()
    assert "no step has ended for 1 s since step 0; every thread's stack, most recent call last" in stacks
    # one of the writes (the first may come during a slow machine's generation) finds the main thread waiting for
    # the reward's process to answer
    main_threads = [part.split("\nThread 0x", 1)[0] for part in stacks.split("(MainThread):\n")[1:]]
    assert any("grpo_cli/rewards/isolated.py" in main for main in main_threads), stacks
    assert f"every thread's stack is in {out / 'stall-stacks.txt'}" in capsys.readouterr().err.replace("\n", "")
    assert json.loads((out / "train_summary.json").read_text())["global_step"] == 1

    quick = train(recipe_file(tmp_path / "quick", tiny_model_dir, "rl", "beta: 0.0\n"), "rl", ["--max_steps", "1"])
    assert not (quick / "stall-stacks.txt").exists()


def test_a_thread_holding_the_interpreter_still_leaves_its_stack(tmp_path, capsys):
    """A C call that keeps the interpreter's lock (no Python thread runs, the watch's included): faulthandler writes
    the stacks once the watch has missed its checks, and the watch says so when it runs again."""
    watch = StallWatch(tmp_path, seconds=1)
    watch.on_train_begin(None, SimpleNamespace(global_step=7), None)
    ctypes.PyDLL(None).sleep(FROZEN_AFTER_CHECKS + 2)  # PyDLL: the call keeps the interpreter's lock
    time.sleep(1.5)  # the watch runs again
    watch.close()
    stacks = (tmp_path / "stall-stacks.txt").read_text()
    assert stacks.startswith("Timeout (") and "test_a_thread_holding_the_interpreter" in stacks, stacks
    assert "no step has ended for 1 s since step 7" in capsys.readouterr().err.replace("\n", "")


@pytest.mark.gpu
def test_without_cudnn_attention_the_backward_of_a_padded_head_is_finite():
    """The cuDNN backward's condition (an explicit mask, a padded length of 64 modulo 128, a row whose logsumexp is far
    below zero: every score far below zero, or left padding that lets the row see no key) through
    scaled_dot_product_attention as a training run leaves it: finite query, key and value gradients at every length
    around it."""
    import torch

    from benchmarks.attention_nan import LEFT_PADDING, LENGTHS, crafted

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        for length in LENGTHS:
            for left_padding in (0, LEFT_PADDING):
                found = crafted(length, cudnn=False, left_padding=left_padding)
                assert found["output_finite"] and found["non_finite"] == {"query": 0, "key": 0, "value": 0}, found
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
