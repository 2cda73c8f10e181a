#!/bin/bash
# Two GPUs, one benchmark per GPU, the code as committed: the 1.5B/256 pair beside its baseline on each GPU, then the
# 0.5B/256 pair on GPU 0.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B="python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok"
mkdir -p "$OUT/logs"; rm -rf /tmp/b0 /tmp/b1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
lscpu | grep -i "model name" >> "$OUT/gpu.txt"
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 240 $B --budget-s 230 --out "$OUT/gpu0.json" --work /tmp/b0 \
    --plan qwen2.5-1.5b:256:trl:90:2,qwen2.5-1.5b:256:grpo:55:3,qwen2.5-0.5b:256:trl:80:2,qwen2.5-0.5b:256:grpo:50:3 \
    > "$OUT/logs/gpu0.log" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 240 $B --budget-s 230 --out "$OUT/gpu1.json" --work /tmp/b1 \
    --plan qwen2.5-1.5b:256:trl:90:2,qwen2.5-1.5b:256:grpo:55:3 \
    > "$OUT/logs/gpu1.log" 2>&1
) &
wait
tail -c 1500 "$OUT/logs/gpu0.log"; tail -c 1000 "$OUT/logs/gpu1.log"
