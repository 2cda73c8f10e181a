#!/bin/bash
# Two GPUs: `grpo rl` under accelerate's DDP config with the offloading defaults (the distributed benchmark's recipe,
# 8 completions per GPU in one micro-batch: layer inputs 1.75x the rollout's cache at the 0.5B shape, so the rule
# turns offloading on), full fine-tuning then LoRA, 2 steps each.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT/logs"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
python3 -c "
import sys; sys.path.insert(0, 'benchmarks')
from pathlib import Path
from grpo_bench import build_model
print(build_model('qwen2.5-0.5b', Path('.whl-bench/assets/tok'), Path('/tmp/m'), 'cuda'))" > "$OUT/logs/model.log" 2>&1
for kind in full lora; do
  extra=(); [ $kind = lora ] && extra=(--use_peft true)
  timeout 150 python3 -m accelerate.commands.launch --config_file configs/accelerate/ddp.yaml --num_processes 2 \
    --main_process_port 29550 -m grpo_cli rl -c benchmarks/distributed/rl.yaml --model_name_or_path /tmp/m \
    --output_dir /tmp/o-$kind --max_steps 2 --save_steps 2 "${extra[@]}" > "$OUT/logs/ddp-$kind.log" 2>&1
  echo "$kind rc=$?"; grep -E "activation_offloading|lean_lm_head|Traceback|Error" "$OUT/logs/ddp-$kind.log" | head -6
  cp /tmp/o-$kind/train_summary.json "$OUT/train_summary-$kind.json" 2>/dev/null
done
