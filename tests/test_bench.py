"""The GPU benchmarks' plumbing on CPU, on tiny random models (grpo's sampler itself: tests/test_rollout.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_train import tiny_run_keys

ROOT = Path(__file__).resolve().parent.parent


def test_benchmark_runs_baseline_and_grpo_side_by_side_on_cpu(tmp_path, demo_tokenizer_dir):
    import torch

    from benchmarks import grpo_bench

    out = tmp_path / "results.json"
    grpo_bench.main(
        ["--device", "cpu", "--tiny", "--plan", "tiny:4:trl:240:2,tiny:4:grpo:240:2", "--prompts", "2",
         "--generations", "2", "--reward-completions", "8", "--tokenizer", str(demo_tokenizer_dir),
         "--out", str(out), "--work", str(tmp_path / "work"), "--memory-limit-gib", "40"]
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert report["reward_scoring"]["completions"] == 8 and report["reward_scoring"]["dapo_answer_s"] > 0
    trl, grpo = report["results"]
    assert (trl["config"], grpo["config"]) == ("trl", "grpo")
    for result in (trl, grpo):
        assert result["status"] == "done", result.get("log_tail")
        assert len(result["steps"]) == 2 and result["summary"]["timed_steps"] == 1
        step = result["steps"][-1]
        assert step["completion_tokens"] <= 2 * 2 * 4 and step["calls"][0]["batch"] == 4  # same GRPO work
        assert 0 < step["generate_s"] < step["step_s"]
        assert result["summary"]["policy_s"] > 0
        # The policy time splits into TRL's bookkeeping, the micro-batches' forward/backward and the rest.
        assert step["prepare_s"] >= 0 and step["train_s"] > 0
        parts = step["generate_s"] + step["reward_s"] + step["prepare_s"] + step["train_s"]
        assert parts <= step["step_s"] * 1.001
        # Each step's reward metrics are kept; the worker leaves as the last step ends, before its log.
        assert [log["step"] for log in result["logs"]] == [1] and "reward" in result["logs"][0]
    assert (trl["micro_batch"], grpo["micro_batch"]) == (8, 32)  # TRL's default; grpo's recipes' split
    # The static-cache rollouts are a GPU lever: on the CPU both sides generate with TRL's own generate.
    assert trl["rollout"] == "trl generate"
    assert grpo["rollout"] == ("grpo static cache" if torch.cuda.is_available() else "trl generate")
    assert grpo["speedup"] == pytest.approx(trl["summary"]["step_s"] / grpo["summary"]["step_s"])
    assert report["memory_limit_gib"] == 40  # a smaller card, on a GPU only
    # grpo's side records the machine defaults it ran with, TRL's has none
    assert set(grpo["resolved"]) == set(grpo_bench.RESOLVED_KEYS) and "resolved" not in trl
    assert grpo["resolved"]["fused_lora"] is False  # full fine-tuning
    if not torch.cuda.is_available():  # none of the GPU levers on the CPU
        assert not any(grpo["resolved"].values()), grpo["resolved"]
    if torch.cuda.is_available():  # where each step's peak lies
        assert all(f"peak_{phase}_gib" in grpo["summary"] for phase in ("generate", "train", "other"))


def test_half_flat_rewards_leave_every_other_group_flat_and_grpo_skip_leaves_it_out(
    tmp_path, demo_tokenizer_dir, monkeypatch
):
    from benchmarks import grpo_bench
    from benchmarks.half_flat import half_flat

    prompts = ["a", "a", "a", "b", "b", "b", "c", "c", "c"]
    assert half_flat(prompts, [""] * 9) == [1.0, 1.0, 1.0, 0.0, 1.0, 2.0, 1.0, 1.0, 1.0]
    assert grpo_bench.baseline_of("grpo-lora16-fused-skip") == "trl-lora16"
    assert grpo_bench.baseline_of("grpo-lora16-mb8-no-liger") == "trl-lora16"
    assert grpo_bench.baseline_of("grpo-zero3-lora16") == "trl-zero3-lora16"
    assert grpo_bench.baseline_of("grpo-mb16-no-liger") == "trl"

    out = tmp_path / "results.json"
    monkeypatch.chdir(ROOT)  # the reward file's path is read from the working directory
    grpo_bench.main(
        ["--device", "cpu", "--tiny", "--plan", "tiny:4:grpo-skip:240:2", "--prompts", "4", "--generations", "2",
         "--reward-completions", "8", "--tokenizer", str(demo_tokenizer_dir), "--out", str(out),
         "--work", str(tmp_path / "work"), "--rewards", "benchmarks/half_flat.py:half_flat"]
    )  # fmt: skip
    report = json.loads(out.read_text())
    (result,) = report["results"]
    assert result["status"] == "done", result.get("log_tail")
    assert report["rewards"] == [f"{ROOT / 'benchmarks' / 'half_flat.py'}:half_flat"]
    (log,) = result["logs"]
    assert log["frac_reward_zero_std"] == 0.5 and log["frac_rows_skipped"] == 0.5


def test_grpo_config_splits_steps_as_the_r1_zero_countdown_settings_do():
    """About 8192 completion tokens a micro-batch (8 of 1024 tokens with the reproduction's overrides), 1 to 32."""
    from benchmarks.grpo_bench import recipe_micro_batch

    assert [recipe_micro_batch(n) for n in (64, 256, 512, 2048, 8192, 20000)] == [32, 32, 16, 4, 1, 1]


def test_a_speedup_needs_a_timed_step_on_both_sides():
    """A baseline cut short after its warm-up step has no step time to compare: no speedup, rather than one against
    a first step several times its next."""
    from benchmarks.grpo_bench import set_speedups

    def result(config, step_s, timed):
        return {"shape": "qwen2.5-7b", "length": 1024, "config": config,
                "summary": {"step_s": step_s, "timed_steps": timed}}  # fmt: skip

    timed = [result("trl-lora16", 60.0, 1), result("grpo-lora16", 30.0, 1)]
    set_speedups(timed)
    assert [r["speedup"] for r in timed] == [1.0, 2.0]
    warm_up_only = [result("trl-lora16", 166.0, 0), result("grpo-lora16", 32.0, 1), result("grpo", 9.0, 1)]
    set_speedups(warm_up_only)
    assert [r["speedup"] for r in warm_up_only] == [None, None, None]  # `grpo` has no baseline in the results


def test_a_plan_entry_that_cannot_run_or_would_time_no_step_stops_the_benchmark_before_it_starts(tmp_path, capsys):
    from benchmarks.grpo_bench import main, parse_plan

    assert parse_plan("qwen2.5-7b:1024:trl-lora16:240:2,smollm2-135m-instruct:192:grpo", 3, 1) == [
        ("qwen2.5-7b", 1024, "trl-lora16", 240.0, 2),
        ("smollm2-135m-instruct", 192, "grpo", 120.0, 3),
    ]
    for plan, why in [
        ("qwen2.5-7b:1024:trl-lora16:365:1", "1 step(s) with 1 warm-up step(s) times none - give it 2 or more"),
        ("qwen2.5-7b:1024:trl-lora", "no configuration trl-lora (one of trl, "),
        ("qwen2.5-9b:1024:trl", "no shape qwen2.5-9b (one of qwen2.5-0.5b, "),
        ("qwen2.5-7b:long:trl", "invalid literal for int()"),
        ("qwen2.5-7b:1024", "not shape:length:config[:cap_s[:steps]]"),
    ]:
        with pytest.raises(SystemExit) as stopped:
            main(["--plan", plan, "--out", str(tmp_path / "out.json"), "--work", str(tmp_path / "work")])
        assert stopped.value.code == 2
        assert f"--plan: {plan}: {why}" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "work").exists()
    # Unsloth's side is measured against TRL's with the same adapter, from a folder of its own packages
    from benchmarks.grpo_bench import baseline_of

    assert baseline_of("unsloth-lora16") == "trl-lora16"
    with pytest.raises(SystemExit) as stopped:
        main(["--plan", "qwen2.5-3b:512:unsloth-lora16", "--out", str(tmp_path / "out.json")])
    assert stopped.value.code == 2
    assert "unsloth-lora16: Unsloth is not installed here - --unsloth-site DIR names a folder" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_a_plan_entry_may_name_a_demo_model_with_its_pretrained_weights(demo_tokenizer_dir):
    from benchmarks.distributed.rewards import digit_share
    from benchmarks.grpo_bench import pretrained_model

    folder, sizes = pretrained_model("smollm2-135m-instruct", "cpu")
    config = json.loads((folder / "config.json").read_text())
    assert (sizes["layers"], sizes["kv_heads"]) == (config["num_hidden_layers"], config["num_key_value_heads"])
    assert 130e6 < sizes["parameters"] < 140e6 and sizes["weight_bytes"] == 4 * sizes["parameters"]
    # the curve's reward for it: the share of digits, plain or conversational completions
    assert digit_share(["a1b2", "", [{"role": "assistant", "content": "7"}]]) == [0.5, 0.0, 1.0]


