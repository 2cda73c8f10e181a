#!/bin/bash
# One GPU: the offloading gpu test, then where an offloaded 0.5B/256 step spends its time (torch.profiler, third step)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"; rm -rf /tmp/b0
timeout 60 python3 -m pytest -m gpu tests/test_offload.py -q -p no:cacheprovider > "$OUT/logs/gpu-tests.log" 2>&1
tail -3 "$OUT/logs/gpu-tests.log"
timeout 150 python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok --budget-s 140 --out "$OUT/profile.json" \
  --work /tmp/b0 --profile grpo-offload --plan qwen2.5-0.5b:256:grpo-offload:70:4 > "$OUT/logs/bench.log" 2>&1
tail -c 1200 "$OUT/logs/bench.log"; ls "$OUT"
