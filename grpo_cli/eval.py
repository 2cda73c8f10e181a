"""`grpo eval`: generate on a recipe's test split and score with the recipe's task and rewards.

Flow: recipe -> task prompts -> completions per model (transformers, or vLLM when asked) -> rewards and the
task's checks per completion -> `summarize` (pure) -> summary.json, samples.jsonl and a side-by-side table.
"""

from __future__ import annotations

import gc
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.markup import escape

from grpo_cli.atomic import check_writable, json_text, write_jsonl, write_text
from grpo_cli.errors import UserError

_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model")
# Prompts per generation call when --batch-size is not given: transformers' generate, grpo's sampler on a GPU
# (which samples a call in parts when it would not fit in the free GPU memory).
GENERATE_BATCH_PROMPTS = 8
STATIC_BATCH_PROMPTS = 64
STATIC_ENGINE = "grpo static-cache sampler"


@dataclass
class EvalSettings:
    """How completions are generated: the same for every model of one eval."""

    split: str
    limit: int | None
    num_generations: int
    temperature: float
    top_p: float
    batch_size: int | None  # prompts per generation call (None: the engine's default)
    max_new_tokens: int
    seed: int
    use_vllm: bool = False
    # The recipe's other sampling keys, as training samples (a model's own generation defaults are not applied).
    top_k: int = 0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    # The recipe's `rollout_engine` is "grpo" (the default on a GPU, grpo_cli/recipe/hardware.py): grpo's
    # static-cache sampler, where the model allows it.
    grpo_sampler: bool = True

    @property
    def greedy(self) -> bool:
        return self.num_generations == 1


@dataclass
class ModelSpec:
    """One model to evaluate: a model (short name, folder or Hub id), optionally with a LoRA adapter."""

    label: str
    model: str
    adapter: str | None = None


# ------------------------------------------------------------------------------------------------ metrics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k) (Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # The product form avoids huge binomial coefficients.
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(
    model: str,
    samples: list[dict],
    num_generations: int,
    skipped_prompts: int = 0,
    reward_weights: dict[str, float] | None = None,
) -> dict:
    """Metrics of one model from its scored samples.

    Each sample: {"index": prompt number, "sample": 0..K-1, "correct": bool, "formatted": bool,
    "rewards": {name: float | None}, "completion_tokens": int}. Sample 0 of a prompt is its first completion.
    Rewards that did not apply (None) are left out of their mean.
    """
    by_prompt: dict[int, list[dict]] = defaultdict(list)
    for sample in samples:
        by_prompt[sample["index"]].append(sample)
    firsts = [min(group, key=lambda s: s["sample"]) for group in by_prompt.values()]
    ks = sorted({1, num_generations})
    pass_k = {}
    for k in ks:
        scores = [
            pass_at_k(len(group), sum(bool(s["correct"]) for s in group), k) for group in by_prompt.values()
        ]
        pass_k[str(k)] = _mean(scores)
    names = list(dict.fromkeys(name for s in samples for name in s["rewards"]))
    rewards = {
        name: _mean([s["rewards"][name] for s in samples if s["rewards"].get(name) is not None])
        for name in names
    }
    summary = {
        "model": model,
        "accuracy": _mean([float(bool(s["correct"])) for s in firsts]),
        "format_rate": _mean([float(bool(s["formatted"])) for s in samples]),
        "pass_at_k": pass_k,
        "rewards": rewards,
        "mean_completion_length": _mean([float(s["completion_tokens"]) for s in samples]),
        "num_prompts": len(by_prompt),
        "num_completions": len(samples),
        "skipped_prompts": skipped_prompts,
    }
    if reward_weights:
        # The training signal: weighted sum per completion, a missing (None) reward counting as 0 as in TRL.
        totals = [sum(w * (s["rewards"].get(n) or 0.0) for n, w in reward_weights.items()) for s in samples]
        summary["reward_total"] = _mean(totals)
    return summary


# ------------------------------------------------------------------------------------------------ scoring


