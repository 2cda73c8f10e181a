"""Check one launch of the distributed benchmark and add it to the results JSON (rewritten whole after each launch).

  collect.py launch RESULTS NAME --phase first|resume --out DIR --log LOG --rc RC --seconds S --nproc N
                    --launcher zero3|ddp --kind lora|full --init MODEL_DIR --steps K
  collect.py merge RESULTS NAME --log LOG --rc RC --seconds S --merged DIR
  collect.py skip RESULTS NAME --why TEXT
  collect.py table RESULTS            (scaling rows and a Markdown table, printed and stored in the JSON)

Reads only what a run leaves behind (combined log, rollouts.jsonl, train_summary.json, checkpoints, weights),
so a failed or cut-short run still gets an entry that says what is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
from collections import Counter
from pathlib import Path

PER_DEVICE_BATCH = 8  # rl.yaml's per_device_train_batch_size
METRICS_LINE = re.compile(r"step\s+(\d+)/(\d+) \|")


def load(results: Path) -> dict:
    return json.loads(results.read_text()) if results.exists() else {"runs": {}}


def save(results: Path, data: dict) -> None:
    tmp = results.with_name(f".{results.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, results)


def log_checks(log: Path) -> dict:
    """One console: the plan printed once and each step's metrics line once, across all processes' output."""
    text = log.read_text(errors="replace") if log.exists() else ""
    steps = Counter(int(m.group(1)) for m in METRICS_LINE.finditer(text))
    errors = [line.strip()[:300] for line in text.splitlines() if re.search(r"Error|Traceback|error:", line)]
    return {
        "plan_lines": text.count("Plan: rl"),
        "metrics_lines_per_step": {str(k): v for k, v in sorted(steps.items())},
        "resumed": "resuming" in text,
        "error_lines": errors[-8:],
    }


def rollout_checks(out: Path) -> dict:
    """One rollouts file; rows per recorded step (the step counter before it is incremented, from 0)."""
    path = out / "rollouts.jsonl"
    if not path.exists():
        return {"rollouts_file": False}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    per_step = Counter(r["step"] for r in rows)
    return {
        "rollouts_file": True,
        "rollout_rows_per_step": {str(k): v for k, v in sorted(per_step.items())},
        "rollouts_elsewhere": sorted(
            str(p.relative_to(out)) for p in out.rglob("rollouts*.jsonl") if p != path
        ),
    }


def tensor_headers(folder: Path) -> dict[str, tuple[list[int], str]]:
    """name -> (shape, dtype) of every tensor in a folder's safetensors files, read from the headers only."""
    from safetensors import safe_open

    found = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                piece = f.get_slice(name)
                found[name] = (list(piece.get_shape()), piece.get_dtype())
    return found


