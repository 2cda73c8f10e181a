#!/bin/bash
# Decode attention through one fused SDPA call; the LM-head backward with TRL's tile width.
# GPU0: 0.5B/256 and 1.5B/256: baseline, grpo, grpo with TRL's LM-head backward; then the 0.5B/1024 baseline
# GPU1: 1.5B/1024 baseline and grpo; the learning curve at lr 1e-4
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bnb/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B="python3 benchmarks/grpo_bench.py --tokenizer .whl-bnb/assets/tok"
mkdir -p "$OUT/logs"; rm -rf /tmp/b0 /tmp/b1
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 565 $B --budget-s 555 --out "$OUT/main.json" --work /tmp/b0 \
    --plan qwen2.5-0.5b:256:trl:80:2,qwen2.5-0.5b:256:grpo:60:3,qwen2.5-0.5b:256:grpo-trl-head:60:3,qwen2.5-1.5b:256:trl:90:2,qwen2.5-1.5b:256:grpo:70:3,qwen2.5-1.5b:256:grpo-trl-head:70:3,qwen2.5-0.5b:1024:grpo:80:3,qwen2.5-0.5b:1024:trl:240:2 \
    > "$OUT/logs/gpu0.log" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 300 $B --budget-s 290 --out "$OUT/main1024.json" --work /tmp/b1 \
    --plan qwen2.5-1.5b:1024:trl:200:2,qwen2.5-1.5b:1024:grpo:80:3 > "$OUT/logs/gpu1-1024.log" 2>&1
  timeout 260 $B --budget-s 250 --out "$OUT/curve.json" --work /tmp/b1 \
    --rewards benchmarks/distributed/rewards.py:vowel_share --learning-rate 1e-4 \
    --plan qwen2.5-0.5b:64:trl:150:20,qwen2.5-0.5b:64:grpo:70:20 > "$OUT/logs/gpu1-curve.log" 2>&1
) &
wait
tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$OUT/logs"
ls -la "$OUT"
