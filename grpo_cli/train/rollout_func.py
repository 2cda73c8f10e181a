"""GRPOTrainer's rollouts through grpo's static-cache sampler (`grpo_cli.engine`), as TRL's `rollout_func`.

TRL tokenizes the prompts (chat template and all) and hands back completions; this decides whether the engine can
serve a trainer's rollouts, tokenizes each distinct prompt once, samples with the trainer's generation settings, and
goes through TRL's own generation wherever the engine does not cover the set-up (vLLM, FSDP, tools, images, a
repetition penalty, another model architecture), saying so once with the reason.

Every process samples its own prompts, as TRL's generation does. Under DDP and DeepSpeed ZeRO-1/2 each process holds
the whole weights and the sampler reads them as they are. Under ZeRO-3 each holds a shard: the weights are gathered
once per generation batch (TRL's `unwrap_model_for_generation`, as its own generation gathers them), sampled from,
and released before the loss's forward and backward. Where the gathered copy would not fit in the GPU memory free,
that batch goes through TRL's generation without the gather (its layers fetched one at a time), said once.
"""

from __future__ import annotations

import contextlib
import logging
import math

from grpo_cli.engine import (
    NonFiniteProbabilities,
    Sampler,
    Sampling,
    cannot_serve,
    distinct_rows,
    without_peft_wrapper,
)
from grpo_cli.engine.rollout import free_gpu_bytes, gathered_bytes, row_bytes
from grpo_cli.once import SayOnce
from grpo_cli.recipe.hardware import rollout_fallback
from grpo_cli.trl_private import generate_single_turn, is_vision_language, text_tokenizer, tokenize_prompts

logger = logging.getLogger("grpo_cli.train.rollout_func")


def sharding(trainer) -> str | None:
    """How the launcher holds the trainer's weights: None (whole, one process or DDP), "zero1"/"zero2"/"zero3", or
    "fsdp"."""
    if trainer.is_fsdp_enabled:
        return "fsdp"
    if trainer.is_deepspeed_enabled:
        return f"zero{trainer.accelerator.state.deepspeed_plugin.zero_stage}"
    return None


def trainer_fallback_reason(trainer) -> str | None:
    """Why this trainer's rollouts must go through TRL's own generation (None when ours can serve them)."""
    reason = rollout_fallback(vars(trainer.args), sharding(trainer))
    if reason:
        return reason
    if trainer.tools or getattr(trainer, "environment_factories", None) or is_vision_language(trainer):
        return "tools, environments and images need TRL's generation loop"
    return cannot_serve(trainer.accelerator.unwrap_model(trainer.model))


def _tokenize_distinct(prompts: list, trainer):
    """TRL's tokenization of the prompts (chat template and all), each distinct prompt once."""
    firsts, rows = distinct_rows([repr(prompt) for prompt in prompts])
    if len(firsts) == len(prompts):
        return tokenize_prompts(trainer, prompts)
    ids, images, fields = tokenize_prompts(trainer, [prompts[row] for row in firsts])
    if images is not None or fields:  # images and multimodal fields go row by row
        return tokenize_prompts(trainer, prompts)
    return [list(ids[u]) for u in rows], None, fields


