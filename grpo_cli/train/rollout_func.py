"""GRPOTrainer's rollouts through grpo's static-cache sampler (`grpo_cli.engine`), as TRL's `rollout_func`.

TRL tokenizes the prompts (chat template and all) and hands back completions; this decides whether the engine can
serve a trainer's rollouts, tokenizes each distinct prompt once, samples with the trainer's generation settings, and
goes through TRL's own generation wherever the engine does not cover the set-up (vLLM, sharded weights, tools,
images, a repetition penalty, another model architecture).
"""

from __future__ import annotations

import logging
import math

from grpo_cli.engine import (
    NonFiniteProbabilities,
    Sampling,
    distinct_rows,
    sample_completions,
    unsupported_reason,
    without_peft_wrapper,
)
from grpo_cli.trl_private import generate_single_turn, is_vision_language, text_tokenizer, tokenize_prompts

logger = logging.getLogger("grpo_cli.train.rollout_func")


def _policy(trainer):
    """The trainer's model without its distributed and PEFT wrappers (LoRA layers stay in place)."""
    return without_peft_wrapper(trainer.accelerator.unwrap_model(trainer.model))


def trainer_fallback_reason(trainer) -> str | None:
    """Why this trainer's rollouts must go through TRL's own generation (None when ours can serve them)."""
    if trainer.use_vllm or getattr(trainer, "use_transformers_continuous_batching", False):
        return "vLLM or continuous batching generates"
    if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
        return "DeepSpeed/FSDP shard the weights"
    if trainer.tools or getattr(trainer, "environment_factories", None) or is_vision_language(trainer):
        return "tools, environments and images need TRL's generation loop"
    if trainer.args.generation_kwargs:
        return "generation_kwargs are set"
    if trainer.repetition_penalty not in (None, 1.0):
        return "repetition_penalty is set"
    return unsupported_reason(_policy(trainer))


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
    """TRL `rollout_func`: completions from `sample_completions`, or from TRL's own generation where it can't serve."""

    def __init__(self):
        self.reported = False

    def __call__(self, prompts: list, trainer) -> dict:
        reason = trainer_fallback_reason(trainer)
        if not self.reported:
            self.reported = True
            if reason:
                logger.info("rollouts through TRL's generation: %s", reason)
        if reason:  # as TRL tokenizes them (environments render each row with its own tools)
            prompt_ids, images, fields = tokenize_prompts(trainer, prompts)
        else:
            prompt_ids, images, fields = _tokenize_distinct(prompts, trainer)
        if reason or images is not None or fields:
            generations = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
            completion_ids = generate_single_turn(trainer, prompt_ids, images, fields, generations)
        else:
            sampling = Sampling(trainer.temperature, trainer.top_k, trainer.top_p, trainer.min_p)
            completion_ids, logprobs = sample_completions(
                _policy(trainer),
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


def static_rollout(args, model) -> StaticCacheRollout | None:
    """The rollout function for a GRPOConfig asking for `cache_implementation: static`, as the recipe resolved it
    (grpo_cli/recipe/hardware.py: the default on a GPU); None: TRL's path."""
    if getattr(args, "cache_implementation", None) != "static" or args.use_vllm:
        return None
    import torch

    if args.use_cpu or not torch.cuda.is_available():
        return None  # the sampler runs on CUDA: a recipe's own `static` on the CPU is transformers' cache in generate
    if getattr(args, "use_transformers_continuous_batching", False):
        return None
    reason = unsupported_reason(model)
    if reason:
        logger.info("rollouts through TRL's generation: %s", reason)
        return None
    return StaticCacheRollout()
