import json
import sys
from pathlib import Path

from safetensors import safe_open

w = Path(sys.argv[1])
for ck in sorted(w.glob("checkpoint-*")):
    print(ck.name, json.loads((ck / "trainer_state.json").read_text())["global_step"])
s = json.loads((w / "train_summary.json").read_text())
print("global_step", s["global_step"], "procs", s["num_processes"], "peak", s["peak_gpu_memory_gib"])
print("step_times", [round(e["step_time"], 2) for e in s["log_history"] if "step_time" in e])
base = safe_open(str(sys.argv[2]), "pt")
f = safe_open(str(w / "model.safetensors"), "pt")
keys = list(f.keys())
bad = [k for k in keys if tuple(f.get_slice(k).get_shape()) != tuple(base.get_slice(k).get_shape())]
print("tensors", len(keys), "of", len(list(base.keys())), "shape mismatches", bad[:3], "dtypes", {str(f.get_tensor(k).dtype) for k in keys})
moved = sum(int(not (f.get_tensor(k) == base.get_tensor(k)).all()) for k in keys)
print("tensors that moved", moved)
