"""Build a random-weight Qwen2 model with a real tokenizer and save it in bf16.

python make_model.py TOKENIZER_DIR OUT [--shape 0.5b|1.5b|tiny]

0.5b and 1.5b have the shapes of Qwen2.5-0.5B and Qwen2.5-1.5B (1.5b: hidden 1536, 28 layers, 12 heads, 2 KV heads,
intermediate 8960, tied embeddings; `grpo_bench.SHAPES`) with the tokenizer's vocabulary and 4096 positions; tiny
is for checking the scripts on a CPU.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.grpo_bench import build_model  # after the repository is on the path

SHAPES = {"0.5b": "qwen2.5-0.5b", "1.5b": "qwen2.5-1.5b", "tiny": "tiny"}
POSITIONS = 4096

parser = argparse.ArgumentParser()
parser.add_argument("tokenizer")
parser.add_argument("out")
parser.add_argument("--shape", choices=SHAPES, default="1.5b")
args = parser.parse_args()

tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
# Initialise on the GPU when there is one: a 1.5B random init on the CPU takes far longer than saving it.
device = "cuda" if torch.cuda.is_available() else "cpu"
sizes = build_model(
    SHAPES[args.shape], Path(args.tokenizer), Path(args.out), device, dtype=torch.bfloat16,
    vocab_size=len(tokenizer), max_position_embeddings=POSITIONS,
)  # fmt: skip
tokenizer.model_max_length = POSITIONS
tokenizer.save_pretrained(args.out)
info = {"out": args.out, "shape": args.shape, "parameters": sizes["parameters"], "vocab": len(tokenizer)}
print("MODEL", json.dumps(info))
