"""The one door to TRL's private API: every `_`-prefixed name of TRL (and of the transformers Trainer under it) that
grpo relies on, behind a small function or class with a name of our own.

TRL's public classes do not give grpo all it needs: the latest generation batch GRPOTrainer keeps for logging, its
tokenization and generation of one batch, the steps of a batch that grpo's trainer takes over, the kernels of its
chunked LM head, its functions' names on a traceback. Other modules reach them only through here, so a TRL upgrade
has one module to read, and tests/test_trl_contract.py names whichever of them changed (tests/test_layers.py keeps
them here). Importing this module imports no TRL: the console reads the trainer's logs without loading torch.
"""

from __future__ import annotations

# The TRL releases these names were checked against: pyproject.toml pins the same range.
TESTED_TRL = ">=1.16,<1.17"

# ------------------------------------------------------------------------------------------------ a scored batch

# The tensors of GRPOTrainer's scored batch (what `_generate_and_score_completions` returns and each micro-batch is a
# slice of), a row per completion, by how each is padded: the prompt's on the left and the completion's on the right,
# with this value (None: the tokenizer's pad token); and those with one value per row.
PROMPT_COLUMNS = {"prompt_ids": None, "prompt_mask": 0}
COMPLETION_COLUMNS = {
    "completion_ids": None,
    "completion_mask": 0,
    "old_per_token_logps": 0.0,
    "ref_per_token_logps": 0.0,
    "sampling_per_token_logps": 0.0,
    "importance_sampling_ratio": 1.0,  # a padded token's ratio is exp(0)
    "tool_mask": 1,
}
ROW_COLUMNS = ("advantages",)

# ------------------------------------------------------------------------------------------------ trainer state


def logs_of(trainer) -> dict | None:
    """The latest generation batch GRPOTrainer keeps for its completions table, gathered from every process:
    `prompt`, `completion`, `rewards` (a list per reward name) and `advantages`, row by row; None from a trainer
    that keeps none."""
    return getattr(trainer, "_logs", None)


def metrics_of(trainer, mode: str = "train") -> dict[str, list]:
    """The lists of values GRPOTrainer averages into each logged metric at its next log, by metric name."""
    return trainer._metrics[mode]


def prepared_micro_batches(trainer) -> int:
    """How many micro-batches GRPOTrainer has prepared so far (it counts them to know when to generate again)."""
    return trainer._step


def text_tokenizer(trainer):
    """The trainer's text tokenizer (the processor's own, for a vision-language model)."""
    return trainer._tokenizer


def is_vision_language(trainer) -> bool:
    """Whether GRPOTrainer took its processing class for a vision-language model's processor."""
    return bool(getattr(trainer, "_is_vlm", False))


def tokenize_prompts(trainer, prompts: list) -> tuple:
    """GRPOTrainer's tokenization of a batch's prompts (chat template and all): (prompt ids per row, images or
    None, multimodal fields)."""
    return trainer._tokenize_prompts(prompts)


def generate_single_turn(trainer, prompt_ids, images, fields, num_generations: int) -> list:
    """Completion ids per row from GRPOTrainer's own generation (vLLM or transformers' `generate`)."""
    completion_ids, _ = trainer._generate_single_turn(prompt_ids, images, fields, num_generations)
    return completion_ids


def training_columns(trainer, dataset, description: str):
    """`dataset` with only the columns the trainer's data collator reads, as its train dataloader has it."""
    return trainer._remove_unused_columns(dataset, description=description)


# ------------------------------------------------------------------------------------------------ steps taken over

# GRPOTrainer's private methods `BatchSteps` overrides.
OVERRIDDEN_METHODS = ("_prepare_inputs", "_generate_and_score_completions", "_calculate_rewards")


