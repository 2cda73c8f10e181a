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

from dataclasses import dataclass

from grpo_cli.errors import UserError

# How each tensor of a scored batch is padded when groups of several batches are put together.
LEFT_PADDED = {"prompt_ids": None, "prompt_mask": 0}  # None: the tokenizer's pad token
RIGHT_PADDED = {
    "completion_ids": None,
    "completion_mask": 0,
    "old_per_token_logps": 0.0,
    "ref_per_token_logps": 0.0,
    "sampling_per_token_logps": 0.0,
    "importance_sampling_ratio": 1.0,  # a padded token's ratio is exp(0)
    "tool_mask": 1,
}
ONE_PER_ROW = ("advantages",)


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
        if key not in LEFT_PADDED and key not in RIGHT_PADDED and key not in ONE_PER_ROW and key != "num_items_in_batch":
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
        if key in LEFT_PADDED:
            pad = LEFT_PADDED[key]
            parts = [_fit(part, widths["prompt"], pad_token_id if pad is None else pad, left=True) for part in parts]
        elif key in RIGHT_PADDED and key not in per_sequence:
            pad = RIGHT_PADDED[key]
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
