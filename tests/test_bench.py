"""The GPU benchmark's plumbing on CPU, and the static-cache rollout it measures, on tiny random models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_train import tiny_run_keys

from grpo_cli.recipe import load_recipe

ROOT = Path(__file__).resolve().parent.parent


def tiny_model(kind: str, **extra):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM),
    }[kind]
    shape = {
        "vocab_size": 300,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
    }
    config = config_cls(**{**shape, **extra})
    torch.manual_seed(0)
    return model_cls(config).eval()


def teacher_forced_logprobs(
    model, prompt: list[int], completion: list[int], temperature: float
) -> list[float]:
    """Log-probs of the completion's tokens from one full forward pass of the model (transformers' own code)."""
    import torch

    with torch.no_grad():
        logits = (
            model(torch.tensor([prompt + completion], device=model.device)).logits[0, len(prompt) - 1 : -1].float()
            / temperature
        )
    chosen = torch.tensor(completion, device=model.device).unsqueeze(-1)
    return torch.log_softmax(logits, -1).gather(-1, chosen).squeeze(-1).tolist()


PROMPTS = [
    [5, 6, 7, 8, 9, 10, 11],
    [12, 13],
    [14, 15, 16],
    [1] * 9,
]  # unequal lengths: left padding is exercised


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_rollout_log_probs_match_the_models_own_forward(kind, monkeypatch):
    from grpo_cli.engine import rollout

    monkeypatch.setattr(rollout, "KV_STRETCH", 8)  # several cache stretches within 30 tokens
    model = tiny_model(kind)
    assert rollout.unsupported_reason(model) is None
    weight, bias, sizes = rollout._stacked_qkv(model.model.layers[0].self_attn)  # one matrix product for q, k, v
    assert sizes == [64, 32, 32] and weight.shape == (128, 64) and (bias is None) == (kind == "llama")
    completions, logprobs = rollout.sample_completions(
        model, PROMPTS, 30, eos_token_ids=[3], pad_token_id=0, sampling=rollout.Sampling(temperature=0.7)
    )
    assert len(completions) == len(PROMPTS)
    for prompt, completion, logp in zip(PROMPTS, completions, logprobs, strict=True):
        assert 1 <= len(completion) <= 30 and len(logp) == len(completion)
        assert 3 not in completion[:-1]  # a completion ends at its first EOS
        reference = teacher_forced_logprobs(model, prompt, completion, 0.7)
        assert max(abs(a - b) for a, b in zip(logp, reference, strict=True)) < 1e-4


def generate_completions(model, prompts: list[list[int]], seed: int) -> list[list[int]]:
    """transformers' sampling `generate` (TRL's own path) at temperature 0.9, each completion up to its first EOS."""
    import torch

    length = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (length - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (length - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(seed)
    with torch.no_grad():
        generated = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            max_new_tokens=20,
            temperature=0.9,
            top_k=0,
            top_p=1.0,
            eos_token_id=3,
            pad_token_id=0,
        )[:, length:].tolist()
    return [row[: row.index(3) + 1] if 3 in row else row for row in generated]


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_rollout_draws_the_tokens_transformers_generate_draws_from_the_same_seed(kind):
    """Same probabilities, same random state, same torch.multinomial: on the CPU, grpo's rollout and transformers'
    sampling `generate` (TRL's own path) give the same completions, so GRPO runs on either follow one trajectory."""
    import torch

    from grpo_cli.engine import rollout

    model = tiny_model(kind)
    torch.manual_seed(11)
    ours, _ = rollout.sample_completions(
        model, PROMPTS, 20, eos_token_ids=[3], pad_token_id=0, sampling=rollout.Sampling(temperature=0.9)
    )
    assert ours == generate_completions(model, PROMPTS, 11)
    assert len({tuple(c) for c in ours}) == len(ours)  # really sampled: the prompts' completions differ


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_rollout_prefills_each_distinct_prompt_once(kind):
    """GRPO samples several completions per prompt: the prefill runs on the distinct prompts only, and every row's
    cache gets its prompt's keys and values. The completions are still `generate`'s from the same seed, each drawn
    on its own, with the model's own log-probs."""
    import torch

    from grpo_cli.engine import rollout

    model = tiny_model(kind)
    prompts = [p for p in PROMPTS for _ in range(3)]  # as TRL repeats each prompt num_generations times
    batches = []
    hook = model.model.embed_tokens.register_forward_hook(lambda module, args, out: batches.append(args[0].shape))
    torch.manual_seed(11)
    ours, logprobs = rollout.sample_completions(
        model, prompts, 20, eos_token_ids=[3], pad_token_id=0, sampling=rollout.Sampling(temperature=0.9)
    )
    hook.remove()
    assert batches[0] == (len(PROMPTS), max(len(p) for p in PROMPTS))  # the prefill: one row per distinct prompt
    assert all(shape == (len(prompts), 1) for shape in batches[1:])  # the decode steps: every completion
    assert ours == generate_completions(model, prompts, 11)
    assert len({tuple(c) for c in ours}) == len(ours)  # a prompt's completions are drawn each on its own
    for prompt, completion, logp in zip(prompts, ours, logprobs, strict=True):
        reference = teacher_forced_logprobs(model, prompt, completion, 0.9)
        assert max(abs(a - b) for a, b in zip(logp, reference, strict=True)) < 1e-4


def test_rollout_tokenizes_each_distinct_prompt_once(tmp_path, tiny_grpo_trainer):
    """TRL's chat template renders each distinct prompt once; every row gets its prompt's tokens, as TRL's own
    tokenization of all rows gives them."""
    from grpo_cli.train.rollout_func import _tokenize_distinct

    trainer = tiny_grpo_trainer(tmp_path, [lambda completions, **kw: [0.0] * len(completions)])
    prompts = [[{"role": "user", "content": word}] for word in ("Say a word.", "Count to three.") for _ in range(3)]
    rendered = []
    tokenize = trainer._tokenize_prompts
    trainer._tokenize_prompts = lambda rows: rendered.append(len(rows)) or tokenize(rows)
    ids, images, fields = _tokenize_distinct(prompts, trainer)
    assert rendered == [2] and images is None and not fields
    assert ids == tokenize(prompts)[0] and ids[0] != ids[3]
    ids[0].append(-1)  # each row's list is its own
    assert ids[1] != ids[0]


@pytest.mark.parametrize("targets", [["q_proj", "v_proj", "down_proj"], "all-linear"])
def test_rollout_applies_lora_layers(targets):
    """GRPO with LoRA samples from base + adapter: the decode steps fold each adapter's update (merged into the
    stacked q/k/v copy, three kernels for the other projections), and the log-probs are PEFT's own forward's. Adapter
    dropout is not applied while sampling, even with the model in training mode (it is back on after)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from grpo_cli.engine import rollout

    model = get_peft_model(
        tiny_model("qwen2"), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5, target_modules=targets)
    )
    with torch.no_grad():  # a trained adapter: B is no longer zero, so the adapter changes the logits
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    model.train()  # as during training: dropout modules active
    inner = model.get_base_model()  # what the rollout gets from the trainer (LoRA layers stay in place)
    attn = inner.model.layers[0].self_attn
    weight, _, sizes = rollout._stacked_qkv(attn)
    assert sizes == [64, 32, 32]
    delta = attn.q_proj.lora_B["default"].weight @ attn.q_proj.lora_A["default"].weight * 2.0
    assert torch.allclose(weight[:64], attn.q_proj.base_layer.weight + delta, atol=1e-6)  # q's update merged
    assert rollout.stacked_qkv_bytes(inner) == 2 * (weight.nbytes + 128 * 4)  # two layers, with q/k/v biases
    folded = rollout._folded_linears(inner.model.layers[0])
    assert isinstance(folded[3], rollout._FoldedLoRA)  # down_proj
    completions, logprobs = rollout.sample_completions(
        inner, PROMPTS, 16, eos_token_ids=[3], pad_token_id=0, sampling=rollout.Sampling(temperature=1.0)
    )
    assert model.training and attn.q_proj.lora_dropout["default"].training  # as the trainer left it
    model.eval()
    for prompt, completion, logp in zip(PROMPTS, completions, logprobs, strict=True):
        with_adapter = teacher_forced_logprobs(model, prompt, completion, 1.0)
        assert max(abs(a - b) for a, b in zip(logp, with_adapter, strict=True)) < 1e-4
        with model.disable_adapter():
            without = teacher_forced_logprobs(model, prompt, completion, 1.0)
        assert max(abs(a - b) for a, b in zip(logp, without, strict=True)) > 1e-3


def test_rollout_leaves_unfoldable_lora_layers_to_peft():
    """A LoRA layer the decode steps cannot fold (DoRA's magnitude vector) runs as PEFT's module, with the same
    log-probs as PEFT's forward."""
    import torch
    from peft import LoraConfig, get_peft_model

    from grpo_cli.engine import rollout

    model = get_peft_model(tiny_model("llama"), LoraConfig(r=4, use_dora=True, target_modules=["q_proj", "o_proj"]))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    model.eval()
    inner = model.get_base_model()
    assert rollout._stacked_qkv(inner.model.layers[0].self_attn) is None
    assert rollout._folded_linears(inner.model.layers[0]) is None
    completions, logprobs = rollout.sample_completions(
        inner, PROMPTS, 12, eos_token_ids=[3], pad_token_id=0, sampling=rollout.Sampling(temperature=1.0)
    )
    for prompt, completion, logp in zip(PROMPTS, completions, logprobs, strict=True):
        reference = teacher_forced_logprobs(model, prompt, completion, 1.0)
        assert max(abs(a - b) for a, b in zip(logp, reference, strict=True)) < 1e-4


def test_rollout_ends_at_eos_and_top_k_one_is_greedy():
    import torch

    from grpo_cli.engine.rollout import Sampling, sample_completions

    model = tiny_model("qwen2")
    greedy, _ = sample_completions(
        model, PROMPTS, 12, eos_token_ids=[3], pad_token_id=0, sampling=Sampling(top_k=1)
    )
    for prompt, completion in zip(PROMPTS, greedy, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
        assert completion == logits.argmax(-1).tolist()
    # With one of row 0's greedy tokens as EOS, every greedy completion stops at its first occurrence, kept.
    eos = greedy[0][2]
    ended, _ = sample_completions(
        model, PROMPTS, 12, eos_token_ids=[eos], pad_token_id=0, sampling=Sampling(top_k=1)
    )
    assert ended == [c[: c.index(eos) + 1] if eos in c else c for c in greedy]
    assert len(ended[0]) <= 3


def test_rollout_in_parts_samples_what_one_batch_samples():
    """A generation batch too large for the GPU's free memory is sampled in parts: greedy (top-k 1), so the parts
    must give token for token what one batch gives, left padding included."""
    from grpo_cli.engine.rollout import Sampling, sample_completions

    model = tiny_model("llama")
    prompts = PROMPTS + [p[::-1] for p in PROMPTS] + [[20, 21, 22, 23]]  # 9 prompts: parts of 4, 4 and 1
    whole = sample_completions(
        model, prompts, 10, eos_token_ids=[3], pad_token_id=0, sampling=Sampling(top_k=1)
    )
    parts = sample_completions(
        model, prompts, 10, eos_token_ids=[3], pad_token_id=0, sampling=Sampling(top_k=1), max_rows=4
    )
    assert parts[0] == whole[0] and len(parts[0]) == 9
    assert max(abs(a - b) for x, y in zip(parts[1], whole[1]) for a, b in zip(x, y)) < 1e-5
    assert len({tuple(c) for c in whole[0]}) > 1  # the prompts lead to different completions


def test_rollout_memory_estimate_covers_the_cache_it_allocates():
    import torch

    from grpo_cli.engine import rollout

    model = tiny_model("qwen2")
    prompt_len, new = 7, 40
    decoder = rollout._Decoder(
        model, 3, prompt_len + new, torch.zeros(3, dtype=torch.long), torch.device("cpu"), torch.float32
    )
    cache_per_row = sum(t.nbytes for t in decoder.keys + decoder.values) // 3
    decoder.stack_projections()
    assert rollout.stacked_qkv_bytes(model) == sum(w.nbytes + b.nbytes for w, b, _ in decoder.qkv)
    estimate = rollout.row_bytes(model, prompt_len, new)
    assert cache_per_row < estimate < cache_per_row + 300 * 4 * 8 + prompt_len * 1024 * 4  # + logits, prefill
    # Rows that fit: whole multiples of 8 from 8 up, at least one however little is free.
    per_row = estimate / rollout.ROLLOUT_MEMORY_SHARE
    assert rollout.rows_that_fit(model, prompt_len, new, int(per_row * 21)) == 16
    assert rollout.rows_that_fit(model, prompt_len, new, int(per_row * 5) + 1) == 5
    assert rollout.rows_that_fit(model, prompt_len, new, 10) == 1


def test_models_the_rollout_does_not_cover_are_named():
    from grpo_cli.engine.rollout import unsupported_reason

    assert "sliding-window" in unsupported_reason(
        tiny_model("qwen2", use_sliding_window=True, sliding_window=16)
    )
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50))
    assert "gpt2" in unsupported_reason(gpt2)


def test_grpo_sampler_is_the_gpu_default_and_trl_turns_it_off(tmp_path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from grpo_cli.train.rollout_func import StaticCacheRollout, static_rollout

    model = tiny_model("qwen2")
    default = load_recipe(None, ["--output_dir", str(tmp_path), "--bf16", "false"], "rl")
    engine = default.rollout.rollout_engine
    # the machine's default, decided at load: on the CPU TRL's own generate is faster
    assert engine == ("grpo" if torch.cuda.is_available() else "trl")
    assert (static_rollout(default.training_config(), engine, model) is None) == (engine == "trl")
    asked = load_recipe(None, ["--output_dir", str(tmp_path), "--bf16", "false", "--rollout_engine", "grpo"], "rl")
    assert isinstance(static_rollout(asked.training_config(), "grpo", model), StaticCacheRollout)
    assert static_rollout(asked.training_config(), "grpo", GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50))) is None
    vllm = load_recipe(None, ["--output_dir", str(tmp_path), "--bf16", "false", "--use_vllm", "true"], "rl")
    assert static_rollout(vllm.training_config(), "grpo", model) is None  # TRL drives vLLM's weight syncing


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
    if torch.cuda.is_available():  # where each step's peak lies
        assert all(f"peak_{phase}_gib" in grpo["summary"] for phase in ("generate", "train", "other"))


