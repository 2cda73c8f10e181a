#!/bin/bash
# one device call: GPU0 the baseline's longest completion on 24 GiB; GPU1 memory diagnosis, then a learning curve
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bnb/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
B="python3 benchmarks/grpo_bench.py --tokenizer .whl-bnb/assets/tok"
mkdir -p "$OUT/logs"; rm -rf /tmp/b0 /tmp/b1 /tmp/b2
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 340 $B --memory-limit-gib 24 --budget-s 330 --out "$OUT/fit-trl4096.json" --work /tmp/b0 \
    --plan qwen2.5-1.5b:4096:trl:300:1 > "$OUT/logs/gpu0-4096.log" 2>&1
  if grep -q '"out of memory"' "$OUT/fit-trl4096.json"; then
    timeout 220 $B --memory-limit-gib 24 --budget-s 210 --out "$OUT/fit-trl3072.json" --work /tmp/b0 \
      --plan qwen2.5-1.5b:3072:trl:200:1 > "$OUT/logs/gpu0-3072.log" 2>&1
  fi
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 70 python3 probe_rollout_memory.py .whl-bnb/assets/tok > "$OUT/logs/probe.log" 2>&1
  timeout 250 $B --budget-s 240 --memory trl,grpo-mb8,grpo --out "$OUT/memory.json" --work /tmp/b1 \
    --plan qwen2.5-0.5b:256:trl:100:3,qwen2.5-0.5b:256:grpo-mb8:70:3,qwen2.5-0.5b:256:grpo:60:3 > "$OUT/logs/gpu1-memory.log" 2>&1
  timeout 220 $B --budget-s 210 --rewards benchmarks/distributed/rewards.py:vowel_share --learning-rate 1e-5 \
    --out "$OUT/curve.json" --work /tmp/b2 \
    --plan qwen2.5-0.5b:64:trl:140:20,qwen2.5-0.5b:64:grpo:70:20 > "$OUT/logs/gpu1-curve.log" 2>&1
) &
wait
tar czf "$OUT/logs.tgz" -C /tmp b0 b1 b2 --exclude='model-*' --exclude='*.safetensors' 2>/dev/null
ls -la "$OUT"
tail -5 "$OUT"/logs/*.log
