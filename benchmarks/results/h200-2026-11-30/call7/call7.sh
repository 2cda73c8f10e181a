#!/bin/bash
# One GPU: offloading (pooled buffers) with the lean LM head, beside main's default and the baseline, both shapes at
# 256 tokens; offloading alone at 1.5B.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B="python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok"
mkdir -p "$OUT/logs"; rm -rf /tmp/b0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
timeout 520 $B --budget-s 510 --out "$OUT/combo.json" --work /tmp/b0 \
  --plan qwen2.5-0.5b:256:trl:80:2,qwen2.5-0.5b:256:grpo:40:3,qwen2.5-0.5b:256:grpo-offload-lean:45:3,qwen2.5-1.5b:256:trl:90:2,qwen2.5-1.5b:256:grpo:50:3,qwen2.5-1.5b:256:grpo-offload-lean:55:3,qwen2.5-1.5b:256:grpo-offload:55:3 \
  > "$OUT/logs/bench.log" 2>&1
tail -c 3000 "$OUT/logs/bench.log"
