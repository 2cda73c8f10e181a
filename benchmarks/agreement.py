"""How closely grpo's GPU fast paths give a real model's own numbers, in bf16:

- the sampler (`grpo_cli.engine.rollout`): its log-probs of the tokens it drew against the model's forward over the
  same prompt and completion (transformers' and PEFT's own code), for the model alone and with a LoRA adapter on every
  linear layer folded into the decode steps, through CUDA graphs;
- the training forward/backward's attention (`flash_attention`, grpo_cli/engine/attention.py): the completions' log-
  probs and the adapter's gradients of a GRPO-like loss over the sampled batch, padded as TRL pads it, in
  micro-batches of 8 with gradient checkpointing, through FlashAttention's variable-length kernel and through SDPA
  with the padding mask.

    python benchmarks/agreement.py --model DIR --out agreement.json

`DIR` is a transformers folder with its tokenizer (e.g. `grpo models prepare smollm2-135m-instruct`). Prompts are
Countdown problems in the model's chat template. The adapter's B is drawn at random (PEFT starts it at zero, which
would leave nothing to fold); the table says how far the adapter moves the log-probs, so the differences read against
the adapter's own effect. The same model and adapter in float32 is the reference every bf16 side is measured against.
Sampler sides:
  plain             the model without an adapter
  lora              with the adapter, as `grpo rl` samples (gate and up projections' updates from one product)
  lora-separate     the same, the gate and up projections' updates each from its own product
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: the repository root, for grpo_cli
    sys.path.insert(0, str(HERE.parent))

from grpo_cli.atomic import write_text

MICRO_BATCH = 8

SIDES = ("plain", "lora", "lora-separate")


def countdown_prompts(tokenizer, count: int, seed: int) -> list[list[int]]:
    """`count` Countdown prompts as `grpo rl` builds them (system prompt, question, the assistant turn's prefill)."""
    from grpo_cli.tasks.countdown import generate_rows
    from grpo_cli.tasks.task import get_task

    task = get_task("countdown")
    prompts = []
    for row in generate_rows(count, seed):
        messages = [{"role": "system", "content": task.system_prompt()}, {"role": "user", "content": task.question(row)}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + task.prefill()
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return prompts


def forward_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    """The completion's tokens' log-probs from one forward pass over prompt + completion."""
    import torch

    with torch.no_grad():
        ids = torch.tensor([prompt + completion], device=model.device)
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    chosen = torch.tensor(completion, device=model.device).unsqueeze(-1)
    return torch.log_softmax(logits, -1).gather(-1, chosen).squeeze(-1).tolist()


def differences(a: list[list[float]], b: list[list[float]]) -> dict:
    """Mean, 99th percentile and largest absolute difference over every token of every completion."""
    flat = sorted(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))
    return {
        "mean": statistics.fmean(flat),
        "p99": flat[min(len(flat) - 1, int(0.99 * len(flat)))],
        "max": flat[-1],
        "tokens": len(flat),
    }


def padded_batch(prompts: list[list[int]], completions: list[list[int]], pad: int):
    """Token ids, attention mask and completion mask as TRL pads a GRPO batch: prompts on the left, completions on
    the right."""
    import torch

    width_p, width_c = max(map(len, prompts)), max(1, max(map(len, completions)))
    ids = torch.full((len(prompts), width_p + width_c), pad)
    mask = torch.zeros_like(ids)
    completion_mask = torch.zeros(len(prompts), width_c)
    for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[row, width_p - len(p) : width_p + len(c)] = torch.tensor(p + c)
        mask[row, width_p - len(p) : width_p + len(c)] = 1
        completion_mask[row, : len(c)] = 1
    return ids, mask, completion_mask, width_p


def train_side(model, batch, advantages, temperature: float, flash: bool, fused: bool) -> dict:
    """One forward/backward of a GRPO-like loss (advantage x the completion tokens' log-probs, over all the batch's
    tokens) in micro-batches with gradient checkpointing: the log-probs, the adapter's gradients, and how many
    attention calls went through FlashAttention's kernel."""
    import torch

    from grpo_cli.engine import attention
    from grpo_cli.engine.lora import fused_lora

    ids, mask, completion_mask, width_p = (t.to(model.device) if hasattr(t, "to") else t for t in batch)
    advantages = advantages.to(model.device)
    calls = []
    kernel = attention.padded_flash_attention
    attention.padded_flash_attention = lambda *a: calls.append(1) or kernel(*a)
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    logps = []
    try:
        with (
            attention.cudnn_attention(False),
            attention.flash_attention() if flash else contextlib.nullcontext(),
            fused_lora() if fused else contextlib.nullcontext(),
        ):
            for start in range(0, len(ids), MICRO_BATCH):
                rows = slice(start, start + MICRO_BATCH)
                logits = model(input_ids=ids[rows], attention_mask=mask[rows]).logits[:, width_p - 1 : -1]
                chosen = torch.log_softmax(logits.float() / temperature, -1).gather(-1, ids[rows, width_p:, None])
                chosen = chosen.squeeze(-1)
                loss = -(advantages[rows, None] * chosen * completion_mask[rows]).sum() / completion_mask.sum()
                loss.backward()
                logps += [row[m.bool()].tolist() for row, m in zip(chosen.detach(), completion_mask[rows], strict=True)]
    finally:
        attention.padded_flash_attention = kernel
    grads = torch.cat([p.grad.float().flatten() for n, p in model.named_parameters() if "lora_" in n])
    return {"logps": logps, "grads": grads, "flash_calls": len(calls)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a transformers model folder with its tokenizer")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--generations", type=int, default=4, help="completions per prompt")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--b-std", type=float, default=0.005, help="standard deviation of the adapter's B")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="JSON file for the results")
    args = parser.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_cli.engine import rollout

    device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: a quick check of the script itself
    if device == "cuda":
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = [p for p in countdown_prompts(tokenizer, args.prompts, args.seed) for _ in range(args.generations)]
    eos = [tokenizer.eos_token_id]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]

    def load(dtype, adapter: bool):
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device)
        if device == "cuda":
            _apply_liger_kernel_to_instance(model=model)  # as `grpo rl` trains and samples it on a GPU
        if not adapter:
            return model.eval()
        config = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, target_modules="all-linear")
        torch.manual_seed(args.seed)  # A drawn alike in both precisions (PEFT draws it in float32)
        model = get_peft_model(model, config)
        generator = torch.Generator().manual_seed(args.seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:  # float32 draws, then the model's dtype: both precisions get the same B
                    param.copy_(torch.randn(param.shape, generator=generator) * args.b_std)
        return model.eval()

    models = {
        "plain": (load(torch.bfloat16, False), load(torch.float32, False)),
        "lora": (load(torch.bfloat16, True), load(torch.float32, True)),
    }
    models["lora-separate"] = models["lora"]
    gate_up = rollout._gate_up
    results, batch = {}, None
    t = args.temperature
    for side in SIDES:
        bf16, fp32 = models[side]
        rollout._gate_up = rollout._separate_gate_up if side == "lora-separate" else gate_up
        sampled = bf16.get_base_model() if side != "plain" else bf16  # unwrapped, as in training
        sampler = rollout.Sampler()
        torch.manual_seed(args.seed)
        completions, logprobs = sampler.sample(
            sampled, prompts, args.new_tokens, eos, pad, sampling=rollout.Sampling(temperature=t)
        )
        own = [forward_logprobs(bf16, p, c, t) for p, c in zip(prompts, completions, strict=True)]
        exact = [forward_logprobs(fp32, p, c, t) for p, c in zip(prompts, completions, strict=True)]
        results[side] = {
            "sampler_vs_forward": differences(logprobs, own),
            "sampler_vs_float32": differences(logprobs, exact),
            "forward_vs_float32": differences(own, exact),
            "graphs_problem": sampler.graphs_problem,
            "completion_tokens": sum(len(c) for c in completions),
            "ended_at_eos": sum(bool(c) and c[-1] in eos for c in completions),
        }
        if side == "lora":  # how far the adapter moves the log-probs of the same tokens; the batch trained below
            plain = [forward_logprobs(models["plain"][1], p, c, t) for p, c in zip(prompts, completions, strict=True)]
            results[side]["adapter_effect"] = differences(exact, plain)
            batch = padded_batch(prompts, completions, pad)
    rollout._gate_up = gate_up

    advantages = torch.randn(len(prompts), generator=torch.Generator().manual_seed(args.seed))
    bf16, fp32 = models["lora"]
    exact = train_side(fp32, batch, advantages, t, flash=False, fused=False)
    training, runs = {}, {}
    for side, flash in (("sdpa", False), ("flash", True)):
        runs[side] = run = train_side(bf16, batch, advantages, t, flash=flash, fused=device == "cuda")
        bf16.zero_grad(set_to_none=True)
        training[side] = {
            "logps_vs_float32": differences(run["logps"], exact["logps"]),
            "grad_relative_error": float((run["grads"] - exact["grads"]).norm() / exact["grads"].norm()),
            "grad_cosine": float(torch.nn.functional.cosine_similarity(run["grads"], exact["grads"], dim=0)),
            "flash_calls": run["flash_calls"],
        }
    sdpa, flash = runs["sdpa"], runs["flash"]
    training["flash"]["logps_vs_sdpa"] = differences(flash["logps"], sdpa["logps"])
    training["flash"]["grad_relative_to_sdpa"] = float((flash["grads"] - sdpa["grads"]).norm() / sdpa["grads"].norm())
    training["flash"]["grad_cosine_to_sdpa"] = float(
        torch.nn.functional.cosine_similarity(flash["grads"], sdpa["grads"], dim=0)
    )

    header = "| sampler side | sampler vs forward (mean / p99 / max) | sampler vs float32 | forward vs float32 |"
    lines = [header, "| --- | --- | --- | --- |"]
    for side, r in results.items():
        cells = [
            " / ".join(f"{r[k][m]:.4f}" for m in ("mean", "p99", "max"))
            for k in ("sampler_vs_forward", "sampler_vs_float32", "forward_vs_float32")
        ]
        lines.append(f"| {side} | " + " | ".join(cells) + " |")
    effect = results["lora"]["adapter_effect"]
    moved = f"{effect['mean']:.4f} on average (max {effect['max']:.3f})"
    lines.append(f"\nThe adapter moves the float32 log-probs by {moved}.\n")
    lines.append(
        "| training attention | log-probs vs float32 (mean / p99 / max) | adapter gradients vs float32: relative "
        "error, cosine | FlashAttention calls |"
    )
    lines.append("| --- | --- | --- | --- |")
    for side, r in training.items():
        d = r["logps_vs_float32"]
        errors = f"{r['grad_relative_error']:.4f}, {r['grad_cosine']:.5f}"
        lines.append(f"| {side} | {d['mean']:.4f} / {d['p99']:.4f} / {d['max']:.4f} | {errors} | {r['flash_calls']} |")
    d, r = training["flash"]["logps_vs_sdpa"], training["flash"]
    lines.append(
        f"\nflash against sdpa: log-probs {d['mean']:.4f} / {d['p99']:.4f} / {d['max']:.4f}; adapter gradients "
        f"relative difference {r['grad_relative_to_sdpa']:.4f}, cosine {r['grad_cosine_to_sdpa']:.5f}."
    )
    print("\n".join(lines))
    if args.out:
        record = {
            "command": " ".join(["python", "benchmarks/agreement.py", *sys.argv[1:]]),
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "torch": torch.__version__,
            "model": Path(args.model).name,
            "settings": {k: v for k, v in vars(args).items() if k not in ("model", "out")},
            "sampler": results,
            "training_attention": training,
        }
        write_text(Path(args.out), json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
