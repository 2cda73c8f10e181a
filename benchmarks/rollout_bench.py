"""Time grpo's rollout alone (`grpo_cli.engine.Sampler`) on one GPU, with variants of its decode
step, to find where a decode step's time goes. The GRPO benchmark (`grpo_bench.py`) times whole optimizer steps;
this times only the sampling, so small changes to it stand out.

    python benchmarks/rollout_bench.py --shape qwen2.5-1.5b --variant main --out main.json
    python benchmarks/rollout_bench.py --shape qwen2.5-1.5b --variant main --profile main.profile.txt

Variants (each in its own process, so one cannot leave state for the next):
  main            the code as it is
  sdpa            the decode attention through PyTorch's scaled_dot_product_attention with a mask for the left
                  padding (its own choice of kernel), instead of FlashAttention's variable-length kernel
  multinomial     each token drawn by torch.multinomial (which checks the probabilities first), not by its draw alone
  unstacked       the q/k/v projections as three matrix products, instead of one over their stacked weights
  sdpa-cudnn      ... through cuDNN's kernel
  sdpa-math       ... through the unfused reference path
  eager           no CUDA graphs: every kernel launched from Python
  compile         the decode step compiled by torch.compile (inductor's fused kernels), then captured as before;
                  the first rollout compiles it (its time is the warm-up's)
  compile-sampling  the sampling between decode steps (float32 softmax, the draw) compiled by torch.compile,
                  so inductor fuses its passes over the logits (its own random numbers: other tokens, same law)
  prefill-every-row  the prefill over every row, not once per distinct prompt
  logsoftmax-sampling  the probabilities as exp(log_softmax(float32 logits)): a float32 copy of the logits and
                  two more passes over them
  bmm             the decode attention as two batched matrix products and a softmax (each key/value head's
                  queries together, every key read once), over the cache in stretches of 256 as on the SDPA path
  bmm-64          ... in stretches of 64 (more graphs, fewer padding keys read)
  separate-gate-up  with --lora: the gate and up projections' updates each from its own product with A, instead of
                  one product with both A stacked

A random-weight model of a Qwen2.5 shape in bf16 with liger-kernel's layers (as `grpo rl` trains it on a GPU;
`--lora R`: with a LoRA adapter on every linear layer, folded into the decode steps), 128 rows of 120-147 prompt
tokens (left padding): 16 distinct prompts, each 8 times, as a GRPO step samples them (`--generations 1`: 128
distinct prompts, as this benchmark had until the prefill was shared), a fixed number of new tokens. Warm-up rollouts
first, then the median of the timed ones; each rollout allocates its cache and captures its graphs, as in training.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: the repository root, for grpo_cli and benchmarks
    sys.path.insert(0, str(HERE.parent))

from benchmarks.grpo_bench import SHAPES, random_qwen2  # the benchmark's model shapes and weights
from grpo_cli.atomic import write_text

VARIANTS = (
    "main",
    "multinomial",
    "unstacked",
    "sdpa",
    "sdpa-cudnn",
    "sdpa-math",
    "eager",
    "compile",
    "compile-sampling",
    "prefill-every-row",
    "logsoftmax-sampling",
    "bmm",
    "bmm-64",
    "separate-gate-up",
)


def random_model(shape: str):
    """The benchmark's random-weight model of `shape` in bf16 on the GPU, with liger-kernel's layers."""
    import torch
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    model = random_qwen2(shape, "cuda", torch.bfloat16)
    _apply_liger_kernel_to_instance(model=model)
    return model.eval()


def with_lora(model, rank: int):
    """`model` with a PEFT LoRA adapter of `rank` (alpha 2 x rank, no dropout) on every linear layer, as
    `grpo_bench.py`'s `LORA16` trains it, unwrapped as the sampler gets it in training: its LoRA layers in place, folded
    into the decode steps (`grpo_cli.engine.rollout._FoldedLoRA`)."""
    from peft import LoraConfig, get_peft_model

    from grpo_cli.engine.rollout import without_peft_wrapper

    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear")
    return without_peft_wrapper(get_peft_model(model, config)).eval()


def attention_backend(variant: str):
    """A context choosing the decode attention's kernel (entered around the whole rollout: graphs are captured
    inside it)."""
    if not variant.startswith("sdpa-"):
        return contextlib.nullcontext()  # "sdpa": PyTorch's own choice
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    return sdpa_kernel([backend[variant.removeprefix("sdpa-")]])


def bmm_attention(decoder, i: int, q, mask, kv_len: int):
    """The decode attention of layer i as two batched matrix products (the `bmm` variants): q [B, heads, 1, dim], the
    mask [B, 1, 1, kv_len] True where a row sees a key."""
    import torch

    batch, groups = q.shape[0], decoder.heads // decoder.kv_heads
    q = q.reshape(batch, decoder.kv_heads, groups, decoder.head_dim)
    keys, values = decoder.keys[i][:, :, :kv_len], decoder.values[i][:, :, :kv_len]
    scores = torch.matmul(q, keys.transpose(-1, -2))  # [B, kv heads, groups, keys]
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores.float() * decoder.scaling, dim=-1).to(values.dtype)
    return torch.matmul(probs, values).reshape(batch, decoder.heads, 1, decoder.head_dim)


def kernel_gaps(trace: dict, top: int = 25) -> str:
    """Where the GPU sat idle in a profiled rollout: its kernels' time against the span from the first to the last,
    and the idle time between two kernels summed by the pair of kernels around it (names cut to 60 characters)."""
    kernels = sorted(
        (e["ts"], e["ts"] + e["dur"], e["name"][:60])
        for e in trace.get("traceEvents", [])
        if e.get("cat") == "kernel" and "dur" in e
    )
    if not kernels:
        return "no kernel events in the trace"
    busy, gaps, end, previous = 0.0, {}, kernels[0][0], "(start)"
    for start, stop, name in kernels:
        if start > end:
            key = (previous, name)
            total, count = gaps.get(key, (0.0, 0))
            gaps[key] = (total + start - end, count + 1)
        busy += max(0.0, stop - max(start, end))
        end, previous = max(end, stop), name
    span = end - kernels[0][0]
    summary = f"kernels: {len(kernels)}; span {span / 1000:.1f} ms, kernels busy {busy / 1000:.1f} ms, "
    summary += f"idle {(span - busy) / 1000:.1f} ms"
    lines = [summary, f"{'idle ms':>9} {'count':>7} {'mean us':>8}  kernel before -> kernel after"]
    for (before, after), (total, count) in sorted(gaps.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{total / 1000:9.2f} {count:7d} {total / count:8.2f}  {before} -> {after}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-1.5b", choices=[s for s in SHAPES if s != "tiny"])
    parser.add_argument("--variant", default="main", choices=VARIANTS)
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--generations", type=int, default=8, help="rows per distinct prompt (GRPO's generations)")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--lora", type=int, default=0, help="rank of a LoRA adapter on every linear layer (0: none)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--timed", type=int, default=3)
    parser.add_argument("--profile", help="write torch.profiler's kernel table of one more rollout to this file")
    parser.add_argument("--out", help="JSON file for the timings")
    args = parser.parse_args()

    import torch

    from grpo_cli.engine import rollout

    # The engine's own options; the other variants swap one of its functions for the alternative timed.
    sampler = rollout.Sampler(
        rollout.EngineOptions(
            cuda_graphs=args.variant != "eager",
            flash_decode=not args.variant.startswith(("sdpa", "bmm")),
            shared_prefill=args.variant != "prefill-every-row",
        )
    )
    if args.variant == "multinomial":
        rollout._draw = lambda probs: torch.multinomial(probs, 1).squeeze(-1)
    if args.variant == "logsoftmax-sampling":
        rollout._token_probs = lambda logits, sampling: torch.log_softmax(logits.float(), dim=-1).exp()
    if args.variant == "unstacked":
        rollout._stacked_qkv = lambda attn: None
    if args.variant == "compile-sampling":
        rollout._token_probs = torch.compile(rollout._token_probs, dynamic=False)
        rollout._draw = torch.compile(rollout._draw, dynamic=False)
    if args.variant.startswith("bmm"):
        rollout._Decoder._decode_attention = bmm_attention
        if args.variant == "bmm-64":
            rollout.KV_STRETCH = 64
    if args.variant == "separate-gate-up":
        rollout._gate_up = rollout._separate_gate_up
    if args.variant == "compile":
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = 64  # one graph per cache stretch and per rollout's new buffers
        rollout._Decoder.step = torch.compile(rollout._Decoder.step, dynamic=False)
    model = random_model(args.shape)
    if args.lora:
        model = with_lora(model, args.lora)
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(120, 148, (args.rows // args.generations,), generator=generator).tolist()
    distinct = [torch.randint(0, 150000, (n,), generator=generator).tolist() for n in lengths]
    prompts = [p for p in distinct for _ in range(args.generations)]  # as TRL repeats each prompt

    def one_rollout() -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        with attention_backend(args.variant):
            sampler.sample(model, prompts, args.new_tokens, eos_token_ids=[151643], pad_token_id=151643)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    warmups = [one_rollout() for _ in range(args.warmup)]
    torch.cuda.reset_peak_memory_stats()
    timed = [one_rollout() for _ in range(args.timed)]
    median = statistics.median(timed)
    result = {
        "command": " ".join(["python", "benchmarks/rollout_bench.py", *sys.argv[1:]]),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": args.shape,
        "variant": args.variant,
        "lora_rank": args.lora,
        "rows": args.rows,
        "generations": args.generations,
        "prompt_tokens": [min(lengths), max(lengths)],
        "new_tokens": args.new_tokens,
        "warmup_s": warmups,
        "timed_s": timed,
        "median_s": median,
        "ms_per_decode_step": 1000 * median / args.new_tokens,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "graph_problems": [sampler.graphs_problem] if sampler.graphs_problem else [],
        "flash_decode": sampler.options.flash_decode
        and rollout._flash_decode_available(
            model.device, model.dtype, model.config.hidden_size // model.config.num_attention_heads
        ),
    }
    adapter = f" LoRA r{args.lora}" if args.lora else ""
    print(
        f"{args.shape}{adapter} {args.variant}: {median:.3f} s a rollout, "
        f"{result['ms_per_decode_step']:.2f} ms per decode step (timed {', '.join(f'{t:.3f}' for t in timed)}; warm-up {', '.join(f'{t:.3f}' for t in warmups)})"
    )
    if args.out:
        write_text(Path(args.out), json.dumps(result, indent=1) + "\n")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            one_rollout()
        averages = prof.key_averages()
        tables = [averages.table(sort_by="cuda_time_total", row_limit=45, max_name_column_width=90)]
        tables.append(averages.table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=90))
        trace = Path(args.profile).with_suffix(".trace.json")
        prof.export_chrome_trace(str(trace))
        tables.append(kernel_gaps(json.loads(trace.read_text())))
        trace.unlink()
        write_text(Path(args.profile), "\n\n".join(tables))


if __name__ == "__main__":
    main()
