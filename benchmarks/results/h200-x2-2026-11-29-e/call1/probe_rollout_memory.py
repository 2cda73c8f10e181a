"""What a rollout leaves allocated on the GPU, call after call (diagnostic)."""
import sys, json, torch
sys.path.insert(0, "benchmarks")
import grpo_bench
from pathlib import Path
from grpo_cli.train import rollout
from transformers import AutoModelForCausalLM

tok = sys.argv[1]
grpo_bench.build_model("qwen2.5-0.5b", Path(tok), Path("/tmp/probe-model"), "cuda")
model = AutoModelForCausalLM.from_pretrained("/tmp/probe-model", dtype=torch.bfloat16).cuda().eval()
prompts = [[5 + (i % 50)] * (90 + i % 20) for i in range(128)]
MiB = 2**20
out = {}
def run(label, calls=3):
    rows = []
    for _ in range(calls):
        before = torch.cuda.memory_allocated()
        rollout.sample_completions(model, prompts, 256, [2], 0)
        torch.cuda.synchronize()
        rows.append(round((torch.cuda.memory_allocated() - before) / MiB, 1))
    out[label] = rows
    print(label, rows, flush=True)
base = torch.cuda.memory_allocated()
run("as is")
out["total_kept_mib"] = round((torch.cuda.memory_allocated() - base) / MiB, 1)
torch._C._cuda_clearCublasWorkspaces()
out["after_clear_cublas_mib"] = round((torch.cuda.memory_allocated() - base) / MiB, 1)
print(out, flush=True)
one = torch.cuda.Stream()
real = torch.cuda.Stream
torch.cuda.Stream = lambda *a, **k: one
base = torch.cuda.memory_allocated()
run("one side stream")
out["one_stream_kept_mib"] = round((torch.cuda.memory_allocated() - base) / MiB, 1)
print(json.dumps(out), flush=True)
