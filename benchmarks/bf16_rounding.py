"""How many of a model's weights one AdamW step leaves unchanged when the weights are bfloat16, by learning rate.

AdamW's first step moves each weight by about the learning rate; a bfloat16 weight keeps 8 significant bits, so a
move smaller than half a unit in its last place rounds back to the same number. Full fine-tuning without DeepSpeed
therefore gets float32 master weights by default (`master_weights`, grpo_cli/train/master_weights.py).

    python benchmarks/bf16_rounding.py --model ~/.cache/grpo/models/smollm2-135m-instruct \\
        --out benchmarks/results/cpu-2026-12-04/bf16-rounding.json

(`grpo models prepare smollm2-135m-instruct` writes that model.) Runs on the CPU in seconds; the gradients are random,
which is all a first AdamW step's size depends on.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

LEARNING_RATES = (5e-7, 1e-6, 2e-6, 1e-5, 2e-5, 1e-4, 3e-4)


def unchanged_share(model, lr: float, seed: int = 0) -> float:
    """The share of the model's weights one AdamW step (no weight decay) with random gradients leaves as they were."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    generator = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator).to(p.dtype)
    torch.optim.AdamW(params, lr=lr, weight_decay=0.0).step()
    same = sum((p.detach() == b).sum().item() for p, b in zip(params, before))
    with torch.no_grad():
        for p, b in zip(params, before):
            p.copy_(b)
            p.grad = None
    return same / sum(p.numel() for p in params)


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a model folder")
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    rows = [{"learning_rate": lr, "unchanged": unchanged_share(model, lr)} for lr in LEARNING_RATES]
    print(f"{'learning rate':>13}  weights one AdamW step leaves unchanged in bfloat16")
    for row in rows:
        print(f"{row['learning_rate']:>13g}  {row['unchanged']:.1%}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        result = {
            "command": "python benchmarks/bf16_rounding.py --model " + Path(args.model).name,
            "model": Path(args.model).name,
            "parameters": sum(p.numel() for p in model.parameters()),
            "rows": rows,
        }
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
