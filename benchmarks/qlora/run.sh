#!/usr/bin/env bash
# QLoRA on one GPU, as a user runs it: `grpo rl` with load_in_4bit for 2 steps (a checkpoint), the same command
# again with max_steps 3 (resumes), `grpo merge` into a bf16 model, then `grpo eval` of base, run folder (the
# adapter on the 4-bit base) and merged model. Every command's exit code and last lines go to $OUT/qlora.log.
#
#   bash benchmarks/qlora/run.sh      # from the repository root; needs .whl-bnb (wheels incl. bitsandbytes, and
#                                     # assets/tok: the tokenizer)
set -u -o pipefail
OUT=${OUT:-/tmp/qlora-out}
W=${QLORA_WORK:-/tmp/grpo-qlora}
WHL=${QLORA_WHEELS:-.whl-bnb}
mkdir -p "$OUT" && rm -rf "$W" && mkdir -p "$W"
exec > >(tee -a "$OUT/qlora.log") 2>&1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$WHL"/*.whl || { echo "pip install failed"; exit 1; }
export PYTHONPATH=$PWD:/tmp/site
python3 -c 'import bitsandbytes, torch; print("bitsandbytes", bitsandbytes.__version__, "torch", torch.__version__)'

python3 benchmarks/distributed/make_model.py "$WHL/assets/tok" "$W/model" --shape 0.5b 2>&1 | grep MODEL
step() {  # step NAME command...: run, time, and record the exit code
  local name=$1 t0=$SECONDS rc
  shift
  echo "=== $name: $*"
  "$@" > "$W/$name.log" 2>&1
  rc=$?
  tail -n 25 "$W/$name.log"
  echo "=== $name: exit $rc in $((SECONDS - t0)) s"
  echo "{\"name\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - t0))}" >> "$OUT/qlora-steps.jsonl"
}
R=(-c benchmarks/qlora/rl.yaml --model_name_or_path "$W/model" --output_dir "$W/run")
step rl python3 -m grpo_cli rl "${R[@]}"
step rl-resume python3 -m grpo_cli rl "${R[@]}" --max_steps 3
step merge python3 -m grpo_cli merge --adapter "$W/run" -o "$W/merged"
step eval python3 -m grpo_cli eval "${R[@]}" -m "$W/model" -m "$W/run" -m "$W/merged" --limit 8 \
  --max-new-tokens 16 -o "$W/eval" --dataset_test_size 8
python3 - "$W" <<'PY' > "$OUT/qlora-checks.json"
import json, sys
from pathlib import Path
w = Path(sys.argv[1])


def read(path, default):
    return json.loads(path.read_text()) if path.is_file() else default


summary = read(w / "run" / "train_summary.json", {})
adapter = read(w / "run" / "adapter_config.json", {})
merged = read(w / "merged" / "config.json", {})
print(json.dumps({
    "global_step": summary.get("global_step"),
    "peak_gpu_memory_gib": summary.get("peak_gpu_memory_gib"),
    "checkpoints": sorted(p.name for p in (w / "run").glob("checkpoint-*")),
    "adapter_r": adapter.get("r"),
    "adapter_files": sorted(p.name for p in (w / "run").iterdir() if p.name.startswith("adapter")),
    "merged_quantization_config": merged.get("quantization_config"),
    "merged_dtype": merged.get("dtype") or merged.get("torch_dtype"),
    "rollout_lines": sum(1 for _ in open(w / "run" / "rollouts.jsonl")) if (w / "run" / "rollouts.jsonl").is_file() else 0,
    "eval": read(w / "eval" / "summary.json", None),
}, indent=1))
PY
cat "$OUT/qlora-checks.json"
