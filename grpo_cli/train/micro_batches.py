"""The micro-batches a step trains on: completions whose advantage is zero left out (`skip_zero_advantage`), the
others packed by tokens (`pack_micro_batches`).

GRPOTrainer shuffles a generation batch's completions and cuts it into micro-batches of `per_device_train_batch_size`
rows, padded to the batch's longest prompt and longest completion. Once it has, `regroup` lays each optimizer step's
completions out again:

- **Left out.** A completion's advantage is zero when every completion of its prompt got the same reward: all
  solved, or, early in a hard task, all failed. Each of TRL's loss types multiplies the advantage, so such a
  completion adds nothing to the policy gradient, unless the loss has a term of its own for every token: a KL penalty
  (`beta` not 0), an entropy bonus, the top-entropy mask (taken over the whole micro-batch), or a mixture-of-experts
  router loss. Its forward and backward are then wasted work: often half of a step's completions once a model solves
  half of its prompts, and most of them while it solves none.
- **Regrouped.** The completions trained, longest first, fill as few micro-batches as they need, each cut to the
  completion columns its rows use: `per_device_train_batch_size` rows each, or with `pack_micro_batches` as many as
  fit the tokens of the micro-batch GRPOTrainer cut (that many rows at the batch's padded length), so a step of short
  completions runs fewer (at the width of each one's widest row). The step's other micro-batches hold no row and
  run no forward or backward. With `packed_forward`, each prompt's completions are kept next to each other (in that
  order), so that a micro-batch computes a prompt once for those of its completions it holds.

Each trained micro-batch's loss is scaled by its rows' share of the loss type's normalizer, so the update is the one
over all rows: rows for `grpo`, `dr_grpo`, `sapo` and `luspo` (whose normalizer does not depend on which rows share a
micro-batch), nothing for `dapo`, `cispo` and `vespo` (they divide by the whole batch's tokens already). Where a
micro-batch's loss depends on which rows share it (`bnpo` divides by its tokens; an entropy bonus or the top-entropy
mask is taken over it) or the generation batch does not line up with the optimizer steps (`steps_per_generation` not
a multiple of the gradient accumulation steps), its rows stay in it (`micro_batch_layout` in
grpo_cli/recipe/hardware.py says where, for the plan and the trainer).

A step keeps at least one row, in its last micro-batch: under DDP that micro-batch's backward averages the step's
gradients over the processes, and every optimizer step has gradients (zero where nothing was learned, as without the
skip). Under DeepSpeed and FSDP, whose engines count on every micro-batch's backward, every micro-batch keeps a row
and micro-batches are not packed. Under several processes all run the same micro-batches with as many rows in each:
TRL gathers one value per row from every process for its clip-ratio metrics. So each keeps as many rows as the
process with the most (its shortest zero-advantage rows making up the count), and packing plans from every process's
lengths. The entropy and clip ratios TRL logs are then measured on the rows trained; `frac_rows_skipped` logs the
share of rows left out.
"""

from __future__ import annotations

from grpo_cli.recipe.hardware import LOSS_NORMALIZERS, micro_batch_layout, zero_advantage_trained
from grpo_cli.trl_private import COMPLETION_COLUMNS

# Inputs of vision-language models (GRPOTrainer hands them to the model beside the ids): a batch that holds any is
# trained whole, its rows and columns as they are.
IMAGE_INPUTS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)
# The key of a regrouped micro-batch that holds the factor its loss is scaled by.
LOSS_SCALE = "loss_scale"


def cannot_skip(trainer) -> str | None:
    """Why zero-advantage completions have a gradient under this GRPO trainer and must be trained, or None: they can
    be left out."""
    if getattr(trainer, "aux_loss_enabled", False):
        return "the model's router loss takes every token"
    return zero_advantage_trained(vars(trainer.args))


