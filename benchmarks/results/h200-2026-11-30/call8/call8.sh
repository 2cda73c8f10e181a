#!/bin/bash
# One GPU: the rollout alone at 1.5B (128 rows, 256 new tokens) with variants of its decode step, one profiled;
# then 0.5B/1024 with the new GPU defaults (offloading + lean LM head), without them, and the baseline.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs" "$OUT/rollout"; rm -rf /tmp/b0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
for v in main multinomial sdpa-efficient sdpa-cudnn sdpa-math; do
  timeout 75 python3 benchmarks/rollout_bench.py --shape qwen2.5-1.5b --variant $v --out "$OUT/rollout/$v.json" \
    > "$OUT/logs/rollout-$v.log" 2>&1; tail -1 "$OUT/logs/rollout-$v.log"
done
timeout 75 python3 benchmarks/rollout_bench.py --shape qwen2.5-1.5b --variant main --timed 1 \
  --profile "$OUT/rollout/main.profile.txt" > "$OUT/logs/rollout-profile.log" 2>&1; tail -1 "$OUT/logs/rollout-profile.log"
timeout 330 python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok --budget-s 320 --out "$OUT/len1024.json" \
  --work /tmp/b0 --plan qwen2.5-0.5b:1024:grpo:80:3,qwen2.5-0.5b:1024:trl:140:2,qwen2.5-0.5b:1024:grpo-no-offload:80:3 \
  > "$OUT/logs/bench.log" 2>&1
tail -c 2500 "$OUT/logs/bench.log"
