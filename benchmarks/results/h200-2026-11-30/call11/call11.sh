#!/bin/bash
# One GPU: the rollout alone at 1.5B (128 rows, 256 new tokens) with its decode step compiled by torch.compile,
# beside the code as it is.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs" "$OUT/rollout"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
timeout 50 python3 benchmarks/rollout_bench.py --shape qwen2.5-1.5b --variant main --out "$OUT/rollout/main.json" \
  > "$OUT/logs/rollout-main.log" 2>&1; tail -1 "$OUT/logs/rollout-main.log"
timeout 270 python3 benchmarks/rollout_bench.py --shape qwen2.5-1.5b --variant compile --out "$OUT/rollout/compile.json" \
  > "$OUT/logs/rollout-compile.log" 2>&1; echo "rc=$?"; tail -5 "$OUT/logs/rollout-compile.log"