def layout(trainer) -> tuple[int, bool, str | None]:
    """`micro_batch_layout` for this GRPO trainer: its engine from the accelerator (one process and DDP average the
    gradients in a step's last backward, so a micro-batch may run none; DeepSpeed's and FSDP's engines count on every
    one), and a router loss, known once the model is loaded, keeps each micro-batch's rows in it."""
    from accelerate.utils import DistributedType

    if getattr(trainer, "aux_loss_enabled", False):
        return 1, True, "the model's router loss is a mean over each micro-batch"
    distributed = trainer.accelerator.distributed_type
    if distributed in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
        engine = None
    else:
        engines = {DistributedType.DEEPSPEED: "DeepSpeed", DistributedType.FSDP: "FSDP"}
        engine = engines.get(distributed, str(distributed.value))
    return micro_batch_layout(vars(trainer.args), engine)


def rows_with_signal(advantages):
    """Which rows have an advantage other than zero (a bool tensor, one per row)."""
    return advantages != 0 if advantages.dim() == 1 else (advantages != 0).any(dim=1)


def regroup(
    micro_batches: list[dict],
    loss_type: str,
    group: int,
    leave_out: bool = True,
    pack: bool = False,
    every_micro_batch: bool = False,
    processes=None,
    pad_to_multiple_of: int | None = None,
    by_prompt: bool = False,
) -> tuple[list[dict], float]:
    """A generation batch's training micro-batches (GRPOTrainer's slices of equal size, in order) laid out again as
    the module says, and the share of rows left out.

    Each run of `group` micro-batches (one optimizer step's) is regrouped; each micro-batch returned holds its loss's
    factor under `LOSS_SCALE`, and one with no row runs no forward or backward. `leave_out`: zero-advantage rows are
    left out. `pack`: micro-batches are filled by tokens, not rows (not with `every_micro_batch`). `every_micro_batch`:
    each keeps a row (DeepSpeed, FSDP). `processes`: the accelerator under several processes (its `reduce` and
    `gather`), None under one. `by_prompt`: each prompt's completions next to each other (for `packed_forward`,
    which computes a prompt once for those of its completions that share a micro-batch). A vision-language batch is
    handed back as it is (with no factor: trained whole)."""
    import torch

    if not micro_batches or any(micro_batches[0].get(key) is not None for key in IMAGE_INPUTS):
        return micro_batches, 0.0
    rows = micro_batches[0]["advantages"].size(0)
    normalizer = LOSS_NORMALIZERS[loss_type]
    steps = [_joined(micro_batches[i : i + group]) for i in range(0, len(micro_batches), group)]
    advantages = [step["advantages"] for step in steps]
    signal = [rows_with_signal(a) if leave_out else torch.ones(a.size(0), dtype=torch.bool, device=a.device)
              for a in advantages]  # fmt: skip
    counts = torch.stack([flags.sum() for flags in signal])
    counts = (processes.reduce(counts, reduction="max") if processes is not None else counts).tolist()
    out, left_out = [], 0
    for step, flags, count in zip(steps, signal, counts):
        slots = flags.numel() // rows
        trained = min(max(int(count), 1), flags.numel())  # the most any process has, at least one
        lengths = step["completion_mask"].sum(dim=1)
        # the rows with signal first, then the shortest others, which make up the count where it is higher
        order = (lengths.float() - flags.float() * (lengths.max() + 1)).argsort(stable=True)
        keep = order[:trained]
        keep = keep[lengths[keep].argsort(descending=True, stable=True)]  # longest first: like lengths together
        if by_prompt and keep.numel() > 1:
            keep = _by_prompt(step, keep)
        if pack and not every_micro_batch:
            sizes = _packed_sizes(step, lengths[keep], rows, processes, pad_to_multiple_of)
        else:
            sizes = [rows] * (trained // rows) + ([trained % rows] if trained % rows else [])
        chunks = list(keep.split(sizes))
        one_row = slots - len(chunks) if every_micro_batch else 0
        extra = [order[trained + i : trained + i + 1] for i in range(one_row)]
        empty = order[:0]
        for index in [empty] * (slots - len(chunks) - one_row) + extra + chunks:  # the step's last micro-batch trains
            out.append(_rows(step, index, normalizer, rows, pad_to_multiple_of))
        left_out += flags.numel() - trained - one_row
    return out, left_out / (rows * len(micro_batches))


def _width(length: int, pad_to_multiple_of: int | None) -> int:
    """The completion columns a row of `length` tokens takes, rounded up as TRL pads."""
    length = max(1, int(length))
    return -(-length // pad_to_multiple_of) * pad_to_multiple_of if pad_to_multiple_of else length


def _packed_sizes(step: dict, lengths, rows: int, processes, pad_to_multiple_of: int | None) -> list[int]:
    """How many of a step's rows (their completion `lengths`, in the order they train) each packed micro-batch takes:
    as many as fit, at the width of its widest row, the tokens of the micro-batch GRPOTrainer cut (`rows` rows at the
    step's prompt and completion widths), and never fewer than `rows`, so no more micro-batches than the step has.
    Under several processes the plan is made from every process's lengths (the widest at each place, the smallest
    budget), so all take the same."""
    import torch

    prompt = step["prompt_ids"].size(1)
    budget = rows * (prompt + step["completion_ids"].size(1))
    widths = [_width(length, pad_to_multiple_of) for length in lengths.tolist()]
    if processes is not None:
        local = torch.tensor([prompt, -budget, *widths], device=lengths.device)
        every = processes.gather(local).view(-1, local.numel()).amax(dim=0).tolist()
        prompt, budget, widths = every[0], -every[1], every[2:]
    sizes, start = [], 0
    while start < len(widths):  # each micro-batch as many rows as fit at its widest row's width, at least `rows`
        size, widest = 0, 0
        while start + size < len(widths):
            wider = max(widest, widths[start + size])
            if size >= rows and (size + 1) * (prompt + wider) > budget:
                break
            size, widest = size + 1, wider
        sizes.append(size)
        start += size
    return sizes


def _by_prompt(step: dict, keep):
    """The rows `keep` with each prompt's next to each other, in their order, prompts in the order of their first
    row."""
    import torch

    from grpo_cli.engine.packed import prompt_groups

    group = prompt_groups(step["prompt_ids"][keep], step["prompt_mask"][keep])
    place = torch.arange(len(keep), device=keep.device)
    first = torch.full((int(group.max()) + 1,), len(keep), device=keep.device, dtype=place.dtype)
    first = first.scatter_reduce(0, group, place, reduce="amin")
    return keep[(first[group] * len(keep) + place).argsort()]


def _joined(micro_batches: list[dict]) -> dict:
    """One step's micro-batches as one: their rows one after another (what is not one value per row, from the
    first)."""
    import torch

    if len(micro_batches) == 1:
        return micro_batches[0]
    rows = micro_batches[0]["advantages"].size(0)
    joined = {}
    for key, value in micro_batches[0].items():
        values = [batch[key] for batch in micro_batches]
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.size(0) == rows:
            joined[key] = torch.cat(values)
        elif isinstance(value, list) and len(value) == rows:
            joined[key] = [item for batch in values for item in batch]
        else:
            joined[key] = value  # num_items_in_batch, None
    return joined


def _rows(step: dict, index, normalizer: str | None, rows: int, pad_to_multiple_of: int | None) -> dict:
    """The rows `index` of a step's joined micro-batches, cut to the completion columns they use, with their loss's
    factor: their share of a micro-batch's `rows` or, for a token normalizer, of its tokens."""
    import torch

    total = step["advantages"].size(0)
    completion_mask = step["completion_mask"]
    used = int(completion_mask[index].sum(dim=1).max()) if index.numel() else 1
    width = _width(used, pad_to_multiple_of)
    # The completions' padding on the right is cut; the prompts' on the left stays: cutting it would move every
    # token's position, and the rotary embeddings' rounding with it (the same attention, not the same numbers).
    picked = {}
    for key, value in step.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.size(0) == total:
            value = value[index]
            if key in COMPLETION_COLUMNS and value.dim() == 2 and value.size(1) > width:
                value = value[:, :width]
        elif isinstance(value, list) and len(value) == total:
            value = [value[i] for i in index.tolist()]
        picked[key] = value
    if normalizer == "rows":
        scale = index.numel() / rows
    elif normalizer == "tokens":  # TRL's bnpo divides by the tokens it sees, at least one
        mask = completion_mask * step["tool_mask"] if "tool_mask" in step else completion_mask
        scale = float(mask[index].sum().clamp(min=1.0) / mask.sum().clamp(min=1.0))
    else:
        scale = 1.0
    picked[LOSS_SCALE] = scale
    return picked