class BatchSteps:
    """Mixin for a GRPOTrainer subclass, before GRPOTrainer among its bases: TRL's private steps of a generation
    batch under names of our own. Override `generate_and_score`, `calculate_rewards` and `regroup`; `super()` of
    the first two is TRL's own step."""

    def _prepare_inputs(self, generation_batch):
        buffered = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if self.model.training and self._buffered_inputs is not buffered:  # a generation batch split just now
            self._buffered_inputs = self.regroup(self._buffered_inputs)
            inputs = self._buffered_inputs[self._step % self.args.steps_per_generation]
        return inputs

    def _generate_and_score_completions(self, inputs):
        return self.generate_and_score(inputs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        return self.calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def generate_and_score(self, inputs: list[dict]) -> dict:
        """Generate a generation batch's completions, score them and compute their advantages: the tensors of the
        batch the micro-batches train on."""
        return super()._generate_and_score_completions(inputs)

    def calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """Every reward function's scores of the batch, gathered from every process: [completions, rewards]."""
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def regroup(self, micro_batches: list[dict]) -> list[dict]:
        """The micro-batches a training generation batch was split into (TRL shuffles its rows, then cuts it into
        `steps_per_generation` slices of equal size), as the steps will train on them, in order: as they are, here.
        Micro-step i of the generation batch trains on entry i."""
        return micro_batches


class BeforeClipping:
    """Mixin for a transformers Trainer (SFTTrainer, GRPOTrainer): `before_clipping(model)` runs at each optimizer
    step just before the Trainer scales the gradients, while every gradient still holds what the backward passes
    left in it. The Trainer scales them in its private `_clip_grad_norm` when `max_grad_norm` > 0, else in
    `_get_grad_norm`, which measures the norm by clipping at infinity (a NaN norm makes every gradient NaN there
    too)."""

    def _clip_grad_norm(self, model):
        self.before_clipping(model)
        return super()._clip_grad_norm(model)

    def _get_grad_norm(self, model, grad_norm=None):
        if grad_norm is None:  # nothing clipped this step's gradients yet
            self.before_clipping(model)
        return super()._get_grad_norm(model, grad_norm=grad_norm)

    def before_clipping(self, model) -> None:
        """Override: look at the gradients before clipping scales them."""


# Functions of TRL's that, on a traceback, place a failure in generating completions or in scoring a batch (its
# log-probabilities without gradients).
GENERATION_FRAMES = ("_generate", "_generate_single_turn")
SCORING_FRAMES = ("_generate_and_score_completions",)

# ------------------------------------------------------------------------------------------------ the chunked LM head


def _kernels():
    from trl.kernels import chunked_logprob

    return chunked_logprob


def use_chunked_logprob(function: type) -> None:
    """Make TRL's fused LM head (the policy forward of every GRPOTrainer in this process) run `function`, a
    `ChunkedLogProbFunction` of the same interface."""
    from trl.trainer import utils

    utils._ChunkedLogProbFunction = function


def chunked_logprob() -> type:
    """The autograd function TRL's fused LM head runs now."""
    from trl.trainer import utils

    return utils._ChunkedLogProbFunction


def kernels_use_triton(device) -> bool:
    """Whether TRL's chunked LM head runs its Triton kernels on `device` (else their torch versions)."""
    return _kernels()._use_triton(device)


def kernel_block_size() -> int:
    """The vocabulary columns one program of TRL's Triton kernels covers."""
    return _kernels()._BLOCK_SIZE


def backward_fold(triton: bool, rows: int, columns: int):
    """TRL's backward of one logits tile of `rows` tokens x `columns` vocabulary entries, turning the tile into the
    logits' gradient in place: its Triton kernel launched over the tile, or its torch version."""
    kernels = _kernels()
    if triton:
        return kernels._backward_kernel[(rows, kernels.triton.cdiv(columns, kernels._BLOCK_SIZE))]
    return kernels._backward_tile


def addmm_fp32(out, a, b) -> None:
    """out += a @ b, summed in float32 as TRL's chunked LM head sums its gradients."""
    _kernels()._addmm_fp32(out, a, b)
