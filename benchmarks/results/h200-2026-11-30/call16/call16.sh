#!/bin/bash
# One GPU: the q/k/v weights stacked after the prefill instead of before it (call 15's rollouts peaked 0.23 GiB
# higher at 1.5B/1024, in the prefill), and the draw without torch.multinomial's check. The gpu tests; the rollout
# alone at 1.5B with and without the check; the 1024-token defaults at both shapes, and the 0.5B/1024 baseline.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs" /tmp/rollout; rm -rf /tmp/b0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
timeout 90 python3 -m pytest -m gpu tests/test_bench.py -q -p no:cacheprovider > "$OUT/logs/gpu-tests.log" 2>&1
tail -3 "$OUT/logs/gpu-tests.log"
for v in main multinomial; do
  timeout 60 python3 benchmarks/rollout_bench.py --shape qwen2.5-1.5b --variant $v --out /tmp/rollout/$v.json \
    > "$OUT/logs/rollout-$v.log" 2>&1; tail -1 "$OUT/logs/rollout-$v.log"
done
tar -C /tmp -czf "$OUT/rollout.tar.gz" rollout
timeout 390 python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok --budget-s 380 --out "$OUT/bench.json" \
  --work /tmp/b0 --plan qwen2.5-1.5b:1024:grpo:90:3,qwen2.5-0.5b:1024:grpo:80:3,qwen2.5-0.5b:1024:trl:200:2 \
  > "$OUT/logs/bench.log" 2>&1
tail -c 3000 "$OUT/logs/bench.log"