def test_grpo_config_splits_steps_as_the_countdown_recipe_does():
    from benchmarks.grpo_bench import recipe_micro_batch

    recipe = load_recipe(str(ROOT / "recipes" / "countdown.yaml"), [], "rl")
    values = recipe.values
    length = values["max_completion_length"]
    assert recipe_micro_batch(length) == values["per_device_train_batch_size"]
    assert [recipe_micro_batch(n) for n in (64, 256, 512, 2048, 8192, 20000)] == [32, 32, 16, 4, 1, 1]


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


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_flash_decode_attention_gives_the_models_own_log_probs(kind, monkeypatch):
    """On the GPU the decode attention goes through FlashAttention's variable-length kernel (one sequence per row
    and key/value head, from the row's first real token): its log-probs are the model's own forward's, as closely
    as the mask-based SDPA path's are, in bf16."""
    import torch

    from grpo_cli.engine import rollout

    monkeypatch.setattr(rollout, "KV_STRETCH", 8)
    model = tiny_model(kind).to("cuda", torch.bfloat16)
    assert rollout._flash_decode_available(model.device, torch.bfloat16, model.model.layers[0].self_attn.head_dim)
    prompts = PROMPTS * 3
    errors = {}
    for flash in (True, False):
        monkeypatch.setattr(rollout, "FLASH_DECODE", flash)
        torch.manual_seed(5)
        completions, logprobs = rollout.sample_completions(
            model, prompts, 30, eos_token_ids=[3], pad_token_id=0, sampling=rollout.Sampling(temperature=0.7)
        )
        assert not rollout._GRAPHS_BROKEN
        errors[flash] = max(
            max(abs(a - b) for a, b in zip(logp, teacher_forced_logprobs(model, p, c, 0.7), strict=True))
            for p, c, logp in zip(prompts, completions, logprobs, strict=True)
        )
    assert errors[True] < 0.1 and errors[True] < 2 * errors[False] + 0.02, errors