def test_curve_stats_compares_the_two_sides_rewards():
    from benchmarks.curve_stats import curve_stats

    def side(name, rewards, std):
        return {"side": name, "logs": [{"reward": r, "reward_std": std} for r in rewards]}

    trl = [0.1 + 0.01 * i for i in range(10)]
    grpo = [r + (0.008 if i == 3 else 0.0) for i, r in enumerate(trl)]
    result = {"per_step": {"prompts": 2, "generations": 8}, "results": [side("trl", trl, 0.08), side("grpo", grpo, 0.08)]}
    report = curve_stats(result)
    assert report["steps"] == 10 and report["trl"]["slope_per_step"] == pytest.approx(0.01)
    assert report["trl"]["first_5"] == pytest.approx(0.12) and report["trl"]["last_5"] == pytest.approx(0.17)
    error = (2 * 0.08**2 / 16) ** 0.5  # one step's difference: two means of 16 completions
    assert report["median_standard_error"] == pytest.approx(error)
    assert report["largest_difference_in_standard_errors"] == pytest.approx(0.008 / error)
    assert report["mean_difference"] == pytest.approx(0.0008)
    assert report["mean_difference_in_standard_errors"] == pytest.approx(0.0008 / (error / 10**0.5))


def test_time_to_accuracy_clock_saves_at_each_mark_and_stops_at_the_budget(tmp_path, monkeypatch):
    import time

    from transformers import TrainerControl, TrainerState

    from benchmarks import time_to_accuracy

    record = tmp_path / "clock.json"
    clock = time_to_accuracy.clock_callback([0.5, 1.0], 2.0, record)
    state = TrainerState()

    def step(n: int, minutes: float) -> TrainerControl:
        monkeypatch.setattr(time_to_accuracy, "STARTED", time.time() - 60 * minutes - clock.paused)
        state.global_step = n
        control = TrainerControl()
        clock.on_step_end(None, state, control)
        if control.should_save:
            clock.on_save(None, state, control)
        return control

    assert not step(1, 0.2).should_save
    control = step(2, 1.2)  # both marks passed within one step: one checkpoint for both
    assert control.should_save and not control.should_training_stop
    clock.on_log(None, state, control, logs={"loss": float("nan"), "grad_norm": 1.0})
    control = step(3, 2.1)  # past the budget: the last checkpoint, then stop
    assert control.should_save and control.should_training_stop
    saved = json.loads(record.read_text())
    assert [(e["minutes"], e["checkpoint"]) for e in saved["marks"]] == [
        (0.5, "checkpoint-2"),
        (1.0, "checkpoint-2"),
        (2.0, "checkpoint-3"),
    ]
    assert saved["steps"] == 3 and saved["non_finite_steps"] == [2]
    assert all("started" not in e for e in saved["marks"])


