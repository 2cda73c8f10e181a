#!/bin/bash
# One GPU: the q/k/v projections stacked into one matrix product, one decode graph per rollout with FlashAttention,
# and the lean LM head only where the head is a fifth or more of the weights (not at 1.5B). The gpu tests; the
# rollout alone at 1.5B with each decode change undone in turn; the 1.5B/256 defaults, the previous defaults
# (offloading with the lean head) and the baseline in one benchmark run.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs" /tmp/rollout; rm -rf /tmp/b0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
timeout 90 python3 -m pytest -m gpu tests/test_bench.py -q -p no:cacheprovider > "$OUT/logs/gpu-tests.log" 2>&1
tail -3 "$OUT/logs/gpu-tests.log"
for v in main unstacked sdpa; do
  timeout 60 python3 benchmarks/rollout_bench.py --shape qwen2.5-1.5b --variant $v --out /tmp/rollout/$v.json \
    > "$OUT/logs/rollout-$v.log" 2>&1; tail -1 "$OUT/logs/rollout-$v.log"
done
tar -C /tmp -czf "$OUT/rollout.tar.gz" rollout
timeout 330 python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok --budget-s 320 --out "$OUT/bench.json" \
  --work /tmp/b0 --plan qwen2.5-1.5b:256:grpo:55:3,qwen2.5-1.5b:256:grpo-offload-lean:55:3,qwen2.5-1.5b:256:trl:90:2 \
  > "$OUT/logs/bench.log" 2>&1
tail -c 3000 "$OUT/logs/bench.log"
