"""The training console: metrics lines, sample completions, progress with ETA, quiet libraries, a real tiny GRPO run."""

from __future__ import annotations

import logging
import math
import warnings
from io import StringIO

import pytest
from rich.console import Console

from grpo_cli.arguments import TrackingArguments
from grpo_cli.quiet import NOISY_LOGGERS, quiet_libraries
from grpo_cli.train.progress import (
    SampleSchedule,
    logged_reward_names,
    metrics_line,
    pick_samples,
    sample_panel,
    short_reward_names,
)

GRPO_LOGS = {
    "loss": 0.0123,
    "grad_norm": 0.9,
    "learning_rate": 4.8e-07,
    "completions/mean_length": 118.4,
    "completions/clipped_ratio": 0.02,
    "rewards/format_reward/mean": 0.95,
    "rewards/format_reward/std": 0.1,
    "rewards/equation_reward/mean": 0.3,
    "reward": 0.62,
    "reward_std": 0.41,
    "kl": 0.001,
    "step_time": 9.1,
}


def render(renderable, width: int = 100) -> str:
    out = Console(file=StringIO(), width=width, color_system=None)
    out.print(renderable)
    return out.file.getvalue()


# ------------------------------------------------------------------------------------------------ pure pieces


def test_grpo_metrics_line_has_every_reward_and_fixed_order():
    line = metrics_line(12, 50, GRPO_LOGS, 9.8)
    assert line == (
        "step 12/50 | reward 0.62 (format 0.95 equation 0.30) | std 0.41 | len 118 | clip 0.02 | kl 0.001 "
        "| loss 0.0123 | lr 4.8e-07 | 9.8 s/step"
    )
    assert "\n" not in line


def test_grpo_metrics_line_leaves_out_kl_when_absent_and_pads_the_step():
    logs = {k: v for k, v in GRPO_LOGS.items() if k not in ("kl", "rewards/equation_reward/mean")}
    line = metrics_line(3, 500, logs)
    assert line.startswith("step   3/500 | reward 0.62 | std")  # one reward: no breakdown
    assert "kl" not in line and "s/step" not in line


def test_grpo_metrics_line_skips_missing_values():
    # TRL logs None when every reward of a batch was NaN.
    line = metrics_line(1, 2, {**GRPO_LOGS, "kl": None, "reward_std": float("nan")})
    assert "kl" not in line and "std" not in line and "reward 0.62" in line


def test_sft_metrics_line():
    logs = {
        "loss": 1.2345,
        "grad_norm": 2.5,
        "learning_rate": 2e-5,
        "mean_token_accuracy": 0.613,
        "epoch": 0.1,
    }
    assert metrics_line(5, 10, logs, 0.42) == (
        "step  5/10 | loss 1.234 | acc 0.613 | lr 2.0e-05 | gnorm 2.5 | 0.42 s/step"
    )


def test_reward_names_and_short_names():
    assert logged_reward_names(GRPO_LOGS) == ["format_reward", "equation_reward"]
    assert short_reward_names(["format_reward", "pkg.rewards:reward_length"]) == {
        "format_reward": "format",
        "pkg.rewards:reward_length": "length",
    }
    assert short_reward_names(["countdown_format", "countdown_equation"]) == {
        "countdown_format": "format",
        "countdown_equation": "equation",
    }
    assert short_reward_names(["countdown_format"]) == {"countdown_format": "countdown_"}
    assert short_reward_names(["a_very_long_name_one", "a_very_long_name_two"]) == {
        "a_very_long_name_one": "one",
        "a_very_long_name_two": "two",
    }
    # Cut to 10 characters they would be the same: kept whole.
    assert short_reward_names(["correctness_strict", "correctness_loose", "format"]) == {
        "correctness_strict": "correctness_strict",
        "correctness_loose": "correctness_loose",
        "format": "format",
    }


