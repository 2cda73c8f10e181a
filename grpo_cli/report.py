"""`grpo report`: a run's own logs as a picture (report.png), a table (report.md) and a diagnosis on the console;
two runs on the same axes; the models of a `grpo eval` side by side.

A run's logs: the trainer's log history (train_summary.json at the end of a run, else the latest checkpoint's
trainer_state.json), rollouts.jsonl (the accuracy, where the task has a reward for correct answers) and the recipe it
ran with (recipe.yaml, for the diagnosis' suggestions). The findings are `grpo_cli.diagnosis`'s.
"""

from __future__ import annotations

import io
import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from grpo_cli.atomic import check_writable, write_bytes, write_text
from grpo_cli.diagnosis import Finding, diagnose, finite_number, is_training_log, nonfinite_steps
from grpo_cli.errors import UserError
from grpo_cli.run_folder import CHECKPOINT_NAME, checkpoint_folders

MAX_TABLE_ROWS = 25
COLORS = ("tab:blue", "tab:orange")
# The panel that shows what a finding is about: a dotted line marks the step it began there.
FINDING_PANELS = {
    "never_rewarded": "reward",
    "reward_flat": "reward",
    "zero_variance": "frac_reward_zero_std",
    "truncation_high": "completions/clipped_ratio",
    "length_collapse": "completions/clipped_ratio",
    "entropy_collapse": "entropy",
    "kl_rising": "kl",
    "nonfinite": "grad_norm",
    "steps_slowing": "step_time",
}


@dataclass
class RunLogs:
    """What a run left behind, read once."""

    folder: Path  # the folder given: the run's output folder or one of its checkpoints
    name: str
    source: Path  # the file the log history came from
    history: list[dict]  # per-step training logs, each with its "step"
    values: dict = field(default_factory=dict)  # the recipe it ran with, defaults filled in
    skipped: list[int] = field(default_factory=list)  # steps the guard skipped (non-finite)
    accuracy: dict[int, float] = field(default_factory=dict)  # step -> share of completions at the top score
    solved: dict[int, float] = field(default_factory=dict)  # step -> share of prompts with every completion there
    accuracy_reward: str | None = None

    @property
    def is_grpo(self) -> bool:
        return any("reward" in entry for entry in self.history)

    @property
    def steps(self) -> int:
        return max((int(entry["step"]) for entry in self.history), default=0)

    def findings(self) -> list[Finding]:
        return diagnose(self.history, self.values, self.skipped)


@dataclass
class Report:
    """What `grpo report` wrote and found."""

    picture: Path
    table: Path
    findings: dict[str, list[Finding]] = field(default_factory=dict)  # run name -> its findings


# ------------------------------------------------------------------------------------------------ reading


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise UserError(f"{path}: cannot read it as JSON ({err}) - the file is damaged; remove it or copy it again")
    if not isinstance(data, dict):
        raise UserError(f"{path}: a JSON {type(data).__name__}, not the object the trainer writes - remove it")
    return data


def _last_step(history: list) -> int:
    steps = [entry.get("step") for entry in history if isinstance(entry, dict)]
    return max((int(s) for s in steps if isinstance(s, (int, float)) and not isinstance(s, bool)), default=-1)


def _log_entries(data) -> list[dict]:
    """A log file's `log_history` entries, what of them is a logged step (anything else written there is not)."""
    history = data.get("log_history") if isinstance(data, dict) else None
    return [entry for entry in history if isinstance(entry, dict)] if isinstance(history, list) else []


def _history_source(folder: Path) -> tuple[Path, list, dict | None] | None:
    """The file holding the most steps of the run's log history: (file, history, train summary or None)."""
    candidates: list[tuple[int, int, Path, list, dict | None]] = []
    summary_file = folder / "train_summary.json"
    if summary_file.is_file():
        summary = _read_json(summary_file)  # refuses anything but an object
        history = _log_entries(summary)
        candidates.append((_last_step(history), 1, summary_file, history, summary))
    latest = checkpoint_folders(folder, "trainer_state.json")[-1:]
    states = [folder / "trainer_state.json"] + [c / "trainer_state.json" for _, c in latest]
    for state_file in states:
        if state_file.is_file():
            history = _log_entries(_read_json(state_file))
            candidates.append((_last_step(history), 0, state_file, history, None))
    if not candidates:
        return None
    _, _, source, history, summary = max(candidates, key=lambda c: (c[0], c[1]))
    return source, history, summary


