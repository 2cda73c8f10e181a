#!/bin/bash
# GPU0: 1.5B/1024: the baseline's steady step, grpo, grpo with TRL's LM-head backward
# GPU1: the gpu tests, then the 0.5B/1024 baseline's steady step
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bnb/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B="python3 benchmarks/grpo_bench.py --tokenizer .whl-bnb/assets/tok"
mkdir -p "$OUT/logs"; rm -rf /tmp/b0 /tmp/b1
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 560 $B --budget-s 550 --out "$OUT/main1024.json" --work /tmp/b0 \
    --plan qwen2.5-1.5b:1024:trl:240:2,qwen2.5-1.5b:1024:grpo:90:3,qwen2.5-1.5b:1024:grpo-trl-head:90:3 \
    > "$OUT/logs/gpu0.log" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1
  GRPO_TEST_TOKENIZER=$PWD/.whl-bnb/assets/tok timeout 150 python3 -m pytest -m gpu tests/ -q -p no:cacheprovider \
    > "$OUT/logs/gpu1-tests.log" 2>&1
  timeout 390 $B --budget-s 380 --out "$OUT/trl05b1024.json" --work /tmp/b1 \
    --plan qwen2.5-0.5b:1024:trl:330:2 > "$OUT/logs/gpu1-trl.log" 2>&1
) &
wait
tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$OUT/logs"
ls -la "$OUT"