@pytest.mark.gpu
def test_folded_lora_decode_gives_peft_log_probs_in_bf16():
    """On the GPU, in bf16 and through CUDA graphs, the folded LoRA decode steps (the update merged into the stacked
    q/k/v copy, three kernels for the other projections) give PEFT's own forward's log-probs as closely as the
    model without adapters gives its own; the base weights are left as they were."""
    import torch
    from peft import LoraConfig, get_peft_model

    from grpo_cli.engine import rollout

    plain = tiny_model("qwen2").to("cuda", torch.bfloat16)
    model = get_peft_model(tiny_model("qwen2"), LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.3)
    model = model.to("cuda", torch.bfloat16).eval()
    inner = model.get_base_model()
    before = inner.model.layers[0].self_attn.q_proj.base_layer.weight.clone()
    prompts = PROMPTS * 3
    errors = {}
    for name, sampled, reference in (("plain", plain, plain), ("lora", inner, model)):
        torch.manual_seed(5)
        completions, logprobs = rollout.sample_completions(
            sampled, prompts, 30, eos_token_ids=[3], pad_token_id=0, sampling=rollout.Sampling(temperature=0.7)
        )
        errors[name] = max(
            max(abs(a - b) for a, b in zip(logp, teacher_forced_logprobs(reference, p, c, 0.7), strict=True))
            for p, c, logp in zip(prompts, completions, logprobs, strict=True)
        )
    assert not rollout._GRAPHS_BROKEN and inner in rollout._GRAPHS_CHECKED
    assert torch.equal(inner.model.layers[0].self_attn.q_proj.base_layer.weight, before)
    assert errors["lora"] < 0.1 and errors["lora"] < 2 * errors["plain"] + 0.02, errors


@pytest.mark.gpu
def test_rollouts_leave_no_gpu_memory_behind():
    """Each rollout captures CUDA graphs on the same side stream and releases cuBLAS's workspaces after: what is
    allocated between rollouts does not grow (a new stream per capture left 32 MiB behind each time)."""
    import torch

    from grpo_cli.engine import rollout

    model = tiny_model("qwen2").to("cuda", torch.bfloat16)
    prompts = PROMPTS * 4
    rollout.sample_completions(model, prompts, 40, [299], 0)  # the first one builds cuBLAS handles
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(3):
        rollout.sample_completions(model, prompts, 40, [299], 0)
    torch.cuda.synchronize()
    assert not rollout._GRAPHS_BROKEN and model in rollout._GRAPHS_CHECKED  # the first replay checked, once
    assert torch.cuda.memory_allocated() <= before


# A stand-in for an attention backward that makes dQ NaN: run as `python -c` with the `grpo` command's arguments.
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