class StaticCacheRollout:
    """TRL `rollout_func`: completions from grpo's `sampler`, or from TRL's own generation where it can't serve."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler
        self.reported = False
        self.said = SayOnce()

    def __call__(self, prompts: list, trainer) -> dict:
        reason = trainer_fallback_reason(trainer)
        if not self.reported:
            self.reported = True
            self._say_path(trainer, reason)
        if reason:  # as TRL tokenizes them (environments render each row with its own tools)
            prompt_ids, images, fields = tokenize_prompts(trainer, prompts)
        else:
            prompt_ids, images, fields = _tokenize_distinct(prompts, trainer)
        if reason or images is not None or fields:
            return self._trl(trainer, prompt_ids, images, fields)
        with self._serving(trainer, prompt_ids) as policy:
            if policy is None:
                return self._trl(trainer, prompt_ids, None, fields, gather=False)
            sampling = Sampling(trainer.temperature, trainer.top_k, trainer.top_p, trainer.min_p)
            completion_ids, logprobs = self.sampler.sample(
                policy,
                prompt_ids,
                trainer.max_completion_length,
                list(trainer.eos_token_ids),
                text_tokenizer(trainer).pad_token_id,
                sampling,
                check_finite=False,
            )
        if not all(math.isfinite(value) for row in logprobs for value in row):
            guard = getattr(trainer, "step_guard", None)
            if guard is None or not trainer.model.training:
                raise NonFiniteProbabilities("completions drew tokens from non-finite probabilities")
            guard.note("rollout probabilities")  # its step applies no update, on every process alike
        # No sampling log-probs: TRL would then use them in place of its own (off-policy masks), changing the loss.
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    @staticmethod
    def _say_path(trainer, reason: str | None) -> None:
        """Once, at the first rollout: TRL's generation and why; or, where the launcher shards the weights, how grpo's
        sampler reads them (the main process)."""
        if reason:
            logger.info("rollouts through TRL's generation: %s", reason)
            return
        held = sharding(trainer)
        if held is None or not trainer.accelerator.is_main_process:
            return
        if held == "zero3":
            whole = gathered_bytes(without_peft_wrapper(trainer.accelerator.unwrap_model(trainer.model)))
            how = f"the ZeRO-3 weights gathered once per generation batch ({whole / 2**30:.2f} GiB per process)"
        else:
            how = f"DeepSpeed ZeRO-{held[-1]}'s whole weights on every process"
        logger.info("rollouts through grpo's sampler: %s", how)

    @staticmethod
    def _trl(trainer, prompt_ids, images, fields, gather: bool = True) -> dict:
        """TRL's own generation of the rows; `gather` False: a ZeRO-3 model's layers fetched one at a time."""
        generations = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        before = getattr(trainer.args, "ds3_gather_for_generation", True)
        trainer.args.ds3_gather_for_generation = before and gather
        try:
            completion_ids = generate_single_turn(trainer, prompt_ids, images, fields, generations)
        finally:
            trainer.args.ds3_gather_for_generation = before
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    @contextlib.contextmanager
    def _serving(self, trainer, prompt_ids: list[list[int]]):
        """The policy the sampler reads, its weights whole for the time of the rollout; None: a ZeRO-3 gather would
        not fit in the GPU memory free on some process (every process then takes TRL's path alike)."""
        model = trainer.accelerator.unwrap_model(trainer.model)
        if sharding(trainer) != "zero3":
            yield without_peft_wrapper(model)
            return
        fits = self._gather_fits(trainer, without_peft_wrapper(model), prompt_ids)
        if not fits:
            yield None
            return
        from trl.models import unwrap_model_for_generation

        with unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=True,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as whole:
            yield without_peft_wrapper(whole)

    def _gather_fits(self, trainer, policy, prompt_ids: list[list[int]]) -> bool:
        """Whether every process has the GPU memory free for the gathered weights and one prompt's completions'
        cache (the sampler splits a larger batch into parts that fit); said once when not."""
        import torch

        need = gathered_bytes(policy)
        device = policy.lm_head.weight.device
        free = None
        if device.type == "cuda":
            rows = min(len(prompt_ids), trainer.num_generations)
            need += rows * row_bytes(policy, max(map(len, prompt_ids)), trainer.max_completion_length)
            free = free_gpu_bytes(device)
        here = free is None or need <= free
        fits = bool(trainer.accelerator.gather(torch.tensor([here], device=trainer.accelerator.device)).all())
        if not fits:
            where = "less free on another process" if here else f"{free / 2**30:.1f} GiB free"
            self.said.warning(
                logger,
                "no-gather",
                "rollouts through TRL's generation without gathering the weights (each layer fetched at every "
                "decode step, much slower): the gathered ZeRO-3 weights and the rollout's cache need %.1f GiB, and "
                "%s - more processes (smaller shards), LoRA, or a smaller `per_device_train_batch_size` make room "
                "(said once)",
                need / 2**30,
                where,
            )
        return fits


def static_rollout(args, rollout_engine: str, model) -> StaticCacheRollout | None:
    """The rollout function for the recipe's `rollout_engine` (grpo_cli/recipe/hardware.py: grpo's on a GPU);
    None: TRL's path from the start (`rollout_engine: trl`; vLLM, whose weight syncing TRL drives; a model the
    sampler does not cover, said once)."""
    if rollout_engine != "grpo" or args.use_vllm:
        return None
    reason = cannot_serve(model)
    if reason:
        logger.info("rollouts through TRL's generation: %s", reason)
        return None
    return StaticCacheRollout(Sampler())
