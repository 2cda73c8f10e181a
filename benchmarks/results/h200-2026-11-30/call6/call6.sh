#!/bin/bash
# One GPU: offloading with pinned buffers kept for the run (call 5's profile: 30 cudaHostAlloc, 284 ms, and 30
# cudaFreeHost, 107 ms, in one offloaded step); the gpu test, then 0.5B/256 with and without offloading.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"; rm -rf /tmp/b0
timeout 45 python3 -m pytest -m gpu tests/test_offload.py -q -p no:cacheprovider > "$OUT/logs/gpu-tests.log" 2>&1
tail -3 "$OUT/logs/gpu-tests.log"
timeout 95 python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok --budget-s 90 --out "$OUT/offload.json" \
  --work /tmp/b0 --plan qwen2.5-0.5b:256:grpo-offload:45:3,qwen2.5-0.5b:256:grpo:40:3 > "$OUT/logs/bench.log" 2>&1
tail -c 1500 "$OUT/logs/bench.log"
