"""The training forward of a micro-batch without its padding, each prompt computed once for the completions that
share it (`packed_forward`).

TRL trains on a padded batch: row i is [left padding][prompt][completion][right padding], and each of a prompt's
completions carries its own copy of the prompt. `PackedForward` lays a micro-batch's tokens out again, once, before
the decoder layers: for each distinct prompt, its tokens, then the tokens of each of its completions, with no
padding anywhere. Each completion attends to its prompt's tokens and causally to its own; the prompt to itself,
causally, as in the padded batch. Every token keeps the position it has in the padded batch (so the rotary
embeddings are the same numbers), and the decoder's output is laid back out as the padded batch, each prompt's hidden
states copied into every row that holds it (their gradients summed in the backward). TRL's LM head, log-probs and
loss then run on it as they do; padding positions get zeros, which no loss reads.

The attention of the packed sequence goes through FlashAttention's variable-length kernel on a GPU: one sequence of
queries per prompt and per completion, against the prompt's keys and values gathered before each completion's (the
kernel's causal mask aligns a sequence's last query with its last key). On the CPU it goes through SDPA with the
equivalent mask over the packed sequence.

A batch it cannot lay out (a row whose tokens are not one stretch from its prompt into its completion, a KV cache,
embeddings given instead of token ids, another attention implementation, a GPU without FlashAttention for the model's
heads and dtype, attention dropout on a GPU) runs as it is, said once.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass

from grpo_cli.once import SayOnce

logger = logging.getLogger(__name__)

PLAN_KEY = "packed_plan"  # the keyword that carries a plan from the decoder's forward to its attention calls


@dataclass
class Plan:
    """Where a padded batch's tokens go in the packed sequence and back.

    `tokens`: for each packed position, its index in the flattened padded batch (rows x columns); `positions`: its
    column there. `query_starts`: where each packed sequence (a prompt, a completion) begins, and the end; `keys`:
    the packed positions each sequence attends to, sequence after sequence (a completion's prompt, then itself);
    `key_starts`: where each sequence's keys begin in `keys`, and the end. `rows`, `columns`: the padded batch's
    shape; `dest` and `src`: the flattened padded positions that get a hidden state, and the packed position each
    copies. `group`, `segment`: each packed position's prompt and its sequence (0 for the prompt, 1 + the row for a
    completion), for the mask on the path without FlashAttention. `flash`: FlashAttention serves it."""

    tokens: object
    positions: object
    query_starts: object
    keys: object
    key_starts: object
    max_queries: int
    max_keys: int
    rows: int
    columns: int
    dest: object
    src: object
    group: object
    segment: object
    flash: bool = False

    @property
    def length(self) -> int:
        return int(self.tokens.numel())

    def mask(self):
        """[T, T] bool: which packed position (column) each packed position (row) attends to."""
        group, segment, position = self.group, self.segment, self.positions
        same_group = group[:, None] == group[None, :]
        seen = (segment[None, :] == 0) | (segment[None, :] == segment[:, None])
        return same_group & seen & (position[None, :] <= position[:, None])


def _spans(starts, lengths):
    """The concatenated ranges starts[i] .. starts[i] + lengths[i] (int64 tensors on the CPU)."""
    import torch

    total = int(lengths.sum())
    if total == 0:
        return torch.zeros(0, dtype=torch.long)
    offsets = torch.cumsum(lengths, 0) - lengths
    return torch.repeat_interleave(starts - offsets, lengths) + torch.arange(total)


def prompt_groups(prompt_ids, prompt_mask):
    """For each row of a batch's prompts (padded: `prompt_mask` 0 there), the index of its prompt among the distinct
    ones: rows with the same tokens share one."""
    import torch

    return torch.unique(torch.where(prompt_mask.bool(), prompt_ids, -1), dim=0, return_inverse=True)[1]


def plan(input_ids, attention_mask, prompt_width: int, flash: bool = False) -> tuple[Plan | None, str]:
    """The packed layout of a padded batch whose first `prompt_width` columns are the prompts (padded on the left)
    and the rest the completions (padded on the right), or (None, why) where its rows are not laid out so."""
    import torch

    rows, columns = input_ids.shape
    if not 0 < prompt_width < columns:
        return None, "no prompt and completion columns"
    mask = attention_mask.bool()
    prompt_lengths = mask[:, :prompt_width].sum(dim=1)
    completion_lengths = mask[:, prompt_width:].sum(dim=1)
    column = torch.arange(columns, device=mask.device)
    expected = (column >= prompt_width - prompt_lengths[:, None]) & (column < prompt_width + completion_lengths[:, None])
    group_of_row = prompt_groups(input_ids[:, :prompt_width], mask[:, :prompt_width])
    laid_out = (mask == expected).all()
    facts = torch.stack([prompt_lengths, completion_lengths, group_of_row]).cpu()  # the one wait for the GPU
    if not bool(laid_out):
        return None, "a row whose tokens are not one stretch from its prompt into its completion"
    prompt_lengths, completion_lengths, group_of_row = facts[0], facts[1], facts[2]

    # groups in the order of their first row; each group's sequences: its prompt, then its rows' completions
    members_of: dict[int, list[int]] = {}
    for row, group in enumerate(group_of_row.tolist()):
        members_of.setdefault(group, []).append(row)
    lengths, sources, kinds = [], [], []  # per sequence: length, start in the flattened batch, -1 prompt / row
    for members in members_of.values():
        lead = members[0]
        p = int(prompt_lengths[lead])
        lengths.append(p)
        sources.append(lead * columns + prompt_width - p)
        kinds.append(-1)
        for row in members:
            lengths.append(int(completion_lengths[row]))
            sources.append(row * columns + prompt_width)
            kinds.append(row)
    lengths = torch.tensor(lengths, dtype=torch.long)
    sources = torch.tensor(sources, dtype=torch.long)
    starts = torch.cumsum(lengths, 0) - lengths  # each sequence's first packed position
    tokens = _spans(sources, lengths)
    positions = tokens % columns

    prompt_of = {}  # sequence index of each group's prompt
    key_spans, key_lengths, dests, srcs, group_ids, segment_ids = [], [], [], [], [], []
    group = -1
    for index, kind in enumerate(kinds):
        length = int(lengths[index])
        if kind == -1:
            group += 1
            prompt_of[group] = index
            key_spans.append((int(starts[index]), length))
            key_lengths.append(length)
            segment_ids.append((0, length))
        else:
            prompt = prompt_of[group]
            p = int(lengths[prompt])
            if length:  # a completion without a token has no queries, so no keys either
                key_spans += [(int(starts[prompt]), p), (int(starts[index]), length)]
            key_lengths.append(p + length)
            segment_ids.append((1 + kind, length))
            # the row's hidden states: its prompt's and its completion's
            dests += [(kind * columns + prompt_width - p, p), (kind * columns + prompt_width, length)]
            srcs += [(int(starts[prompt]), p), (int(starts[index]), length)]
        group_ids.append((group, length))

    def spans(pairs):
        if not pairs:
            return torch.zeros(0, dtype=torch.long)
        begin, size = zip(*pairs)
        return _spans(torch.tensor(begin, dtype=torch.long), torch.tensor(size, dtype=torch.long))

    def repeated(pairs):
        values, counts = zip(*pairs)
        return torch.repeat_interleave(torch.tensor(values, dtype=torch.long), torch.tensor(counts, dtype=torch.long))

    used = lengths > 0  # sequences without a token (an empty prompt) take no part in the kernel's call
    key_lengths = torch.tensor(key_lengths, dtype=torch.long)
    query_starts = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths[used], 0)])
    key_starts = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(key_lengths[used], 0)])
    device = input_ids.device
    return Plan(
        tokens=tokens.to(device),
        positions=positions.to(device),
        query_starts=query_starts.to(device, torch.int32),
        keys=spans(key_spans).to(device),
        key_starts=key_starts.to(device, torch.int32),
        max_queries=int(lengths.max()) if len(lengths) else 0,
        max_keys=int(key_lengths.max()) if len(key_lengths) else 0,
        rows=rows,
        columns=columns,
        dest=spans(dests).to(device),
        src=spans(srcs).to(device),
        group=repeated(group_ids).to(device),
        segment=repeated(segment_ids).to(device),
        flash=flash,
    ), ""


def packed_attention(query, key, value, plan: Plan, scaling, dropout: float, sdpa):
    """Attention over the packed sequence (query [1, heads, T, dim], key and value [1, kv heads, T, dim]), as
    transformers' attention functions return it ([1, T, heads, dim]); `sdpa` is transformers' SDPA attention
    function, for the path without FlashAttention."""
    from grpo_cli.engine.attention import flash_varlen

    if plan.flash and not dropout:
        q = query[0].transpose(0, 1)
        k = key[0].transpose(0, 1).index_select(0, plan.keys)
        v = value[0].transpose(0, 1).index_select(0, plan.keys)
        out = flash_varlen(
            q, k, v, plan.query_starts, plan.key_starts, plan.max_queries, plan.max_keys, scaling, causal=True
        )
        return out[None]
    return sdpa(query, key, value, plan.mask()[None, None], dropout, scaling)


class PackedForward:
    """Packs the training forward of `model`'s decoder stacks (the modules that run its decoder layers) while
    `prompts(width)` lasts: a forward with gradients, in training mode, of token ids and a 2D mask, without a cache.
    Its attention calls are served inside `packed_attention` (grpo_cli/engine/attention.py), which `grpo rl`
    enters with it."""

    def __init__(self, model):
        from grpo_cli.engine.offload import decoder_stacks

        self.stacks = decoder_stacks(model)
        self.width: int | None = None
        self.said = SayOnce()
        self.packed = 0  # forwards packed so far
        for stack in self.stacks:
            stack.forward = self._wrapped(stack, stack.forward)

    @contextmanager
    def prompts(self, width: int):
        """While this lasts, the decoder's training forwards are of batches whose first `width` columns are prompts."""
        self.width = width
        try:
            yield
        finally:
            self.width = None

    def _why_not(self, stack, input_ids, attention_mask, position_ids, kwargs) -> str | None:
        import torch

        from grpo_cli.engine.attention import packed_attention_entered

        if self.width is None or not stack.training or not torch.is_grad_enabled():
            return ""  # not a training forward of a micro-batch: nothing to say
        if not packed_attention_entered():
            return "its attention calls are not served (grpo_cli.engine.attention.packed_attention)"
        implementation = getattr(stack.config, "_attn_implementation", None)
        if implementation != "sdpa":
            return f"the model's attention is {implementation!r}, not 'sdpa'"
        kinds = set(getattr(stack.config, "layer_types", None) or ["full_attention"])
        if kinds != {"full_attention"}:
            return f"attention layers other than full attention ({', '.join(sorted(kinds - {'full_attention'}))})"
        if input_ids is None or attention_mask is None or attention_mask.dim() != 2:
            return "no token ids and 2D mask"
        if position_ids is not None:
            return "position ids given with the batch"
        given = {key for key, value in kwargs.items() if value is not None}
        if given & {"past_key_values", "cache"}:
            return "a KV cache"
        if given - {"use_cache", "cache_position", "return_dict"}:
            return f"inputs it does not lay out ({', '.join(sorted(given))})"
        return None

    def _wrapped(self, stack, forward):
        def packed_forward(input_ids=None, attention_mask=None, position_ids=None, **kwargs):
            why = self._why_not(stack, input_ids, attention_mask, position_ids, kwargs)
            plan_ = None
            if why is None:
                flash = _flash_for(stack, input_ids) and not getattr(stack.config, "attention_dropout", 0.0)
                if input_ids.is_cuda and not flash:  # SDPA's padded kernels serve a GPU better than a dense mask
                    why = "no FlashAttention kernel for this model's attention (or its attention dropout) on this GPU"
                else:
                    plan_, why = plan(input_ids, attention_mask, self.width, flash=flash)
            if plan_ is None:
                if why:
                    self.said.warning(logger, why, "packed_forward: a micro-batch ran padded (%s)", why)
                return forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
            return self._run(forward, input_ids, plan_, kwargs)

        return packed_forward

    def _run(self, forward, input_ids, plan_: Plan, kwargs):
        import torch

        kwargs = {k: v for k, v in kwargs.items() if v is not None and k not in ("use_cache", "cache_position")}
        ids = input_ids.reshape(-1).index_select(0, plan_.tokens)[None]
        ones = torch.ones_like(ids)  # all ones: transformers makes no mask of its own (SDPA's causal flag instead)
        out = forward(
            input_ids=ids, attention_mask=ones, position_ids=plan_.positions[None], use_cache=False,
            **{PLAN_KEY: plan_}, **kwargs,
        )  # fmt: skip
        hidden = out.last_hidden_state[0]
        laid_out = hidden.new_zeros(plan_.rows * plan_.columns, hidden.shape[-1])
        laid_out = laid_out.index_put((plan_.dest,), hidden.index_select(0, plan_.src))
        out.last_hidden_state = laid_out.view(plan_.rows, plan_.columns, -1)
        self.packed += 1
        return out


def _flash_for(stack, input_ids) -> bool:
    """Whether FlashAttention's variable-length kernel trains the stack's attention here."""
    from grpo_cli.engine.attention import _flash_runs
    from grpo_cli.engine.rollout import head_size

    return _flash_runs(input_ids.device, next(stack.parameters()).dtype, head_size(stack.config))
