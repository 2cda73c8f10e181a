#!/bin/bash
# Two GPUs, the rollout alone: FlashAttention's split-key kernel (keys in 2, 4, 8 parts) and the compiled sampling
# against main, 1.5B shape on GPU 0 and 0.5B on GPU 1; torch's FlashAttention entry as this host has it.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-bench/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs" /tmp/rollout
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"; nproc >> "$OUT/gpu.txt"
python3 -c "import torch; print(torch.__version__, torch.ops.aten._flash_attention_forward.default._schema)" >> "$OUT/gpu.txt"
for g in 0 1; do
  (
    export CUDA_VISIBLE_DEVICES=$g
    shape=$([ $g = 0 ] && echo qwen2.5-1.5b || echo qwen2.5-0.5b)
    n=0
    for v in main flash-splits-2 flash-splits-4 flash-splits-8 compile-sampling main; do
      n=$((n + 1))
      timeout 80 python3 benchmarks/rollout_bench.py --shape $shape --variant $v --timed 5 \
        --out /tmp/rollout/$shape-$n-$v.json >> /tmp/rollout/$shape.log 2>&1
    done
  ) &
done
wait
cat "$OUT/gpu.txt"; grep -h "a rollout\|Error" /tmp/rollout/*.log
tar -C /tmp -czf "$OUT/rollout.tar.gz" rollout
