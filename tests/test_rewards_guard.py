"""The reward guard (exceptions, hangs, bad values), time limits, and users' own reward functions."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest

from grpo_cli.errors import UserError
from grpo_cli.rewards import (
    RewardGuard,
    RewardSpec,
    build_reward_funcs,
    resolve_reward,
    reward_names_problems,
)
from grpo_cli.tasks.time_limit import TimeLimitExpired, time_limit


def spec(func, failure=-1.0, name="probe") -> RewardSpec:
    return RewardSpec(name=name, func=func, low=-1.0, high=1.0, failure=failure)


def test_an_exception_fails_only_the_offending_completion_and_is_logged_once(caplog):
    def picky(prompts, completions, **kwargs):
        return [1.0 / len(c) for c in completions]  # ZeroDivisionError on an empty completion

    guard = RewardGuard(spec(picky), timeout=5)
    with caplog.at_level(logging.WARNING, logger="grpo_cli.rewards"):
        assert guard(prompts=[None] * 3, completions=["ab", "", "abcd"]) == [0.5, -1.0, 0.25]
        assert guard(prompts=[None, None], completions=["", ""]) == [-1.0, -1.0]
    assert guard.failures == 3 and guard.exceptions == 3
    warnings = [r for r in caplog.records if "raised ZeroDivisionError" in r.getMessage()]
    assert (
        len(warnings) == 1 and "''" in warnings[0].getMessage()
    )  # the offending (empty) completion is shown


def test_a_hanging_reward_scores_the_batch_as_failures_and_the_run_goes_on(caplog, monkeypatch):
    monkeypatch.setattr("grpo_cli.rewards.guard.MIN_BATCH_SECONDS", 0.0)

    def hangs(prompts, completions, **kwargs):
        while True:
            pass

    guard = RewardGuard(spec(hangs, failure=0.0), timeout=0.2)
    with caplog.at_level(logging.WARNING, logger="grpo_cli.rewards"):
        assert guard(prompts=[None] * 2, completions=["a", "a much longer completion"]) == [0.0, 0.0]
    assert guard.timeouts == 1 and guard.failures == 2
    message = caplog.records[-1].getMessage()
    assert "longer than 0.2 s" in message and "a much longer completion" in message
    # The timer is gone: later work is not interrupted.
    assert RewardGuard(spec(lambda prompts, completions, **kw: [1.0]), timeout=None)(completions=["x"]) == [
        1.0
    ]


def test_wrong_length_and_bad_values_become_failures(caplog):
    short = RewardGuard(spec(lambda prompts, completions, **kw: [1.0]), timeout=5)
    with caplog.at_level(logging.WARNING, logger="grpo_cli.rewards"):
        assert short(completions=["a", "b"]) == [-1.0, -1.0]
        assert short(completions=["a", "b", "c"]) == [-1.0, -1.0, -1.0]
    assert short.failures == 5
    assert sum("must return one value per completion" in r.getMessage() for r in caplog.records) == 1

    odd = RewardGuard(
        spec(lambda prompts, completions, **kw: ["yes", None, float("nan"), True, 2, float("-inf")]), timeout=5
    )
    # NaN and inf are failures (None is how a reward says it does not apply), never passed on to TRL
    assert odd(completions=list("abcdef")) == [-1.0, None, -1.0, 1.0, 2.0, -1.0]
    assert odd.failures == 3


def test_the_guard_keeps_the_name_passes_columns_and_logs_the_failure_rate():
    seen = {}

    def reader(prompts, completions, target, **kwargs):
        seen.update(target=target, extra=kwargs["trainer_state"])
        return [float(t) for t in target]

    metrics = []
    guard = RewardGuard(spec(reader, name="reader"), timeout=5)
    values = guard(
        prompts=[None] * 2,
        completions=["a", "b"],
        target=[3, 4],
        trainer_state="state",
        log_metric=lambda name, value: metrics.append((name, value)),
    )
    assert values == [3.0, 4.0] and guard.__name__ == "reader"
    assert seen == {"target": [3, 4], "extra": "state"}
    assert metrics == [("rewards/reader/failed_frac", 0.0), ("rewards/reader/timed_out_frac", 0.0)]


def test_time_limits_nest():
    with time_limit(5) as outer:
        with time_limit(0.05) as inner:
            while True:
                pass
        assert inner.expired
        total = sum(range(1000))  # the outer limit still runs and has not fired
    assert not outer.expired and total == 499500

    # The outer one ends first: its expiry passes through the inner one.
    with time_limit(0.05) as outer, time_limit(10) as inner:
        while True:
            pass
    assert outer.expired and not inner.expired


def test_time_limit_is_a_no_op_off_the_main_thread():
    import threading

    result = {}

    def work():
        with time_limit(0.01) as limit:
            result["value"] = sum(range(10))
        result["expired"] = limit.expired

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert result == {"value": 45, "expired": False}
    assert issubclass(TimeLimitExpired, BaseException) and not issubclass(TimeLimitExpired, Exception)


# --- users' own functions ----------------------------------------------------------------------------------------


def write(path, source: str):
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


def test_a_file_function_is_resolved_checked_and_guarded(tmp_path):
    path = write(
        tmp_path / "my_rewards.py",
        """
        def length_bonus(prompts, completions, **kwargs):
            \"\"\"Longer is better.\"\"\"
            return [min(len(c) / 10, 1.0) for c in completions]

        def explodes(prompts, completions, **kwargs):
            raise RuntimeError("boom")
        """,
    )
    bonus, explodes = build_reward_funcs([f"{path}:length_bonus", f"{path}:explodes"], timeout=5)
    assert bonus.__name__ == "length_bonus" and bonus.spec.doc == "Longer is better."
    assert bonus(completions=["12345", "x" * 30]) == [0.5, 1.0]
    assert explodes(completions=["a", "b"]) == [0.0, 0.0] and explodes.failures == 2


def test_a_module_function_and_its_own_reward_spec(tmp_path, monkeypatch):
    write(
        tmp_path / "team_rewards.py",
        """
        from grpo_cli.rewards import reward

        @reward(name="team_exact", low=0.0, high=2.0, doc="2 if it says ok")
        def exact(prompts, completions, **kwargs):
            return [2.0 if c == "ok" else 0.0 for c in completions]

        async def slow_ok(prompts, completions, **kwargs):
            return [1.0 for c in completions]

        def no_kwargs(prompts, completions):
            return [0.0 for c in completions]
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    resolved = resolve_reward("team_rewards:exact")
    assert (resolved.name, resolved.high, resolved.doc) == ("exact", 2.0, "2 if it says ok")
    assert build_reward_funcs(["team_rewards:slow_ok"], timeout=5)[0](completions=["a"]) == [1.0]
    with pytest.raises(UserError, match=r"must accept \*\*kwargs"):
        resolve_reward("team_rewards:no_kwargs")


