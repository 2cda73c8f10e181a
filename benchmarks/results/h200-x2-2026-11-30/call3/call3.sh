#!/bin/bash
# Two GPUs. GPU 0: the gpu tests, then the rollout alone with three decode changes each undone in turn (residual
# additions inside the matrix products, probabilities by one softmax from the logits) or tried (FlashAttention
# with query heads as its heads), and a profile. GPU 1: both 256-token pairs and 1.5B/1024 with those changes.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B="python3 benchmarks/grpo_bench.py --tokenizer .whl-bench/assets/tok"
mkdir -p "$OUT/logs" /tmp/rollout; rm -rf /tmp/b1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
lscpu | grep -i "model name" >> "$OUT/gpu.txt"
(
  export CUDA_VISIBLE_DEVICES=0
  GRPO_TEST_TOKENIZER=$PWD/.whl-bench/assets/tok timeout 90 python3 -m pytest -m gpu tests/ -q -p no:cacheprovider \
    > "$OUT/logs/gpu-tests.log" 2>&1
  for v in main unfused-residual flash-heads logsoftmax-sampling; do
    timeout 80 python3 benchmarks/rollout_bench.py --shape qwen2.5-1.5b --variant $v --timed 5 \
      --out /tmp/rollout/$v.json > /tmp/rollout/$v.log 2>&1
  done
  for v in main flash-heads; do
    timeout 80 python3 benchmarks/rollout_bench.py --shape qwen2.5-0.5b --variant $v --timed 5 \
      --out /tmp/rollout/05b-$v.json > /tmp/rollout/05b-$v.log 2>&1
  done
  timeout 90 python3 benchmarks/rollout_bench.py --shape qwen2.5-1.5b --variant main --timed 2 \
    --profile /tmp/rollout/main.profile.txt > /tmp/rollout/profile.log 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 420 $B --budget-s 410 --out "$OUT/gpu1.json" --work /tmp/b1 \
    --plan qwen2.5-1.5b:256:trl:90:2,qwen2.5-1.5b:256:grpo:55:3,qwen2.5-0.5b:256:trl:80:2,qwen2.5-0.5b:256:grpo:50:3,qwen2.5-1.5b:1024:grpo:90:3 \
    > "$OUT/logs/gpu1.log" 2>&1
) &
wait
tail -3 "$OUT/logs/gpu-tests.log"; tail -qn1 /tmp/rollout/*.log
tail -c 2000 "$OUT/logs/gpu1.log"
tar -C /tmp -czf "$OUT/rollout.tar.gz" rollout
