"""Where scaled_dot_product_attention makes non-finite gradients on padded batches. CUDA only.

    python3 benchmarks/attention_nan.py --out $OUT/attention-random-weights.json
    python3 benchmarks/attention_nan.py --lengths --out $OUT/attention-lengths.json \
      [--model /tmp/qwen2.5-coder-0.5b-instruct]

Without `--lengths`: two decoder layers of the Qwen2.5-0.5B shape (hidden 896, 14 heads, 2 KV heads, head size 64)
with random weights, in bf16 with gradient checkpointing as the recipes run it, 64 sequences of 60 prompt tokens
(0-13 of them left padding) and 20-512 completion tokens (the rest right padding), the loss a masked mean of the
completion tokens' log-probabilities; per SDPA backend (then with liger-kernel's kernels) and seed, how many
parameter gradients are not finite.

With `--lengths`: the condition of the cuDNN backward's NaN (grpo_cli/engine/attention.py) at padded lengths
around it (64 modulo 128 and its neighbours), with torch's cuDNN attention allowed and not: one head under a causal
boolean mask whose every score is far below zero (logsumexp under -88.7), and one with ordinary scores whose first
positions are left padding (their rows see no key), the query, key and value gradients' non-finite elements; and
with `--model`, a real model's padded batch at those lengths, its non-finite parameter gradients.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROMPT, COMPLETION, SEQUENCES = 60, 512, 64


def batch(seed: int):
    import torch

    generator = torch.Generator().manual_seed(seed)
    left = torch.randint(0, 14, (SEQUENCES,), generator=generator)
    lengths = torch.randint(20, COMPLETION + 1, (SEQUENCES,), generator=generator)
    ids = torch.randint(10, 1000, (SEQUENCES, PROMPT + COMPLETION), generator=generator)
    attention = torch.ones_like(ids)
    completion = torch.zeros(SEQUENCES, COMPLETION)
    for row in range(SEQUENCES):
        attention[row, : left[row]] = 0
        attention[row, PROMPT + lengths[row] :] = 0
        completion[row, : lengths[row]] = 1
    return ids.cuda(), attention.cuda(), completion.cuda()


def model():
    """Two layers of the step-time benchmark's Qwen2.5-0.5B shape, a vocabulary of 1000, random weights."""
    import torch

    from benchmarks.grpo_bench import random_qwen2

    built = random_qwen2("qwen2.5-0.5b", "cuda", torch.bfloat16, num_hidden_layers=2, vocab_size=1000,
                         max_position_embeddings=4096)
    built.config._attn_implementation = "sdpa"
    built.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return built.train()


def step(built, backend, seed: int) -> dict:
    import torch
    from torch.nn.attention import sdpa_kernel

    ids, attention, completion = batch(seed)
    built.zero_grad(set_to_none=True)
    with sdpa_kernel([backend]) if backend is not None else torch.enable_grad():
        logits = built(input_ids=ids, attention_mask=attention, logits_to_keep=COMPLETION + 1).logits[:, :-1]
        logps = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, -COMPLETION:, None]).squeeze(-1)
        loss = -(logps * completion).sum() / completion.sum()
        loss.backward()
    named = [(name, p.grad) for name, p in built.named_parameters() if p.grad is not None]
    bad = [name for name, grad in named if not bool(torch.isfinite(grad).all())]
    return {"seed": seed, "loss": float(loss), "non_finite": len(bad), "of": len(named), "names": bad[:4]}


LENGTHS = (576, 640, 704, 768, 832)  # 64 modulo 128: 704 and 832 (and 576); multiples of 128: 640 and 768
LEFT_PADDING = 5  # positions hidden as keys at the start of the crafted head's sequence


