#!/bin/bash
# GPU0: the 0.5B/256 and 1.5B/1024 rows again (one rollout stream), with activation offloading on trial;
# GPU1: the baseline's steady step (2 steps) at 4096 tokens on an emulated 24 GiB card
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bnb/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B="python3 benchmarks/grpo_bench.py --tokenizer .whl-bnb/assets/tok"
mkdir -p "$OUT/logs"; rm -rf /tmp/b0 /tmp/b1 /tmp/b2
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 290 $B --budget-s 280 --out "$OUT/main256.json" --work /tmp/b0 \
    --plan qwen2.5-0.5b:256:trl:100:3,qwen2.5-0.5b:256:grpo-mb8:50:3,qwen2.5-0.5b:256:grpo:45:3,qwen2.5-0.5b:256:grpo-offload:60:3 > "$OUT/logs/gpu0-256.log" 2>&1
  timeout 245 $B --budget-s 240 --out "$OUT/main1024.json" --work /tmp/b2 \
    --plan qwen2.5-1.5b:1024:grpo:85:3,qwen2.5-1.5b:1024:grpo-offload:110:3 > "$OUT/logs/gpu0-1024.log" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 545 $B --memory-limit-gib 24 --budget-s 540 --out "$OUT/fit-trl4096x2.json" --work /tmp/b1 \
    --plan qwen2.5-1.5b:4096:trl:530:2 > "$OUT/logs/gpu1-4096.log" 2>&1
) &
wait
for f in /tmp/b0/*.log /tmp/b1/*.log /tmp/b2/*.log; do echo "== $f"; grep -v "it/s\]" "$f" | tail -25; done > "$OUT/logs/workers.txt" 2>&1
ls -la "$OUT"
