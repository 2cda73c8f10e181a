#!/usr/bin/env bash
# Held-out accuracy before and after MINUTES of `grpo rl` on the built-in recipes with a real model, through
# benchmarks/time_to_accuracy.py (checkpoints at half the budget and at its end, one `grpo eval` of them all):
#   gsm8k      the gsm8k recipe as shipped on reasoning-gym's gsm_symbolic (its rewards and format)
#   math       the dapo-math recipe's math-verify rewards on reasoning-gym's coin_flip (exact fractions), an instruct
#              model's own chat template, 8 prompts x 8 in one micro-batch, 512 tokens
#   countdown  the countdown recipe as shipped, on generated 3-4 number problems
#   r1-zero    the same problems with the R1-Zero reproduction's settings (docs/recipes.md, "countdown")
# Usage (from the repository root):
#   benchmarks/learning_runs.sh MODEL WORK [RUN ...]     RUN: gsm8k math countdown r1-zero (default: all, one by one)
#   TOGETHER=1 benchmarks/learning_runs.sh ...           all at once on one GPU (each gets a share of it)
# MINUTES (default 10) is each run's budget; each run writes WORK/<run>.json (the time_to_accuracy format) and its
# logs beside. The reasoning-gym rows are written first with `grpo data recipe` (needs grpo-cli[gym]); a machine
# without reasoning-gym can take the two files from one that has it (GYM_DATA=folder holding gsm.jsonl, coin.jsonl).
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,15p "$0"; exit 2; }
model=$1 work=$2; shift 2
runs=${*:-gsm8k math countdown r1-zero}
minutes=${MINUTES:-10}
name=${MODEL_NAME:-$(basename "$model")}
data=${GYM_DATA:-$work/data}
mkdir -p "$work" "$data"
tta=(python3 benchmarks/time_to_accuracy.py)

gsm8k=(use_cpu=false swanlab=false "dataset_name=$data/gsm.jsonl" dataset_generate=0 dataset_test_size=200)
math=(use_cpu=false swanlab=false chat_template= "dataset_name=$data/coin.jsonl" dataset_generate=0
      dataset_test_size=100 per_device_train_batch_size=64 gradient_accumulation_steps=1 max_completion_length=512)
countdown=(use_cpu=false swanlab=false dataset_generate=4000 dataset_test_size=200 save_only_model=true)
r1_zero=("${countdown[@]}" use_peft=false learning_rate=5e-7 lr_scheduler_type=cosine warmup_steps=0.03 beta=0.001
         num_generations=8 per_device_train_batch_size=8 max_completion_length=1024)

[ -f "$data/gsm.jsonl" ] || python3 -m grpo_cli data recipe -c gsm8k --dataset_generate 4000 -o "$data/gsm.jsonl"
[ -f "$data/coin.jsonl" ] || python3 -m grpo_cli data recipe -c dapo-math --dataset_generate 3000 \
  --dataset_generate_name coin_flip --dataset_generate_config '{max_trials: 20}' -o "$data/coin.jsonl"

one() {  # run: train for the budget (checkpoints at half of it and at its end), then score them
  local run=$1 recipe label steps=100000 keys
  case $run in
    gsm8k) recipe=gsm8k label="gsm8k recipe, reasoning-gym gsm_symbolic" keys=("${gsm8k[@]}") ;;
    math) recipe=dapo-math label="dapo-math recipe, reasoning-gym coin_flip (max_trials 20)" keys=("${math[@]}") ;;
    countdown) recipe=countdown label="countdown recipe as shipped, generated 3-4 numbers" keys=("${countdown[@]}") ;;
    r1-zero) recipe=countdown label="countdown recipe with the R1-Zero reproduction's settings" steps=450
      keys=("${r1_zero[@]}") ;;
    *) echo "unknown run '$run': gsm8k, math, countdown or r1-zero" >&2; return 2 ;;
  esac
  local half; half=$(python3 -c "print($minutes / 2)")
  "${tta[@]}" train --side grpo --recipe "$recipe" --model "$model" --minutes "$minutes" --marks "$half,$minutes" \
    --max-steps "$steps" --work "$work/$run" --set "${keys[@]}" > "$work/$run-train.log" 2>&1
  "${tta[@]}" eval --recipe "$recipe" --model "$model" --name "$name" --task "$label" --runs "$work/$run" \
    --limit 200 --batch-size 64 --eval-dir "$work/$run-eval" --out "$work/$run.json" --set "${keys[@]}" \
    > "$work/$run-eval.log" 2>&1
  tail -1 "$work/$run-eval.log"
}

for run in $runs; do
  if [ -n "${TOGETHER:-}" ]; then one "$run" & else one "$run"; fi
done
wait