def test_name_problems_are_found_without_running_user_code(tmp_path):
    write(
        tmp_path / "side_effects.py",
        "raise SystemExit('imported!')\ndef fine(prompts, completions, **kw): ...\n",
    )
    write(tmp_path / "broken.py", "def nope(:\n")
    problems = reward_names_problems(
        [
            "countdown_format",
            "countdown_fromat",
            "countdown_format",
            f"{tmp_path}/side_effects.py:fine",
            f"{tmp_path}/side_effects.py:missing",
            f"{tmp_path}/absent.py:fn",
            f"{tmp_path}/broken.py:nope",
            "no_such_module_xyz:fn",
            "json:loads",
            "bad:not-a-name",
        ]
    )
    text = "\n".join(problems)
    assert "did you mean 'countdown_format'" in text
    assert "'countdown_format' is listed twice" in text
    assert "defines no function 'missing'" in text and "side_effects.py:fine" not in text
    assert "absent.py' not found" in text and "syntax error" in text
    assert "module 'no_such_module_xyz' not found" in text and "json:loads" not in text
    assert "Python function name after the colon" in text
    assert len(problems) == 7


def test_unknown_rewards_and_import_errors_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="did you mean 'gsm8k_int'"):
        resolve_reward("gsm8k_itn")
    path = write(
        tmp_path / "fails.py", "import not_installed_package_xyz\ndef f(prompts, completions, **kw): ...\n"
    )
    with pytest.raises(UserError, match="importing .* failed .*ModuleNotFoundError"):
        resolve_reward(f"{path}:f")


@pytest.mark.parametrize(
    "module_level, says",
    [
        ("import sys\nsys.exit(0)", "exited (code 0) before it finished"),
        ("import os\nos._exit(0)", "exited (code 0) before it finished"),
        ("raise KeyboardInterrupt", "before it finished"),
        ("raise SystemExit('bye')", "exited (code 1) before it finished"),
        ("1 / 0", "failed (ZeroDivisionError: division by zero)"),
        ("while True:\n    pass", "did not finish in 2 s - does it loop or wait at import?"),
    ],
)
def test_a_reward_module_that_exits_hangs_or_raises_at_import_is_an_error_naming_it(
    tmp_path, monkeypatch, module_level, says
):
    """Its import runs first in a process of its own, with a time limit: the command gets an error naming the file,
    never an exit 0 having done nothing, a hang or a traceback."""
    from grpo_cli.rewards import registry

    monkeypatch.setattr(registry, "IMPORT_TIME_LIMIT_S", 2.0)
    path = tmp_path / "at_import.py"
    path.write_text(module_level + "\ndef r(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    with pytest.raises(UserError) as raised:
        resolve_reward(f"{path}:r")
    [problem] = raised.value.problems
    assert f"importing '{path}'" in problem and says in problem, problem


def test_what_a_reward_module_starts_at_import_is_stopped_with_its_trial_import(tmp_path, monkeypatch):
    import os
    import time

    from grpo_cli.rewards import registry

    monkeypatch.setattr(registry, "IMPORT_TIME_LIMIT_S", 2.0)
    pid_file, child = tmp_path / "child.pid", tmp_path / "child.py"
    child.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    path = tmp_path / "starts.py"
    path.write_text(
        f"import subprocess, sys\nsubprocess.Popen([sys.executable, {str(child)!r}])\nwhile True:\n    pass\n"
        "def r(prompts, completions, **kw):\n    return [0.0] * len(completions)\n"
    )
    with pytest.raises(UserError, match="did not finish in 2 s"):
        resolve_reward(f"{path}:r")
    pid = int(pid_file.read_text())
    for _ in range(50):  # killed with its trial import's process group (a zombie until its parent reaps it)
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        raise AssertionError("the process the module started outlived its trial import")


def test_a_batch_gets_at_least_the_minimum_time(monkeypatch):
    """A first call that imports a slow library must not time out on a batch of one."""
    import time

    monkeypatch.setattr("grpo_cli.rewards.guard.MIN_BATCH_SECONDS", 0.5)

    def slow_start(prompts, completions, **kwargs):
        time.sleep(0.2)
        return [1.0] * len(completions)

    guard = RewardGuard(spec(slow_start), timeout=0.01)
    assert guard(prompts=[None], completions=["a"]) == [1.0]
    assert guard.timeouts == 0