def test_kernel_gaps_sums_the_idle_time_between_kernels():
    from benchmarks.rollout_bench import kernel_gaps

    def kernel(name, ts_ms, dur_ms):  # the trace's times are in microseconds
        return {"cat": "kernel", "name": name, "ts": 1000 * ts_ms, "dur": 1000 * dur_ms}

    trace = {
        "traceEvents": [
            kernel("gemm", 0, 10),
            {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 50},  # not a kernel
            kernel("norm", 14, 2),  # 4 ms after gemm
            kernel("rope", 15, 5),  # overlaps norm: no idle time, busy until 20
            kernel("gemm", 30, 10),  # 10 ms after rope
            kernel("norm", 44, 6),  # 4 ms after gemm again
        ]
    }
    lines = kernel_gaps(trace).splitlines()
    assert lines[0] == "kernels: 5; span 50.0 ms, kernels busy 32.0 ms, idle 18.0 ms"
    assert lines[2].split() == ["10.00", "1", "10000.00", "rope", "->", "gemm"]
    assert lines[3].split() == ["8.00", "2", "4000.00", "gemm", "->", "norm"]
    assert len(lines) == 4
    assert kernel_gaps({"traceEvents": []}) == "no kernel events in the trace"


def test_memory_trace_names_who_holds_the_peak_and_what_stays():
    from benchmarks.memory_trace import live_blocks, peak

    def frames(*sites):
        return [{"filename": f, "line": n, "name": "f"} for f, n in sites]

    torch_frame = ("/x/site-packages/torch/nn/modules/linear.py", 10)
    weights = frames(torch_frame, ("/x/site-packages/transformers/modeling_utils.py", 5))
    activation = frames(torch_frame, ("/x/site-packages/transformers/models/qwen2/modeling_qwen2.py", 7))
    cache = frames(("/repo/grpo_cli/train/rollout.py", 99))
    gib = 2**30
    trace = [
        {"action": "alloc", "addr": 1, "size": 2 * gib, "frames": weights},
        {"action": "alloc", "addr": 2, "size": gib, "frames": cache},
        {"action": "free_requested", "addr": 2, "size": gib, "frames": cache},
        {"action": "free_completed", "addr": 2, "size": gib, "frames": cache},
        {"action": "alloc", "addr": 3, "size": gib // 2, "frames": activation},
        {"action": "alloc", "addr": 4, "size": gib // 4, "frames": activation},
        {"action": "free_completed", "addr": 3, "size": gib // 2, "frames": activation},
    ]
    # From event 1 on, the peak is the cache's 3 GiB; from event 4 on, weights plus two activations, 2.75 GiB.
    assert peak(trace)["peak_gib"] == 3.0
    later = peak(trace, start=4)
    assert later["peak_gib"] == 2.75
    sites = {row["where"]: row for row in later["sites"]}
    assert sites["transformers/modeling_utils.py:5 f"]["gib"] == 2.0
    assert sites["transformers/models/qwen2/modeling_qwen2.py:7 f"] == {
        "where": "transformers/models/qwen2/modeling_qwen2.py:7 f",
        "gib": 0.75,
        "count": 2,
    }
    snapshot = {
        "segments": [
            {
                "blocks": [
                    {"state": "active_allocated", "size": gib, "frames": cache},
                    {"state": "inactive", "size": gib, "frames": weights},
                ]
            }
        ]
    }
    kept = live_blocks(snapshot)
    assert kept["allocated_gib"] == 1.0
    assert kept["sites"] == [{"where": "grpo_cli/train/rollout.py:99 f", "gib": 1.0, "count": 1}]


NAN_QUERY_GRADIENTS = """
import sys, torch
import torch.nn.functional as F

class NaNGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * torch.nan

sdpa = F.scaled_dot_product_attention
F.scaled_dot_product_attention = lambda q, k, v, *a, **kw: sdpa(NaNGradient.apply(q) if q.requires_grad else q, k, v, *a, **kw)
from grpo_cli.cli import main
sys.argv = ["grpo", *sys.argv[1:]]
main()
"""


def test_stabilitys_plain_run_replays_a_bad_step_and_names_the_attention_call(tmp_path, tiny_model_dir):
    """`stability.py --plain` as a plain run gets it (its sitecustomize), on a tiny run whose attention backward
    makes dQ NaN at every step: the guard stops the run after three bad steps, each replayed on the same batch, the
    probe names the top layer's call and its query gradient, the NaN comes back as run and with the rotary embedding
    in plain torch, and transformers' eager attention (no SDPA) gives finite gradients."""
    import os
    import subprocess
    import sys

    import torch

    from benchmarks import stability

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(stability._SITECUSTOMIZE)
    record = tmp_path / "run.jsonl"
    recipe = tmp_path / "rl.yaml"
    recipe.write_text(
        tiny_run_keys(tiny_model_dir, tmp_path / "out", max_steps=4, save_steps=10)
        + "reward_funcs: [countdown_format]\nnum_generations: 4\nmax_completion_length: 12\n"
        + "attn_implementation: sdpa\nuse_cpu: true\nbf16: false\nswanlab: false\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
        stability.STALL_FILE_ENV: str(tmp_path / "stall.txt"),
        stability.REPLAY_FILE_ENV: str(record),
    }
    command = [sys.executable, "-c", NAN_QUERY_GRADIENTS, "rl", "-c", str(recipe), "--no-resume", "--overwrite"]
    proc = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    replayed = [line for line in lines if "replays" in line]
    assert [line["step"] for line in replayed] == [1, 2, 3]
    for line in replayed:
        replays = line["replays"]
        probed = replays["as run, probed"]
        assert probed["gradients"] == line["gradients"]  # the same NaN again, on the same weights and batch
        attention = probed["attention"]
        assert attention["calls"] == 2 and attention["origin"] == 1  # the top layer's call, the first backward reaches
        assert attention["origin_flags"] == {"output": True, "query": False, "key": True, "value": True}
        assert attention["query_rows"][0] == [0, 0, 0] and "first_query_row_scores" in attention
        assert attention["alone"]["math"] == {"output_finite": True, "query": False, "key": True, "value": True}
        assert "model.layers.1.self_attn.k_proj.weight" in probed["finite_gradients"]
        assert replays["as run, again"]["gradients"] == line["gradients"]
        assert replays["reference rotary"]["gradients"] == line["gradients"]
        assert replays["attention eager"]["gradients"] is None and replays["attention eager"]["grad_norm"] is not None
    saved = torch.load(record.with_suffix(".attention.pt"), weights_only=False)
    assert saved["query"].shape[0] == 1 and saved["sequences"] == [0]


def test_lora_layers_times_pefts_forward_and_the_fused_one(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "lora-layers.json"
    command = [sys.executable, "benchmarks/lora_layers.py", "--shapes", "qwen2.5-0.5b", "--tokens", "32",
               "--repeats", "1", "--out", str(out)]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    result = json.loads(out.read_text())
    assert result["command"].startswith("python3 benchmarks/lora_layers.py --shapes qwen2.5-0.5b")
    (entry,) = result["results"]
    assert entry["shape"] == "qwen2.5-0.5b" and entry["tokens"] == 32
    assert entry["peft_s"] > 0 and entry["fused_s"] > 0 and entry["speedup"] > 0
    assert set(entry["peak_gib"]) == {"peft", "fused"}


def test_rollout_bench_lora_puts_a_foldable_adapter_on_every_projection():
    """`rollout_bench.py --lora R` times the decode steps with every projection's adapter folded in, as training samples
    them: each linear layer of each decoder layer carries one adapter the decode steps fold, without dropout."""
    import torch

    from benchmarks.grpo_bench import random_qwen2
    from benchmarks.rollout_bench import with_lora
    from grpo_cli.engine.estimate import LINEAR_NAMES
    from grpo_cli.engine.rollout import foldable_adapters

    model = with_lora(random_qwen2("tiny", "cpu", torch.float32), 4)
    assert not hasattr(model, "get_base_model") and not model.training  # what the sampler gets
    for layer in model.model.layers:
        projections = {**dict(layer.self_attn.named_children()), **dict(layer.mlp.named_children())}
        for name in LINEAR_NAMES:
            assert foldable_adapters(projections[name]) == ["default"], name
            assert projections[name].r["default"] == 4
            assert isinstance(projections[name].lora_dropout["default"], torch.nn.Identity)  # no dropout


def test_rollout_bench_bmm_attention_samples_what_the_sampler_does(monkeypatch):
    """`rollout_bench.py --variant bmm` times the decode attention as two batched matrix products: the same
    completions and log-probs as the sampler's own attention over a masked, left-padded cache (to float32 rounding)."""
    import torch

    from benchmarks.grpo_bench import random_qwen2
    from benchmarks.rollout_bench import bmm_attention
    from grpo_cli.engine import rollout

    model = random_qwen2("tiny", "cpu", torch.float32).eval()
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13]] * 2  # left padding, each prompt twice

    def sample():
        sampler = rollout.Sampler(rollout.EngineOptions(cuda_graphs=False, flash_decode=False))
        torch.manual_seed(0)
        return sampler.sample(model, prompts, 12, eos_token_ids=[0], pad_token_id=0)

    tokens, logprobs = sample()
    monkeypatch.setattr(rollout._Decoder, "_decode_attention", bmm_attention)
    bmm_tokens, bmm_logprobs = sample()
    assert bmm_tokens == tokens
    flat = [torch.tensor([p for row in rows for p in row]) for rows in (bmm_logprobs, logprobs)]
    assert torch.allclose(*flat, atol=1e-5)
