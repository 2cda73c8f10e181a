#!/bin/bash
# Two GPUs, one benchmark per GPU. GPU 0: the rollout alone with liger's rotary kernel in place (now in rollout.py),
# the residual additions fused into the norms (main), without each (rope-copies, unfused-add-norm), twice over at
# 1.5B, once at 0.5B; the gpu tests. GPU 1: the 1.5B/256 and 0.5B/256 pairs beside their baselines, and 1.5B/256 grpo
# again.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B="python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok"
mkdir -p "$OUT/logs" /tmp/rollout; rm -rf /tmp/b0 /tmp/b1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
lscpu | grep -i "model name" >> "$OUT/gpu.txt"
(
  export CUDA_VISIBLE_DEVICES=0
  for round in 1 2; do
    for v in main rope-copies unfused-add-norm; do
      timeout 100 python3 benchmarks/rollout_bench.py --shape qwen2.5-1.5b --variant $v --timed 5 \
        --out /tmp/rollout/$v-$round.json > /tmp/rollout/$v-$round.log 2>&1
    done
  done
  for v in main rope-copies unfused-add-norm; do
    timeout 80 python3 benchmarks/rollout_bench.py --shape qwen2.5-0.5b --variant $v --timed 5 --out /tmp/rollout/05b-$v.json \
      > /tmp/rollout/05b-$v.log 2>&1
  done
  GRPO_TEST_TOKENIZER=$PWD/.whl-bench/assets/tok timeout 120 python3 -m pytest -m gpu tests/ -q -p no:cacheprovider \
    > "$OUT/logs/gpu-tests.log" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 420 $B --budget-s 410 --out "$OUT/gpu1.json" --work /tmp/b1 \
    --plan qwen2.5-1.5b:256:trl:90:2,qwen2.5-1.5b:256:grpo:55:3,qwen2.5-0.5b:256:trl:80:2,qwen2.5-0.5b:256:grpo:50:3,qwen2.5-1.5b:256:grpo:55:3 \
    > "$OUT/logs/gpu1.log" 2>&1
) &
wait
tail -3 "$OUT/logs/gpu-tests.log"; tail -qn1 /tmp/rollout/*.log
tail -c 2500 "$OUT/logs/gpu1.log"
tar -C /tmp -czf "$OUT/rollout.tar.gz" rollout
