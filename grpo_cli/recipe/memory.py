"""`grpo check`'s prediction of a `grpo rl` run's peak GPU memory and step time per process, on the GPU here or on a
card the user names, and the recipe keys that would make a run that does not fit fit (grpo_cli/engine/estimate.py
holds the model of the memory; this module reads the recipe and the model's config for it).

Reading the model's config.json is the one thing it may fetch (from the Hub, for a Hub id); a local folder or a
prepared demo model needs no network.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from grpo_cli.engine.estimate import CARDS, GIB, LINEAR_NAMES, Card, Estimate, ModelShape, RunShape, estimate
from grpo_cli.errors import UserError
from grpo_cli.recipe.hardware import (
    Hardware,
    fuses_lora,
    generation_batch,
    model_text_config,
    packing_pays,
    quantized,
)
from grpo_cli.recipe.load import Recipe

# The check reads no data: prompts are assumed this long (Countdown's and GSM8K's chat prompts are 100-250 tokens).
PROMPT_TOKENS = 256
# A run fits where the predicted peak stays under FIT_SHARE of the card's memory (the allocator's cached blocks and
# the CUDA context take the rest) and does not where it is above NO_FIT_SHARE of it. Between the two, the prediction's
# own error decides: docs/performance.md, "The predicted peak and step time", has how far measured peaks were from it.
FIT_SHARE = 0.92
NO_FIT_SHARE = 1.10
TRL_DEFAULT_LORA_MODULES = ("q_proj", "v_proj")  # PEFT's default targets for Llama and Qwen models
# A larger micro-batch that fits is named where its predicted step is under this share of the recipe's own.
FASTER_SHARE = 0.95


@dataclass
class MemoryPlan:
    """The prediction for one card, and the changes that would fit a run that does not."""

    card: Card
    shape: RunShape
    estimate: Estimate
    fixes: list[tuple[str, Estimate]] = field(default_factory=list)
    part_rows: int = 0  # where the rollout is sampled in parts: the completions of each part
    # for a run that fits: a larger micro-batch that fits too (the step's completions in fewer of them) and is
    # predicted to make the fastest steps, where they are faster than the recipe's
    larger: tuple[str, Estimate] | None = None

    @property
    def limit(self) -> float:
        return fit_limit(self.card)

    @property
    def verdict(self) -> str:
        """"fits", "tight" (within the prediction's error of the card's memory) or "does not fit"."""
        if self.estimate.peak <= self.limit:
            return "fits"
        return "does not fit" if self.estimate.peak > self.card.memory_gib * GIB * NO_FIT_SHARE else "tight"

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"

    @property
    def parts(self) -> int:
        return -(-self.shape.rollout_rows // self.part_rows) if self.part_rows else 1


def fit_limit(card: Card) -> float:
    """The bytes under which a predicted peak fits `card`."""
    return card.memory_gib * GIB * FIT_SHARE


def card_for(gpu: str | None, gpu_memory: float | None) -> Card | None:
    """The card to predict for: `--gpu NAME`, `--gpu-memory GIB` (an unnamed card of that size), else the GPU of this
    machine, else None."""
    if gpu_memory is not None:
        if not gpu_memory > 0:
            raise UserError(f"--gpu-memory {gpu_memory}: give the card's memory in GiB, e.g. --gpu-memory 24")
        base = _known(gpu) if gpu else None
        return replace(base, memory_gib=float(gpu_memory)) if base else Card(f"a {gpu_memory:g} GiB card", gpu_memory)
    if gpu:
        card = _known(gpu)
        if card is None:
            raise UserError(
                f"--gpu {gpu}: not a card grpo knows - one of {', '.join(CARDS)}, or give its memory: --gpu-memory GIB"
            )
        return card
    from grpo_cli.recipe.hardware import has_cuda

    if not has_cuda():
        return None
    import torch

    props = torch.cuda.get_device_properties(0)
    known = card_of_device(props.name)
    memory = props.total_memory / GIB
    return replace(known, name=props.name, memory_gib=memory) if known else Card(props.name, memory)


def card_of_device(device: str) -> Card | None:
    """The known card a driver's device name ("NVIDIA H100 80GB HBM3") is, or None."""
    return next((card for name, card in CARDS.items() if name.split("-")[0] in device), None)


def _known(name: str) -> Card | None:
    wanted = name.strip().lower().replace("_", "-").replace(" ", "-")
    return next((card for key, card in CARDS.items() if key.lower() == wanted), None)


