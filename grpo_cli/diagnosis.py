"""What a run's logs say: findings from the trainer's log entries, each with the step it began and the recipe key to
change. Pure functions over a list of log dicts (TRL's `log_history`), light to import: `grpo report` reads them
after a run, and the console's `FindingWatch` says each once during one.

A finding's state must hold for `HOLD` (3) logs in a row unless said otherwise. The thresholds:

- never rewarded: the run's first logs have reward <= 0 and reward_std 0 (every completion scored alike, nothing
  above 0) for `HOLD` logs: GRPO has nothing to learn from until some completion is rewarded.
- most groups zero-variance: `frac_reward_zero_std` >= `ZERO_STD_SHARE` (0.5). With `dynamic_sampling` the share
  of the groups trained on instead (`dynamic_sampling/filled_share`: the dropped groups that filled a batch still
  short after the extra rounds), since the others never reach the update. Where the logs say how many groups got
  every completion right (`frac_groups_solved`, tasks with a reward for correct answers), the advice says which way
  the prompts are off: harder when those are at least half the zero-variance share, else easier.
- reward flat: over `FLAT_LOGS` (50) logs the reward's fitted change (a least-squares line) is small for sure: its
  size plus two standard errors stays under `FLAT_RISE` (0.05) x max(1, |reward|), while most groups still tell
  completions apart (else "zero-variance" explains it). A step's reward is the mean of a few prompts' groups and moves
  by several hundredths from step to step, so a run that learns slowly is not called flat on noise alone.
- truncation high: `completions/clipped_ratio` >= `CLIPPED_SHARE` (0.3).
- length collapse: every completion cut (clipped ratio >= 0.99), reward_std 0 and the reward below its best.
- entropy collapse: `entropy` below `ENTROPY_FLOOR` (0.02) in GRPO logs.
- KL rising fast: over `KL_LOGS` (5) logs the KL rose at least 3 times out of 4, to >= `KL_HIGH` (0.1) and to
  >= `KL_GROWTH` (4) times where the window began.
- non-finite steps: a log whose loss, gradient norm, reward, KL or entropy is NaN or inf (null in strict JSON), or a
  step the run's guard skipped; said at the first.
- a reward failing: `rewards/NAME/failed_frac` (an exception, a bad value or a timeout) averages >= `FAIL_SHARE`
  (0.1) over the logs since its first failure, with failures in at least 2 logs; said as timing out when
  `rewards/NAME/timed_out_frac` is at least half of that.
- steps slowing: the median `step_time` of the last 3 logs is >= `SLOW_FACTOR` (1.5) times the median of logs 2-6
  (the first includes warm-up), with at least 8 logs, and the steps' work does not explain it. A step's time follows
  its longest completion (generation runs until it ends) and the completion tokens it trains (`frac_rows_skipped`:
  a step whose groups all scored alike trains one completion); while the slow steps' work grew by as much, only
  completions that grew longer are said (a longer step is no fault where more completions teach something).

The findings that are shares of groups or completions (zero-variance, truncation, length and entropy collapse) wait
until the logs cover `MIN_GROUPS` (16) prompt groups, as far as the recipe tells (per_device_train_batch_size x
gradient_accumulation_steps / num_generations a log, at least): two groups a step say little for three steps.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field

HOLD = 3
ZERO_STD_SHARE = 0.5
FLAT_LOGS = 50
FLAT_RISE = 0.05
CLIPPED_SHARE = 0.3
ENTROPY_FLOOR = 0.02
KL_LOGS = 5
KL_HIGH = 0.1
KL_GROWTH = 4.0
FAIL_SHARE = 0.1
SLOW_FACTOR = 1.5
SLOW_MIN_LOGS = 8
MIN_GROUPS = 16
EPS = 1e-9

# Keys whose non-finite value makes a step non-finite.
NONFINITE_KEYS = ("loss", "grad_norm", "reward", "kl", "entropy")


@dataclass(frozen=True)
class Finding:
    """One thing the logs show: `name` (e.g. never_rewarded, reward_failing:NAME), the step it began, one line."""

    name: str
    step: int
    message: str

    @property
    def line(self) -> str:
        return f"step {self.step}: {self.message}"


def finite_number(logs: dict, key: str) -> float | None:
    """The log's value for `key` when it is a finite number, else None."""
    value = logs.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def is_training_log(entry: dict) -> bool:
    """A per-step training log: not the closing summary (train_runtime), not an evaluation."""
    return "train_runtime" not in entry and not any(str(key).startswith("eval_") for key in entry)


