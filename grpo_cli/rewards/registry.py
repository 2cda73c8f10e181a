"""The reward registry: built-in rewards by name, and users' own functions as `module:function` or `file.py:function`."""

from __future__ import annotations

import ast
import difflib
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grpo_cli.errors import UserError


@dataclass(frozen=True)
class RewardSpec:
    """A reward function and what is known about it."""

    name: str
    func: Callable | None  # None: a user's function whose module is imported only in processes of its own
    task: str | None = None
    low: float | None = None
    high: float | None = None
    failure: float = 0.0  # what a completion scores when the reward raises or times out on it
    doc: str = ""
    columns: tuple[str, ...] = ()  # dataset columns the reward reads
    params: tuple[str, ...] = ()  # recipe keys the reward reads, passed to it as keyword arguments of those names
    source: str = "built-in"
    # how a process of its own finds the reward (None: it runs in the training process): a built-in's name, or for a
    # user's reward an absolute file path or a module, then `:function`
    reference: str | None = None

    @property
    def range_text(self) -> str:
        if self.low is None or self.high is None:
            return "?"
        return f"[{self.low:g}, {self.high:g}]"


REWARDS: dict[str, RewardSpec] = {}


def accuracy_reward(task_name: str | None, rewards) -> tuple[str, float] | None:
    """Among the run's `rewards` (names), the one whose top score means a correct answer, and that score: the first
    of its task's `accuracy_rewards` that the run uses, where the task has one."""
    from grpo_cli.tasks import TASKS

    task = TASKS.get(str(task_name or ""))
    for name in task.accuracy_rewards if task else ():
        spec = REWARDS.get(name)
        if name in rewards and spec is not None and spec.high is not None:
            return name, spec.high
    return None


def reward(
    name: str,
    task: str | None = None,
    low: float | None = None,
    high: float | None = None,
    failure: float | None = None,
    doc: str = "",
    columns: tuple[str, ...] = (),
    params: tuple[str, ...] = (),
    isolated: bool = False,
) -> Callable[[Callable], Callable]:
    """Decorator: register a TRL reward function `fn(prompts, completions, **kwargs) -> list[float | None]`.

    `failure` defaults to `low` (else 0.0): a completion that crashes or hangs the reward scores the worst.
    `params`: recipe keys whose values the reward receives as keyword arguments (e.g. `max_completion_length`).
    `isolated`: run it in a process of its own, as users' rewards run, for rewards that call code not bounded by
    construction (another library's scorers): one stuck in a long C call is stopped there.
    """

    def register(func: Callable) -> Callable:
        spec = RewardSpec(
            name=name,
            func=func,
            task=task,
            low=low,
            high=high,
            failure=failure if failure is not None else (low if low is not None else 0.0),
            doc=doc or (inspect.getdoc(func) or "").split("\n")[0],
            columns=tuple(columns),
            params=tuple(params),
            source="built-in" if func.__module__.startswith("grpo_cli.") else func.__module__,
            reference=name if isolated else None,
        )
        if name in REWARDS and REWARDS[name].func is not func and spec.source == "built-in":
            raise ValueError(f"reward {name} is registered twice")
        REWARDS[name] = spec
        func.reward_spec = spec  # type: ignore[attr-defined]
        return func

    return register


def _split_reference(name: str) -> tuple[str, str]:
    target, _, function = name.rpartition(":")
    if not target or not function.isidentifier():
        raise UserError(
            f"reward '{name}': write 'package.module:function' or 'path/to/file.py:function' "
            "with a Python function name after the colon"
        )
    return target, function