def score_completions(
    task,
    reward_funcs: list,
    rows: list[dict],
    completions: list[str],
    lengths: list[int] | None = None,
    correctness=None,
) -> list[dict]:
    """Rewards, format and correctness of completions[i] for rows[i] (each row holds its "prompt" messages);
    `lengths`: their token counts, for rewards that read them (`completion_lengths`); `correctness`: what a correct
    answer is (`grpo_cli.rewards.scoring.Correctness`; None: the task's, for these rewards)."""
    from grpo_cli.rewards.scoring import Correctness
    from grpo_cli.tasks import as_chats, prefill_of

    correctness = correctness or Correctness.of(task.name, [f.__name__ for f in reward_funcs])

    prompts = [row["prompt"] for row in rows]
    chats = as_chats(completions)
    columns = {key: [row[key] for row in rows] for key in rows[0] if key != "prompt"} if rows else {}
    if lengths is not None:
        columns["completion_lengths"] = list(lengths)
    rewards: dict[str, list] = {}
    for func in reward_funcs:
        values = func(prompts=prompts, completions=chats, **columns)
        rewards[func.__name__] = [None if v is None or math.isnan(v) else float(v) for v in values]
    right = correctness.judge(prompts, chats, columns, rewards) if rows else []
    scored = []
    for i, (row, completion) in enumerate(zip(rows, completions)):
        text = prefill_of(row["prompt"]) + completion
        scored.append(
            {
                "correct": right[i],
                "formatted": bool(task.is_formatted(text)),
                "rewards": {name: values[i] for name, values in rewards.items()},
            }
        )
    return scored


# --------------------------------------------------------------------------------------------- generation


def model_specs(models: list[str], adapter: str | None, recipe_model: str | None) -> list[ModelSpec]:
    """The models to evaluate: each --model (a run or adapter folder means base + that adapter); --adapter goes
    with one --model or, alone, with the base it names; neither means the recipe's model."""
    from grpo_cli.merge import base_model_of
    from grpo_cli.run_folder import find_adapter, find_full_model

    def adapter_spec(path: str, base: str | None) -> ModelSpec:
        adapter_dir, label = find_adapter(path)
        recorded = base_model_of(adapter_dir)
        if not (base or recorded):
            raise UserError(
                f"{adapter_dir / 'adapter_config.json'} names no base model - pass it with --model"
            )
        return ModelSpec(
            label=f"{base} + {label}" if base else label, model=base or recorded, adapter=str(adapter_dir)
        )

    if adapter:
        if len(models) > 1:
            raise UserError(
                "--adapter goes with one --model - to compare models, pass each (a run folder is fine) as --model"
            )
        spec = adapter_spec(adapter, models[0] if models else None)
        return [spec]
    if not models:
        if not recipe_model:
            raise UserError(
                "no model to evaluate - pass --model MODEL or set model_name_or_path in the recipe"
            )
        models = [recipe_model]
    specs = []
    for name in models:
        path = Path(name).expanduser()
        is_adapter = path.is_dir() and (
            (path / "adapter_config.json").is_file() or any(path.glob("checkpoint-*/adapter_config.json"))
        )
        full = None if is_adapter else find_full_model(name)
        if is_adapter:
            specs.append(adapter_spec(name, None))
        elif full:
            specs.append(ModelSpec(label=full[1], model=str(full[0])))
        else:
            specs.append(ModelSpec(label=name, model=name))
    labels = [s.label for s in specs]
    for spec, name in zip(specs, models, strict=True):
        if labels.count(spec.label) > 1:  # e.g. checkpoint-8 of two runs: the folder each was given as
            spec.label = f"{spec.label} ({Path(name).expanduser()})"
    return specs


def _tokenizer_for(spec: ModelSpec, chat_template: str | None, trust_remote_code: bool):
    from grpo_cli.models import load_tokenizer

    # Training saves the tokenizer (with the chat template it used) next to the adapter.
    if spec.adapter and any((Path(spec.adapter) / f).is_file() for f in _TOKENIZER_FILES):
        return load_tokenizer(spec.adapter, chat_template, trust_remote_code=trust_remote_code)
    return load_tokenizer(spec.model, chat_template, trust_remote_code=trust_remote_code)


def context_length(model_config, tokenizer) -> int | None:
    """Longest sequence the model takes: its position limit, or the tokenizer's when that is smaller."""
    limits = [getattr(model_config, "max_position_embeddings", None)]
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and limit < 10**8:
        limits.append(limit)
    limits = [x for x in limits if isinstance(x, int) and x > 0]
    return min(limits) if limits else None


def _completion_length(ids: list[int], eos_ids: set[int], pad_id: int | None) -> int:
    """Tokens the model generated, up to and including the first end-of-sequence token."""
    for i, token in enumerate(ids):
        if token in eos_ids:
            return i + 1
    while ids and pad_id is not None and ids[-1] == pad_id:
        ids = ids[:-1]
    return len(ids)


