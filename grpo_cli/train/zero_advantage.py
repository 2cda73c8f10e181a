"""Completions whose advantage is zero, left out of the loss's forward and backward (`skip_zero_advantage`).

A completion's advantage is zero when every completion of its prompt got the same reward: all solved, or, early in
a hard task, all failed. Each of TRL's loss types multiplies the advantage, so such a completion adds nothing to the
policy gradient, unless the loss has a term of its own for every token: a KL penalty (`beta` not 0), an entropy
bonus, the top-entropy mask (taken over the whole micro-batch), or a mixture-of-experts router loss. Its forward and
backward are then wasted work: often half of a step's completions once a model solves half of its prompts, and
most of them while it solves none.

Each micro-batch keeps its rows whose advantage is not zero, cut to the completion columns they use, and
its loss is scaled by the kept rows' share of the loss type's normalizer (rows for `grpo`, `dr_grpo`, `sapo` and
`luspo`, tokens for `bnpo`; `dapo`, `cispo` and `vespo` divide by the whole batch's tokens already), so the
gradient is the one over all rows. A micro-batch with no such row keeps its shortest one: every micro-batch still
runs one forward and backward, which gradient accumulation under DDP and DeepSpeed counts on, and every optimizer
step has gradients (zero where nothing was learned, as without the skip). Under several processes each keeps as
many rows as the process with the most (its shortest zero-advantage rows making up the count): TRL gathers one
value per row from every process for its clip-ratio metrics. The entropy and clip ratios TRL logs are
then measured on the rows trained; `frac_rows_skipped` logs the share of rows left out.
"""

from __future__ import annotations

from grpo_cli.recipe.hardware import LOSS_NORMALIZERS, zero_advantage_trained
from grpo_cli.trl_private import COMPLETION_COLUMNS

# Inputs of vision-language models (GRPOTrainer hands them to the model beside the ids): a batch that holds any is
# trained whole, its rows and columns as they are.
IMAGE_INPUTS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)


def cannot_skip(trainer) -> str | None:
    """Why zero-advantage completions have a gradient under this GRPO trainer and must be trained, or None: they can
    be left out."""
    if getattr(trainer, "aux_loss_enabled", False):
        return "the model's router loss takes every token"
    return zero_advantage_trained(vars(trainer.args))


def rows_with_signal(advantages):
    """Which rows of a micro-batch have an advantage other than zero (a bool tensor, one per row)."""
    return advantages != 0 if advantages.dim() == 1 else (advantages != 0).any(dim=1)


def kept_rows(
    inputs: dict, loss_type: str, pad_to_multiple_of: int | None = None, at_least: int = 1
) -> tuple[dict, float, int]:
    """A training micro-batch's `inputs` (GRPOTrainer's tensors) without its zero-advantage rows, the factor its
    loss is scaled by, and how many rows were left out; `inputs` itself when none is. It keeps `at_least` rows
    (where it has them), the shortest zero-advantage rows making up the count: TRL gathers one value per row from
    every process for its metrics, so under several processes each keeps the same number."""
    import torch

    nonzero = rows_with_signal(inputs["advantages"])
    rows = nonzero.numel()
    completion_mask = inputs["completion_mask"]
    if bool(nonzero.all()) or any(inputs.get(key) is not None for key in IMAGE_INPUTS):
        return inputs, 1.0, 0
    keep = nonzero.nonzero().squeeze(1)
    short = min(max(at_least, 1), rows) - keep.numel()
    if short > 0:  # the shortest rows without signal run in the forward and backward too
        lengths = completion_mask.sum(dim=1).float().masked_fill(nonzero, float("inf"))
        keep = torch.cat([keep, lengths.argsort(stable=True)[:short]]).sort().values
    if keep.numel() == rows:
        return inputs, 1.0, 0
    mask = completion_mask * inputs["tool_mask"] if "tool_mask" in inputs else completion_mask

    def width(used) -> int:  # columns a row uses, rounded up as TRL pads
        used = max(1, int(used))
        return -(-used // pad_to_multiple_of) * pad_to_multiple_of if pad_to_multiple_of else used

    # The completions' padding on the right is cut; the prompts' on the left stays: cutting it would move every
    # token's position, and the rotary embeddings' rounding with it (the same attention, not the same numbers).
    completion_width = width(completion_mask[keep].sum(dim=1).max())
    kept = {}
    for key, value in inputs.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.size(0) != rows:
            kept[key] = value  # num_items_in_batch and what is not one value per row
            continue
        value = value[keep]
        if key in COMPLETION_COLUMNS and value.dim() == 2 and value.size(1) > completion_width:
            value = value[:, :completion_width]
        kept[key] = value
    share = LOSS_NORMALIZERS[loss_type]
    if share == "rows":
        scale = keep.numel() / rows
    elif share == "tokens":  # TRL's bnpo divides by the tokens it sees, at least one
        scale = float(mask[keep].sum().clamp(min=1.0) / mask.sum().clamp(min=1.0))
    else:
        scale = 1.0
    return kept, scale, rows - keep.numel()
