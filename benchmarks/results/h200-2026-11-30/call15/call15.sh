#!/bin/bash
# One GPU: the decode changes of calls 13 and 14 (FlashAttention's variable-length kernel, one decode graph per
# rollout, stacked q/k/v) and each token drawn without torch.multinomial's check, at 1024 tokens, where the rollout
# sets the peak: the gpu tests, then 1.5B/1024 beside the baseline and 0.5B/1024.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"; rm -rf /tmp/b0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
timeout 90 python3 -m pytest -m gpu tests/test_bench.py -q -p no:cacheprovider > "$OUT/logs/gpu-tests.log" 2>&1
tail -3 "$OUT/logs/gpu-tests.log"
timeout 470 python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok --budget-s 460 --out "$OUT/bench.json" \
  --work /tmp/b0 --plan qwen2.5-1.5b:1024:grpo:90:3,qwen2.5-1.5b:1024:trl:285:2,qwen2.5-0.5b:1024:grpo:80:3 \
  > "$OUT/logs/bench.log" 2>&1
tail -c 3000 "$OUT/logs/bench.log"
