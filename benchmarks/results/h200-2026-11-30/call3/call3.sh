#!/bin/bash
# One GPU: the offloading gpu test, then layer-input offloading with the lean LM-head backward (the recipe split:
# 32 completions per micro-batch at 256 tokens, 8 at 1024) beside the baseline, both shapes.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B="python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok"
mkdir -p "$OUT/logs"; rm -rf /tmp/b0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
timeout 90 python3 -m pytest -m gpu tests/test_offload.py -q -p no:cacheprovider > "$OUT/logs/gpu-tests.log" 2>&1
tail -3 "$OUT/logs/gpu-tests.log"
timeout 490 $B --budget-s 480 --out "$OUT/offload.json" --work /tmp/b0 \
  --plan qwen2.5-0.5b:256:grpo-offload-lean:50:3,qwen2.5-0.5b:256:trl:80:2,qwen2.5-1.5b:256:grpo-offload-lean:60:3,qwen2.5-1.5b:256:trl:90:2,qwen2.5-0.5b:256:grpo-offload:50:3,qwen2.5-0.5b:1024:grpo-offload-lean:80:3,qwen2.5-1.5b:1024:grpo-offload-lean:90:3 \
  > "$OUT/logs/bench.log" 2>&1
tail -c 2500 "$OUT/logs/bench.log"
