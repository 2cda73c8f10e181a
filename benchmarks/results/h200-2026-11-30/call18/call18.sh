#!/bin/bash
# One GPU: call 17's 1.5B/256 rows again, on whichever host this call gets (the speedup depends on the host's CPU).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"; rm -rf /tmp/b0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
timeout 170 python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok --budget-s 160 --out "$OUT/bench.json" \
  --work /tmp/b0 --plan qwen2.5-1.5b:256:grpo:55:3,qwen2.5-1.5b:256:trl:90:2 \
  > "$OUT/logs/bench.log" 2>&1
tail -c 2500 "$OUT/logs/bench.log"