def _recipe_values(root: Path, grpo: bool) -> dict:
    """The recipe the run ran with (its recipe.yaml) over the keys' defaults; {} when unreadable."""
    import yaml

    from grpo_cli.recipe import schema

    try:
        values = {key: spec.get("default") for key, spec in schema.keys("rl" if grpo else "sft").items()}
    except Exception:  # noqa: BLE001 - no schema: suggestions without the run's values
        values = {}
    try:
        recorded = yaml.safe_load((root / "recipe.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        recorded = None
    if isinstance(recorded, dict):
        values.update({str(k): v for k, v in recorded.items() if k != "env"})
    return values


def _read_rollouts(
    path: Path, values: dict, before: int | None
) -> tuple[str | None, dict[int, float], dict[int, float]]:
    """Per step, the share of rollouts whose reward for correct answers is at its top, and the share of prompts whose
    completions all are (their groups carry no gradient because they are solved: the prompts are too easy for the
    model), from rollouts.jsonl."""
    from grpo_cli.rewards import accuracy_reward

    if not path.is_file():
        return None, {}, {}
    chosen = None
    counts: dict[int, list[int]] = {}
    groups: dict[int, dict[str, bool]] = {}  # step -> prompt -> every completion at the top so far
    with path.open(encoding="utf-8", errors="replace") as rows:
        for line in rows:
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            if not isinstance(row, dict):
                continue  # not a rollout row
            rewards, done = row.get("rewards"), row.get("step")
            if not isinstance(rewards, dict) or not isinstance(done, int):
                continue
            if chosen is None:
                chosen = accuracy_reward(values.get("task"), set(rewards))
                if chosen is None:
                    return None, {}, {}
            name, top = chosen
            step = done + 1  # a row's `step` is the number of steps done when it was generated
            if before is not None and step > before:
                continue
            value = rewards.get(name)
            right = isinstance(value, (int, float)) and value >= top - 1e-9
            tally = counts.setdefault(step, [0, 0])
            tally[0] += right
            tally[1] += 1
            prompt = json.dumps(row.get("prompt"), sort_keys=True)
            solved = groups.setdefault(step, {})
            solved[prompt] = solved.get(prompt, True) and right
    if chosen is None:
        return None, {}, {}
    accuracy = {step: hits / total for step, (hits, total) in sorted(counts.items()) if total}
    solved = {step: sum(prompts.values()) / len(prompts) for step, prompts in sorted(groups.items()) if prompts}
    return chosen[0], accuracy, solved


def read_run(path: str | Path) -> RunLogs:
    """A run's logs from its output folder or one of its checkpoint folders; UserError when there are none."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise UserError(
            f"{path} {what} - give a run's output folder (its output_dir), one of its checkpoint-N folders, or the "
            "output folder of `grpo eval`"
        )
    found = _history_source(folder)
    if found is None:
        raise UserError(
            f"{path} holds no training logs (no train_summary.json, trainer_state.json or checkpoint-N/"
            "trainer_state.json) - give the output_dir of a `grpo rl` or `grpo sft` run; a run writes its logs at "
            "each checkpoint (save_steps) and at its end"
        )
    source, raw, summary = found
    history = []
    for index, entry in enumerate(raw):
        if isinstance(entry, dict) and is_training_log(entry):
            history.append(dict(entry, step=entry.get("step", index + 1)))
    if not history:
        raise UserError(f"{source} has no step logged yet - wait for the run's first log (logging_steps), then retry")
    checkpoint = CHECKPOINT_NAME.match(folder.name)
    root = folder.parent if checkpoint else folder
    if summary is None and checkpoint and (root / "train_summary.json").is_file():
        summary = _read_json(root / "train_summary.json")
    before = int(checkpoint.group(1)) if checkpoint else None
    skipped = [
        int(bad["step"]) for bad in (summary or {}).get("non_finite_steps") or []
        if isinstance(bad, dict) and isinstance(bad.get("step"), int) and (before is None or bad["step"] <= before)
    ]
    run = RunLogs(folder=folder, name=_run_name(folder), source=source, history=history, skipped=skipped)
    run.values = _recipe_values(root, run.is_grpo)
    if run.is_grpo:
        run.accuracy_reward, run.accuracy, run.solved = _read_rollouts(root / "rollouts.jsonl", run.values, before)
    return run


def _run_name(folder: Path) -> str:
    folder = folder.resolve()
    return f"{folder.parent.name}/{folder.name}" if CHECKPOINT_NAME.match(folder.name) else folder.name


def is_eval_folder(path: str | Path) -> bool:
    """A `grpo eval` output folder: its summary.json lists models."""
    summary = Path(path).expanduser() / "summary.json"
    if not summary.is_file():
        return False
    try:
        return isinstance(json.loads(summary.read_text(encoding="utf-8")).get("models"), list)
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return False


# ------------------------------------------------------------------------------------------------ series


def _series(run: RunLogs, key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one logged key, its finite values only."""
    steps, values = [], []
    for entry in run.history:
        value = finite_number(entry, key)
        if value is not None:
            steps.append(int(entry["step"]))
            values.append(value)
    return steps, values


def _reward_names(runs: list[RunLogs]) -> list[str]:
    names: dict[str, None] = {}
    for run in runs:
        for entry in run.history:
            for key in entry:
                if key.startswith("rewards/") and key.endswith("/mean"):
                    names[key[len("rewards/") : -len("/mean")]] = None
    return list(names)


@dataclass
class Panel:
    title: str
    keys: list[str]  # one line per key (per run); "accuracy" is the rollouts' share
    labels: list[str] | None = None  # per key, when there are several
    log_scale: bool = False
    share: bool = False  # a share in [0, 1]


def _panels(runs: list[RunLogs]) -> list[Panel]:
    grpo = any(run.is_grpo for run in runs)
    names = _reward_names(runs)
    panels = []
    if grpo:
        panels.append(Panel("reward (weighted sum)", ["reward"]))
        panels += [Panel(f"reward: {name}", [f"rewards/{name}/mean"]) for name in names]
        if any(run.accuracy for run in runs):
            which = next(run.accuracy_reward for run in runs if run.accuracy)
            panels.append(Panel(f"accuracy ({which} at its top score)", ["accuracy"], share=True))
        panels += [
            Panel("completion length (tokens)", ["completions/mean_length"]),
            Panel("clipped share (cut at max_completion_length)", ["completions/clipped_ratio"], share=True),
            Panel("zero-variance groups (share)", ["frac_reward_zero_std"], share=True),
        ]
        failing = [n for n in names if any(any(_series(run, f"rewards/{n}/failed_frac")[1]) for run in runs)]
        if failing:
            panels.append(
                Panel("reward failures (share of completions)", [f"rewards/{n}/failed_frac" for n in failing],
                      labels=failing, share=True)
            )
    else:
        panels.append(Panel("token accuracy", ["mean_token_accuracy"], share=True))
    panels += [
        Panel("entropy", ["entropy"]),
        Panel("KL to the reference", ["kl"]),
        Panel("gradient norm (x: non-finite step)", ["grad_norm"]),
        Panel("learning rate", ["learning_rate"]),
        Panel("step time (s)", ["step_time"]),
        Panel("loss (near 0 is normal in GRPO)" if grpo else "loss", ["loss"]),
    ]

    def has_data(panel: Panel) -> bool:
        if panel.keys == ["accuracy"]:
            return True
        return any(_series(run, key)[0] for run in runs for key in panel.keys) or (
            panel.keys == ["grad_norm"] and any(nonfinite_steps(run.history, run.skipped) for run in runs)
        )

    return [panel for panel in panels if has_data(panel)]


# ------------------------------------------------------------------------------------------------ drawing


def _label(finding: str) -> str:
    """A finding's name as a short label: `reward_failing:format` -> `format failing`."""
    kind, _, reward = finding.partition(":")
    return f"{reward} failing" if reward else {"nonfinite": "non-finite"}.get(kind, kind.replace("_", " "))


def draw(runs: list[RunLogs], findings: dict[str, list[Finding]] | None = None) -> bytes:
    """The runs' panels on one PNG (matplotlib's Agg renderer, no display needed); each finding's first step marked."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    panels = _panels(runs)
    columns = 3
    rows = max(1, math.ceil(len(panels) / columns))
    figure = Figure(figsize=(5.2 * columns, 3.1 * rows + 0.6), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).flatten()
    findings = findings if findings is not None else {run.name: run.findings() for run in runs}
    for ax, panel in zip(axes, panels):
        ax.set_title(panel.title, fontsize=10, loc="left")
        ax.grid(True, alpha=0.3)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        marked = False  # the non-finite marks' legend entry, once
        for r, run in enumerate(runs):
            color = COLORS[r % len(COLORS)]
            for k, key in enumerate(panel.keys):
                if key == "accuracy":
                    steps, values = list(run.accuracy), list(run.accuracy.values())
                else:
                    steps, values = _series(run, key)
                if not steps:
                    continue
                label = run.name if len(runs) > 1 else None
                if panel.labels:
                    label = f"{panel.labels[k]}" + (f" ({run.name})" if len(runs) > 1 else "")
                style = {"color": color} if len(panel.keys) == 1 else {}
                line = ax.plot(steps, values, label=label, linewidth=1.4, marker="o" if len(steps) <= 30 else None,
                               markersize=3, linestyle="-" if r == 0 else "--", **style)[0]
                if key == "reward" and len(runs) == 1:
                    _, std = _series(run, "reward_std")
                    if len(std) == len(values):
                        low = [v - s for v, s in zip(values, std)]
                        high = [v + s for v, s in zip(values, std)]
                        ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
            if panel.keys == ["grad_norm"]:
                bad = nonfinite_steps(run.history, run.skipped)
                if bad:
                    ax.plot(bad, [0.0] * len(bad), "x", color="red", markersize=8, markeredgewidth=2,
                            label=None if marked else "non-finite", clip_on=False)
                    marked = True
            for finding in findings[run.name]:
                target = FINDING_PANELS.get(finding.name.split(":")[0])
                if finding.name.startswith("reward_failing:"):
                    target = f"rewards/{finding.name.split(':', 1)[1]}/failed_frac"
                if target in panel.keys:
                    ax.axvline(finding.step, color="tab:red", linestyle=":", linewidth=1.2, alpha=0.8)
                    ax.annotate(_label(finding.name), (finding.step, 1.0),
                                xycoords=("data", "axes fraction"), fontsize=7, color="tab:red",
                                xytext=(2, -9), textcoords="offset points")
        if panel.share:
            ax.set_ylim(-0.03, 1.03)
        if panel.keys == ["learning_rate"]:
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        else:
            ax.ticklabel_format(axis="y", useOffset=False)  # 10.7898 reads better than 1e-5 + 1.07898e1
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    title = " vs ".join(f"{run.name} ({run.steps} steps)" for run in runs)
    figure.suptitle(f"grpo report: {title}", fontsize=12)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


# ------------------------------------------------------------------------------------------------ the table


def _every(steps: int) -> int:
    """Steps per table row: 1, 2, 5, 10, 20, 50, ... so that the table has at most MAX_TABLE_ROWS rows."""
    size = 1
    while steps / size > MAX_TABLE_ROWS:
        size = size * 5 // 2 if str(size).startswith("2") else size * 2
    return size


def _cell(value: float | None, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "share":
        return f"{value:.0%}"
    if kind == "sci":
        return f"{value:.1e}"
    if kind == "int":
        return f"{value:.0f}"
    return f"{value:.3g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"


def run_table(run: RunLogs) -> list[str]:
    """A markdown table of the run's numbers, one row per N steps (each the mean over its steps)."""
    columns: list[tuple[str, str, str]] = []  # (header, key, kind)
    if run.is_grpo:
        columns.append(("reward", "reward", "num"))
        columns += [(name, f"rewards/{name}/mean", "num") for name in _reward_names([run])]
        if run.accuracy:
            columns.append(("accuracy", "accuracy", "share"))
        columns += [
            ("length", "completions/mean_length", "int"),
            ("clipped", "completions/clipped_ratio", "share"),
            ("zero-std groups", "frac_reward_zero_std", "share"),
            ("skipped", "frac_rows_skipped", "share"),  # completions left out of the forward/backward
            ("micro-batches", "micro_batches_run", "num"),  # a step's micro-batches with a forward/backward
        ]
        if run.solved:  # the zero-variance groups that are solved, not failed: the prompts are too easy
            columns.append(("solved groups", "solved", "share"))
    else:
        columns += [("loss", "loss", "num"), ("token acc", "mean_token_accuracy", "share")]
    columns += [
        ("entropy", "entropy", "num"),
        ("KL", "kl", "num"),
        ("grad norm", "grad_norm", "num"),
        ("lr", "learning_rate", "sci"),
        ("s/step", "step_time", "num"),
    ]
    from_rollouts = {"accuracy": run.accuracy, "solved": run.solved}  # step -> share; the rest from the logs
    columns = [c for c in columns if c[1] in from_rollouts or _series(run, c[1])[0]]
    size = _every(run.steps)
    bad = set(nonfinite_steps(run.history, run.skipped))
    buckets: dict[int, list[dict]] = {}
    for entry in run.history:
        buckets.setdefault((int(entry["step"]) - 1) // size, []).append(entry)
    lines = [
        "| step | " + " | ".join(header for header, _, _ in columns) + (" | non-finite |" if bad else " |"),
        "|---:|" + "---:|" * len(columns) + ("---:|" if bad else ""),
    ]
    for bucket, entries in sorted(buckets.items()):
        steps = [int(e["step"]) for e in entries]
        cells = []
        for _, key, kind in columns:
            if key in from_rollouts:
                found = [from_rollouts[key][s] for s in steps if s in from_rollouts[key]]
            else:
                found = [v for v in (finite_number(e, key) for e in entries) if v is not None]
            cells.append(_cell(statistics.fmean(found) if found else None, kind))
        row = f"| {max(steps)} | " + " | ".join(cells) + " |"
        if bad:
            row += f" {sum(s in bad for s in range(min(steps), max(steps) + 1)) or ''} |"
        lines.append(row)
    head = f"One row per {size} steps, each the mean over them:" if size > 1 else "One row per step:"
    return [head, "", *lines]


def _markdown(runs: list[RunLogs], picture: Path, findings: dict[str, list[Finding]]) -> str:
    title = " vs ".join(run.name for run in runs)
    lines = [f"# grpo report: {title}", "", f"![report]({picture.name})", ""]
    for run in runs:
        lines += [f"## {run.name}", "", f"{run.steps} steps, logs from `{run.source}`.", ""]
        lines += ["### Diagnosis", ""]
        found = findings[run.name]
        lines += [f"- {f.line}" for f in found] if found else ["Nothing found: none of the checks holds."]
        lines += ["", "### Numbers", "", *run_table(run), ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ evals


def read_eval(path: str | Path) -> dict:
    """A `grpo eval` summary.json."""
    summary = _read_json(Path(path).expanduser() / "summary.json")
    if not summary.get("models"):
        raise UserError(f"{path}/summary.json lists no models - run `grpo eval` again")
    return summary


def _eval_metrics(models: list[dict]) -> list[tuple[str, list[float | None], bool]]:
    """(metric, value per model, is a share) for the eval's panels and table."""
    metrics = [
        ("accuracy", [m.get("accuracy") for m in models], True),
        ("format rate", [m.get("format_rate") for m in models], True),
    ]
    ks = list(dict.fromkeys(k for m in models for k in (m.get("pass_at_k") or {})))
    metrics += [(f"pass@{k}", [(m.get("pass_at_k") or {}).get(k) for m in models], True) for k in ks]
    metrics.append(("mean completion tokens", [m.get("mean_completion_length") for m in models], False))
    if any("reward_total" in m for m in models):
        metrics.append(("reward (weighted sum)", [m.get("reward_total") for m in models], False))
    return metrics


def draw_eval(models: list[dict], title: str) -> bytes:
    from matplotlib.figure import Figure

    metrics = _eval_metrics(models)
    columns = min(3, len(metrics))
    rows = math.ceil(len(metrics) / columns)
    width = max(4.5, 0.9 * len(models) + 2)
    figure = Figure(figsize=(width * columns, 3.4 * rows + 0.6), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).flatten()
    labels = [str(m.get("model")) for m in models]
    short = [label if len(label) <= 28 else "…" + label[-27:] for label in labels]
    for ax, (name, values, share) in zip(axes, metrics):
        heights = [v if isinstance(v, (int, float)) else 0.0 for v in values]
        bars = ax.bar(range(len(models)), heights, color=[f"C{i % 10}" for i in range(len(models))])
        for bar, value in zip(bars, values):
            text = "-" if value is None else (f"{value:.1%}" if share else f"{value:.3g}")
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                        fontsize=8, xytext=(0, 2), textcoords="offset points")
        ax.set_title(name, fontsize=10, loc="left")
        ax.set_xticks(range(len(models)), short, rotation=20, ha="right", fontsize=8)
        ax.tick_params(axis="y", labelsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        if share:
            ax.set_ylim(0, 1.1)
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    figure.suptitle(f"grpo report: {title}", fontsize=12)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def _eval_markdown(models: list[dict], title: str, picture: Path) -> str:
    lines = [f"# grpo report: {title}", "", f"![report]({picture.name})", ""]
    lines.append("| metric | " + " | ".join(str(m.get("model")).replace("|", "\\|") for m in models) + " |")
    lines.append("|---|" + "---:|" * len(models))
    for name, values, share in _eval_metrics(models):
        cells = ["-" if v is None else (f"{v:.1%}" if share else f"{v:.3g}") for v in values]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ the command


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "run"


def _targets(folders: list[Path], output: str | None, names: list[str]) -> tuple[Path, Path]:
    out = Path(output).expanduser() if output else folders[-1]
    check_writable(out, "--output", folder=True)
    stem = "report" if len(folders) == 1 else f"report-vs-{_slug(names[0])}"
    return out / f"{stem}.png", out / f"{stem}.md"


def report_run(paths: list[str | Path], output: str | None = None) -> Report:
    """`grpo report PATH [PATH]`: draw report.png, write report.md, print the diagnosis; returns what it wrote."""
    from grpo_cli.console import console

    if not paths or len(paths) > 2:
        raise UserError(
            f"grpo report takes one or two folders, got {len(paths)} - a run (or `grpo eval` output), or a baseline "
            "run and a changed one"
        )
    folders = [Path(p).expanduser() for p in paths]
    evals = [is_eval_folder(folder) for folder in folders]
    if any(evals):
        if not all(evals):
            raise UserError(
                "grpo report draws runs or `grpo eval` outputs, not one of each - give two runs, or two eval folders"
            )
        return _report_evals(folders, output)
    runs = [read_run(folder) for folder in folders]
    if len(runs) == 2 and runs[0].name == runs[1].name:
        for run in runs:
            run.name = f"{run.folder.resolve().parent.name}/{run.name}"
    picture, table = _targets(folders, output, [run.name for run in runs])
    findings = {run.name: run.findings() for run in runs}
    write_bytes(picture, draw(runs, findings))
    write_text(table, _markdown(runs, picture, findings))
    for run in runs:
        found = findings[run.name]
        head = f"report of {_escape(run.name)}: {run.steps} steps"
        console.print(f"[bold]{head}[/]" + (f", {len(found)} finding(s)" if found else ", nothing found"),
                      soft_wrap=True, markup=True, highlight=False)
        for finding in found:
            console.print(f"[bold yellow]{_escape(finding.line)}[/]", soft_wrap=True)
    console.print(f"wrote {_escape(str(picture))} and {_escape(str(table))}", soft_wrap=True)
    return Report(picture=picture, table=table, findings=findings)


def _report_evals(folders: list[Path], output: str | None) -> Report:
    from grpo_cli.console import console
    from grpo_cli.eval import print_summary

    summaries = [read_eval(folder) for folder in folders]
    models = []
    for folder, summary in zip(folders, summaries):
        for model in summary["models"]:
            label = str(model.get("model"))
            models.append(dict(model, model=f"{label} ({folder.name})" if len(folders) > 1 else label))
    settings = summaries[0].get("settings") or {}
    title = f"eval of {settings.get('task', '?')} ({settings.get('split', '?')})"
    picture, table = _targets(folders, output, [_slug(f.resolve().name) for f in folders])
    write_bytes(picture, draw_eval(models, title))
    write_text(table, _eval_markdown(models, title, picture))
    print_summary({"models": models, "settings": {**settings, "task": settings.get("task", "?"),
                                                  "split": settings.get("split", "?")}})
    console.print(f"wrote {_escape(str(picture))} and {_escape(str(table))}", soft_wrap=True)
    return Report(picture=picture, table=table)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