def rollout(advantages, completions=None):
    n = len(advantages)
    return {
        "prompt": [
            [{"role": "system", "content": "sys"}, {"role": "user", "content": f"question {i}"}]
            for i in range(n)
        ],
        "completion": completions or [[{"role": "assistant", "content": f"answer {i}"}] for i in range(n)],
        "rewards": {"format_reward": [1.0] * n, "equation_reward": [float(i) for i in range(n)]},
        "advantages": advantages,
    }


def test_pick_samples_shows_best_and_worst_first():
    samples = pick_samples(rollout([0.1, 1.5, -1.2, 0.3, -0.2]), 2)
    assert [s.completion for s in samples] == ["answer 1", "answer 2"]
    assert samples[0].prompt == "question 1"  # the last turn, not the system prompt
    assert samples[0].rewards == {"format_reward": 1.0, "equation_reward": 1.0}
    assert samples[0].advantage == 1.5
    three = pick_samples(rollout([0.1, 1.5, -1.2, 0.3, -0.2]), 3)
    assert [s.advantage for s in three] == [1.5, 0.1, -1.2]
    assert len(pick_samples(rollout([0.0, 0.0]), 5)) == 2
    assert pick_samples({"prompt": [], "completion": []}, 2) == []


def test_samples_escape_control_bytes_and_keep_brackets_literal():
    completions = [[{"role": "assistant", "content": "x\x1b[2Jy [bold]z[/bold]\nnext"}]]
    (sample,) = pick_samples(rollout([0.5], completions), 1)
    assert sample.completion == "x\\x1b[2Jy [bold]z[/bold]\nnext"
    text = render(sample_panel(sample, "sample 1/1 at step 3"))
    assert "sample 1/1 at step 3 | format 1.00 equation 0.00 | adv +0.50" in text
    assert "[bold]z[/bold]" in text and "\x1b" not in text


def test_sample_panel_marks_nan_rewards():
    logs = rollout([0.0])
    logs["rewards"]["equation_reward"] = [math.nan]
    text = render(sample_panel(pick_samples(logs, 1)[0], "s"))
    assert "equation -" in text


def test_sample_schedule_first_log_then_every_n():
    schedule = SampleSchedule(10)
    assert [step for step in range(1, 35) if schedule.due(step)] == [1, 10, 20, 30]
    schedule = SampleSchedule(4)  # logging every 3 steps: the first log at or after each multiple of 4
    assert [step for step in range(3, 30, 3) if schedule.due(step)] == [3, 6, 9, 12, 18, 21, 24]
    assert not any(SampleSchedule(0).due(step) for step in range(1, 5))


# ------------------------------------------------------------------------------------------------ library noise


@pytest.fixture
def restore_logging(monkeypatch):
    """Give back logger levels and filters, progress bar switches and the env var that quiet_libraries sets."""
    import datasets
    import huggingface_hub.utils as hub
    from transformers.utils import logging as transformers_logging

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "")
    monkeypatch.delenv("TRL_EXPERIMENTAL_SILENCE")
    monkeypatch.delenv("HF_DATASETS_DISABLE_PROGRESS_BARS", raising=False)
    saved = {
        name: (logging.getLogger(name).level, list(logging.getLogger(name).filters)) for name in NOISY_LOGGERS
    }
    verbosity = (transformers_logging.get_verbosity(), datasets.utils.logging.get_verbosity())
    bars = (transformers_logging.is_progress_bar_enabled(), datasets.is_progress_bar_enabled())
    hub_bars = not hub.are_progress_bars_disabled()
    hub.enable_progress_bars()  # earlier tests in this process may have switched them off
    yield
    for name, (level, filters) in saved.items():
        logging.getLogger(name).setLevel(level)
        logging.getLogger(name).filters[:] = filters
    transformers_logging.set_verbosity(verbosity[0])
    datasets.utils.logging.set_verbosity(verbosity[1])
    if bars[0]:
        transformers_logging.enable_progress_bar()
    if bars[1]:
        datasets.enable_progress_bars()
    assert not hub.are_progress_bars_disabled()
    if not hub_bars:
        hub.disable_progress_bars()