def full_weights(folder: Path, init: Path, dtype: str, compare: bool) -> dict:
    """A full fine-tuned model folder: every tensor of the initial model, at full shape, in `dtype` (the trained
    precision: BF16 on the GPUs, F32 in the CPU check), and trained."""
    if not folder.is_dir():
        return {"present": False}
    start, saved = tensor_headers(init), tensor_headers(folder)
    report = {
        "present": bool(saved),
        "files": sorted(p.name for p in folder.glob("*.safetensors*")),
        "tensors": f"{sum(k in saved for k in start)}/{len(start)}",
        "missing": sorted(set(start) - set(saved))[:5],
        "bad_shape": [k for k in start if k in saved and saved[k][0] != start[k][0]][:5],
        "dtypes": sorted({d for _, d in saved.values()}),
    }
    report["ok"] = (
        bool(saved)
        and not report["missing"]
        and not report["bad_shape"]
        and report["dtypes"] == [dtype]
    )
    if compare and report["ok"]:
        import torch
        from safetensors import safe_open

        changed = 0
        opened = {}
        for file in sorted(init.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    opened[name] = f.get_tensor(name)
        for file in sorted(folder.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    if name in opened and not torch.equal(opened[name], f.get_tensor(name)):
                        changed += 1
        report["changed_vs_init"] = f"{changed}/{len(start)}"
        report["ok"] = changed > 0
    return report


def adapter_weights(folder: Path) -> dict:
    """A LoRA adapter folder: gathered tensors (none empty, as ZeRO-3 shards would be) and trained lora_B."""
    path = folder / "adapter_model.safetensors"
    if not path.exists():
        return {"present": False}
    from safetensors.torch import load_file

    adapter = load_file(str(path))
    empty = [k for k, v in adapter.items() if v.numel() == 0]
    nonzero_b = sum(int(v.abs().sum() > 0) for k, v in adapter.items() if "lora_B" in k)
    total_b = sum("lora_B" in k for k in adapter)
    return {
        "present": True,
        "tensors": len(adapter),
        "empty": empty[:5],
        "dtypes": sorted({str(v.dtype) for v in adapter.values()}),
        "lora_B_nonzero": f"{nonzero_b}/{total_b}",
        "ok": bool(adapter) and not empty and nonzero_b > 0,
    }


def step_times(log_history: list[dict]) -> dict[str, float]:
    """TRL's per-step step_time (generation + scoring + backward + optimizer step), by global step."""
    return {str(e["step"]): round(e["step_time"], 3) for e in log_history if "step_time" in e and "step" in e}


def launch(args) -> None:
    out, init = Path(args.out), Path(args.init)
    entry = {
        "phase": args.phase,
        "rc": args.rc,
        "seconds": args.seconds,
        "nproc": args.nproc,
        "launcher": args.launcher,
        "kind": args.kind,
        "expected_steps": args.steps,
        "log": Path(args.log).name,
    }
    entry.update(log_checks(Path(args.log)))
    entry.update(rollout_checks(out))
    summary_path = out / "train_summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    entry["global_step"] = summary.get("global_step")
    entry["num_processes"] = summary.get("num_processes")
    entry["peak_gpu_memory_gib"] = summary.get("peak_gpu_memory_gib")
    entry["step_time_s"] = step_times(summary.get("log_history", []))
    checkpoint = out / f"checkpoint-{args.steps}"
    state = checkpoint / "trainer_state.json"
    entry["checkpoint"] = checkpoint.name if state.exists() else None
    entry["checkpoint_global_step"] = json.loads(state.read_text())["global_step"] if state.exists() else None
    if args.kind == "full":
        entry["checkpoint_weights"] = full_weights(checkpoint, init, args.dtype, compare=False)
        entry["final_weights"] = full_weights(out, init, args.dtype, compare=args.rc == 0)
    else:
        entry["checkpoint_weights"] = adapter_weights(checkpoint)
        entry["final_weights"] = adapter_weights(out)
    entry["checkpoint_files"] = sorted(p.name for p in checkpoint.iterdir()) if checkpoint.is_dir() else []

    # The steps this launch ran: all of them on a first launch, the last one after a resume.
    ran = list(range(args.steps - 1, args.steps)) if args.phase == "resume" else list(range(args.steps))
    rows = entry.get("rollout_rows_per_step", {})
    metrics = entry["metrics_lines_per_step"]
    entry["checks"] = {
        "exit_0": args.rc == 0,
        "one_plan": entry["plan_lines"] == 1,
        "one_metrics_line_per_step": all(metrics.get(str(s + 1)) == 1 for s in ran)
        and len(metrics) == len(ran),
        "rollout_rows_per_step_eq_global_batch": all(
            rows.get(str(s)) == PER_DEVICE_BATCH * args.nproc for s in ran
        ),
        "one_rollouts_file": entry.get("rollouts_file") is True and not entry.get("rollouts_elsewhere"),
        "global_step": entry["global_step"] == args.steps and entry["checkpoint_global_step"] == args.steps,
        "num_processes": entry["num_processes"] == args.nproc,
        "resumed": entry["resumed"] == (args.phase == "resume"),
        "checkpoint_weights": bool(entry["checkpoint_weights"].get("ok")),
        "final_weights": bool(entry["final_weights"].get("ok")),
    }
    entry["ok"] = all(entry["checks"].values())
    update(args.results, args.name, entry)


def merge(args) -> None:
    merged = Path(args.merged)
    report = json.loads((merged / "merge.json").read_text()) if (merged / "merge.json").exists() else {}
    entry = {"phase": "merge", "rc": args.rc, "seconds": args.seconds, "log": Path(args.log).name}
    entry.update(
        {
            k: report.get(k)
            for k in (
                "changed_modules",
                "lora_modules",
                "max_logit_diff",
                "tolerance",
                "adapter_logit_effect",
                "same_top1",
                "files",
            )
        }
    )
    entry["ok"] = args.rc == 0 and bool(report)
    update(args.results, args.name, entry)


def skip(args) -> None:
    update(args.results, args.name, {"phase": "skipped", "why": args.why, "ok": False})


def update(results: str, name: str, entry: dict) -> None:
    path = Path(results)
    data = load(path)
    data["runs"][name] = entry
    save(path, data)
    if entry["phase"] == "skipped":
        print(f"RESULT {name}: skipped ({entry['why']})")
        return
    checks = entry.get("checks", {})
    failed = [k for k, v in checks.items() if not v]
    print(
        f"RESULT {name}: ok={entry['ok']} rc={entry.get('rc')} {entry.get('seconds', '-')}s "
        f"steps={entry.get('step_time_s', '')} peak={entry.get('peak_gpu_memory_gib', '')} failed={failed}"
    )


def warm_step_time(entry: dict) -> float | None:
    """Median step time of a first launch over its steps after step 1 (step 1 compiles kernels, warms NCCL)."""
    warm = [t for s, t in (entry.get("step_time_s") or {}).items() if int(s) > 1]
    return round(statistics.median(warm), 3) if warm else None


def table(args) -> None:
    path = Path(args.results)
    data = load(path)
    runs = data["runs"]
    rows = []
    for kind in ("lora", "full"):
        for name in (f"1gpu-zero3-{kind}", f"1gpu-plain-{kind}", f"2gpu-zero3-{kind}", f"2gpu-ddp-{kind}"):
            entry = runs.get(name)
            if not entry or entry.get("phase") == "skipped":
                continue
            # Two processes are measured against one process of the same launcher: DDP against one plain GPU.
            base = runs.get(f"1gpu-{'plain' if entry.get('launcher') == 'ddp' else 'zero3'}-{kind}")
            t = warm_step_time(entry)
            t1 = warm_step_time(base) if base else None
            nproc = entry.get("nproc", 1)
            rows.append(
                {
                    "run": name,
                    "kind": kind,
                    "launcher": entry.get("launcher"),
                    "processes": nproc,
                    "step_time_s": entry.get("step_time_s"),
                    "warm_step_time_s": t,
                    "completions_per_s": round(PER_DEVICE_BATCH * nproc / t, 2) if t else None,
                    "peak_gpu_memory_gib": entry.get("peak_gpu_memory_gib"),
                    "scaling_efficiency": round(t1 / t, 3) if (t and t1 and nproc == 2) else None,
                    "checks_ok": entry.get("ok"),
                }
            )
    data["table"] = rows
    lines = [
        "| run | processes | step 1 / 2 / 3 (s) | warm step (s) | completions/s | peak GiB per GPU | scaling eff. | checks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        times = r["step_time_s"] or {}
        per_step = " / ".join(f"{times[s]:.2f}" if s in times else "-" for s in ("1", "2", "3"))
        eff = f"{r['scaling_efficiency']:.2f}" if r["scaling_efficiency"] is not None else "-"
        peak = ", ".join(f"{x:.1f}" for x in r["peak_gpu_memory_gib"] or []) or "-"
        lines.append(
            f"| {r['run']} | {r['processes']} | {per_step} | {r['warm_step_time_s'] or '-'} | "
            f"{r['completions_per_s'] or '-'} | {peak} | {eff} | {'ok' if r['checks_ok'] else 'FAILED'} |"
        )
    data["table_markdown"] = "\n".join(lines)
    save(path, data)
    print(data["table_markdown"])


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("launch")
    p.add_argument("results")
    p.add_argument("name")
    p.add_argument("--phase", choices=["first", "resume"], required=True)
    for key in ("out", "log", "launcher", "kind", "init"):
        p.add_argument(f"--{key}", required=True)
    for key in ("rc", "seconds", "nproc", "steps"):
        p.add_argument(f"--{key}", type=int, required=True)
    p.add_argument("--dtype", default="BF16", help="the precision full fine-tuning saves (safetensors' name)")
    p.set_defaults(func=launch)
    p = sub.add_parser("merge")
    p.add_argument("results")
    p.add_argument("name")
    p.add_argument("--log", required=True)
    p.add_argument("--merged", required=True)
    p.add_argument("--rc", type=int, required=True)
    p.add_argument("--seconds", type=int, required=True)
    p.set_defaults(func=merge)
    p = sub.add_parser("skip")
    p.add_argument("results")
    p.add_argument("name")
    p.add_argument("--why", required=True)
    p.set_defaults(func=skip)
    p = sub.add_parser("table")
    p.add_argument("results")
    p.set_defaults(func=table)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
