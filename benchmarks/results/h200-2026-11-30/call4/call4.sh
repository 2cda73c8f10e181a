#!/bin/bash
# One GPU: the offloading gpu test, then each memory lever on its own and together, same call, 0.5B/256
# (32 completions per micro-batch), then 1.5B/256 with and without offloading.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B="python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok"
mkdir -p "$OUT/logs"; rm -rf /tmp/b0
timeout 60 python3 -m pytest -m gpu tests/test_offload.py -q -p no:cacheprovider > "$OUT/logs/gpu-tests.log" 2>&1
tail -3 "$OUT/logs/gpu-tests.log"
timeout 310 $B --budget-s 300 --out "$OUT/levers.json" --work /tmp/b0 \
  --plan qwen2.5-0.5b:256:grpo:45:3,qwen2.5-0.5b:256:grpo-offload:45:3,qwen2.5-0.5b:256:grpo-lean:45:3,qwen2.5-0.5b:256:grpo-offload-lean:45:3,qwen2.5-1.5b:256:grpo:55:3,qwen2.5-1.5b:256:grpo-offload:55:3 \
  > "$OUT/logs/bench.log" 2>&1
tail -c 2000 "$OUT/logs/bench.log"
