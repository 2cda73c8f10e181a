"""Scoring without a model: `grpo rewards score` (a JSONL of completions), `grpo rewards test` (the recipe's
rewards on its own rows' reference answers and on malformed ones), and what "correct" means (`Correctness`)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_cli.arguments import TaskArguments
from grpo_cli.atomic import check_writable, refuse_to_replace, write_jsonl
from grpo_cli.errors import UserError
from grpo_cli.rewards.guard import RewardGuard, build_reward_funcs
from grpo_cli.rewards.registry import REWARDS, accuracy_reward
from grpo_cli.tasks.task import Task, as_chats, for_prefill, get_task

BATCH_SIZE = 64
MAX_LISTED_PROBLEMS = 20


@dataclass
class RewardSetup:
    """What scoring needs from a recipe: the task, its keys, the rewards with their weights."""

    task: Task
    task_args: TaskArguments
    names: list[str]
    weights: list[float]
    timeout: float | None = None
    base_dir: str | None = None
    params: dict = field(default_factory=dict)  # the recipe's values, for rewards that read some (`RewardSpec.params`)

    def guards(self) -> list[RewardGuard]:
        return build_reward_funcs(self.names, self.timeout, self.base_dir, self.params)


def reward_setup(
    task_args: TaskArguments,
    names: list[str] | None = None,
    weights: list[float] | None = None,
    timeout: float | None = None,
    base_dir: str | None = None,
    params: dict | None = None,
) -> RewardSetup:
    """The setup for a task's keys and a recipe's reward_funcs / reward_weights (defaults: the task's, 1.0 each);
    `params`: the recipe's values (every key, defaults included), for the rewards that read some."""
    task = get_task(task_args.task)
    names = list(names or task.default_rewards)
    weights = [1.0] * len(names) if weights is None else [float(w) for w in weights]
    if len(weights) != len(names):
        raise UserError(
            f"reward_weights: {len(weights)} weights for {len(names)} rewards ({', '.join(names)}) - "
            "give one weight per reward"
        )
    return RewardSetup(task, task_args, names, weights, timeout, base_dir, dict(params or {}))


@dataclass(frozen=True)
class Correctness:
    """What a correct answer is: the top score of the task's accuracy reward `name` (`top`). The one definition:
    training's solved groups and `grpo report` read the same reward. `func` scores it where the run's own rewards
    leave it out (None: their values are read)."""

    name: str
    top: float
    func: RewardGuard | None = None

    @classmethod
    def of(cls, task_name: str, rewards: list[str], timeout: float | None = None) -> Correctness:
        """For the run's `rewards` (names): the first of the task's `accuracy_rewards` among them, else the first
        the registry has, built once here."""
        chosen = accuracy_reward(task_name, rewards) or accuracy_reward(task_name, REWARDS)
        if chosen is None:
            raise UserError(f"task {task_name} has no accuracy reward, so no definition of a correct answer")
        name, top = chosen
        return cls(name, top, None if name in rewards else build_reward_funcs([name], timeout)[0])

    def judge(self, prompts: list | None, completions: list, columns: dict, scored: dict[str, list]) -> list[bool]:
        """Whether each completion is correct; `scored`: the run's reward values by name (None: not scored),
        `columns`: the dataset's columns, as TRL passes them to rewards."""
        if self.func is None:
            values = scored[self.name]
        else:
            values = self.func(prompts=prompts, completions=completions, **columns)
        return [value is not None and not math.isnan(value) and value >= self.top - 1e-9 for value in values]


def weighted_total(values: list[float | None], weights: list[float]) -> float | None:
    """The weighted sum, skipping rewards that did not apply (None), as TRL does; None if none applied."""
    present = [(v, w) for v, w in zip(values, weights) if v is not None]
    return sum(v * w for v, w in present) if present else None


# --- reading completions ---------------------------------------------------------------------------------------


def _needed_columns(setup: RewardSetup) -> list[tuple[Task, tuple[str, ...]]]:
    needs = []
    for name in setup.names:
        spec = REWARDS.get(name)
        if spec is not None and spec.columns:
            needs.append((get_task(spec.task) if spec.task else setup.task, spec.columns))
    return needs


def _prompt_for(row: dict, task: Task, args: TaskArguments) -> list[dict]:
    """The line's prompt messages; else the task's prompt for the row (a string `prompt` is the user message)."""
    prompt = row.get("prompt")
    if isinstance(prompt, list):
        return prompt
    if isinstance(prompt, str) and task.question_column and task.question_column not in row:
        row = {**row, task.question_column: prompt}
    try:
        return task.prompt(row, args)
    except (UserError, KeyError, TypeError, ValueError, IndexError):
        # Rewards only need the prefill from the prompt; the question may be absent from a scoring file.
        prefill = task.prefill(args)
        return [{"role": "assistant", "content": prefill}] if prefill else []


def read_completions(path: str | Path, setup: RewardSetup) -> list[dict]:
    """The lines of a completions JSONL, normalized by the task, each with a "prompt" of messages.

    Every line must be a JSON object with a string `completion` and the columns the rewards need, of the right
    types; UserError lists the bad lines (line numbers start at 1).
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--input: file '{path}' not found")
    needs = _needed_columns(setup)
    rows, problems = [], []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        line = err.object[: err.start].count(b"\n") + 1
        raise UserError(f"--input: {path}: line {line}: not UTF-8 text - give a JSONL file of completions") from None
    # JSONL lines end at "\n" alone: model outputs hold U+2028, U+0085 and the like inside their strings
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            problems.append(f"{where}: not JSON ({err.msg} at column {err.colno})")
            continue
        if not isinstance(row, dict):
            problems.append(f"{where}: must be a JSON object, got {type(row).__name__}")
            continue
        if not isinstance(row.get("completion"), str):
            got = "nothing" if "completion" not in row else type(row["completion"]).__name__
            problems.append(f"{where}: 'completion' must be a string, got {got}")
        prompt = row.get("prompt")
        if (
            prompt is not None
            and not isinstance(prompt, str)
            and not (
                isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)
            )
        ):
            problems.append(f"{where}: 'prompt' must be a string or a list of {{role, content}} messages")
        row = setup.task.normalize(row)
        for task, columns in needs:
            problems.extend(f"{where}: {p}" for p in task.column_problems(row, columns))
        rows.append(row)
    if problems:
        shown = problems[:MAX_LISTED_PROBLEMS]
        if len(problems) > len(shown):
            shown.append(f"... and {len(problems) - len(shown)} more problems")
        raise UserError(*shown)
    if not rows:
        raise UserError(f"--input: '{path}' has no lines to score")
    for row in rows:
        row["prompt"] = _prompt_for(row, setup.task, setup.task_args)
    return rows


# --- scoring ---------------------------------------------------------------------------------------------------


@dataclass
class RewardStats:
    """One reward's summary over the scored completions."""

    name: str
    weight: float
    values: list[float | None] = field(default_factory=list)
    failures: int = 0

    @property
    def present(self) -> list[float]:
        return [v for v in self.values if v is not None]

    def as_dict(self) -> dict:
        present = self.present
        return {
            "name": self.name,
            "weight": self.weight,
            "mean": sum(present) / len(present) if present else None,
            "min": min(present) if present else None,
            "max": max(present) if present else None,
            "positive": sum(1 for v in present if v > 0),
            "not_applicable": len(self.values) - len(present),
            "failures": self.failures,
            "count": len(self.values),
        }


def score_rows(
    setup: RewardSetup,
    rows: list[dict],
    completions: list[str] | None = None,
    guards: list[RewardGuard] | None = None,
) -> list[RewardStats]:
    """Score rows[i]["completion"] (or completions[i]) with every reward; per-reward values in row order."""
    guards = guards if guards is not None else setup.guards()
    before = [guard.failures for guard in guards]
    stats = [RewardStats(g.__name__, w) for g, w in zip(guards, setup.weights)]
    completions = completions if completions is not None else [row["completion"] for row in rows]
    for start in range(0, len(rows), BATCH_SIZE):
        batch = rows[start : start + BATCH_SIZE]
        prompts = [row["prompt"] for row in batch]
        chats = as_chats(completions[start : start + BATCH_SIZE])
        keys = [k for k in batch[0] if k not in ("prompt", "completion")]
        columns = {k: [row.get(k) for row in batch] for k in keys if all(k in row for row in batch)}
        for guard, stat in zip(guards, stats):
            stat.values.extend(guard(prompts=prompts, completions=chats, **columns))
    for guard, stat, failures in zip(guards, stats, before):
        stat.failures = guard.failures - failures
    return stats


def _clean(value: float | None) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def score_file(
    setup: RewardSetup, input_path: str | Path, output_path: str | Path | None = None, force: bool = False
) -> dict:
    """Score a completions JSONL; write each line back with one field per reward and `reward` (the weighted total).

    Returns {"rewards": [per-reward summary], "total": summary of the weighted totals, "lines": scored lines}.
    """
    if output_path is not None:
        check_writable(output_path, "--output")
        refuse_to_replace(output_path, "--output", force)
    rows = read_completions(input_path, setup)
    originals = []
    with Path(input_path).open(encoding="utf-8") as lines:
        originals = [json.loads(line) for line in lines if line.strip()]
    stats = score_rows(setup, rows)
    totals = []
    out_rows = []
    for i, original in enumerate(originals):
        values = [_clean(stat.values[i]) for stat in stats]
        total = weighted_total(values, setup.weights)
        totals.append(total)
        out_rows.append(
            {**original, **{stat.name: value for stat, value in zip(stats, values)}, "reward": total}
        )
    if output_path is not None:
        write_jsonl(output_path, out_rows)
    total_stats = RewardStats("reward", 1.0, totals)
    return {"rewards": [s.as_dict() for s in stats], "total": total_stats.as_dict(), "lines": out_rows}


def score_table(summary: dict):
    """A Rich table of a score_file summary: per reward mean, min, max, how often > 0, n/a, failures."""
    from rich.table import Table

    table = Table(title="rewards", title_justify="left")
    for column in ("reward", "weight", "mean", "min", "max", "> 0", "n/a", "failures"):
        table.add_column(column, justify="left" if column == "reward" else "right")

    def fmt(value) -> str:
        return "-" if value is None else f"{value:.3f}"

    for row in summary["rewards"] + [summary["total"]]:
        is_total = row is summary["total"]
        table.add_row(
            "[bold]weighted total[/]" if is_total else row["name"],
            "" if is_total else f"{row['weight']:g}",
            fmt(row["mean"]),
            fmt(row["min"]),
            fmt(row["max"]),
            f"{row['positive']}/{row['count']}",
            str(row["not_applicable"]),
            "" if is_total else (f"[red]{row['failures']}[/]" if row["failures"] else "0"),
        )
    return table


# --- testing the reward set on reference answers ---------------------------------------------------------------


@dataclass
class CaseResult:
    """One completion of `grpo rewards test`: the reference answer or a malformed one for a row."""

    row: int
    kind: str  # "reference" or "malformed N"
    completion: str
    values: list[float | None]
    total: float | None
    ok: bool = True


@dataclass
class RewardTestReport:
    names: list[str]
    weights: list[float]
    cases: list[CaseResult]
    problems: list[str]
    skipped_rows: int = 0


def _show(value: float | None) -> str:
    return "None" if value is None else f"{value:g}"


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def run_reward_test(setup: RewardSetup, num_rows: int = 5) -> RewardTestReport:
    """Run the rewards on the first rows of the recipe's training data: each row's reference answer, as a
    well-formatted completion, must get every reward's top score and a higher total than each malformed one."""
    from grpo_cli.tasks.dataset import dataset_source, load_task_dataset

    if num_rows < 1:
        raise UserError(f"--rows must be at least 1, got {num_rows}")
    # Only the first rows matter here: no held-out split to carve, no sampling.
    args = dataclasses.replace(setup.task_args, dataset_test_size=0.0, max_samples=None)
    data = load_task_dataset(args, args.dataset_train_split)
    rows = [data[i] for i in range(min(num_rows, len(data)))]
    task, prefill = setup.task, setup.task.prefill(args)
    guards = setup.guards()
    specs = [guard.spec for guard in guards]
    cases, problems, skipped = [], [], 0
    for index, row in enumerate(rows, 1):
        reference = task.reference_completion(row)
        if reference is None:
            skipped += 1
            continue
        texts = [for_prefill(task, reference, prefill)]
        texts += [for_prefill(task, m, prefill) for m in task.malformed_completions(row)]
        batch = [row] * len(texts)
        stats = score_rows(setup, batch, texts, guards)
        failed = [s.name for s in stats if s.failures]
        if failed:
            problems.append(
                f"row {index}: {', '.join(failed)} failed (raised or timed out; see the log above)"
            )
        row_cases = []
        for k, text in enumerate(texts):
            values = [_clean(s.values[k]) for s in stats]
            kind = "reference" if k == 0 else f"malformed {k}"
            row_cases.append(CaseResult(index, kind, text, values, weighted_total(values, setup.weights)))
        cases += row_cases
        ref_case = row_cases[0]
        for spec, weight, value in zip(specs, setup.weights, ref_case.values):
            if value is None or weight <= 0 or spec.high is None:
                continue
            if not _close(value, spec.high):
                ref_case.ok = False
                problems.append(
                    f"row {index}: the reference answer gets {value:g} from {spec.name}, below its top score "
                    f"{spec.high:g} - the reward or the task's answer columns are off"
                )
        for case in row_cases[1:]:
            if ref_case.total is None or (case.total is not None and case.total >= ref_case.total):
                case.ok = False
                problems.append(
                    f"row {index}: {case.kind} completion {case.completion[:80]!r} scores {_show(case.total)}, not "
                    f"below the reference answer's {_show(ref_case.total)} - a malformed completion would be "
                    "rewarded like a correct one"
                )
    if not cases:
        problems.append(
            f"none of the first {len(rows)} rows of {dataset_source(args)} has a reference answer "
            f"task {task.name} can write as a completion - check the dataset's answer columns "
            f"({', '.join(task.answer_columns)})"
        )
    return RewardTestReport(setup.names, setup.weights, cases, problems, skipped)


def reward_test_table(report: RewardTestReport):
    """A Rich table of a rewards test: one line per completion with each reward and the weighted total."""
    from rich.table import Table

    table = Table(title="rewards test", title_justify="left")
    table.add_column("row", justify="right")
    table.add_column("completion", no_wrap=True)
    for name in report.names:
        table.add_column(name, justify="right")
    table.add_column("total", justify="right")
    table.add_column("", justify="center")
    for case in report.cases:
        table.add_row(
            str(case.row),
            f"[bold]{case.kind}[/]" if case.kind == "reference" else case.kind,
            *["-" if v is None else f"{v:g}" for v in case.values],
            "-" if case.total is None else f"{case.total:g}",
            "[green]ok[/]" if case.ok else "[bold red]FAIL[/]",
        )
    return table


def setup_from_recipe(recipe: Any) -> RewardSetup:
    """The RewardSetup of a loaded recipe (its task keys, reward_funcs or the task's, reward_weights)."""
    names = list(recipe.values.get("reward_funcs") or [])
    return reward_setup(
        recipe.task,
        names or None,
        recipe.values.get("reward_weights"),
        recipe.reward.reward_timeout,
        recipe.folder,
        recipe.resolved(),
    )