def model_shape(recipe: Recipe) -> ModelShape:
    """The recipe's model's shape from its config.json (a local folder, a prepared demo model, or the Hub)."""
    shape = ModelShape.of(model_text_config(recipe.values, dict(recipe.env)))
    if not shape.complete:
        name = recipe.values.get("model_name_or_path")
        raise UserError(f"{name}'s config is not a decoder the prediction knows (hidden, layers, heads, MLP sizes)")
    return shape


def run_shape(recipe: Recipe, processes: int, accelerate_config: dict | None, shape: ModelShape) -> RunShape:
    """What one process of the run does on a GPU, from the recipe's resolved keys. Keys the recipe leaves to the
    machine take a GPU's defaults, whatever machine checks it: grpo's sampler (where nothing makes the run fall back
    to TRL's), activation offloading where a micro-batch's layer inputs are a large share of the rollout's cache
    (`grpo_cli.recipe.hardware.training_sets_the_peak`), `fused_lora` for LoRA (`fuses_lora`), `flash_attention`, and
    `packed_forward` where the estimate says it pays (`packing_pays`)."""
    from grpo_cli.launch import zero_stage
    from grpo_cli.recipe.check import rollout_path

    v = dict(recipe.resolved())
    stage = zero_stage(accelerate_config) or 0
    machine = {key for key in v if recipe.where(key).startswith("hardware default")}
    if "rollout_engine" in machine or "rollout_engine" not in recipe.values:
        v["rollout_engine"] = "grpo"
    rows = generation_batch(v, processes) // processes
    if "activation_offloading" in machine or "activation_offloading" not in recipe.values:
        share = v["per_device_train_batch_size"] * shape.hidden / (rows * shape.cache_width())
        offload = v.get("gradient_checkpointing") and stage == 0 and share >= (1.0 if v.get("use_peft") else 0.5)
        v["activation_offloading"] = bool(offload)
    if "fused_lora" in machine or "fused_lora" not in recipe.values:
        v["fused_lora"] = fuses_lora(v, Hardware(gpu=True, sharded=bool(stage)))
    if "flash_attention" in machine or "flash_attention" not in recipe.values:
        v["flash_attention"] = True  # `grpo rl`'s GPU default, DeepSpeed or not
    if "packed_forward" in machine or "packed_forward" not in recipe.values:
        whole = stage == 0 and not v.get("fsdp")
        v["packed_forward"] = whole and bool(packing_pays(v, processes, shape))
    modules = v.get("lora_target_modules")
    if modules in (None, []):
        modules = TRL_DEFAULT_LORA_MODULES
    elif "all-linear" in (modules if isinstance(modules, list) else [modules]):
        modules = LINEAR_NAMES
    dtype = str(v.get("dtype") or "float32")
    return RunShape(
        micro_batch=v["per_device_train_batch_size"],
        rollout_rows=rows,
        prompt_tokens=PROMPT_TOKENS,
        completion_tokens=v["max_completion_length"],
        weight_bytes=4 if dtype in ("float32", "fp32") else 2,
        lora_rank=(v.get("lora_r") or 16) if v.get("use_peft") else 0,
        lora_modules=tuple(modules),
        lora_dropout=bool(v.get("lora_dropout")),
        # (ZeRO-3's and quantized layers run PEFT's own forward: grpo_cli.engine.lora.fusable_adapter)
        fused_lora=bool(v.get("fused_lora")) and stage != 3 and not quantized(v),
        gradient_checkpointing=bool(v.get("gradient_checkpointing")),
        activation_offloading=bool(v.get("activation_offloading")),
        flash_attention=bool(v.get("flash_attention")),
        packed_forward=bool(v.get("packed_forward")),
        generations=v["num_generations"],
        zero_stage=stage,
        processes=processes,
        grpo_sampler=rollout_path(v, accelerate_config).startswith("grpo's sampler"),
        master_weights=bool(v.get("master_weights")) and stage == 0 and dtype not in ("float32", "fp32"),
    )