def _is_grpo(entry: dict) -> bool:
    return "reward" in entry


def _step(entry: dict, index: int) -> int:
    step = entry.get("step")
    return int(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else index + 1


def _value(values: dict, key: str):
    value = values.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _now(values: dict, key: str, fmt: str = "{:g}") -> str:
    """`, now X` for a suggestion when the run's value of `key` is known."""
    value = _value(values, key)
    return f", now {fmt.format(value)}" if value is not None else ""


def _held(flags: list[bool], hold: int = HOLD) -> tuple[int, int] | None:
    """(start, index) of the first run of `hold` true flags in a row: where it began and where it first held."""
    count = 0
    for index, flag in enumerate(flags):
        count = count + 1 if flag else 0
        if count == hold:
            return index - hold + 1, index
    return None


def _share_held(logs: list[dict], key: str, threshold: float) -> tuple[int, float] | None:
    """Where `key` first stayed at or above `threshold` for `HOLD` logs in a row, and its value when it first held."""
    shares = [finite_number(entry, key) for entry in logs]
    held = _held([share is not None and share >= threshold for share in shares])
    if held is None:
        return None
    start, index = held
    return start, shares[index]


def _unrewarded_prefix(logs: list[dict]) -> int:
    """How many GRPO logs from the first scored every completion alike and none above 0."""
    count = 0
    for entry in logs:
        reward, std = finite_number(entry, "reward"), finite_number(entry, "reward_std")
        if reward is None or std is None or reward > EPS or std > EPS:
            break
        count += 1
    return count


# ------------------------------------------------------------------------------------------------ the findings


def never_rewarded(logs: list[dict], values: dict) -> Finding | None:
    count = _unrewarded_prefix(logs)
    if count < HOLD:
        return None
    first, last = _step(logs[0], 0), _step(logs[count - 1], count - 1)
    span = f"in any of the {count} steps so far" if count == len(logs) else f"in steps {first}-{last}"
    return Finding(
        "never_rewarded",
        first,
        f"never rewarded: no completion scored above 0 {span} (every reward 0), so GRPO has nothing to learn from - "
        "teach the task's format first with a cold start (`grpo sft` on the task's reference solutions), then train "
        "from it (--model_name_or_path SFT_OUTPUT_DIR), or start from an instruct model",
    )


def zero_variance_key(values: dict) -> str:
    """The logged share of trained groups whose completions all got the same reward (`zero_variance`)."""
    return "dynamic_sampling/filled_share" if values.get("dynamic_sampling") is True else "frac_reward_zero_std"


def zero_variance(logs: list[dict], values: dict) -> Finding | None:
    dynamic = zero_variance_key(values) != "frac_reward_zero_std"
    held = _share_held(logs, zero_variance_key(values), ZERO_STD_SHARE)
    if held is None:
        return None
    start, share = held
    n = _value(values, "num_generations")
    more = f"--num_generations {int(n) * 2}" if n else "a higher --num_generations"
    if dynamic:
        rounds = _value(values, "dynamic_sampling_max_rounds")
        higher = "a higher --dynamic_sampling_max_rounds"
        if rounds:
            higher = f"--dynamic_sampling_max_rounds {int(rounds) * 2}"
        said = (
            f"zero-variance groups: after dynamic sampling's extra rounds, {share:.0%} of the groups trained on still "
            f"gave all their completions the same reward, so they teach nothing - more rounds ({higher}"
            f"{_now(values, 'dynamic_sampling_max_rounds')}), more "
        )
    else:
        said = (
            f"zero-variance groups: {share:.0%} of groups gave all their completions the same reward, so they teach "
            "nothing - more "
        )
    window = logs[start : start + HOLD]  # the logs where it first held
    solved = [value for value in (finite_number(entry, "frac_groups_solved") for entry in window) if value is not None]
    level = "prompts nearer the model's level (harder if it solves them all, easier if none)"
    if solved:  # the task has a reward for correct answers: which way the prompts are off
        right = statistics.fmean(solved)
        flat = statistics.fmean(finite_number(entry, zero_variance_key(values)) or 0.0 for entry in window)
        if right >= flat / 2:
            level = f"harder prompts: {right:.0%} of groups got every completion right"
        else:
            level = (
                f"easier prompts, or a cold start on the task first: only {right:.0%} of groups got every completion "
                "right, the others all scored alike below it"
            )
    return Finding(
        "zero_variance",
        _step(logs[start], start),
        f"{said}completions per prompt ({more}{_now(values, 'num_generations')}; the generation batch must stay a "
        f"multiple of it) or {level}",
    )


def _fitted_change(values: list[float]) -> tuple[float, float]:
    """The change across `values` of their least-squares line, and its standard error."""
    n = len(values)
    x_mean, y_mean = (n - 1) / 2, statistics.fmean(values)
    sxx = sum((x - x_mean) ** 2 for x in range(n))
    slope = sum((x - x_mean) * (y - y_mean) for x, y in enumerate(values)) / sxx
    residuals = sum((y - y_mean - slope * (x - x_mean)) ** 2 for x, y in enumerate(values))
    error = math.sqrt(residuals / (n - 2) / sxx)
    return slope * (n - 1), error * (n - 1)


def reward_flat(logs: list[dict], values: dict) -> Finding | None:
    rewards = [finite_number(entry, "reward") for entry in logs]
    for end in range(FLAT_LOGS, len(logs) + 1):
        start = end - FLAT_LOGS
        window = rewards[start:end]
        if any(r is None for r in window):
            continue
        mean = statistics.fmean(window)
        change, error = _fitted_change(window)
        if abs(change) + 2 * error > FLAT_RISE * max(1.0, abs(mean)):
            continue
        shares = [finite_number(entry, zero_variance_key(values)) for entry in logs[start:end]]
        known = [s for s in shares if s is not None]
        if known and statistics.fmean(known) >= ZERO_STD_SHARE:
            continue  # most groups have no variance: `zero_variance` says why
        lr = _value(values, "learning_rate")
        higher = f"--learning_rate {lr * 2:.1e}" if lr else "a higher --learning_rate"
        return Finding(
            "reward_flat",
            _step(logs[start], start),
            f"reward flat at {mean:.3f} over steps {_step(logs[start], start)}-{_step(logs[end - 1], end - 1)} "
            f"(fitted change {change:+.3f} +- {error:.3f}) although groups tell completions apart: the updates are "
            f"too small to move it - a higher learning rate ({higher}{_now(values, 'learning_rate', '{:.1e}')})",
        )
    return None


def truncation_high(logs: list[dict], values: dict) -> Finding | None:
    held = _share_held(logs, "completions/clipped_ratio", CLIPPED_SHARE)
    if held is None:
        return None
    start, clipped = held
    length = _value(values, "max_completion_length")
    longer = f"--max_completion_length {int(length) * 2}" if length else "a higher --max_completion_length"
    return Finding(
        "truncation_high",
        _step(logs[start], start),
        f"truncation high: {clipped:.0%} of completions are cut at the length limit, before their answer - "
        "longer "
        f"completions ({longer}{_now(values, 'max_completion_length')}) or cut ones left out of the loss "
        "(--mask_truncated_completions true)",
    )


def length_collapse(logs: list[dict], values: dict) -> Finding | None:
    best: tuple[float, int] | None = None
    flags, bests = [], []
    for index, entry in enumerate(logs):
        reward, std = finite_number(entry, "reward"), finite_number(entry, "reward_std")
        clipped = finite_number(entry, "completions/clipped_ratio")
        if reward is not None and (best is None or reward > best[0]):
            best = (reward, _step(entry, index))
        flags.append(
            clipped is not None and clipped >= 0.99 and std is not None and std <= 1e-6
            and best is not None and reward is not None and best[0] > reward + 1e-6
        )
        bests.append(best)
    held = _held(flags)
    if held is None:
        return None
    start, index = held
    reward = finite_number(logs[index], "reward")
    top, at = bests[index]
    lr = _value(values, "learning_rate")
    lower = f" (--learning_rate {lr / 2:.1e}{_now(values, 'learning_rate', '{:.1e}')})" if lr else ""
    return Finding(
        "length_collapse",
        _step(logs[start], start),
        f"length collapse: every completion runs to the length limit and none is rewarded any more (reward {reward:.3f}, "
        f"best {top:.3f} at step {at}) - resume from a checkpoint before it with a lower learning_rate{lower}",
    )


def entropy_collapse(logs: list[dict], values: dict) -> Finding | None:
    entropies = [finite_number(entry, "entropy") if "mean_token_accuracy" not in entry else None for entry in logs]
    held = _held([e is not None and e < ENTROPY_FLOOR for e in entropies])
    if held is None:
        return None
    start, index = held
    temperature = _value(values, "temperature")
    hotter = f" (--temperature {temperature + 0.2:g}{_now(values, 'temperature')})" if temperature else ""
    return Finding(
        "entropy_collapse",
        _step(logs[start], start),
        f"entropy collapse: entropy {entropies[index]:.4f}, the policy samples almost one completion per prompt, so "
        f"groups stop telling completions apart - a lower learning_rate or a higher temperature{hotter} keeps it "
        "exploring",
    )


def kl_rising(logs: list[dict], values: dict) -> Finding | None:
    kls = [(index, finite_number(entry, "kl")) for index, entry in enumerate(logs)]
    kls = [(index, kl) for index, kl in kls if kl is not None]
    for end in range(KL_LOGS, len(kls) + 1):
        if kls[end - 1][1] < KL_HIGH:
            continue
        window = [kl for _, kl in kls[end - KL_LOGS : end]]
        rises = sum(b > a for a, b in itertools.pairwise(window))
        if rises >= KL_LOGS - 2 and window[-1] >= KL_HIGH and window[-1] >= KL_GROWTH * max(window[0], EPS):
            start, last = kls[end - KL_LOGS][0], kls[end - 1][0]
            lr, beta = _value(values, "learning_rate"), _value(values, "beta")
            lower = f"--learning_rate {lr / 2:.1e}{_now(values, 'learning_rate', '{:.1e}')}" if lr else "--learning_rate"
            stronger = f"--beta {beta * 2:g}, now {beta:g}" if beta else "--beta 0.04"
            return Finding(
                "kl_rising",
                _step(logs[start], start),
                f"KL rising fast: from {window[0]:.3g} to {window[-1]:.3g} over steps {_step(logs[start], start)}-"
                f"{_step(logs[last], last)}, the policy moves away from the reference quickly - a lower learning rate "
                f"({lower}) or a stronger KL penalty ({stronger})",
            )
    return None


def _nonfinite_keys(entry: dict) -> list[str]:
    bad = []
    for key in NONFINITE_KEYS:
        if key not in entry:
            continue
        value = entry[key]
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            bad.append(key)
    return bad


def nonfinite_steps(logs: list[dict], skipped: list[int] | tuple[int, ...] = ()) -> list[int]:
    """Steps with a non-finite loss, gradient norm, reward, KL or entropy in their log, or skipped by the guard."""
    steps = {_step(entry, index) for index, entry in enumerate(logs) if _nonfinite_keys(entry)}
    return sorted(steps | {int(step) for step in skipped})


def nonfinite(logs: list[dict], values: dict, skipped: list[int] | tuple[int, ...] = ()) -> Finding | None:
    steps = nonfinite_steps(logs, skipped)
    if not steps:
        return None
    first = steps[0]
    what = next(
        (_nonfinite_keys(entry) for index, entry in enumerate(logs) if _step(entry, index) == first and
         _nonfinite_keys(entry)),
        [],
    )
    lr, norm = _value(values, "learning_rate"), _value(values, "max_grad_norm")
    lower = f"--learning_rate {lr / 2:.1e}{_now(values, 'learning_rate', '{:.1e}')}" if lr else "a lower --learning_rate"
    clip = f"--max_grad_norm {norm / 2:g}, now {norm:g}" if norm else "--max_grad_norm 1.0"
    named = f" ({', '.join(what).replace('grad_norm', 'gradient norm')})" if what else ""
    return Finding(
        "nonfinite",
        first,
        f"non-finite values{named}: {len(steps)} step(s) so far applied no update - a lower learning rate ({lower}) "
        f"or tighter gradient clipping ({clip})",
    )


def reward_failures(logs: list[dict], values: dict) -> list[Finding]:
    keys = dict.fromkeys(key for entry in logs for key in entry)  # every key logged, in the order first logged
    names = [key[len("rewards/") : -len("/failed_frac")] for key in keys
             if key.startswith("rewards/") and key.endswith("/failed_frac")]
    found = []
    timeout = _value(values, "reward_timeout")
    for name in names:
        shares = [finite_number(entry, f"rewards/{name}/failed_frac") for entry in logs]
        first = next((i for i, share in enumerate(shares) if share), None)
        if first is None:
            continue
        failing, total, count = 0, 0.0, 0  # since the first failure: logs with failures, the shares' sum and count
        for index in range(first, len(logs)):
            failing += bool(shares[index])
            if shares[index] is not None:
                total, count = total + shares[index], count + 1
            share = total / count if count else 0.0
            if failing >= 2 and share >= FAIL_SHARE:
                slow = f"--reward_timeout {timeout * 4:g}, now {timeout:g} s" if timeout else "a higher --reward_timeout"
                timed = [finite_number(entry, f"rewards/{name}/timed_out_frac") for entry in logs[first : index + 1]]
                timed_share = statistics.fmean(t for t in timed if t is not None) if any(t is not None for t in timed) else None
                if timed_share is not None and timed_share >= share / 2:  # most of its failures are timeouts
                    message = (
                        f"reward {name} timing out: it ran past reward_timeout on {timed_share:.0%} of completions "
                        f"(failed on {share:.0%} in all), which score its failure value - allow it more time ({slow} "
                        f"per completion) or make it faster (`grpo rewards score` times it on completions)"
                    )
                elif timed_share is not None:
                    message = (
                        f"reward {name} failing: it failed on {share:.0%} of completions (raised or returned a "
                        "non-number; its first warning in the log says which): those completions score its failure "
                        f"value - fix {name} (`grpo rewards score` runs it on completions)"
                    )
                else:  # logs from before timeouts were told apart
                    message = (
                        f"reward {name} failing: it failed on {share:.0%} of completions (raised, returned a "
                        "non-number or ran past reward_timeout; its first warning in the log says which): those "
                        f"completions score its failure value - fix {name} (`grpo rewards score` runs it on "
                        f"completions), or for a slow reward allow it more time ({slow} per completion)"
                    )
                found.append(Finding(f"reward_failing:{name}", _step(logs[first], first), message))
                break
    return found


def _trained_tokens(entry: dict) -> float | None:
    length = finite_number(entry, "completions/mean_length")
    skipped = finite_number(entry, "frac_rows_skipped")
    return None if length is None else length * (1.0 - (skipped or 0.0))


# What a GRPO step's time grows with, read from its log: the decode steps of generation and the tokens it trains.
STEP_WORK = {
    "longest completion": lambda entry: finite_number(entry, "completions/max_length"),
    "completion tokens": lambda entry: finite_number(entry, "completions/mean_length"),
    "trained tokens": _trained_tokens,
}


def _mean(work, logs: list[dict]) -> float | None:
    """The mean of `work` over the logs that have it, or None."""
    values = [v for v in map(work, logs) if v is not None]
    return statistics.fmean(values) if values else None


def _growth(work, before: list[dict], after: list[dict]) -> float:
    """How many times the mean of `work` over the logs `after` is its mean over `before` (1.0 where unknown)."""
    a, b = _mean(work, before), _mean(work, after)
    return b / a if a and b is not None and a > 0 else 1.0


def steps_slowing(logs: list[dict], values: dict) -> Finding | None:
    times = [(index, finite_number(entry, "step_time")) for index, entry in enumerate(logs)]
    times = [(index, t) for index, t in times if t is not None and t > 0]
    if len(times) < SLOW_MIN_LOGS:
        return None
    base_window = times[1:6]
    baseline = statistics.median(t for _, t in base_window)
    slow = [t >= SLOW_FACTOR * baseline for _, t in times]
    for end in range(SLOW_MIN_LOGS, len(times) + 1):
        if sum(slow[end - 3 : end]) < 2:  # the median of the last 3 is below the threshold
            continue
        start = end - 1  # the slow stretch: back from here while steps stay slow
        while start > 6 and times[start - 1][1] >= SLOW_FACTOR * baseline:
            start -= 1
        stretch = times[start:end]
        began, recent = stretch[0][0], statistics.median(t for _, t in stretch)
        before, after = [logs[i] for i, _ in base_window], [logs[i] for i, _ in stretch]
        grown = {what: _growth(work, before, after) for what, work in STEP_WORK.items()}
        unexplained = recent / baseline >= SLOW_FACTOR * max(1.0, *grown.values())
        grew = grown["completion tokens"] >= 1.3
        if not unexplained and not grew:
            continue  # as much more work: longer generations or more completions trained
        head = (
            f"steps slowing: {recent / baseline:.1f}x as long as at the start ({baseline:.2f} s -> {recent:.2f} s "
            "per step)"
        )
        if unexplained:
            timeout = _value(values, "reward_timeout")
            near = f" ({timeout:g} s per completion)" if timeout else ""
            if max(grown.values()) < 1.1:
                work = " with completions no longer"
            else:
                work = ", more than their work explains (" + ", ".join(
                    f"{what} {ratio:.1f}x" for what, ratio in grown.items() if ratio >= 1.1
                ) + ")"
            message = (
                f"{head}{work}: something besides the model slows them - a reward running near its "
                f"reward_timeout{near}, another job on the machine, or memory swapping"
            )
        else:
            tokens = STEP_WORK["completion tokens"]
            mean, mean_now = _mean(tokens, before), _mean(tokens, after)
            limit = _value(values, "max_completion_length")
            cap = f"--max_completion_length {int(mean_now)}" if limit else "--max_completion_length"
            message = (
                f"{head}, as completions grew from {mean:.0f} to {mean_now:.0f} tokens - cap them "
                f"({cap}{_now(values, 'max_completion_length')}) if longer answers do not pay"
            )
        return Finding("steps_slowing", _step(logs[began], began), message)
    return None


def diagnose(
    history: list[dict], values: dict | None = None, skipped_steps: list[int] | tuple[int, ...] = ()
) -> list[Finding]:
    """Every finding of a run's log history (TRL's `log_history`, or the logs so far), ordered by the step it began.

    `values`: the run's recipe values, for the suggestions (`learning_rate`, `num_generations`, ...).
    `skipped_steps`: steps the run's guard skipped for non-finite values (train_summary.json).
    """
    return _findings([entry for entry in history if is_training_log(entry)], values or {}, skipped_steps)


def _groups_seen(logs: list[dict], values: dict) -> float | None:
    """Prompt groups the logs cover at least, from the recipe's batch keys (None where it does not say)."""
    batch, generations = _value(values, "per_device_train_batch_size"), _value(values, "num_generations")
    if not batch or not generations:
        return None
    return len(logs) * batch * (_value(values, "gradient_accumulation_steps") or 1) / generations


def _findings(logs: list[dict], values: dict, skipped_steps: list[int] | tuple[int, ...] = ()) -> list[Finding]:
    found = [f for f in (never_rewarded(logs, values),) if f]
    # A start where no completion is rewarded is `never_rewarded`'s: the checks of learning signal begin after it.
    rest = logs[_unrewarded_prefix(logs) :] if found else logs
    groups = _groups_seen(logs, values)
    shares = groups is None or groups >= MIN_GROUPS  # enough groups for a share of them to mean something
    for check in (zero_variance, reward_flat):
        found.append(check(rest, values) if shares or check is reward_flat else None)
    for check in (truncation_high, length_collapse, entropy_collapse):
        found.append(check(logs, values) if shares else None)
    for check in (kl_rising, steps_slowing):
        found.append(check(logs, values))
    found.append(nonfinite(logs, values, skipped_steps))
    found += reward_failures(logs, values)
    return sorted((f for f in found if f is not None), key=lambda f: f.step)


# A diagnosis reads the whole history: the watch runs one at every log of a short run, and about WATCH_EVERY_LOG
# times per run length after that (every len(history) // 200-th log), so a long run's cost stays linear; a finding is
# said at most 1/200 of the run late, still naming the step it began.
WATCH_EVERY_LOG = 200


@dataclass
class FindingWatch:
    """Says each finding once, at the log where it first holds (the console prints it, the tracker logs it)."""

    values: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    said: list[Finding] = field(default_factory=list)

    def update(self, step: int, logs: dict) -> list[Finding]:
        """The findings that hold for the first time with this log."""
        entry = dict(logs, step=step)
        if not is_training_log(entry):
            return []
        self.history.append(entry)
        if len(self.history) % max(1, len(self.history) // WATCH_EVERY_LOG):
            return []
        names = {f.name for f in self.said}
        new = [f for f in _findings(self.history, self.values) if f.name not in names]
        self.said += new
        return new
