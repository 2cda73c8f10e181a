#!/bin/bash
# Two GPUs, the 1.5B/256 pair on each: the baseline, then `grpo` (the defaults: layer-input offloading and the lean
# LM-head backward both on here) against `grpo-no-lean` (offloading on, the LM head's backward as TRL's), alternating,
# in opposite orders on the two GPUs.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B="python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok"
mkdir -p "$OUT/logs"; rm -rf /tmp/b0 /tmp/b1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
lscpu | grep -i "model name" >> "$OUT/gpu.txt"
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 400 $B --budget-s 390 --out "$OUT/gpu0.json" --work /tmp/b0 \
    --plan qwen2.5-1.5b:256:trl:90:2,qwen2.5-1.5b:256:grpo:55:4,qwen2.5-1.5b:256:grpo-no-lean:55:4,qwen2.5-1.5b:256:grpo:55:4,qwen2.5-1.5b:256:grpo-no-lean:55:4 \
    > "$OUT/logs/gpu0.log" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 400 $B --budget-s 390 --out "$OUT/gpu1.json" --work /tmp/b1 \
    --plan qwen2.5-1.5b:256:trl:90:2,qwen2.5-1.5b:256:grpo-no-lean:55:4,qwen2.5-1.5b:256:grpo:55:4,qwen2.5-1.5b:256:grpo-no-lean:55:4,qwen2.5-1.5b:256:grpo:55:4 \
    > "$OUT/logs/gpu1.log" 2>&1
) &
wait
tail -c 2500 "$OUT/logs/gpu0.log"; tail -c 2500 "$OUT/logs/gpu1.log"
