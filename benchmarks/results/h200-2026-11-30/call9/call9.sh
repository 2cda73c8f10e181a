#!/bin/bash
# One GPU: where the rollout's decode step spends its time (1.5B, 128 rows, 256 new tokens, torch.profiler); then
# the defaults that offload only where the forward/backward sets the peak: 0.5B/256 (on), 1.5B/1024 (off) beside
# the baseline.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs" /tmp/rollout; rm -rf /tmp/b0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
timeout 60 python3 benchmarks/rollout_bench.py --shape qwen2.5-1.5b --variant main --timed 1 --out /tmp/rollout/main.json \
  --profile /tmp/rollout/main.profile.txt > "$OUT/logs/rollout-profile.log" 2>&1; tail -1 "$OUT/logs/rollout-profile.log"
tar -C /tmp -czf "$OUT/rollout.tar.gz" rollout
timeout 480 python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok --budget-s 470 --out "$OUT/defaults.json" \
  --work /tmp/b0 --plan qwen2.5-0.5b:256:grpo:40:3,qwen2.5-1.5b:1024:grpo:90:3,qwen2.5-1.5b:1024:trl:285:2 \
  > "$OUT/logs/bench.log" 2>&1
tail -c 2000 "$OUT/logs/bench.log"
