#!/usr/bin/env bash
# R1-Zero Countdown: GRPO on every GPU of this machine with DeepSpeed ZeRO-3, logged to SwanLab and to a file.
#
#   scripts/train_countdown.sh [recipe overrides...]
#   NUM_GPUS=2 ACCELERATE_CONFIG=zero3_offload scripts/train_countdown.sh --max_steps 200   # two 24 GB cards
#
#   NUM_GPUS           GPUs to use (default: the GPUs in CUDA_VISIBLE_DEVICES, else nvidia-smi's)
#   ACCELERATE_CONFIG  accelerate config file, or a name under configs/accelerate/ (default: zero3)
#   RECIPE             recipe file or built-in name (default: countdown)
#   LOG_DIR            where the log file goes (default: logs); the log is also printed
#   SWANLAB_MODE       cloud (needs SWANLAB_API_KEY or `swanlab login`), local, offline or disabled
#   SWANLAB_PROJECT    passed as --swanlab_project and unset (swanlab 0.10 fails to start when it is set)
#   PYTHON             the Python that has grpo installed (default: python3 on PATH)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

count_gpus() {
  if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    local -a ids
    IFS=',' read -r -a ids <<<"$CUDA_VISIBLE_DEVICES"
    echo "${#ids[@]}"
  else
    nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true
  fi
}

num_gpus=${NUM_GPUS:-$(count_gpus)}
if ! [[ "$num_gpus" =~ ^[1-9][0-9]*$ ]]; then
  echo "train_countdown: no GPU found (NUM_GPUS=${num_gpus:-unset}) - set NUM_GPUS or check nvidia-smi" >&2
  exit 2
fi

config=${ACCELERATE_CONFIG:-zero3}
if [[ ! -f "$config" ]]; then
  config="$repo/configs/accelerate/${config%.yaml}.yaml"
fi
if [[ ! -f "$config" ]]; then
  echo "train_countdown: no accelerate config $config - see $repo/configs/accelerate/" >&2
  exit 2
fi

overrides=()
if [[ -n "${SWANLAB_MODE:-}" ]]; then
  overrides+=(--swanlab_mode "$SWANLAB_MODE")
fi
if [[ -n "${SWANLAB_PROJECT:-}" ]]; then
  overrides+=(--swanlab_project "$SWANLAB_PROJECT")
fi
unset SWANLAB_PROJECT SWANLAB_EXPERIMENT

log_dir=${LOG_DIR:-logs}
mkdir -p "$log_dir"
log="$log_dir/countdown-$(date +%Y%m%d-%H%M%S).log"

# grpo_cli.launch is `accelerate launch` that lets the ranks save on a stop signal and exits 128 + N after one.
cmd=("${PYTHON:-python3}" -m grpo_cli.launch
  --config_file "$config"
  --num_processes "$num_gpus"
  -m grpo_cli rl --config "${RECIPE:-countdown}" "${overrides[@]}" "$@")

echo "train_countdown: ${cmd[*]}" | tee "$log"
echo "train_countdown: log in $log" >&2
# pipefail: the script exits with the training's exit code, not tee's. tee ignores Ctrl-C and SIGTERM: it keeps
# logging while the ranks save their checkpoint, and ends when they do.
"${cmd[@]}" 2>&1 | (trap '' INT TERM; exec tee -a "$log")
