#!/bin/bash
# GPU0: grpo at 8192 tokens (micro-batches of 4), 2 steps, on an emulated 24 GiB card
# GPU1: baseline against grpo (recipe split, lean LM-head backward) and grpo with TRL's LM-head backward
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bnb/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B="python3 benchmarks/grpo_bench.py --tokenizer .whl-bnb/assets/tok"
mkdir -p "$OUT/logs"; rm -rf /tmp/b0 /tmp/b1
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 565 $B --memory-limit-gib 24 --budget-s 555 --out "$OUT/fit-grpo8192x2.json" --work /tmp/b0 \
    --plan qwen2.5-1.5b:8192:grpo-mb4:490:2 > "$OUT/logs/gpu0.log" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 565 $B --budget-s 555 --out "$OUT/main.json" --work /tmp/b1 \
    --plan qwen2.5-0.5b:256:trl:80:2,qwen2.5-0.5b:256:grpo:60:3,qwen2.5-0.5b:256:grpo-trl-head:60:3,qwen2.5-1.5b:1024:trl:200:2,qwen2.5-1.5b:1024:grpo:100:3,qwen2.5-1.5b:256:trl:90:2,qwen2.5-1.5b:256:grpo:70:3 \
    > "$OUT/logs/gpu1.log" 2>&1
) &
wait
tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$OUT/logs"
ls -la "$OUT"
