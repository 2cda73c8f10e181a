"""Build a random-weight Qwen2 model with a real tokenizer and save it in bf16.

python make_model.py TOKENIZER_DIR OUT [--shape 0.5b|1.5b|tiny]

0.5b and 1.5b have the shapes of Qwen2.5-0.5B and Qwen2.5-1.5B (1.5b: hidden 1536, 28 layers, 12 heads, 2 KV heads,
intermediate 8960, tied embeddings) with the tokenizer's vocabulary; tiny is for checking the scripts on a CPU.
"""

import argparse
import json

import torch
from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

SHAPES = {
    "0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "intermediate_size": 4864},
    "1.5b": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
             "intermediate_size": 8960},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 128},
}

parser = argparse.ArgumentParser()
parser.add_argument("tokenizer")
parser.add_argument("out")
parser.add_argument("--shape", choices=SHAPES, default="1.5b")
args = parser.parse_args()

tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
tokenizer.model_max_length = 4096
config = Qwen2Config(
    vocab_size=len(tokenizer), max_position_embeddings=4096, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    pad_token_id=tokenizer.pad_token_id, **SHAPES[args.shape],
)
torch.manual_seed(0)
# Initialise on the GPU when there is one: a 1.5B random init on the CPU takes far longer than saving it.
device = "cuda" if torch.cuda.is_available() else "cpu"
with torch.device(device):
    model = Qwen2ForCausalLM(config)
model = model.to(torch.bfloat16)
model.config.dtype = torch.bfloat16
model.generation_config = GenerationConfig(
    bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
)
model.save_pretrained(args.out)
tokenizer.save_pretrained(args.out)
params = sum(p.numel() for p in model.parameters())
print("MODEL", json.dumps({"out": args.out, "shape": args.shape, "parameters": params, "vocab": len(tokenizer)}))
