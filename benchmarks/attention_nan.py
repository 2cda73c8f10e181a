"""Whether the attention of a Qwen2.5-0.5B-shaped stack makes non-finite gradients on a padded GRPO-like batch by
itself, with random weights: each SDPA backend, then liger-kernel's kernels (rotary, RMSNorm, SwiGLU).

    python3 benchmarks/attention_nan.py --out $OUT/attention-random-weights.json

Two decoder layers of the 0.5B shape (hidden 896, 14 heads, 2 KV heads, head size 64) in bf16 with gradient
checkpointing as the recipes run it, 64 sequences of 60 prompt tokens (0-13 of them left padding) and 20-512
completion tokens (the rest right padding), the loss a masked mean of the completion tokens' log-probabilities;
per backend and seed, how many parameter gradients are not finite. CUDA only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

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
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=1000,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=2,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    built = Qwen2ForCausalLM(config).to("cuda", torch.bfloat16)
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
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
