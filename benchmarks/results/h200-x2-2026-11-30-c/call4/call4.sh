#!/bin/bash
# Two GPUs, one benchmark per GPU: all four shape/length pairs beside their baselines with the code as committed
# (math-verify on up to 32 workers); the rollout alone at 1.5B; the gpu tests; then math-verify's batch of 128 distinct
# symbolic answers with the default workers (32 here), alone on the host, two runs.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B="python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok"
mkdir -p "$OUT/logs" /tmp/rollout; rm -rf /tmp/b0 /tmp/b1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
lscpu | grep -i "model name" >> "$OUT/gpu.txt"
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 420 $B --budget-s 410 --out "$OUT/gpu0.json" --work /tmp/b0 \
    --plan qwen2.5-1.5b:256:trl:90:2,qwen2.5-1.5b:256:grpo:55:3,qwen2.5-0.5b:1024:trl:200:2,qwen2.5-0.5b:1024:grpo:80:3 \
    > "$OUT/logs/gpu0.log" 2>&1
  timeout 80 python3 benchmarks/rollout_bench.py --shape qwen2.5-1.5b --variant main --timed 5 --out /tmp/rollout/main.json \
    > /tmp/rollout/main.log 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 430 $B --budget-s 420 --out "$OUT/gpu1.json" --work /tmp/b1 \
    --plan qwen2.5-1.5b:1024:trl:240:2,qwen2.5-1.5b:1024:grpo:90:3,qwen2.5-0.5b:256:trl:80:2,qwen2.5-0.5b:256:grpo:50:3 \
    > "$OUT/logs/gpu1.log" 2>&1
  GRPO_TEST_TOKENIZER=$PWD/.whl-bench/assets/tok timeout 100 python3 -m pytest -m gpu tests/ -q -p no:cacheprovider \
    > "$OUT/logs/gpu-tests.log" 2>&1
) &
wait
S="import sys, json; sys.path.insert(0, 'benchmarks'); import grpo_bench; print(json.dumps(grpo_bench.reward_scoring(128, batches=%d)))"
for round in 1 2; do
  timeout 60 python3 -c "$(printf "$S" 8)" > /tmp/rollout/pool-default-$round.json 2>/tmp/rollout/pool-default-$round.log
done
tail -3 "$OUT/logs/gpu-tests.log"; tail -qn1 /tmp/rollout/*.log
for f in /tmp/rollout/pool-*.json; do echo "$f $(cat $f)"; done
tail -c 1500 "$OUT/logs/gpu0.log"; tail -c 1500 "$OUT/logs/gpu1.log"
tar -C /tmp -czf "$OUT/rollout.tar.gz" rollout
