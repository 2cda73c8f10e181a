"""How close `grpo check`'s predicted peak memory and step time come to what `benchmarks/grpo_bench.py` measured.

    python benchmarks/estimate_calibration.py FITTED.json ... [--held-out MORE.json ...] --out calibration.json

Reads every `grpo` configuration of the given results files that made at least one step after its warm-up, predicts
it from its shape and set-up with `grpo_cli.engine.estimate` for the card it ran on (the file's `machine.device`; an
H200 where it names none), and prints predicted against
measured: the peak (torch's `max_memory_allocated`) and the median step after the warm-up. The first files are the
runs the estimate's constants were fitted to; `--held-out` files are runs it did not see (a set-up that is also in
the fitted files is left out of them). Runs on the CPU in seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.grpo_bench import CONFIGS, SHAPES
from grpo_cli.engine.estimate import CARDS, GIB, LINEAR_NAMES, ModelShape, RunShape, estimate
from grpo_cli.engine.offload import layer_input_share
from grpo_cli.recipe.memory import card_of_device

GENERATIONS = 8  # grpo_bench.py's completions per prompt
PROMPTS = 16


def _config(shape: str):
    from transformers import Qwen2Config

    return Qwen2Config(**{"tie_word_embeddings": True, **SHAPES[shape]})  # as grpo_bench.py builds them


def run_shape(entry: dict) -> RunShape:
    """The set-up of one grpo_bench.py result entry, with the machine defaults its run had."""
    _, keys = CONFIGS[entry["config"]]
    overrides = {**keys, **(entry.get("overrides") or {})}
    lora = entry.get("lora") or {}
    calls = (entry.get("steps") or [{}])[-1].get("calls") or [{"batch": PROMPTS * GENERATIONS, "prompt_len": 147}]
    sharded = entry.get("accelerate") is not None
    resolved = entry.get("resolved") or {}  # the machine defaults the run resolved (newer results record them)
    offload = resolved.get("activation_offloading", overrides.get("activation_offloading"))
    if offload is None:  # the GPU default (grpo_cli.recipe.hardware.training_sets_the_peak)
        share = layer_input_share(_config(entry["shape"]), entry["micro_batch"], calls[0]["batch"])
        offload = not sharded and share >= (1.0 if lora else 0.5)
    targets = lora.get("target_modules")
    return RunShape(
        micro_batch=entry["micro_batch"],
        rollout_rows=calls[0]["batch"],
        prompt_tokens=calls[0]["prompt_len"],
        completion_tokens=entry["length"],
        lora_rank=lora.get("r", 0),
        lora_modules=LINEAR_NAMES if targets in (None, "all-linear") else tuple(targets),
        # grpo_bench.py's grpo side took TRL's ModelConfig default (0.05) before its adapters named their dropout
        lora_dropout=bool(lora.get("dropout", 0.05)),
        fused_lora=bool(resolved.get("fused_lora", overrides.get("fused_lora"))),
        gradient_checkpointing=overrides.get("gradient_checkpointing", True),
        activation_offloading=bool(offload),
        flash_attention=bool(resolved.get("flash_attention", overrides.get("flash_attention"))),
        packed_forward=bool(resolved.get("packed_forward", overrides.get("packed_forward"))),
        generations=GENERATIONS,
        zero_stage={"zero2": 2, "zero3": 3}.get(entry.get("accelerate"), 0),
        grpo_sampler=overrides.get("cache_implementation", "static") == "static",
        master_weights=bool(entry.get("master_weights")),  # absent: measured before full fine-tuning had them
    )


def card_of(data: dict):
    """The card a results file ran on, from its `machine.device` (the driver's name), else an H200."""
    return card_of_device(str((data.get("machine") or {}).get("device") or "")) or CARDS["H200"]


def _timed(entry: dict, warmup: int = 1) -> bool:
    """A grpo configuration with a step after its warm-up: done, or stopped at its cap after one."""
    if not isinstance(entry, dict) or entry.get("side") != "grpo" or not entry.get("summary"):
        return False
    return entry.get("status") == "done" or len(entry.get("steps") or []) > warmup


def _shown(path: str) -> str:
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else path


def rows_of(paths: list[str], held_out: list[str] = ()) -> list[dict]:
    fitted = _rows(paths)
    seen = {(row["shape"], row["run"], row["card"]) for row in fitted}
    rows = [{**row, "fitted": True} for row in fitted]
    rows += [{**row, "fitted": False} for row in _rows(held_out) if (row["shape"], row["run"], row["card"]) not in seen]
    for row in rows:
        del row["run"]
    return rows


def _rows(paths) -> list[dict]:
    found: dict = {}  # a later file's measurement of the same set-up replaces an earlier one's
    for path in sorted(paths):
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict):
            continue
        calls = [data] if data.get("results") else data.get("calls") or []
        for call, entry in ((c, e) for c in calls for e in c.get("results") or []):
            if not _timed(entry):
                continue
            if entry.get("shape") not in SHAPES or entry.get("config") not in CONFIGS:
                continue
            if any(word in entry["config"] for word in ("cudnn", "guard", "dynamic", "-cb", "no-liger")):
                continue  # switches the estimate does not model
            run = run_shape(entry)
            shape = ModelShape.of(_config(entry["shape"]))
            card = card_of(call)
            predicted = estimate(shape, run, card)
            summary = entry["summary"]
            found[(entry["shape"], run, card.name)] = (
                {
                    "file": _shown(path),
                    "card": card.name,
                    "run": run,
                    "shape": entry["shape"],
                    "tokens": entry["length"],
                    "config": entry["config"],
                    "micro_batch": run.micro_batch,
                    "offloading": run.activation_offloading,
                    "peak_gib": round(summary["peak_gib"], 2),
                    "predicted_peak_gib": round(predicted.peak / GIB, 2),
                    "peak_error": round(predicted.peak / GIB / summary["peak_gib"] - 1, 3),
                    "step_s": round(summary["step_s"], 2),
                    "predicted_step_s": round(predicted.step_s, 2),
                    "step_error": round(predicted.step_s / summary["step_s"] - 1, 3),
                }
            )
    return list(found.values())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="the runs the constants were fitted to")
    parser.add_argument("--held-out", nargs="*", default=[], help="runs the constants did not see")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    rows = rows_of(args.results, args.held_out)
    print(f"{'card':9} {'shape':14} {'tok':>5} {'config':18} {'mb':>3} off {'peak':>6} {'pred':>6} {'err':>6} {'step':>6} {'pred':>6} {'err':>6}")
    for fitted in (True, False):
        group = [r for r in rows if r["fitted"] == fitted]
        if not group:
            continue
        print("fitted:" if fitted else "held out:")
        for r in group:
            print(
                f"{r['card']:9} {r['shape']:14} {r['tokens']:>5} {r['config']:18} {r['micro_batch']:>3} {'y' if r['offloading'] else 'n':>3} "
                f"{r['peak_gib']:>6} {r['predicted_peak_gib']:>6} {r['peak_error']:>+6.1%} "
                f"{r['step_s']:>6} {r['predicted_step_s']:>6} {r['step_error']:>+6.1%}"
            )
        worst = max(abs(r["peak_error"]) for r in group), max(abs(r["step_error"]) for r in group)
        print(f"  {len(group)} configurations; largest error: peak {worst[0]:.1%}, step {worst[1]:.1%}")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
