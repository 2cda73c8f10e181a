#!/bin/bash
# One GPU: the decode attention through FlashAttention's variable-length kernel. The gpu tests; the rollout alone at
# 1.5B (128 rows, 256 new tokens) with it and with the previous SDPA path, and a profile; then the 1.5B/256 defaults
# beside the baseline.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs" /tmp/rollout; rm -rf /tmp/b0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
timeout 90 python3 -m pytest -m gpu tests/test_bench.py -q -p no:cacheprovider > "$OUT/logs/gpu-tests.log" 2>&1
tail -3 "$OUT/logs/gpu-tests.log"
for v in main sdpa; do
  timeout 60 python3 benchmarks/rollout_bench.py --shape qwen2.5-1.5b --variant $v --out /tmp/rollout/$v.json \
    > "$OUT/logs/rollout-$v.log" 2>&1; tail -1 "$OUT/logs/rollout-$v.log"
done
timeout 60 python3 benchmarks/rollout_bench.py --shape qwen2.5-1.5b --variant main --timed 1 \
  --profile /tmp/rollout/main.profile.txt > "$OUT/logs/rollout-profile.log" 2>&1; tail -1 "$OUT/logs/rollout-profile.log"
tar -C /tmp -czf "$OUT/rollout.tar.gz" rollout
timeout 300 python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok --budget-s 290 --out "$OUT/bench.json" \
  --work /tmp/b0 --plan qwen2.5-1.5b:256:grpo:55:3,qwen2.5-1.5b:256:trl:90:2 \
  > "$OUT/logs/bench.log" 2>&1
tail -c 2500 "$OUT/logs/bench.log"