def _generate_transformers(
    spec, model_args, tokenizer, prompt_ids, settings, advance
) -> tuple[list[list[tuple[str, int]]], str]:
    """K completions (text, token count) per prompt, and the engine: on a GPU grpo's static-cache sampler (the one
    that samples training's rollouts), else transformers' generate; batched, left-padded."""
    import copy

    from transformers import set_seed

    from grpo_cli.engine import is_nonfinite_sampling
    from grpo_cli.engine.memory import is_out_of_memory
    from grpo_cli.models import load_model
    from grpo_cli.quiet import quiet_progress_bars
    from grpo_cli.weights import refuse_short_embedding

    with quiet_progress_bars():
        model = load_model(spec.model, model_args, adapter=spec.adapter)
    refuse_short_embedding(model, tokenizer, spec.model)
    config = copy.deepcopy(model.generation_config)
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    eos = list(dict.fromkeys(e for e in eos + [tokenizer.eos_token_id] if e is not None))
    set_seed(settings.seed)
    # grpo's sampler has no repetition penalty: a recipe that sets one samples with generate, as in training.
    served = rollout_model(model) if settings.grpo_sampler and settings.repetition_penalty == 1.0 else None
    per_call = settings.batch_size or (
        STATIC_BATCH_PROMPTS if served is not None else GENERATE_BATCH_PROMPTS
    )
    try:
        if served is not None:
            results = _sample_static(served, tokenizer, prompt_ids, settings, per_call, eos, advance)
        else:
            results = _generate_batches(
                model, config, tokenizer, prompt_ids, settings, per_call, eos, advance
            )
    except Exception as err:
        if is_nonfinite_sampling(err):
            raise UserError(
                f"{spec.label} produced non-finite token probabilities (NaN or inf logits: {err}) - its forward pass "
                "overflows; evaluate it in float32 (--dtype float32) or use an earlier checkpoint"
            ) from None
        if not is_out_of_memory(err):
            raise
        problem = out_of_memory_problem(spec.label, per_call, settings.num_generations, settings.max_new_tokens, err)
        raise UserError(problem) from None
    finally:
        del model
    return results, (STATIC_ENGINE if served is not None else "transformers generate")


def out_of_memory_problem(model: str, batch_size: int, num_generations: int, max_new_tokens: int, err) -> str:
    """`grpo eval` ran out: each batch generates batch_size x num_generations completions at once."""
    from grpo_cli.engine.memory import gpu_numbers

    head = (
        f"out of GPU memory evaluating {model}{gpu_numbers(err)}: each batch generates {batch_size} prompts x "
        f"{num_generations} completions at once, up to {max_new_tokens} tokens each. To fit:"
    )
    lines = [head]
    if batch_size > 1:
        lines.append(f"    - `--batch-size {batch_size // 2}` (the same results, smaller batches)")
    lines.append(f"    - `--max-new-tokens {max(1, max_new_tokens // 2)}` (shorter completions)")
    return "\n".join(lines)


def rollout_model(model):
    """The model grpo's static-cache sampler can run (LoRA layers in place), or None: not on one CUDA device (the
    sampler's CUDA graphs), or of an architecture the sampler does not cover."""
    from grpo_cli.engine import cannot_serve, without_peft_wrapper

    core = without_peft_wrapper(model)
    devices = {p.device for p in core.parameters()}
    if len(devices) != 1 or next(iter(devices)).type != "cuda" or cannot_serve(core):
        return None
    return core


def _sample_static(
    model, tokenizer, prompt_ids, settings, per_call, eos, advance
) -> list[list[tuple[str, int]]]:
    """K completions per prompt from grpo's static-cache sampler, `per_call` prompts at a time."""
    from grpo_cli.engine import Sampler, Sampling

    sampler, sampling = Sampler(), Sampling(greedy=True)
    if not settings.greedy:
        sampling = Sampling(settings.temperature, settings.top_k, settings.top_p, settings.min_p)
    k = settings.num_generations
    results: list[list[tuple[str, int]]] = []
    for start in range(0, len(prompt_ids), per_call):
        batch = prompt_ids[start : start + per_call]
        # Each prompt's K samples side by side, in the order generate's num_return_sequences gives them.
        rows = [ids for ids in batch for _ in range(k)]
        # All rows at once, or in parts that fit in the GPU memory free now.
        completions, _ = sampler.sample(model, rows, settings.max_new_tokens, eos, tokenizer.pad_token_id, sampling)
        for p in range(len(batch)):
            group = completions[p * k : (p + 1) * k]
            results.append([(tokenizer.decode(ids, skip_special_tokens=True), len(ids)) for ids in group])
        advance(len(batch))
    return results


