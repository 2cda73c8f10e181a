"""grpo's sampler (grpo_cli/engine/rollout.py) on tiny random models: the model's own log-probs, transformers'
`generate`'s tokens from the same seed, shared prefills, LoRA folded into the decode steps, batches in parts, its
memory estimate; on a GPU, the FlashAttention decode, bf16 LoRA and the memory it leaves behind."""

from __future__ import annotations

import pytest

from grpo_cli.recipe import load_recipe


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
    assert rollout.cannot_serve(model) is None
    weight, bias, sizes = rollout._stacked_qkv(model.model.layers[0].self_attn)  # one matrix product for q, k, v
    assert sizes == [64, 32, 32] and weight.shape == (128, 64) and (bias is None) == (kind == "llama")
    completions, logprobs = rollout.Sampler().sample(
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
    ours, _ = rollout.Sampler().sample(
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
    ours, logprobs = rollout.Sampler().sample(
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
    assert isinstance(folded[2], rollout._FoldedLoRA)  # down_proj
    # gate and up share their input: with both adapted, one product with their stacked A serves both
    assert isinstance(folded[1], rollout._FoldedGateUp) == (targets == "all-linear")
    completions, logprobs = rollout.Sampler().sample(
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
    completions, logprobs = rollout.Sampler().sample(
        inner, PROMPTS, 12, eos_token_ids=[3], pad_token_id=0, sampling=rollout.Sampling(temperature=1.0)
    )
    for prompt, completion, logp in zip(PROMPTS, completions, logprobs, strict=True):
        reference = teacher_forced_logprobs(model, prompt, completion, 1.0)
        assert max(abs(a - b) for a, b in zip(logp, reference, strict=True)) < 1e-4


def test_rollout_ends_at_eos_and_top_k_one_is_greedy():
    import torch

    from grpo_cli.engine.rollout import Sampler, Sampling

    model = tiny_model("qwen2")
    greedy, _ = Sampler().sample(
        model, PROMPTS, 12, eos_token_ids=[3], pad_token_id=0, sampling=Sampling(top_k=1)
    )
    for prompt, completion in zip(PROMPTS, greedy, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
        assert completion == logits.argmax(-1).tolist()
    # With one of row 0's greedy tokens as EOS, every greedy completion stops at its first occurrence, kept.
    eos = greedy[0][2]
    ended, _ = Sampler().sample(
        model, PROMPTS, 12, eos_token_ids=[eos], pad_token_id=0, sampling=Sampling(top_k=1)
    )
    assert ended == [c[: c.index(eos) + 1] if eos in c else c for c in greedy]
    assert len(ended[0]) <= 3


def test_rollout_in_parts_samples_what_one_batch_samples():
    """A generation batch too large for the GPU's free memory is sampled in parts: greedy (top-k 1), so the parts
    must give token for token what one batch gives, left padding included."""
    from grpo_cli.engine.rollout import Sampler, Sampling

    model = tiny_model("llama")
    prompts = PROMPTS + [p[::-1] for p in PROMPTS] + [[20, 21, 22, 23]]  # 9 prompts: parts of 4, 4 and 1
    whole = Sampler().sample(
        model, prompts, 10, eos_token_ids=[3], pad_token_id=0, sampling=Sampling(top_k=1)
    )
    parts = Sampler().sample(
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
        model, 3, prompt_len + new, torch.zeros(3, dtype=torch.long), torch.device("cpu"), torch.float32, flash=False
    )
    cache_per_row = sum(t.nbytes for t in decoder.keys + decoder.values) // 3
    decoder.stack_projections()
    assert rollout.stacked_qkv_bytes(model) == sum(w.nbytes + b.nbytes for w, b, _ in decoder.qkv)
    estimate = rollout.row_bytes(model, prompt_len, new)
    assert cache_per_row < estimate < cache_per_row + 300 * 4 * 8 + prompt_len * 1024 * 4  # + logits, prefill
    # Rows that fit: whole multiples of 8 from 8 up, at least one however little is free.
    share = rollout.EngineOptions().memory_share
    per_row = estimate / share
    assert rollout.rows_that_fit(model, prompt_len, new, int(per_row * 21), share) == 16
    assert rollout.rows_that_fit(model, prompt_len, new, int(per_row * 5) + 1, share) == 5
    assert rollout.rows_that_fit(model, prompt_len, new, 10, share) == 1


def test_a_graph_the_driver_refuses_or_that_differs_leaves_eager_steps(caplog):
    """The decode graphs' safety net, on the CPU with stand-ins for the captured graphs: a capture that fails, or a
    first replay that differs from the eager step, gives the eager step's logits, sets the sampler's
    `graphs_problem` (eager steps from then on) and says so in the log; a replay that matches marks the model checked."""
    import torch

    from grpo_cli.engine import rollout

    model = tiny_model("qwen2")
    decoder = rollout._Decoder(model, 1, 8, torch.zeros(1, dtype=torch.long), torch.device("cpu"), torch.float32, False)
    ids, positions, slot = torch.tensor([[5]]), torch.tensor([[0]]), torch.tensor([0])
    with torch.no_grad():
        eager = decoder.step(ids, positions, slot, 8)

    class Graphs:  # what `_GraphSteps` offers the sampler: the decoder, the static inputs, a replay
        def __init__(self, replay):
            self.decoder, self.ids, self.positions, self.slot, self.replay = decoder, ids, positions, slot, replay

        def __call__(self, kv_len):
            return self.replay()

    def refused():
        raise RuntimeError("operation not permitted when stream is capturing")

    with torch.no_grad():  # as the sampler decodes
        sampler = rollout.Sampler()
        assert torch.equal(sampler._replay(Graphs(refused), model, 8, check=True), eager)
        assert sampler.graphs_problem == "graph capture failed: operation not permitted when stream is capturing"
        sampler = rollout.Sampler()
        assert torch.equal(sampler._replay(Graphs(lambda: eager + 1.0), model, 8, check=True), eager)
        assert sampler.graphs_problem.startswith("graph replay differs from the eager step by")
        assert caplog.text.count("CUDA graph decoding disabled") == 2
        sampler = rollout.Sampler()
        assert torch.equal(sampler._replay(Graphs(lambda: eager.clone()), model, 8, check=True), eager)
        assert sampler.graphs_problem is None and model in sampler._checked


def test_models_the_rollout_does_not_cover_are_named():
    from grpo_cli.engine.rollout import cannot_serve

    assert "sliding-window" in cannot_serve(
        tiny_model("qwen2", use_sliding_window=True, sliding_window=16)
    )
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50))
    assert "gpt2" in cannot_serve(gpt2)


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
        sampler = rollout.Sampler(rollout.EngineOptions(flash_decode=flash))
        torch.manual_seed(5)
        completions, logprobs = sampler.sample(
            model, prompts, 30, eos_token_ids=[3], pad_token_id=0, sampling=rollout.Sampling(temperature=0.7)
        )
        assert sampler.graphs_problem is None
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
    sampler = rollout.Sampler()
    for name, sampled, reference in (("plain", plain, plain), ("lora", inner, model)):
        torch.manual_seed(5)
        completions, logprobs = sampler.sample(
            sampled, prompts, 30, eos_token_ids=[3], pad_token_id=0, sampling=rollout.Sampling(temperature=0.7)
        )
        errors[name] = max(
            max(abs(a - b) for a, b in zip(logp, teacher_forced_logprobs(reference, p, c, 0.7), strict=True))
            for p, c, logp in zip(prompts, completions, logprobs, strict=True)
        )
    assert sampler.graphs_problem is None and inner in sampler._checked
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
    sampler = rollout.Sampler()
    sampler.sample(model, prompts, 40, [299], 0)  # the first one builds cuBLAS handles
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(3):
        sampler.sample(model, prompts, 40, [299], 0)
    torch.cuda.synchronize()
    assert sampler.graphs_problem is None and model in sampler._checked  # the first replay checked, once
    assert torch.cuda.memory_allocated() <= before


# A stand-in for an attention backward that makes dQ NaN: run as `python -c` with the `grpo` command's arguments.