def _is_file_reference(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def _file_path(target: str, base_dir: str | Path | None) -> Path:
    path = Path(target).expanduser()
    if not path.is_absolute() and not path.exists() and base_dir is not None:
        path = Path(base_dir) / path
    return path


def _defines(source: str, function: str) -> bool:
    """Whether Python source defines `function` at top level (def, assignment or import)."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            return True
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == function for t in node.targets
        ):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            (a.asname or a.name.split(".")[0]) == function for a in node.names
        ):
            return True
    return False


def _unknown(name: str) -> str:
    close = difflib.get_close_matches(name, REWARDS, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return (
        f"unknown reward '{name}' (key: reward_funcs) - {hint}see `grpo rewards list`, "
        "or name your own function as 'package.module:function' or 'path/to/file.py:function'"
    )


def reward_names_problems(names: list[str], base_dir: str | Path | None = None) -> list[str]:
    """Problems with reward names, found without importing user code: unknown names, missing files or functions."""
    problems = []
    seen = set()
    for name in names:
        if not isinstance(name, str) or not name:
            problems.append(f"reward_funcs: {name!r} is not a reward name")
            continue
        if name in seen:
            problems.append(
                f"reward_funcs: '{name}' is listed twice - list each reward once (weights scale them)"
            )
        seen.add(name)
        if name in REWARDS:
            continue
        if ":" not in name:
            problems.append(_unknown(name))
            continue
        try:
            target, function = _split_reference(name)
        except UserError as err:
            problems.extend(err.problems)
            continue
        if _is_file_reference(target):
            path = _file_path(target, base_dir)
            if not path.is_file():
                where = ""
                if not Path(target).expanduser().is_absolute():
                    where = " in the working directory" + (f" or in the recipe's folder {base_dir}" if base_dir else "")
                problems.append(f"reward '{name}': file '{target}' not found{where} - check the path")
                continue
            try:
                source = path.read_text(encoding="utf-8", errors="replace")
            except OSError as err:
                problems.append(f"reward '{name}': file '{target}' cannot be read ({err.strerror}) - check its mode")
                continue
        else:
            try:
                spec = importlib.util.find_spec(target)
            except (ImportError, ValueError) as err:
                spec, error = None, err
            else:
                error = None
            if spec is None:
                why = f" ({error})" if error else ""
                problems.append(
                    f"reward '{name}': module '{target}' not found{why} - is it installed or on PYTHONPATH?"
                )
                continue
            if not spec.origin or not spec.origin.endswith(".py"):
                continue  # compiled or namespace module: only importing it can tell
            source = Path(spec.origin).read_text(encoding="utf-8", errors="replace")
        try:
            defined = _defines(source, function)
        except SyntaxError as err:
            problems.append(
                f"reward '{name}': {err.filename or target}:{err.lineno}: syntax error ({err.msg})"
            )
            continue
        if not defined:
            problems.append(f"reward '{name}': '{target}' defines no function '{function}'")
    return problems


# A user's reward module is imported only in processes of its own: first a trial import, for at most this long (one
# that loops, exits or is killed at import is said as such, and never hangs or ends the command that loads it), which
# also reports what resolving needs to know of the function; then the process the reward runs in. Nothing the module
# starts at import or when scoring lives in the command's own process, and each of those processes is stopped with
# its process group.
IMPORT_TIME_LIMIT_S = 60.0
_IMPORTED_MARK = "grpo: reward module imported: "
_DESCRIBED = ("task", "low", "high", "failure", "doc", "columns", "params")  # RewardSpec fields a trial import reports
_PROBED: dict[tuple[str, int, str], dict] = {}  # (file or module, its mtime, function) -> what its trial import said
_PROBE = """
import importlib, importlib.util, json, sys
target, is_file, function = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
if is_file:
    spec = importlib.util.spec_from_file_location("grpo_user_reward_probe", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
else:
    module = importlib.import_module(target)
from grpo_cli.rewards.registry import describe
sys.stdout.write("\\n%s%s\\n" % (sys.argv[4], json.dumps(describe(module, function))))
sys.stdout.flush()
"""


def describe(module, function: str) -> dict:
    """What resolving needs to know of `module.function`, as JSON data: {"missing": true}, or the signature's problem
    (or None) and the RewardSpec fields it declares with `@reward` (else its docstring's first line)."""
    func = getattr(module, function, None)
    if func is None or not callable(func):
        return {"missing": True}
    own = getattr(func, "reward_spec", None)
    if isinstance(own, RewardSpec):
        fields = {key: getattr(own, key) for key in _DESCRIBED}
    else:
        fields = {"doc": (inspect.getdoc(func) or "").split("\n")[0]}
    return {"problem": _signature_problem(func), "fields": fields}


def _probe_import(name: str, target: str, is_file: bool, function: str) -> dict:
    """Import a user's reward module in a child process (its own process group, killed with whatever it started
    once done) and return what `describe` says there of `function`; raise UserError naming the file where the import
    does not come back as an import should."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
    # files, not pipes: a process the module starts keeps a pipe open and would hold the wait
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        child = subprocess.Popen(
            [sys.executable, "-c", _PROBE, target, "1" if is_file else "0", function, _IMPORTED_MARK],
            stdin=subprocess.DEVNULL, stdout=out_file, stderr=err_file, env=env, start_new_session=True,
        )  # fmt: skip
        try:
            child.wait(timeout=IMPORT_TIME_LIMIT_S)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            try:
                os.killpg(child.pid, signal.SIGKILL)  # with whatever the module started
            except (ProcessLookupError, PermissionError):
                pass
            child.wait()
        out_file.seek(0)
        err_file.seek(0)
        out, err = out_file.read(), err_file.read()
    if timed_out:
        raise UserError(
            f"reward '{name}': importing '{target}' did not finish in {IMPORT_TIME_LIMIT_S:.0f} s - does it loop or "
            "wait at import? Do slow work inside the function, not at module level"
        )
    _, marked, report = out.decode(errors="replace").rpartition(_IMPORTED_MARK)
    if marked:
        try:
            return json.loads(report.splitlines()[0])
        except (IndexError, ValueError):
            pass  # cut short while writing it: said below as an exit
    errors = err.decode(errors="replace")
    if child.returncode == 1 and "Traceback (most recent call last)" in errors:  # it raised: say what
        raise UserError(f"reward '{name}': importing '{target}' failed ({errors.strip().splitlines()[-1].strip()})")
    if child.returncode < 0:
        how = f"was killed by signal {signal.Signals(-child.returncode).name}"
    else:
        how = f"exited (code {child.returncode})"
    raise UserError(
        f"reward '{name}': importing '{target}' {how} before it finished - a reward module must not exit or "
        "stop the process at import (sys.exit, os._exit, exit(), KeyboardInterrupt)"
    )


def _load_file(path: Path):
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    module_name = f"grpo_user_rewards_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"cannot load '{path}' as Python code")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _signature_problem(func: Callable) -> str | None:
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return None
    kinds = {p.kind for p in params}
    if inspect.Parameter.VAR_KEYWORD not in kinds:
        return "must accept **kwargs (TRL passes prompts, completions and every dataset column as keywords)"
    if inspect.Parameter.POSITIONAL_ONLY in kinds:
        return "must take its arguments by keyword (TRL calls fn(prompts=..., completions=..., **columns))"
    return None


def resolve_reward(name: str, base_dir: str | Path | None = None) -> RewardSpec:
    """The RewardSpec for a registered name, 'package.module:function' or 'path/to/file.py:function'.

    A user's module is imported only in a trial process (see `_probe_import`), unless this process already has it;
    its function runs in a process of its own (`RewardSpec.reference`), which imports it again (`load_reward`)."""
    if name in REWARDS:
        return REWARDS[name]
    if ":" not in name:
        raise UserError(_unknown(name))
    problems = reward_names_problems([name], base_dir)
    if problems:
        raise UserError(*problems)
    target, function = _split_reference(name)
    is_file = _is_file_reference(target)
    path = _file_path(target, base_dir).resolve() if is_file else None
    func = None
    if not is_file and target in sys.modules:  # imported here already: nothing new runs
        func = getattr(sys.modules[target], function, None)
        description = describe(sys.modules[target], function)
    else:
        probed = (str(path), path.stat().st_mtime_ns, function) if path else (target, 0, function)
        if probed not in _PROBED:
            _PROBED[probed] = _probe_import(name, probed[0], is_file, function)
        description = _PROBED[probed]
    if description.get("missing"):
        raise UserError(f"reward '{name}': '{target}' has no function '{function}'")
    if description.get("problem"):
        raise UserError(f"reward '{name}': {description['problem']}")
    fields = dict(description["fields"])
    for key in ("columns", "params"):
        fields[key] = tuple(fields.get(key) or ())
    reference = f"{path}:{function}" if path else name
    return RewardSpec(**{**fields, "name": function, "func": func, "source": name, "reference": reference})


def load_reward(reference: str) -> Callable:
    """The function a RewardSpec's `reference` names, imported into this process: the process a reward runs in."""
    if reference in REWARDS:
        return REWARDS[reference].func
    target, function = _split_reference(reference)
    try:
        module = _load_file(Path(target)) if _is_file_reference(target) else importlib.import_module(target)
    except (Exception, SystemExit, KeyboardInterrupt) as err:  # noqa: BLE001 - the user's module: why, no traceback
        raise UserError(f"importing '{target}' failed ({type(err).__name__}: {err})") from None
    func = getattr(module, function, None)
    if func is None or not callable(func):
        raise UserError(f"'{target}' has no function '{function}'")
    return func


def reward_table(task: str | None = None):
    """A Rich table of the registered rewards (of one task if given): name, task, range, columns, what it checks."""
    from rich.table import Table

    table = Table(title="rewards", title_justify="left")
    for column in ("reward", "task", "range"):
        table.add_column(column, no_wrap=True)
    for column in ("columns", "what it checks"):
        table.add_column(column, overflow="fold")
    for name, spec in sorted(REWARDS.items(), key=lambda item: (item[1].task or "", item[0])):
        if task is None or spec.task == task:
            table.add_row(name, spec.task or "-", spec.range_text, ", ".join(spec.columns) or "-", spec.doc)
    return table