class _FiniteScores:
    """A logits processor that leaves the scores as they are and remembers (on the device, no sync per token)
    whether any was NaN or inf: greedy decoding would turn them into token 0 without a word."""

    def __init__(self):
        self.bad = None

    def __call__(self, input_ids, scores):
        import torch

        bad = torch.isnan(scores).any() | torch.isposinf(scores).any()
        self.bad = bad if self.bad is None else self.bad | bad
        return scores

    def check(self) -> None:
        from grpo_cli.engine import NonFiniteProbabilities

        if self.bad is not None and bool(self.bad):
            raise NonFiniteProbabilities("generate met NaN or inf logits")


def _generate_batches(
    model, config, tokenizer, prompt_ids, settings, per_call, eos, advance
) -> list[list[tuple[str, int]]]:
    """K completions per prompt from transformers' generate, `per_call` prompts at a time."""
    import torch

    # Every sampling key explicit: generate fills the ones left None from the model's own generation config (a
    # Qwen2.5-Instruct one brings repetition_penalty 1.05 and top_k 20), which training does not apply.
    sampling = {
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "top_k": settings.top_k,
        "min_p": settings.min_p or 0.0,
        "repetition_penalty": settings.repetition_penalty,
    }
    if settings.greedy:  # neutral values: no sampling flags for generate to warn about
        sampling.update(temperature=1.0, top_p=1.0, top_k=50, min_p=None)
    config.update(
        do_sample=not settings.greedy,
        num_return_sequences=settings.num_generations,
        max_new_tokens=settings.max_new_tokens,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        **sampling,
    )
    device = next(model.parameters()).device
    results: list[list[tuple[str, int]]] = []
    for start in range(0, len(prompt_ids), per_call):
        batch = prompt_ids[start : start + per_call]
        width = max(len(ids) for ids in batch)
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=device)
        finite = _FiniteScores()
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids, attention_mask=mask, generation_config=config, logits_processor=[finite]
            )
        finite.check()
        generated = out[:, width:].tolist()
        for p in range(len(batch)):
            group = generated[p * settings.num_generations : (p + 1) * settings.num_generations]
            results.append(
                [
                    (tokenizer.decode(ids, skip_special_tokens=True), _completion_length(ids, set(eos), pad))
                    for ids in group
                ]
            )
        advance(len(batch))
    return results


def _generate_vllm(
    spec, model_args, tokenizer, prompt_ids, settings, advance
) -> tuple[list[list[tuple[str, int]]], str]:
    """K completions (text, token count) per prompt with vLLM (the adapter served as a LoRA request), and "vllm"."""
    try:
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest
    except ImportError as err:
        raise UserError("--vllm needs vLLM - pip install 'grpo-cli[vllm]', or leave out --vllm") from err
    from grpo_cli.models import resolve_model

    lora = None
    kwargs: dict[str, Any] = {}
    if spec.adapter:
        rank = int(json.loads((Path(spec.adapter) / "adapter_config.json").read_text()).get("r", 16))
        # vLLM takes only powers of two (8, 16, 32, ...) as the largest LoRA rank.
        kwargs.update(enable_lora=True, max_lora_rank=max(8, 1 << (rank - 1).bit_length()))
        lora = LoRARequest("adapter", 1, spec.adapter)
    dtype = getattr(model_args, "dtype", None) or "auto"
    llm = LLM(model=resolve_model(spec.model), dtype=dtype, seed=settings.seed, **kwargs)
    params = SamplingParams(
        n=settings.num_generations,
        temperature=0.0 if settings.greedy else settings.temperature,
        top_p=1.0 if settings.greedy else settings.top_p,
        top_k=-1 if settings.greedy else settings.top_k or -1,  # -1: every token (all vLLM versions)
        min_p=0.0 if settings.greedy else settings.min_p or 0.0,
        repetition_penalty=settings.repetition_penalty,
        max_tokens=settings.max_new_tokens,
        seed=settings.seed,
    )
    outputs = llm.generate(
        [{"prompt_token_ids": ids} for ids in prompt_ids], params, lora_request=lora, use_tqdm=False
    )
    advance(len(prompt_ids))
    results = [[(o.text, len(o.token_ids)) for o in out.outputs] for out in outputs]
    del llm  # shuts the engine down so the next model gets the GPU memory
    gc.collect()
    return results, "vllm"