def candidate_fixes(run: RunShape) -> list[tuple[str, RunShape]]:
    """Changes that lower the peak, those that leave the training's results alone first."""
    found = []
    if run.gradient_checkpointing and not run.activation_offloading and run.zero_stage == 0:
        found.append(("activation_offloading: true", replace(run, activation_offloading=True)))
    if not run.gradient_checkpointing:
        found.append(("gradient_checkpointing: true", replace(run, gradient_checkpointing=True)))
    micro = run.micro_batch
    while micro > 1 and len(found) < 8:
        micro //= 2
        found.append((
            (f"per_device_train_batch_size: {micro} (gradient_accumulation_steps x{run.micro_batch // micro}: the same "
            "completions per step)"),
            replace(run, micro_batch=micro),
        ))
    if not run.lora_rank:
        for n in (2, 4, 8):
            if n > run.processes:
                found.append((
                    (f"ZeRO-3 across {n} GPUs (accelerate launch --config_file configs/accelerate/zero3.yaml "
                    f"--num_processes {n})"),
                    replace(run, zero_stage=3, processes=n),
                ))
        found.append(("use_peft: true (LoRA r16 on every linear layer: lora_target_modules: all-linear)",
                      replace(run, lora_rank=16, lora_modules=LINEAR_NAMES)))
    if run.master_weights:
        dropped = "master_weights: false (8 bytes a parameter less; bfloat16 rounding then loses most small updates)"
        found.append((dropped, replace(run, master_weights=False)))
    length = run.completion_tokens
    while length > 256:
        length //= 2
        found.append((f"max_completion_length: {length}", replace(run, completion_tokens=length)))
    return found


def larger_micro_batches(values: dict, run: RunShape) -> list[tuple[str, RunShape]]:
    """The same completions per optimizer step in fewer, larger micro-batches, the largest first: the recipe's
    `gradient_accumulation_steps` divided, its micro-batch multiplied alike. None where `steps_per_generation` is set
    apart from the accumulation (the generation batch would change with the micro-batch)."""
    accumulation = int(values.get("gradient_accumulation_steps") or 1)
    if values.get("steps_per_generation") not in (None, accumulation):
        return []
    found = []
    factor = 2
    while accumulation % factor == 0:
        micro = run.micro_batch * factor
        keys = f"per_device_train_batch_size: {micro}, gradient_accumulation_steps: {accumulation // factor}"
        found.insert(0, (keys, replace(run, micro_batch=micro)))
        factor *= 2
    return found


def memory_plan(
    recipe: Recipe, processes: int, accelerate_config: dict | None, card: Card, shape: ModelShape | None = None
) -> MemoryPlan:
    """The prediction on `card`; where it fits, the larger micro-batch that fits too and makes the fastest steps
    (where they are faster), and where it does not, the first two changes that would."""
    shape = shape or model_shape(recipe)
    run = run_shape(recipe, processes, accelerate_config, shape)
    limit = fit_limit(card)
    predicted, part_rows = in_parts(shape, run, card, limit)
    plan = MemoryPlan(card, run, predicted, part_rows=part_rows)
    if plan.fits:
        plan.larger = _fastest_larger_micro_batch(recipe, shape, run, card, predicted)
    else:
        for what, changed in candidate_fixes(run):
            after, _ = in_parts(shape, changed, card, limit)
            if after.peak <= plan.limit:
                plan.fixes.append((what, after))
            if len(plan.fixes) == 2:
                break
    return plan


def _fastest_larger_micro_batch(
    recipe: Recipe, shape: ModelShape, run: RunShape, card: Card, predicted: Estimate
) -> tuple[str, Estimate] | None:
    """Of the larger micro-batches that fit, the smallest whose predicted step is as fast as the fastest's (no more
    memory than the speed needs), where that step is faster than `predicted`'s."""
    limit = fit_limit(card)
    fitting = []
    for what, changed in larger_micro_batches(recipe.resolved(), run):  # the largest first
        after, _ = in_parts(shape, changed, card, limit)
        if after.peak <= limit:
            fitting.append((what, after))
    if not fitting:
        return None
    fastest = min(after.step_s for _, after in fitting)
    what, after = [(w, a) for w, a in fitting if a.step_s <= 1.01 * fastest][-1]
    return (what, after) if after.step_s < FASTER_SHARE * predicted.step_s else None


def in_parts(shape: ModelShape, run: RunShape, card: Card, limit: float) -> tuple[Estimate, int]:
    """The estimate, with the rollout sampled in parts where the whole generation batch's cache would not fit under
    `limit` but the forward/backward does: grpo's sampler samples as many completions at once as the free memory
    holds (grpo_cli/engine/rollout.py), each part a whole decode. Returns the estimate and the completions of a part
    (0: one part)."""
    whole = estimate(shape, run, card)
    if not run.grpo_sampler or sum(whole.sampling.values()) <= limit or sum(whole.training.values()) > limit:
        return whole, 0
    for rows in range(run.rollout_rows - 1, 0, -1):
        if rows >= 8 and rows % 8:
            continue  # the sampler's parts are whole multiples of 8 completions
        part = estimate(shape, replace(run, rollout_rows=rows), card)
        if sum(part.sampling.values()) <= limit:
            parts = -(-run.rollout_rows // rows)
            return Estimate(part.sampling, whole.training, part.generation_s * parts, whole.train_s), rows
    return whole, 0
