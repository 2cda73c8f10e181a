#!/bin/bash
# One GPU: 0.5B/1024, the baseline's steady step and grpo in the same call (the final code)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bnb/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
timeout 255 python3 benchmarks/grpo_bench.py --tokenizer .whl-bnb/assets/tok --budget-s 245 --out "$OUT/main1024.json" \
  --work /tmp/b0 --plan qwen2.5-0.5b:1024:grpo:60:3,qwen2.5-0.5b:1024:trl:175:2 > "$OUT/call4.log" 2>&1
tail -c 3000 "$OUT/call4.log"
