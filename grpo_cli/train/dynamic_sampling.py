"""Dynamic sampling (DAPO): train only on groups whose completions got different rewards.

A group (the `num_generations` completions of one prompt) whose completions all got the same reward has zero
advantage and adds no policy gradient. With `dynamic_sampling: true` such groups are dropped from each scored
generation batch and the batch is refilled with the groups of fresh prompts, generated and scored in extra rounds
(at most `dynamic_sampling_max_rounds`). A batch still short after them is filled with dropped groups, so every
batch keeps its size and the run its step count.

Each process keeps or drops the groups it holds (its completions of a prompt are consecutive rows). Which groups are
flat is read from the rewards gathered from every process, so every process sees the same verdicts and runs the
same number of rounds (each round's generation and scoring hold collective operations).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from grpo_cli.arguments import SamplingArguments
from grpo_cli.console import console
from grpo_cli.errors import UserError
from grpo_cli.once import SayOnce
from grpo_cli.trl_private import (
    COMPLETION_COLUMNS,
    PROMPT_COLUMNS,
    ROW_COLUMNS,
    logs_of,
    metrics_of,
    prepared_micro_batches,
    text_tokenizer,
    training_columns,
)


def flat_groups(rewards_per_func, weights, num_generations: int, aggregation: str) -> list[bool]:
    """For each group of the gathered batch: whether all its completions got the same reward (TRL's zero-std test).

    A group with at most one scored completion is flat too: its advantages are all zero.
    """
    import torch
    from trl.trainer.utils import nanstd

    weights = weights.to(rewards_per_func.device)
    if aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        std = nanstd(rewards.view(-1, num_generations), dim=1)
        flat = torch.isclose(std, torch.zeros_like(std)) | torch.isnan(std)
    else:  # normalize_then_sum: each reward is normalized within the group first
        std = nanstd(rewards_per_func.view(-1, num_generations, rewards_per_func.size(1)), dim=1)
        flat = (torch.isclose(std, torch.zeros_like(std)) | torch.isnan(std)).all(dim=1)
    return flat.tolist()


class FreshPrompts:
    """Rows of the training set for refill rounds: a walk over seeded permutations, the same on every process.

    The first pass skips the prompts this generation batch already holds and those drawn before; where the training
    set has no prompt left, later passes draw again from all of it.
    """

    def __init__(self, dataset, seed: list[int], seen: set[str]):
        import numpy as np

        if len(dataset) == 0:
            raise UserError("`dynamic_sampling` has no prompts to draw from: the training set is empty")
        self.dataset = dataset
        self.rng = np.random.default_rng(seed)
        self.seen = seen
        self.order = iter(())
        self.passes = 0

    def take(self, count: int) -> list[dict]:
        rows = []
        while len(rows) < count:
            index = next(self.order, None)
            if index is None:
                self.order = iter(self.rng.permutation(len(self.dataset)).tolist())
                self.passes += 1
                continue
            row = self.dataset[index]
            key = prompt_key(row.get("prompt"))
            if self.passes == 1 and key in self.seen:
                continue
            self.seen.add(key)
            rows.append(row)
        return rows


def prompt_key(prompt) -> str:
    return str(prompt)


@dataclass
class Choice:
    """Which groups one process trains on: (batch, group) pairs, and how many of them are flat fillers."""

    picks: list[tuple[int, int]]
    filled: int


def choose(flat: list[list[bool]], process: int, groups: int) -> Choice:
    """The first `groups` groups of `process` with signal, in the order they were generated, then flat ones if short.

    `flat[k]` holds batch k's verdicts for every process's groups, process by process.
    """
    mine = [(k, j) for k, verdicts in enumerate(flat) for j in range(groups) if not verdicts[process * groups + j]]
    picks = mine[:groups]
    if len(picks) < groups:
        fillers = [(k, j) for k, verdicts in enumerate(flat) for j in range(groups) if verdicts[process * groups + j]]
        picks += fillers[: groups - len(picks)]
    return Choice(picks, groups - min(groups, len(mine)))


def is_short(flat: list[list[bool]], processes: int, groups: int) -> bool:
    """Whether some process still holds fewer groups with signal than its share of the batch."""
    return any(choose(flat, p, groups).filled for p in range(processes))


def merge(batches: list[dict], picks: list[tuple[int, int]], num_generations: int, pad_token_id: int,
          multiple: int | None, per_sequence: frozenset[str] = frozenset()) -> dict:
    """One scored batch of the picked groups: prompt tensors padded on the left and completion tensors on the right
    to the longest picked row (a multiple of `multiple` when set); `per_sequence` keys hold one value per row.
    `num_items_in_batch` is left to the caller."""
    import torch

    keys = list(batches[0])
    for batch in batches[1:]:
        if list(batch) != keys:
            raise ValueError(f"scored batches hold different keys: {keys} and {list(batch)}")
    for key in keys:
        if key not in PROMPT_COLUMNS and key not in COMPLETION_COLUMNS and key not in ROW_COLUMNS and key != "num_items_in_batch":
            raise UserError(
                f"`dynamic_sampling` works on text prompts: the scored batch also holds `{key}` (images or other "
                "inputs) - set `dynamic_sampling: false`"
            )

    def rows(values, j):
        return values[j * num_generations : (j + 1) * num_generations]

    def width(mask_key: str) -> int:
        lengths = [batch[mask_key].sum(dim=1).tolist() for batch in batches]  # one sync per batch
        used = max([1] + [max(rows(lengths[k], j)) for k, j in picks])
        return -(-used // multiple) * multiple if multiple else used

    widths = {"prompt": width("prompt_mask"), "completion": width("completion_mask")}
    merged = {}
    for key in keys:
        if key == "num_items_in_batch":
            merged[key] = None
            continue
        parts = [rows(batches[k][key], j) for k, j in picks]
        if key in PROMPT_COLUMNS:
            pad = PROMPT_COLUMNS[key]
            parts = [_fit(part, widths["prompt"], pad_token_id if pad is None else pad, left=True) for part in parts]
        elif key in COMPLETION_COLUMNS and key not in per_sequence:
            pad = COMPLETION_COLUMNS[key]
            parts = [_fit(part, widths["completion"], pad_token_id if pad is None else pad, left=False) for part in parts]
        merged[key] = torch.cat(parts, dim=0)
    return merged


def _fit(part, width: int, value, left: bool):
    """`part` cut or padded to `width` columns on its padded side (only padding is cut)."""
    import torch.nn.functional as F

    have = part.size(1)
    if have >= width:
        return part[:, have - width :] if left else part[:, :width]
    return F.pad(part, (width - have, 0) if left else (0, width - have), value=value)


def _flat_groups(trainer) -> list[bool]:
    """`flat_groups` of the trainer's latest scored batch."""
    return flat_groups(
        trainer.last_rewards, trainer.reward_weights, trainer.num_generations, trainer.multi_objective_aggregation
    )


class DynamicSampler:
    """The rounds of the module's docstring for a GRPO trainer (grpo_cli.train.rl.RLTrainer), which calls it with
    each scored training batch; `sampling`: the recipe's dynamic sampling keys."""

    def __init__(self, sampling: SamplingArguments):
        self.max_rounds = sampling.dynamic_sampling_max_rounds
        self.said = SayOnce()
        self._fresh_rows = None  # the training set as the dataloader reads it, once drawn from

    def __call__(self, trainer, inputs: list[dict], output: dict, score: Callable[[list[dict]], dict]) -> dict:
        """Drop the flat groups of the trainer's scored generation batch `output` (of `inputs`) and refill it from
        fresh prompts' groups, each round generated and scored by `score`."""
        n = trainer.num_generations
        processes, process = trainer.accelerator.num_processes, trainer.accelerator.process_index
        if len(inputs) % n:
            raise UserError(
                f"`dynamic_sampling` keeps or drops whole groups on each process, and this process holds "
                f"{len(inputs)} completions, not a multiple of `num_generations` ({n}) - make "
                "per_device_train_batch_size x gradient_accumulation_steps a multiple of it"
            )
        groups = len(inputs) // n
        batches, flat = [output], [_flat_groups(trainer)]
        metrics = metrics_of(trainer)
        if not any(flat[0]):
            metrics["dynamic_sampling/dropped_share"].append(0.0)
            metrics["dynamic_sampling/rounds"].append(0.0)
            metrics["dynamic_sampling/filled_share"].append(0.0)
            return output
        fresh = None
        while len(batches) <= self.max_rounds and is_short(flat, processes, groups):
            if fresh is None:
                # seeded by the generation batch's place in the run, so a resumed run draws the same prompts
                step = [trainer.args.seed, trainer.state.global_step,
                        prepared_micro_batches(trainer) % trainer.args.gradient_accumulation_steps]
                # this batch's prompts, from every process
                seen = {prompt_key(prompt) for prompt in logs_of(trainer)["prompt"]}
                fresh = FreshPrompts(self._fresh_dataset(trainer), step, seen)
            drawn = fresh.take(groups * processes)[process * groups : (process + 1) * groups]
            batches.append(score([dict(row) for row in drawn for _ in range(n)]))
            flat.append(_flat_groups(trainer))
        choice = choose(flat, process, groups)
        per_sequence = frozenset()
        if str(getattr(trainer, "vllm_importance_sampling_mode", "")).startswith("sequence"):
            per_sequence = frozenset({"importance_sampling_ratio"})
        pad = text_tokenizer(trainer).pad_token_id
        merged = merge(batches, choice.picks, n, pad, trainer.pad_to_multiple_of, per_sequence)
        loss_mask = merged["completion_mask"] * merged["tool_mask"] if "tool_mask" in merged else merged["completion_mask"]
        merged["num_items_in_batch"] = trainer.accelerator.gather(loss_mask.sum()).sum()
        rounds = len(batches) - 1
        filled = sum(choose(flat, p, groups).filled for p in range(processes))
        metrics["dynamic_sampling/dropped_share"].append(sum(map(sum, flat)) / (len(flat) * groups * processes))
        metrics["dynamic_sampling/rounds"].append(float(rounds))
        metrics["dynamic_sampling/filled_share"].append(filled / (groups * processes))
        if filled and trainer.accelerator.is_main_process and self.said.first("short-after-dynamic-sampling"):
            console.print(
                f"[yellow]dynamic sampling: after {rounds} extra generation round{'s' * (rounds != 1)}, {filled} of "
                f"{groups * processes} groups of the batch at step {trainer.state.global_step + 1} still gave all "
                "their completions the same reward; dropped groups fill the batch (they add no gradient) - raise "
                "`dynamic_sampling_max_rounds`, or train on prompts nearer the model's level (said once; "
                "`dynamic_sampling/filled_share` in the logs counts them)[/]",
                soft_wrap=True,
            )
        return merged

    def _fresh_dataset(self, trainer):
        """The training set as the train dataloader reads it, for drawing fresh prompts by index."""
        import datasets

        if self._fresh_rows is not None:
            return self._fresh_rows
        if not isinstance(trainer.train_dataset, datasets.Dataset):
            raise UserError(
                "`dynamic_sampling` draws fresh prompts by index, and this training set is a streaming dataset - "
                "load it as a regular dataset, or set `dynamic_sampling: false`"
            )
        self._fresh_rows = training_columns(trainer, trainer.train_dataset, "training")
        return self._fresh_rows
