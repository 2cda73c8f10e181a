#!/bin/bash
# Two GPUs. GPU 0: the rollout alone at 1.5B, the MLP's gate/up stacked (main) against not (unstacked-mlp), two
# interleaved rounds, then one profiled rollout with its idle-time summary. GPU 1: the same at 0.5B, then
# math-verify's batch of 128 distinct symbolic answers with the workers' pairs sent one at a time (before,
# pool-chunks.diff undone) and several to a message (after), interleaved, while GPU 0 runs; then the gpu tests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
R="python3 benchmarks/rollout_bench.py --timed 5"
mkdir -p "$OUT/logs" /tmp/rollout /tmp/before
cp -r grpo_cli /tmp/before/ && (cd /tmp/before && patch -p1 -R -s < "$OLDPWD/benchmarks/results/h200-x2-2026-11-30-c/call1/pool-chunks.diff") || exit 1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
lscpu | grep -i "model name" >> "$OUT/gpu.txt"
(
  export CUDA_VISIBLE_DEVICES=0
  for round in 1 2; do for v in main unstacked-mlp; do
    timeout 90 $R --shape qwen2.5-1.5b --variant $v --out /tmp/rollout/15b-$v-$round.json > /tmp/rollout/15b-$v-$round.log 2>&1
  done; done
  timeout 120 $R --shape qwen2.5-1.5b --variant main --timed 2 --profile /tmp/rollout/15b-main.profile.txt > /tmp/rollout/15b-profile.log 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1
  for round in 1 2; do for v in main unstacked-mlp; do
    timeout 90 $R --shape qwen2.5-0.5b --variant $v --out /tmp/rollout/05b-$v-$round.json > /tmp/rollout/05b-$v-$round.log 2>&1
  done; done
  S="import sys, json; sys.path.insert(0, 'benchmarks'); import grpo_bench; print(json.dumps(grpo_bench.reward_scoring(128, batches=8)))"
  for round in 1 2; do
    PYTHONPATH=/tmp/before:/tmp/site timeout 60 python3 -c "$S" > /tmp/rollout/pool-before-$round.json 2>/tmp/rollout/pool-before-$round.log
    timeout 60 python3 -c "$S" > /tmp/rollout/pool-after-$round.json 2>/tmp/rollout/pool-after-$round.log
  done
  GRPO_TEST_TOKENIZER=$PWD/.whl-bench/assets/tok timeout 150 python3 -m pytest -m gpu tests/ -q -p no:cacheprovider \
    > "$OUT/logs/gpu-tests.log" 2>&1
) &
wait
tail -3 "$OUT/logs/gpu-tests.log"; tail -qn1 /tmp/rollout/*.log | grep -v "^$"
for f in /tmp/rollout/pool-*.json; do echo "$f $(cat $f)"; done
grep -A 30 "^kernels:" /tmp/rollout/15b-main.profile.txt
tar -C /tmp -czf "$OUT/rollout.tar.gz" rollout