def crafted_head(length: int, left_padding: int = 0, head_size: int = 64):
    """One head's query, key and value (bf16, with gradients) and its boolean mask (causal, the first `left_padding`
    positions hidden as keys, as a left-padded sequence has them). Without padding every scaled score is about -120,
    so every row's logsumexp is far below -88.7; with it the scores are ordinary, and the padded positions' rows see
    no key at all."""
    import torch

    generator = torch.Generator().manual_seed(length)
    query, key, value = (torch.randn(1, 1, length, head_size, generator=generator) for _ in range(3))
    query, key = query * 0.1, key * 0.1
    if not left_padding:
        query[..., 0], key[..., 0] = 1.0, -120.0 * head_size**0.5  # the scaled product of the first entries: -120
    mask = torch.ones(length, length, dtype=torch.bool).tril()
    mask[:, :left_padding] = False
    tensors = [t.to("cuda", torch.bfloat16).requires_grad_(True) for t in (query, key, value)]
    return (*tensors, mask[None, None].to("cuda"))


def crafted(length: int, cudnn: bool, left_padding: int = 0) -> dict:
    import torch

    from grpo_cli.engine.attention import cudnn_attention

    query, key, value, mask = crafted_head(length, left_padding)
    with cudnn_attention(cudnn):
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
        out.backward(torch.ones_like(out))
    found = {name: int((~torch.isfinite(t.grad)).sum()) for name, t in zip(("query", "key", "value"), (query, key, value))}
    return {
        "length": length,
        "left_padding": left_padding,
        "cudnn": cudnn,
        "output_finite": bool(torch.isfinite(out).all()),
        "non_finite": found,
    }


def real_model(path: str, length: int, cudnn: bool) -> dict:
    """A real model's padded batch of `length` tokens (8 sequences, 0-7 tokens of left padding), forward and backward
    with gradient checkpointing: which parameter gradients are not finite."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_cli.engine.attention import cudnn_attention

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    generator = torch.Generator().manual_seed(length)
    ids = torch.randint(100, 20000, (8, length), generator=generator).cuda()
    attention = torch.ones_like(ids)
    for row in range(8):
        attention[row, :row] = 0
    with cudnn_attention(cudnn):
        logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=129).logits[:, :-1].float()
        loss = -torch.log_softmax(logits, -1).gather(-1, ids[:, -128:, None]).mean()
        loss.backward()
    names = [name for name, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    del model
    torch.cuda.empty_cache()
    return {"length": length, "cudnn": cudnn, "loss": float(loss), "non_finite": len(names), "names": names[-3:]}


def lengths(args) -> dict:
    found: dict[str, list] = {"crafted head": [], "crafted head, left padding": []}
    for length in LENGTHS:
        for cudnn in (True, False):
            found["crafted head"].append(crafted(length, cudnn))
            found["crafted head, left padding"].append(crafted(length, cudnn, left_padding=LEFT_PADDING))
            print(found["crafted head"][-1], found["crafted head, left padding"][-1], flush=True)
    if args.model:
        found["model"] = []
        for length in LENGTHS:
            for cudnn in (True, False):
                found["model"].append(real_model(args.model, length, cudnn))
                print(found["model"][-1], flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--lengths", action="store_true", help="the cuDNN backward's condition, by padded length")
    parser.add_argument("--model", help="with --lengths: a real model's folder")
    args = parser.parse_args()
    if args.lengths:
        import torch

        found = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), **lengths(args)}
        Path(args.out).write_text(json.dumps(found, indent=1))
        return
    from torch.nn.attention import SDPBackend

    backends = {
        "default": None,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
    }
    found: dict[str, list] = {}
    built = model()
    for name, backend in backends.items():
        for seed in range(args.seeds):
            try:
                found.setdefault(name, []).append(step(built, backend, seed))
            except RuntimeError as err:  # a backend that refuses these inputs
                found[name].append({"seed": seed, "error": str(err)[:200]})
                break
            print(name, found[name][-1], flush=True)
    from liger_kernel.transformers import apply_liger_kernel_to_qwen2

    apply_liger_kernel_to_qwen2(rope=True, rms_norm=True, swiglu=True, cross_entropy=False)
    built = model()
    for seed in range(args.seeds):
        found.setdefault("liger, default backend", []).append(step(built, None, seed))
        print("liger", found["liger, default backend"][-1], flush=True)
    Path(args.out).write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
