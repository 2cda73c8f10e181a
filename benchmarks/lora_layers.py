"""One decoder layer's LoRA projections, forward and backward, through PEFT's forward and through `fused_lora`
(grpo_cli/engine/lora.py), timed alone on one GPU: what the fused layers save of a LoRA step's forward/backward.

    python3 benchmarks/lora_layers.py --shapes qwen2.5-3b,qwen2.5-7b --tokens 9600 --out lora-layers.json

Each shape's seven projections (q, k, v, o, gate, up, down: `grpo_bench.SHAPES`) as `nn.Linear` layers of random
bfloat16 weights, wrapped by PEFT with LoRA of rank 16 (alpha 32, dropout 0.05, float32 adapters, as TRL's
`get_peft_config` makes them), run as a decoder layer runs them (q/k/v and gate/up on the normed input, o on the
attention's output, down on the gated product) on `--tokens` tokens under bfloat16 autocast, in training mode; the
loss is the sum of the outputs. Timed: the median of `--repeats` forward+backward passes after warm-up, with the
device synchronised around each; peak memory from `torch.cuda.max_memory_allocated`. On the CPU (a small check of
the script) the times mean nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.grpo_bench import SHAPES

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def layer(shape: dict, device: str):
    """The shape's seven projections with PEFT's LoRA on each."""
    import torch
    from peft import LoraConfig, get_peft_model

    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    kv = shape["num_key_value_heads"] * hidden // shape["num_attention_heads"]
    sizes = {
        "q_proj": (hidden, hidden), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (hidden, hidden),
        "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden),
    }
    torch.manual_seed(0)
    module = torch.nn.Module()
    for name, (n_in, n_out) in sizes.items():
        setattr(module, name, torch.nn.Linear(n_in, n_out, bias=name in ("q_proj", "k_proj", "v_proj")))
    module = module.to(device=device, dtype=torch.bfloat16)
    model = get_peft_model(module, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=list(PROJECTIONS)))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.01)
    model.train()
    return model.base_model.model, sizes


def step(m, x, gated):
    """A decoder layer's use of its projections, forward and backward."""
    q, k, v = m.q_proj(x), m.k_proj(x), m.v_proj(x)
    o = m.o_proj(q)  # stands in for the attention's output (the same size as q)
    gate, up = m.gate_proj(x), m.up_proj(x)
    down = m.down_proj(gated)
    loss = sum(t.float().sum() for t in (k, v, o, gate, up, down))
    loss.backward()


def timed(m, x, gated, device: str, repeats: int) -> tuple[float, float]:
    import torch

    times = []
    for i in range(repeats + 2):  # two warm-up passes
        if device == "cuda":
            torch.cuda.synchronize()
            if i == 2:
                torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16):
            step(m, x, gated)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        m.zero_grad(set_to_none=True)
        x.grad = gated.grad = None
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0
    return statistics.median(times[2:]), peak


def main() -> None:
    import torch

    from grpo_cli.engine.lora import fused_lora

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="qwen2.5-3b,qwen2.5-7b")
    parser.add_argument("--tokens", type=int, default=9600, help="tokens per forward (a micro-batch of 16 x 600)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = []
    for name in args.shapes.split(","):
        m, sizes = layer(SHAPES[name], device)
        x = torch.randn(args.tokens, sizes["q_proj"][0], device=device, dtype=torch.bfloat16, requires_grad=True)
        gated = torch.randn(args.tokens, sizes["down_proj"][0], device=device, dtype=torch.bfloat16, requires_grad=True)
        peft_s, peft_peak = timed(m, x, gated, device, args.repeats)
        with fused_lora():
            fused_s, fused_peak = timed(m, x, gated, device, args.repeats)
        entry = {"shape": name, "tokens": args.tokens, "device": device, "peft_s": round(peft_s, 5),
                 "fused_s": round(fused_s, 5), "speedup": round(peft_s / fused_s, 3),
                 "peak_gib": {"peft": round(peft_peak, 3), "fused": round(fused_peak, 3)}}
        results.append(entry)
        print(json.dumps(entry), flush=True)
        del m, x, gated
        if device == "cuda":
            torch.cuda.empty_cache()
    info = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name() if device == "cuda" else None}
    Path(args.out).write_text(json.dumps({"command": " ".join(["python3", "benchmarks/lora_layers.py", *sys.argv[1:]]),
                                          **info, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
