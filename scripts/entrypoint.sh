#!/usr/bin/env bash
# Container entry point: runs one grpo recipe described by environment variables, exits with its exit code.
#
#   GRPO_RECIPE             recipe file or built-in name (required), e.g. /data/my.yaml or countdown
#   GRPO_COMMAND            rl (default) or sft
#   GRPO_NUM_GPUS           processes to run (default: the GPUs in CUDA_VISIBLE_DEVICES, else nvidia-smi's, else 1)
#   GRPO_ACCELERATE_CONFIG  accelerate config file or shipped name (default: zero3 with 2+ GPUs, none with 1)
#   GRPO_OUTPUT_DIR         output_dir override (put it on a mounted volume)
#   GRPO_EXTRA_ARGS         more recipe overrides, split on spaces, e.g. "--max_steps 100 --learning_rate 1e-6"
#   SWANLAB_MODE            swanlab_mode override: cloud, local, offline or disabled
#   SWANLAB_PROJECT, SWANLAB_EXPERIMENT
#                           passed as --swanlab_project / --swanlab_experiment and unset: swanlab 0.10 fails to
#                           start when they are in the environment
#   SWANLAB_API_KEY         read by swanlab itself for cloud mode
#   GRPO_DRY_RUN=1          print the command instead of running it
# Arguments to this script are appended as further overrides.
#
# With 2+ processes grpo re-launches itself through `accelerate launch` and prints the exact command it runs.
set -euo pipefail

die() {
  echo "entrypoint: $*" >&2
  exit 2
}

count_gpus() {
  if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    local -a ids
    IFS=',' read -r -a ids <<<"$CUDA_VISIBLE_DEVICES"
    echo "${#ids[@]}"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    local n
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    echo "$((n > 0 ? n : 1))"
  else
    echo 1
  fi
}

recipe=${GRPO_RECIPE:-}
[[ -n "$recipe" ]] || die "GRPO_RECIPE is not set - give a recipe file or a built-in name (grpo recipes list)"

command=${GRPO_COMMAND:-rl}
[[ "$command" == rl || "$command" == sft ]] || die "GRPO_COMMAND=$command - use rl or sft"

num_gpus=${GRPO_NUM_GPUS:-$(count_gpus)}
[[ "$num_gpus" =~ ^[1-9][0-9]*$ ]] || die "GRPO_NUM_GPUS=$num_gpus - give a whole number of GPUs, 1 or more"

accelerate_config=${GRPO_ACCELERATE_CONFIG:-}
if [[ -z "$accelerate_config" && "$num_gpus" -gt 1 ]]; then
  accelerate_config=zero3
fi

args=("$command" --config "$recipe")
if [[ -n "$accelerate_config" ]]; then
  args+=(--num-processes "$num_gpus" --accelerate-config "$accelerate_config")
fi
if [[ -n "${GRPO_OUTPUT_DIR:-}" ]]; then
  args+=(--output_dir "$GRPO_OUTPUT_DIR")
fi
if [[ -n "${SWANLAB_MODE:-}" ]]; then
  args+=(--swanlab_mode "$SWANLAB_MODE")
fi
if [[ -n "${SWANLAB_PROJECT:-}" ]]; then
  args+=(--swanlab_project "$SWANLAB_PROJECT")
fi
if [[ -n "${SWANLAB_EXPERIMENT:-}" ]]; then
  args+=(--swanlab_experiment "$SWANLAB_EXPERIMENT")
fi
unset SWANLAB_PROJECT SWANLAB_EXPERIMENT

if [[ -n "${GRPO_EXTRA_ARGS:-}" ]]; then
  read -r -a extra <<<"$GRPO_EXTRA_ARGS"
  args+=("${extra[@]}")
fi
args+=("$@")

if [[ "${GRPO_DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' grpo "${args[@]}"
  echo
  exit 0
fi

echo "entrypoint: grpo ${args[*]}" >&2
# exec: grpo becomes this process, so `docker stop` (SIGTERM) reaches it and its exit code is the container's.
exec grpo "${args[@]}"
