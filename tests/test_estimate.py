"""The peak-memory and step-time prediction (`grpo check --gpu-memory`), from configs alone: hand-computed parts,
monotone in the keys that set the peak, and the plan's verdict and fixes through `grpo`'s entry point."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from grpo_cli.engine.estimate import CARDS, GIB, LINEAR_NAMES, ModelShape, RunShape, estimate

QWEN_7B = {  # config.json of Qwen2.5-7B-Instruct, the keys the estimate reads
    "model_type": "qwen2",
    "hidden_size": 3584,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}
QWEN_05B = {**QWEN_7B, "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True}
QWEN_3B = {**QWEN_7B, "hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16,
           "num_key_value_heads": 2, "intermediate_size": 11008, "vocab_size": 151936, "tie_word_embeddings": True}
RUN = RunShape(micro_batch=8, rollout_rows=64, prompt_tokens=200, completion_tokens=1024)


def test_parameters_match_the_released_models():
    """Qwen2.5-0.5B has 494,032,768 parameters and Qwen2.5-7B 7,615,616,512 (their model cards' safetensors)."""
    assert ModelShape.of(QWEN_05B).parameters() == 494_032_768
    assert ModelShape.of(QWEN_7B).parameters() == 7_615_616_512


def test_parts_are_the_hand_computed_sizes():
    shape = ModelShape.of(QWEN_05B)
    p = shape.parameters()
    full = estimate(shape, RUN)
    assert full.sampling["weights"] == 2 * p  # bf16
    assert full.sampling["optimizer state"] == 4 * p  # Adam's two moments in the weights' dtype
    assert full.training["gradients"] == 2 * p
    # KV cache: rows x layers x (keys + values) x kv heads x head size x 2 bytes x (prompt + completion)
    assert full.sampling["KV cache"] == 64 * 24 * 2 * 2 * 64 * 2 * (200 + 1024)
    lora = estimate(shape, replace(RUN, lora_rank=16))
    adapter = 24 * 16 * sum(a + b for a, b in shape.projection_sizes().values())  # r x (in + out), every linear
    assert lora.sampling["weights"] == 2 * p + 4 * adapter  # float32 adapters
    assert lora.sampling["optimizer state"] == 8 * adapter
    assert "gradients" not in lora.training or lora.training["gradients"] == 0
    zero3 = estimate(shape, replace(RUN, zero_stage=3, processes=4))
    assert zero3.sampling["weights"] == 2 * p // 4
    assert zero3.sampling["gathered weights"] >= 2 * p - 2 * p // 4  # the whole bf16 model while sampling


@pytest.mark.parametrize("config", [QWEN_05B, QWEN_7B])
def test_the_peak_grows_with_the_keys_that_set_it(config):
    shape = ModelShape.of(config)
    base = estimate(shape, RUN)
    for bigger, moment in (
        (replace(RUN, micro_batch=16), "training"),
        (replace(RUN, rollout_rows=128), "sampling"),
        (replace(RUN, completion_tokens=2048), "training"),
        (replace(RUN, completion_tokens=2048), "sampling"),
        (replace(RUN, weight_bytes=4), "training"),
        (replace(RUN, gradient_checkpointing=False), "training"),
    ):
        after = estimate(shape, bigger)
        assert sum(getattr(after, moment).values()) > sum(getattr(base, moment).values()), bigger
        assert after.peak >= base.peak
    for smaller in (
        replace(RUN, lora_rank=16, lora_modules=LINEAR_NAMES),
        replace(RUN, activation_offloading=True),
        replace(RUN, zero_stage=3, processes=8),
        replace(RUN, micro_batch=4),
    ):
        assert estimate(shape, smaller).peak < base.peak, smaller
    # step time: longer with more tokens, shorter on a faster card
    assert estimate(shape, RUN, CARDS["H200"]).step_s < estimate(shape, RUN, CARDS["A100-80GB"]).step_s
    longer = estimate(shape, replace(RUN, completion_tokens=2048), CARDS["H200"])
    assert longer.generation_s > estimate(shape, RUN, CARDS["H200"]).generation_s


FITTED = ["h200-2026-12-01/*.json", "h200-2026-12-02/*.json", "h200-2026-12-03/lora-folded.json",
          "h200-2026-12-03/zero2-and-7b-1024.json", "h100-2026-12-05/micro-batches-0.5b.json",
          "h100-2026-12-05/lora-3b-512-fused.json", "h100-2026-12-05/lora-3b-1024.json",
          "h100-2026-12-05/lora-7b-1024-pair.json", "h200-2026-12-05/lora-7b-512-equal.json",
          "h200-2026-12-05/lora-3b-512-fused-alone.json", "h100-2026-12-06/lora-7b-1024-flash-pair.json",
          "h100-2026-12-06/lora-3b-1024-flash-ab.json", "h100-2026-12-06/lora-*-packed.json",
          "h100-2026-12-06/lora-7b-512-pair.json"]
HELD_OUT = ["h200-2026-12-04/*.json", "h100-2026-12-06/*.json"]


def test_fused_lora_keeps_the_lora_layers_inputs_in_bf16():
    """At the 3B shape, 512 tokens, micro-batches of 16, LoRA dropout 0.05 (an H100,
    `h100-2026-12-05/lora-3b-512-fused.json`): PEFT's float32 copies of the LoRA layers' inputs made the
    forward/backward the step's peak, 10.34 GiB against the rollout's 9.79; with `fused_lora` the rollout's was."""
    shape = ModelShape.of(QWEN_3B)
    run = RunShape(micro_batch=16, rollout_rows=128, prompt_tokens=147, completion_tokens=512, lora_rank=16)
    peft, fused = estimate(shape, run), estimate(shape, replace(run, fused_lora=True))
    assert peft.peak_moment == "forward/backward" and fused.peak_moment == "sampling"
    assert peft.peak / GIB == pytest.approx(10.34, rel=0.05) and fused.peak / GIB == pytest.approx(9.79, rel=0.05)
    # one recomputed layer's LoRA inputs, q, k, v, o, gate, up (2048 each) and down (11008): PEFT's float32 copy,
    # dropout's float32 output and mask against the bf16 dropped input and its mask
    inputs = 6 * 2048 + 11008
    tokens = 16 * (147 + 512)
    assert sum(peft.training.values()) - sum(fused.training.values()) == tokens * inputs * (9 - 3)
    # without dropout the fused layers keep their bf16 input once for the projections that share it (q/k/v, gate/up)
    plain = replace(run, lora_dropout=False)
    saved = sum(estimate(shape, plain).training.values()) - sum(
        estimate(shape, replace(plain, fused_lora=True)).training.values()
    )
    assert saved == tokens * (4 * inputs - 2 * (3 * 2048 + 11008))


def test_fused_lora_without_dropout_shortens_the_forward_backward_as_measured():
    """On an H200 at 512 tokens in micro-batches of 16, PEFT's forward with dropout 0.05
    (`h200-2026-12-03/lora-folded.json`) against `fused_lora` without dropout
    (`h200-2026-12-05/lora-7b-512-equal.json`, `lora-3b-512-fused-alone.json`):
    the forward/backward took 6.03 -> 4.76 s at 3B and 9.43 -> 7.12 s at 7B."""
    run = RunShape(micro_batch=16, rollout_rows=128, prompt_tokens=147, completion_tokens=512, lora_rank=16)
    for config, measured in ((QWEN_3B, 4.76 / 6.03), (QWEN_7B, 7.12 / 9.43)):
        shape = ModelShape.of(config)
        peft = estimate(shape, run, CARDS["H200"])
        fused = estimate(shape, replace(run, fused_lora=True, lora_dropout=False), CARDS["H200"])
        assert fused.train_s / peft.train_s == pytest.approx(measured, abs=0.08)
        assert fused.generation_s == peft.generation_s


def test_flash_attention_shortens_the_forward_backward_as_measured():
    """On one H100 at 1024 tokens in micro-batches of 8, LoRA r16 on every linear layer without dropout, `fused_lora`
    (`h100-2026-12-06/lora-3b-1024-flash-ab.json`, `lora-7b-1024-flash-pair.json`): the forward/backward took
    9.01 -> 7.04 s at 3B and 14.73 -> 12.34 s at 7B with `flash_attention`, at the same peak."""
    run = RunShape(micro_batch=8, rollout_rows=128, prompt_tokens=147, completion_tokens=1024, lora_rank=16,
                   fused_lora=True, lora_dropout=False)  # fmt: skip
    for config, measured in ((QWEN_3B, 7.04 / 9.01), (QWEN_7B, 12.34 / 14.73)):
        shape = ModelShape.of(config)
        sdpa = estimate(shape, run, CARDS["H100-80GB"])
        flash = estimate(shape, replace(run, flash_attention=True), CARDS["H100-80GB"])
        assert flash.train_s / sdpa.train_s == pytest.approx(measured, abs=0.04)
        assert flash.generation_s == sdpa.generation_s and flash.peak == sdpa.peak


def test_packed_forward_changes_the_forward_backward_as_measured():
    """On one H100, LoRA r16 on every linear layer without dropout, `fused_lora`, `flash_attention`
    (`h100-2026-12-06/lora-*-packed.json`, `lora-7b-512-pair.json`): `packed_forward` took the forward/backward from
    6.76 to 5.86 s at 7B/512 in micro-batches of 16, 12.20 -> 11.67 s at 7B/1024 and 7.27 -> 7.52 s at 3B/1024 in
    micro-batches of 8; the peak and the rollout are the padded run's. Far from the measurements, at long completions
    and small models, the forward/backward the estimate predicts stays positive."""
    for config, tokens, micro, measured in ((QWEN_7B, 512, 16, 5.86 / 6.76), (QWEN_7B, 1024, 8, 11.67 / 12.20),
                                            (QWEN_3B, 1024, 8, 7.52 / 7.27)):  # fmt: skip
        run = RunShape(micro_batch=micro, rollout_rows=128, prompt_tokens=147, completion_tokens=tokens, lora_rank=16,
                       fused_lora=True, lora_dropout=False, flash_attention=True)  # fmt: skip
        shape = ModelShape.of(config)
        padded = estimate(shape, run, CARDS["H100-80GB"])
        packed = estimate(shape, replace(run, packed_forward=True), CARDS["H100-80GB"])
        assert packed.train_s / padded.train_s == pytest.approx(measured, abs=0.05), (tokens, micro)
        assert (packed.train_s < padded.train_s) is (measured < 1)
        assert packed.generation_s == padded.generation_s and packed.peak == padded.peak
    for config in (QWEN_05B, QWEN_7B):
        for tokens in (4096, 16384):
            long = RunShape(micro_batch=2, rollout_rows=64, prompt_tokens=256, completion_tokens=tokens,
                            flash_attention=True)  # fmt: skip
            assert estimate(ModelShape.of(config), long, CARDS["H200"]).train_s > 0
            assert estimate(ModelShape.of(config), replace(long, packed_forward=True), CARDS["H200"]).train_s > 0


def test_each_micro_batch_takes_at_least_the_launch_of_its_layers():
    """A small model's forward/backward in many small micro-batches is bound by launching their kernels: the same
    completions take longer in more micro-batches; a large model's is bound by its arithmetic, however it is split."""
    from grpo_cli.engine.estimate import TRAIN_LAUNCH_LAYER_S

    small, large = ModelShape.of(QWEN_05B), ModelShape.of(QWEN_7B)
    short = replace(RUN, completion_tokens=192, prompt_tokens=147)
    whole, split = (estimate(small, replace(short, micro_batch=m), CARDS["H100-80GB"]) for m in (64, 16))
    assert split.train_s > whole.train_s
    assert split.train_s == pytest.approx(4 * small.layers * TRAIN_LAUNCH_LAYER_S)  # 64 rows in four of 16
    assert estimate(large, replace(RUN, micro_batch=4), CARDS["H200"]).train_s == pytest.approx(
        estimate(large, replace(RUN, micro_batch=64), CARDS["H200"]).train_s
    )


def _results(patterns: list[str]) -> list[str]:
    from benchmarks.estimate_calibration import ROOT

    return sorted(str(p) for pattern in patterns for p in (ROOT / "benchmarks" / "results").glob(pattern))


def test_the_measured_h200_peaks_are_predicted_within_their_calibration():
    """The configurations `benchmarks/estimate_calibration.py` compares (their peaks as measured on an H200, with
    grpo_bench.py's set-up): full fine-tuning, LoRA, ZeRO-2 and ZeRO-3, 256 to 4096 tokens, offloading and the lean LM
    head on and off; those the constants were fitted to and those they were not."""
    from benchmarks.estimate_calibration import rows_of

    rows = rows_of(_results(FITTED), _results(HELD_OUT))
    assert {r["card"] for r in rows} == {"H200", "H100-80GB"}  # each predicted for the card it ran on
    held_out = [r for r in rows if not r["fitted"]]
    assert len(rows) >= 12 and len(held_out) >= 6, rows
    assert {r["tokens"] for r in held_out} >= {256, 1024, 2048, 4096}
    assert max(abs(r["peak_error"]) for r in rows) < 0.15, rows
    assert max(abs(r["step_error"]) for r in rows) < 0.30, rows


def test_the_verdicts_on_a_24_gib_card_agree_with_the_runs_there():
    """grpo_bench.py's runs on an H200 held to 24 GiB: each run the check says fits ran, each it says does not fit
    ran out of memory ("may not fit" may do either)."""
    from benchmarks.estimate_calibration import _config, run_shape
    from grpo_cli.recipe.memory import MemoryPlan, fit_limit, in_parts

    card = replace(CARDS["H200"], memory_gib=24.0)
    seen = {}
    for path in _results(["*/fit-24gib*.json"]):
        data = json.loads(Path(path).read_text())
        calls = [data, *(v for v in data.values() if isinstance(v, dict))]  # one call's JSON, or several by name
        for entry in (e for call in calls if call.get("memory_limit_gib") == 24 for e in call.get("results") or []):
            if entry.get("side") != "grpo" or entry["status"] not in ("done", "out of memory"):
                continue
            run = run_shape(entry)
            predicted, part_rows = in_parts(ModelShape.of(_config(entry["shape"])), run, card, fit_limit(card))
            verdict = MemoryPlan(card, run, predicted, part_rows=part_rows).verdict
            seen[(entry["shape"], entry["length"], entry["config"])] = (verdict, entry["status"])
    assert len(seen) >= 4, seen
    for what, (verdict, status) in seen.items():
        assert (verdict, status) not in (("fits", "out of memory"), ("does not fit", "done")), (what, verdict, status)
    assert {verdict for verdict, _ in seen.values()} == {"fits", "tight", "does not fit"}


def test_a_rollout_too_large_for_the_card_is_sampled_in_parts():
    """Where only the whole generation batch's cache is over the card, the plan samples it in parts of whole multiples
    of 8 completions under the limit, each part a whole decode; where the forward/backward is over, nothing changes."""
    from grpo_cli.recipe.memory import NO_FIT_SHARE, MemoryPlan, in_parts

    shape = ModelShape.of(QWEN_05B)
    card = replace(CARDS["H200"], memory_gib=24.0)
    run = replace(RUN, micro_batch=2, rollout_rows=512, completion_tokens=4096)
    whole = estimate(shape, run, card)
    limit = 20 * GIB
    assert sum(whole.sampling.values()) > limit >= sum(whole.training.values())
    parted, rows = in_parts(shape, run, card, limit)
    assert 8 <= rows < 512 and rows % 8 == 0 and sum(parted.sampling.values()) <= limit
    assert sum(estimate(shape, replace(run, rollout_rows=rows + 8), card).sampling.values()) > limit
    assert parted.training == whole.training and parted.generation_s > whole.generation_s
    plan = MemoryPlan(card, run, parted, part_rows=rows)
    assert plan.parts == -(-512 // rows) and plan.verdict == "fits"
    big = replace(run, micro_batch=64)
    assert in_parts(shape, big, card, limit) == (estimate(shape, big, card), 0)
    # the verdict's three bands
    for peak_share, verdict in ((0.9, "fits"), (1.0, "tight"), (NO_FIT_SHARE + 0.01, "does not fit")):
        at = estimate(shape, RUN, card)
        at.training = {"all": int(peak_share * 24 * GIB)}
        at.sampling = {}
        assert MemoryPlan(card, RUN, at).verdict == verdict, peak_share


def test_dropping_the_master_weights_is_offered_after_the_changes_that_keep_the_results():
    from grpo_cli.recipe.memory import candidate_fixes

    run = replace(RUN, master_weights=True)
    names = [what for what, _ in candidate_fixes(run)]
    [drop] = [i for i, what in enumerate(names) if what.startswith("master_weights: false")]
    assert drop > names.index("per_device_train_batch_size: 1 (gradient_accumulation_steps x8: the same completions per step)")
    assert drop > next(i for i, what in enumerate(names) if what.startswith("use_peft: true"))
    shape = ModelShape.of(QWEN_05B)
    saved = estimate(shape, run).peak - estimate(shape, candidate_fixes(run)[drop][1]).peak
    assert saved >= 8 * shape.parameters()  # the float32 copies and Adam's moments in float32
    assert not any(what.startswith("master_weights") for what, _ in candidate_fixes(RUN))


def grpo(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_cli", *args], cwd=cwd, capture_output=True, text=True, check=False,
                          timeout=120)


def local_model_recipe(folder: Path, config: dict, keys: str) -> None:
    """r.yaml in `folder` on a local model that is only its config.json (nothing loads), 8 completions a prompt."""
    model = folder / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen2ForCausalLM"]}))
    (folder / "r.yaml").write_text(f"model_name_or_path: {model}\ndtype: bfloat16\nnum_generations: 8\n{keys}")


def test_check_predicts_for_a_local_model_and_names_what_fits(tmp_path):
    """`grpo check --gpu-memory 24` on a recipe whose model is a local folder (config.json only: nothing loads):
    the parts, the peak, the verdict, and for a 7B model with full fine-tuning the change that fits it."""
    local_model_recipe(tmp_path, QWEN_7B, "per_device_train_batch_size: 8\nmax_completion_length: 1024\n")
    done = grpo("check", "-c", "r.yaml", "--gpu-memory", "24", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Predicted GPU memory per process" in done.stdout and "optimizer state" in done.stdout
    assert "does not fit" in done.stdout and "fits with use_peft: true" in done.stdout
    roomy = grpo("check", "-c", "r.yaml", "--gpu", "H200", cwd=tmp_path)
    assert "fits:" in roomy.stdout and "does not fit" not in roomy.stdout


def test_the_check_predicts_a_lora_run_with_the_gpu_default_of_fused_lora(tmp_path):
    """Checked on a machine without a GPU, a LoRA recipe is predicted as a GPU runs it: through `fused_lora`, unless
    the recipe turns it off or DeepSpeed runs it (its layers then run PEFT's forward), and with `flash_attention`
    unless the recipe turns it off."""
    from grpo_cli.recipe.hardware import Hardware
    from grpo_cli.recipe.load import load_recipe
    from grpo_cli.recipe.memory import run_shape

    local_model_recipe(tmp_path, QWEN_3B, "use_peft: true\noutput_dir: out\n")
    shape = ModelShape.of(QWEN_3B)

    def run(*overrides, accelerate=None):
        recipe = load_recipe(str(tmp_path / "r.yaml"), list(overrides), "rl", Hardware(gpu=False))
        return run_shape(recipe, 1, accelerate, shape)

    assert run().fused_lora and not run("--fused_lora", "false").fused_lora
    assert run().flash_attention and not run("--flash_attention", "false").flash_attention
    zero2 = {"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 2}}
    assert not run(accelerate=zero2).fused_lora
    assert estimate(shape, run()).peak < estimate(shape, run("--fused_lora", "false")).peak


def _offered(done: subprocess.CompletedProcess) -> tuple[str, float, float] | None:
    """The larger micro-batch `grpo check` names, its predicted step and the recipe's, or None."""
    assert done.returncode == 0, done.stderr
    step = float(re.search(r"^step: about ([\d.]+) s", done.stdout, re.MULTILINE).group(1))
    named = re.search(r"fits too with (per_device_train_batch_size: \d+, gradient_accumulation_steps: \d+): "
                      r"[\d.]+ GiB, a step about ([\d.]+) s", done.stdout)  # fmt: skip
    return (named.group(1), float(named.group(2)), step) if named else None


def test_a_run_that_fits_is_offered_the_micro_batch_that_makes_the_fastest_steps(tmp_path):
    """Fewer micro-batches make faster steps where launching kernels bounds them: for a recipe that fits, the check
    names the larger micro-batch (the accumulation divided alike) that fits too and is predicted to make the fastest
    steps (the smallest of those as fast), for a small model; none where the arithmetic sets the step's time (7B,
    padded: with `packed_forward`, its default there, each micro-batch's layout costs time, and fewer save it)."""
    from grpo_cli.recipe.memory import larger_micro_batches

    offered = larger_micro_batches({"gradient_accumulation_steps": 8}, RUN)
    assert [what for what, _ in offered] == [
        "per_device_train_batch_size: 64, gradient_accumulation_steps: 1",
        "per_device_train_batch_size: 32, gradient_accumulation_steps: 2",
        "per_device_train_batch_size: 16, gradient_accumulation_steps: 4",
    ]
    assert [run.micro_batch for _, run in offered] == [64, 32, 16] and {run.rollout_rows for _, run in offered} == {64}
    assert larger_micro_batches({"gradient_accumulation_steps": 1}, RUN) == []
    assert larger_micro_batches({"gradient_accumulation_steps": 8, "steps_per_generation": 16}, RUN) == []
    local_model_recipe(tmp_path, QWEN_05B, "use_peft: true\nper_device_train_batch_size: 4\n"
                       "gradient_accumulation_steps: 16\nmax_completion_length: 1024\n")  # fmt: skip
    roomy = _offered(grpo("check", "-c", "r.yaml", "--gpu-memory", "24", cwd=tmp_path))
    assert roomy is not None and roomy[1] < roomy[2], roomy
    tight = _offered(grpo("check", "-c", "r.yaml", "--gpu-memory", "3", cwd=tmp_path))
    assert tight is not None and tight[1] < tight[2], tight
    micro = {what: int(what.split(": ")[1].split(",")[0]) for what in (roomy[0], tight[0])}
    assert micro[tight[0]] < micro[roomy[0]]  # on a smaller card, a smaller one: the faster one fits no longer
    assert _offered(grpo("check", "-c", "r.yaml", "--gpu-memory", "24", "--per_device_train_batch_size", "64",
                         "--gradient_accumulation_steps", "1", cwd=tmp_path)) is None  # fmt: skip
    big = tmp_path / "big"
    big.mkdir()
    local_model_recipe(big, QWEN_7B, "use_peft: true\nper_device_train_batch_size: 8\ngradient_accumulation_steps: 16\n"
                       "max_completion_length: 1024\n")  # fmt: skip
    assert _offered(grpo("check", "-c", "big/r.yaml", "--gpu", "H200", "--packed_forward", "false", cwd=tmp_path)) is None
    packed = _offered(grpo("check", "-c", "big/r.yaml", "--gpu", "H200", cwd=tmp_path))
    assert packed is not None and packed[1] < packed[2], packed


def test_check_says_in_one_line_why_it_cannot_predict(tmp_path):
    (tmp_path / "r.yaml").write_text(f"model_name_or_path: {tmp_path}\n")  # a folder without config.json
    done = grpo("check", "-c", "r.yaml", "--gpu-memory", "24", cwd=tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    assert "memory: not predicted:" in done.stderr
    unknown = grpo("check", "-c", "r.yaml", "--gpu", "Z80", cwd=tmp_path)
    assert unknown.returncode == 2 and "--gpu Z80: not a card grpo knows" in unknown.stderr
    assert "Traceback" not in unknown.stderr


def test_the_runs_comparison_says_what_makes_the_measurement_differ():
    from grpo_cli.train.prediction import comparison_line, completion_share

    logs = [{"loss": 0.1}, {"completions/mean_length": 100.0}, {"completions/mean_length": 200.0}]
    assert completion_share(logs, 512) == 0.29 and completion_share([{"loss": 0.1}], 512) is None
    alone = {"predicted_peak_gib": 16.0, "measured_peak_gib": 12.0, "predicted_step_s": 4.0, "measured_step_s": 5.0,
             "completion_length_share": 0.95, "gpu_gib_held_elsewhere": 0.5}  # fmt: skip
    assert comparison_line(alone) == "prediction: peak 16.0 GiB, measured 12.0 GiB (-25%); step 4.0 s, measured 5.0 s (+25%)"
    shared = comparison_line({**alone, "completion_length_share": 0.29, "gpu_gib_held_elsewhere": 24.0})
    assert "completions averaged 29% of max_completion_length; the prediction assumes all of it" in shared
    assert "24.0 GiB of the GPU is held by other processes: the step time is not this run's alone" in shared
