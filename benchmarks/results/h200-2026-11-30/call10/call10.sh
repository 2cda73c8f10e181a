#!/bin/bash
# One GPU: the gpu tests on the committed code; LoRA with the offloading rule (off at 256 tokens) and forced on; the
# 1.5B/256 default (the rule turns offloading and the lean head on) beside the baseline.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"; rm -rf /tmp/b0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
timeout 120 python3 -m pytest -m gpu tests -q -p no:cacheprovider > "$OUT/logs/gpu-tests.log" 2>&1
tail -3 "$OUT/logs/gpu-tests.log"
timeout 330 python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok --budget-s 320 --out "$OUT/lora.json" \
  --work /tmp/b0 --plan qwen2.5-1.5b:256:grpo:55:3,qwen2.5-1.5b:256:trl:90:2,qwen2.5-0.5b:256:grpo-lora:45:3,qwen2.5-0.5b:256:grpo-lora-offload:45:3 \
  > "$OUT/logs/bench.log" 2>&1
tail -c 2000 "$OUT/logs/bench.log"