def test_quiet_libraries_filters_noise_and_keeps_errors(restore_logging, monkeypatch):
    import datasets
    import huggingface_hub.utils as hub
    from transformers.utils import logging as transformers_logging

    monkeypatch.delenv("GRPO_VERBOSE", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert quiet_libraries() is True
        warnings.warn("`gradient_checkpointing` is deprecated", FutureWarning)
        warnings.warn(
            "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly", UserWarning
        )
        warnings.warn(
            "barrier(): using the device under current context. You can specify `device_id` in "
            "`init_process_group` to mute this warning.",
            UserWarning,
        )
        warnings.warn("reward file has a real problem", UserWarning)
    assert [str(w.message) for w in caught] == ["reward file has a real problem"]
    assert transformers_logging.get_verbosity() == logging.ERROR
    assert not transformers_logging.is_progress_bar_enabled()  # loading/writing weights
    assert not hub.are_progress_bars_disabled()  # downloads keep their bars
    assert not datasets.is_progress_bar_enabled()
    assert not logging.getLogger("bitsandbytes.backends.cpu.ops").isEnabledFor(logging.WARNING)
    assert logging.getLogger("bitsandbytes.backends.cpu.ops").isEnabledFor(logging.ERROR)
    assert logging.getLogger("trl.trainer").isEnabledFor(logging.WARNING)
    assert not logging.getLogger("liger_kernel.backends.registry").isEnabledFor(logging.WARNING)
    # DeepSpeed resets its own level at import: the filter still drops its warnings, not its errors.
    deepspeed = logging.getLogger("DeepSpeed")
    deepspeed.setLevel(logging.INFO)
    record = deepspeed.makeRecord(
        "DeepSpeed", logging.WARNING, __file__, 1, "Setting accelerator to CPU", (), None
    )
    assert not deepspeed.filter(record)
    record.levelno = logging.ERROR
    assert deepspeed.filter(record)


def test_grpo_verbose_silences_nothing(restore_logging, monkeypatch):
    import os

    from transformers.utils import logging as transformers_logging

    monkeypatch.setenv("GRPO_VERBOSE", "1")
    level = transformers_logging.get_verbosity()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert quiet_libraries() is False
        warnings.warn("`gradient_checkpointing` is deprecated", FutureWarning)
    assert len(caught) == 1
    assert transformers_logging.get_verbosity() == level
    assert "TRL_EXPERIMENTAL_SILENCE" not in os.environ


def test_quieting_the_libraries_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, grpo_cli.quiet as q; q.quiet_libraries(); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# ------------------------------------------------------------------------------------------------ the callback


def drive(run_console, logs_per_step, max_steps):
    """Feed the callback the events a Trainer sends, with transformers' own state objects."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    args = TrainingArguments(output_dir="unused", report_to="none", use_cpu=True)
    state, control = TrainerState(max_steps=max_steps), TrainerControl()
    run_console.on_train_begin(args, state, control)
    for step in range(1, max_steps + 1):
        run_console.on_step_begin(args, state, control)
        state.global_step = step
        run_console.on_step_end(args, state, control)
        run_console.on_log(args, state, control, logs=dict(logs_per_step(step)))
    run_console.on_log(args, state, control, logs={"train_runtime": 65.0, "train_loss": 0.5})
    run_console.on_train_end(args, state, control)


def test_live_bar_in_a_terminal():
    from grpo_cli.train.progress import RunConsole

    out = Console(file=StringIO(), force_terminal=True, width=140, color_system=None)
    run_console = RunConsole(console=out)
    assert run_console.live
    drive(run_console, lambda step: {"loss": 1.0 / step, "learning_rate": 1e-5}, 3)
    text = out.file.getvalue()
    assert "training" in text and "3/3" in text and "eta" in text  # the bar
    assert "step 2/3 | loss 0.5 | lr 1.0e-05" in text
    assert "elapsed, eta" not in text  # the bar says it: no ETA on metric lines
    assert "done: 3 steps in 1:05 (21.7 s/step) | final loss 0.3333" in text
    assert text.rstrip().endswith("final loss 0.3333")
    assert run_console.progress is None  # stopped: the cursor is back


def test_plain_lines_when_not_a_terminal():
    from grpo_cli.train.progress import RunConsole

    out = Console(file=StringIO(), width=80)
    run_console = RunConsole(console=out)
    assert not run_console.live
    drive(run_console, lambda step: {"loss": 2.0, "mean_token_accuracy": 0.5, "learning_rate": 1e-5}, 2)
    lines = out.file.getvalue().splitlines()
    assert lines[0].startswith("step 1/2 | loss 2 | acc 0.500 | lr 1.0e-05 |")
    assert "elapsed, eta 0:00" in lines[0]
    assert len(lines) == 3 and lines[2].startswith("done: 2 steps")
    assert "\x1b" not in "".join(lines)


def test_eval_logs_get_their_own_line_and_other_processes_print_nothing():
    from transformers import TrainerControl, TrainerState

    from grpo_cli.train.progress import RunConsole

    out = Console(file=StringIO(), width=200)
    run_console = RunConsole(console=out)
    state = TrainerState(max_steps=10, global_step=4)
    run_console.on_train_begin(None, state, TrainerControl())
    run_console.on_log(
        None, state, TrainerControl(), logs={"eval_loss": 0.7, "eval_reward": 0.25, "epoch": 1.0}
    )
    assert out.file.getvalue().startswith("eval step  4/10 | reward 0.25 | loss 0.7")
    worker = RunConsole(console=out)
    state = TrainerState(max_steps=10, global_step=4, is_world_process_zero=False)
    before = out.file.getvalue()
    worker.on_train_begin(None, state, TrainerControl())
    worker.on_log(None, state, TrainerControl(), logs={"loss": 1.0})
    worker.on_train_end(None, state, TrainerControl())
    assert out.file.getvalue() == before


# ------------------------------------------------------------------------------------------------ a real tiny GRPO run


def format_reward(completions, **kwargs):
    return [1.0 if "a" in c[0]["content"] else 0.0 for c in completions]


def length_reward(completions, **kwargs):
    return [len(c[0]["content"]) / 10 for c in completions]


def test_tiny_grpo_run_prints_progress_metrics_and_samples(tiny_grpo_trainer, tmp_path, capsys):
    from grpo_cli.train.progress import RunConsole, remove_default_printers

    trainer = tiny_grpo_trainer(
        tmp_path / "out", [format_reward, length_reward], prompt="What is 2 + 2? [b]", beta=0.04  # beta: KL is logged
    )
    run_console = RunConsole(TrackingArguments(sample_every=1, sample_count=2))
    run_console.bind(trainer)
    trainer.add_callback(run_console)
    remove_default_printers(trainer)
    assert not [
        c
        for c in trainer.callback_handler.callbacks
        if type(c).__name__ in ("PrinterCallback", "ProgressCallback")
    ]
    capsys.readouterr()
    trainer.train()
    err = capsys.readouterr().err
    lines = err.splitlines()
    metric_lines = [line for line in lines if line.startswith("step ")]
    assert [line[:9] for line in metric_lines] == ["step 1/2 ", "step 2/2 "]
    for line in metric_lines:
        assert " | reward " in line and "(format " in line and " length " in line
        for part in ("| std ", "| len ", "| clip ", "| kl ", "| loss ", "| lr ", " s/step", "elapsed, eta "):
            assert part in line, (part, line)
    assert "sample 1/2 at step 1 | format " in err and "sample 2/2 at step 2" in err
    assert "What is 2 + 2? [b]" in err  # the prompt's end, brackets kept
    assert "done: 2 steps in " in err and "final reward " in err
    assert "{'loss'" not in err and "'learning_rate'" not in err  # no per-step dict dump