# ------------------------------------------------------------------------------------------------- driver


def evaluate_model(
    spec, recipe, rows, task, reward_funcs, correctness, settings, progress=None
) -> tuple[dict, list[dict]]:
    """Generate and score one model on the rows; returns (its summary, its samples)."""
    from grpo_cli.models import gpu_problems, load_config, render_prompt

    model_args = recipe.model_config()
    problems = gpu_problems(model_args)
    if problems:
        raise UserError(*problems)
    trust = bool(recipe.values.get("trust_remote_code", False))
    tokenizer = _tokenizer_for(spec, recipe.task.chat_template, trust)
    context = context_length(load_config(spec.model, trust_remote_code=trust), tokenizer)
    kept, texts, prompt_ids = [], [], []
    for i, row in enumerate(rows):
        text = render_prompt(tokenizer, row["prompt"])
        ids = tokenizer(text)["input_ids"]
        if context is not None and len(ids) + settings.max_new_tokens > context:
            continue
        kept.append(i)
        texts.append(text)
        prompt_ids.append(ids)
    skipped = len(rows) - len(kept)
    if not kept:
        raise UserError(
            f"all {len(rows)} prompts plus max_new_tokens {settings.max_new_tokens} exceed the context of "
            f"{spec.label} ({context} tokens) - lower --max-new-tokens (max_completion_length)"
        )
    task_id = progress.add_task(escape(spec.label), total=len(kept)) if progress else None

    def advance(n: int) -> None:
        if progress is not None:
            progress.advance(task_id, n)

    generate = _generate_vllm if settings.use_vllm else _generate_transformers
    groups, engine = generate(spec, model_args, tokenizer, prompt_ids, settings, advance)
    flat_rows = [rows[i] for i, group in zip(kept, groups) for _ in group]
    flat = [completion for group in groups for completion in group]
    scored = score_completions(
        task,
        reward_funcs,
        flat_rows,
        [text for text, _ in flat],
        [length for _, length in flat],
        correctness,
    )
    samples = []
    position = 0
    for i, text_prompt, group in zip(kept, texts, groups):
        for j, (completion, length) in enumerate(group):
            samples.append(
                {
                    "model": spec.label,
                    "index": i,
                    "sample": j,
                    "prompt": text_prompt,
                    "completion": completion,
                    "completion_tokens": length,
                    **scored[position],
                }
            )
            position += 1
    names = [f.__name__ for f in reward_funcs]
    weights = recipe.values.get("reward_weights") or [1.0] * len(names)
    summary = summarize(spec.label, samples, settings.num_generations, skipped, dict(zip(names, weights)))
    summary["engine"] = engine
    return summary, samples


