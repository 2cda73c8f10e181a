#!/bin/bash
# GPU0: grpo-mb8 0.5B/256 with the side workspace released; grpo at 8192 tokens (mb 4), 2 steps, on 24 GiB
# GPU1: the baseline's steady step (2 steps) at 3072, then 2048 tokens, on 24 GiB
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bnb/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B="python3 benchmarks/grpo_bench.py --tokenizer .whl-bnb/assets/tok"
mkdir -p "$OUT/logs"; rm -rf /tmp/b0 /tmp/b1 /tmp/b2
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 80 $B --budget-s 75 --out "$OUT/mb8-release.json" --work /tmp/b0 \
    --plan qwen2.5-0.5b:256:grpo-mb8:60:3 > "$OUT/logs/gpu0-mb8.log" 2>&1
  timeout 465 $B --memory-limit-gib 24 --budget-s 460 --out "$OUT/fit-grpo8192x2.json" --work /tmp/b2 \
    --plan qwen2.5-1.5b:8192:grpo-mb4:450:2 > "$OUT/logs/gpu0-8192.log" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 300 $B --memory-limit-gib 24 --budget-s 295 --out "$OUT/fit-trl3072x2.json" --work /tmp/b1 \
    --plan qwen2.5-1.5b:3072:trl:285:2 > "$OUT/logs/gpu1-3072.log" 2>&1
  timeout 240 $B --memory-limit-gib 24 --budget-s 235 --out "$OUT/fit-trl2048x2.json" --work /tmp/b1 \
    --plan qwen2.5-1.5b:2048:trl:225:2 > "$OUT/logs/gpu1-2048.log" 2>&1
) &
wait
ls -la "$OUT"