def run_eval(
    config: str,
    overrides: list[str] | None = None,
    models: list[str] | None = None,
    adapter: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    num_generations: int = 1,
    temperature: float | None = None,
    batch_size: int | None = None,
    max_new_tokens: int | None = None,
    output: str | None = None,
    use_vllm: bool = False,
) -> dict:
    """Evaluate each model on the recipe's test split; write summary.json and samples.jsonl; return the summary."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from grpo_cli.console import console
    from grpo_cli.recipe import load_recipe, reward_funcs
    from grpo_cli.recipe.hardware import detect_hardware, rollout_engine
    from grpo_cli.rewards.scoring import Correctness
    from grpo_cli.tasks import get_task, load_task_dataset

    problems = []
    if limit is not None and limit < 1:
        problems.append(f"--limit must be at least 1, got {limit}")
    if num_generations < 1:
        problems.append(f"--num-generations must be at least 1, got {num_generations}")
    if batch_size is not None and batch_size < 1:
        problems.append(f"--batch-size must be at least 1, got {batch_size}")
    if temperature is not None and not (math.isfinite(temperature) and temperature > 0):
        problems.append(
            f"--temperature must be a finite number above 0 (sampling), got {temperature} - use "
            "--num-generations 1 for greedy decoding"
        )
    if max_new_tokens is not None and max_new_tokens < 1:
        problems.append(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if any(arg.split("=", 1)[0] == "--num_generations" for arg in overrides or []):
        problems.append(
            "--num_generations is the training key (completions per prompt in a GRPO step), which grpo eval does "
            "not read - sample k completions per prompt with --num-generations K (-k K)"
        )
    if problems:
        raise UserError(*problems)

    recipe = load_recipe(config, overrides or [], None, detect_hardware(processes=1, training=False))
    recipe.apply_env()
    values = recipe.resolved()
    out_dir = Path(output or Path(values["output_dir"]) / "eval").expanduser()
    check_writable(out_dir, "--output", folder=True)  # before the generation, not after
    settings = EvalSettings(
        split=split or recipe.task.dataset_test_split,
        limit=limit,
        num_generations=num_generations,
        temperature=temperature if temperature is not None else float(values.get("temperature") or 1.0),
        top_p=float(values.get("top_p") or 1.0),
        top_k=int(values.get("top_k") or 0),
        min_p=values.get("min_p"),
        repetition_penalty=float(values.get("repetition_penalty") or 1.0),
        batch_size=batch_size,
        max_new_tokens=max_new_tokens or int(values.get("max_completion_length") or 512),
        seed=int(values.get("seed") or 0),
        use_vllm=use_vllm,
        # an SFT recipe has no rollout keys: it samples as an rl recipe on this machine would
        grpo_sampler=values.get("rollout_engine", rollout_engine(values, recipe.hardware)[0]) == "grpo",
    )
    specs = model_specs(list(models or []), adapter, values.get("model_name_or_path"))
    task = get_task(recipe.task.task)
    data = load_task_dataset(recipe.task, settings.split, seed=settings.seed)
    rows = [data[i] for i in range(min(len(data), limit or len(data)))]
    rewards = reward_funcs(recipe)
    correctness = Correctness.of(task.name, [f.__name__ for f in rewards], recipe.reward.reward_timeout)

    summaries, all_samples = [], []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        for spec in specs:
            summary, samples = evaluate_model(spec, recipe, rows, task, rewards, correctness, settings, progress)
            summaries.append(summary)
            all_samples.extend(samples)

    result = {
        "models": summaries,
        "settings": {
            "recipe": str(recipe.path) if recipe.path else None,
            "task": task.name,
            "split": settings.split,
            "limit": limit,
            "num_generations": settings.num_generations,
            "decoding": "greedy" if settings.greedy else f"sampling (temperature {settings.temperature:g})",
            "sampling": {
                key: getattr(settings, key) for key in ("top_p", "top_k", "min_p", "repetition_penalty")
            },
            "max_new_tokens": settings.max_new_tokens,
            "seed": settings.seed,
        },
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(out_dir / "samples.jsonl", all_samples)
    write_text(out_dir / "summary.json", json_text(result, indent=1) + "\n")
    print_summary(result)
    console.print(f"wrote {escape(str(out_dir / 'summary.json'))} and {escape(str(out_dir / 'samples.jsonl'))}")
    return result


def print_summary(result: dict) -> None:
    """One table, one column per model, side by side."""
    from rich.table import Table

    from grpo_cli.console import output

    models = result["models"]
    table = Table(
        title=f"eval: {result['settings']['task']} ({result['settings']['split']})", title_justify="left"
    )
    table.add_column("metric", style="bold")
    for summary in models:
        table.add_column(escape(summary["model"]), justify="right")

    def pct(value):
        return "-" if value is None else f"{value:.1%}"

    def num(value):
        return "-" if value is None else f"{value:.3f}"

    table.add_row("accuracy", *(pct(s["accuracy"]) for s in models))
    table.add_row("format rate", *(pct(s["format_rate"]) for s in models))
    for k in models[0]["pass_at_k"]:
        table.add_row(f"pass@{k}", *(pct(s["pass_at_k"].get(k)) for s in models))
    for name in models[0]["rewards"]:
        table.add_row(f"reward {name}", *(num(s["rewards"].get(name)) for s in models))
    if "reward_total" in models[0]:
        table.add_row("reward (weighted sum)", *(num(s.get("reward_total")) for s in models))
    table.add_row("mean completion tokens", *(f"{s['mean_completion_length']:.1f}" for s in models))
    table.add_row("prompts", *(str(s["num_prompts"]) for s in models))
    table.add_row("completions", *(str(s["num_completions"]) for s in models))
    if any(s["skipped_prompts"] for s in models):
        table.add_row("skipped (too long)", *(str(s["skipped_prompts"]) for s in models))
    output.print(table)
