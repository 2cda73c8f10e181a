"""`grpo merge` on a tiny Llama with a LoRA adapter trained for a few real steps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import save_model_of_another_shape

from grpo_cli.errors import UserError
from grpo_cli.merge import merge_adapter


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_adapter_dir, tiny_model_dir, train_adapter) -> Path:
    """A run's output folder with two LoRA checkpoints; the latest (step 8) is the trained adapter."""
    run = tmp_path_factory.mktemp("runs") / "countdown-lora"
    train_adapter(tiny_model_dir, run / "checkpoint-2", steps=1, seed=1)
    shutil.copytree(tiny_adapter_dir, run / "checkpoint-8")
    return run


@pytest.fixture(scope="module")
def merged(tmp_path_factory, run_dir):
    out = tmp_path_factory.mktemp("merged") / "model"
    return merge_adapter(run_dir, out), out


def test_merged_model_loads_alone_and_generates_like_base_plus_adapter(merged, run_dir, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_cli.models import load_model

    report, out = merged
    assert report.adapter_label == "countdown-lora/checkpoint-8 (latest checkpoint, step 8)"
    assert report.adapter == str(run_dir / "checkpoint-8") and report.dtype == "float32"
    assert report.changed_modules == report.lora_modules == 14  # 7 linear layers x 2 blocks
    assert report.max_logit_diff <= report.tolerance and report.adapter_logit_effect > 0.01
    assert json.loads((out / "merge.json").read_text())["adapter_label"] == report.adapter_label
    for name in (
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "chat_template.jinja",
    ):
        assert (out / name).is_file(), name
    assert not _leftovers(out.parent)

    tokenizer = AutoTokenizer.from_pretrained(out)
    alone = AutoModelForCausalLM.from_pretrained(out)
    assert not hasattr(alone, "peft_config")
    tuned = load_model(str(tiny_model_dir), adapter=str(run_dir))  # the run folder -> its latest checkpoint
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    greedy = {"max_new_tokens": 12, "do_sample": False}
    alone.to(tuned.device)  # load_model places models on the GPU when there is one
    prompt = prompt.to(tuned.device)
    with torch.no_grad():
        assert torch.equal(alone.generate(**prompt, **greedy), tuned.generate(**prompt, **greedy))

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(alone.state_dict()[name].cpu(), base.state_dict()[name])


def test_the_merged_folder_is_as_readable_as_the_umask_says(merged):
    """A server running as another user reads the merged model: the folder is not left private (tempfile's 0700)."""
    import os

    _, out = merged
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~mask
    assert all(f.stat().st_mode & 0o777 == 0o666 & ~mask for f in out.iterdir() if f.is_file())


def test_merge_refuses_to_overwrite(merged, run_dir):
    _, out = merged
    before = (out / "merge.json").read_text()
    with pytest.raises(
        UserError, match="already exists and is not empty - choose another folder or pass --force"
    ):
        merge_adapter(run_dir, out)
    assert (out / "merge.json").read_text() == before


def test_failed_merge_leaves_no_half_output(tmp_path, run_dir):
    out = tmp_path / "merged"
    out.mkdir()
    (out / "keep.txt").write_text("old model")
    with pytest.raises(UserError, match="does not exist"):
        merge_adapter(run_dir, out, base=str(tmp_path / "no-such-model"), force=True)

    # A base of another shape: the adapter's matrices do not fit.
    from transformers import LlamaConfig, LlamaForCausalLM

    other = tmp_path / "other-base"
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    LlamaForCausalLM(config).save_pretrained(other)
    with pytest.raises(UserError, match="does not fit the base model"):
        merge_adapter(run_dir, out, base=str(other), force=True)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    assert not _leftovers(tmp_path)


def test_force_replaces_output_in_16_bit(tmp_path, tiny_adapter_dir):
    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path / "merged"
    out.mkdir()
    (out / "stale.txt").write_text("x")
    report = merge_adapter(tiny_adapter_dir, out, dtype="bfloat16", force=True)
    assert report.dtype == "bfloat16" and report.max_logit_diff <= report.tolerance
    assert not (out / "stale.txt").exists() and not _leftovers(tmp_path)
    assert AutoModelForCausalLM.from_pretrained(out, dtype="auto").dtype == torch.bfloat16


def test_untrained_adapter_changes_nothing(tmp_path, tiny_model_dir, train_adapter):
    untrained = train_adapter(tiny_model_dir, tmp_path / "untrained", steps=0)
    with pytest.raises(UserError, match="merge changed nothing"):
        merge_adapter(untrained, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


def test_full_fine_tuning_output_has_nothing_to_merge(tmp_path, tiny_model_dir):
    with pytest.raises(UserError, match="nothing to merge"):
        merge_adapter(tiny_model_dir, tmp_path / "out")


def test_quantized_base_is_refused(tmp_path, tiny_model_dir, tiny_adapter_dir):
    quantized = tmp_path / "base-bnb-4bit"
    shutil.copytree(tiny_model_dir, quantized)
    config = json.loads((quantized / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (quantized / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"stored quantized \(bitsandbytes\).*original 16-bit model"):
        merge_adapter(tiny_adapter_dir, tmp_path / "out", base=str(quantized))


def test_merge_command(tmp_path, tiny_adapter_dir):
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    out = tmp_path / "cli-merged"
    result = CliRunner().invoke(app, ["merge", "--adapter", str(tiny_adapter_dir), "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "model.safetensors").is_file()
    result = CliRunner().invoke(app, ["merge", "--adapter", str(tiny_adapter_dir), "--output", str(out)])
    assert isinstance(result.exception, UserError) and "pass --force" in str(result.exception)


@pytest.mark.gpu
def test_merge_on_gpu_in_bfloat16(tmp_path, tiny_adapter_dir):
    import torch

    from grpo_cli.models import load_model

    torch.cuda.reset_peak_memory_stats()
    report = merge_adapter(tiny_adapter_dir, tmp_path / "merged", dtype="bfloat16")
    assert torch.cuda.max_memory_allocated() > 0  # the base was loaded onto the GPU
    assert report.changed_modules == report.lora_modules and report.max_logit_diff <= report.tolerance
    merged = load_model(str(tmp_path / "merged"), {"dtype": "auto"})
    assert merged.device.type == "cuda" and merged.dtype == torch.bfloat16


def test_an_adapter_without_weights_and_a_base_of_another_shape_are_one_line(tmp_path, tiny_adapter_dir):
    bare = tmp_path / "bare"
    shutil.copytree(tiny_adapter_dir, bare)
    (bare / "adapter_model.safetensors").unlink()
    with pytest.raises(UserError, match="holds adapter_config.json but no adapter weights"):
        merge_adapter(bare, tmp_path / "out")
    other = save_model_of_another_shape(tiny_adapter_dir, tmp_path / "other-base")
    with pytest.raises(UserError) as err:
        merge_adapter(tiny_adapter_dir, tmp_path / "out", base=str(other))
    message = str(err.value)
    assert "does not fit the base model" in message and "weights of other shapes" in message
    assert "\n" not in message and len(message) < 400


def test_leftovers_of_killed_merges_are_removed(tmp_path, tiny_adapter_dir):
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    out = tmp_path / "merged"
    for name in (f".merged.tmp-{dead.pid}-abc", f".merged.old-{dead.pid}"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"x" * 100)
    merge_adapter(tiny_adapter_dir, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]


def test_a_full_disk_is_one_message_and_leaves_the_output_as_it_was(tmp_path, tiny_adapter_dir):
    from conftest import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "small", "size=64k") as disk:
        out = disk / "merged"
        with pytest.raises(UserError, match=r"out of disk space writing .*merged \(0\.0 GiB free now\): nothing was left"):
            merge_adapter(str(tiny_adapter_dir), str(out))
        assert list(disk.iterdir()) == []  # no staging folder left behind


def test_a_base_recorded_relative_to_another_folder_is_one_message(tmp_path, tiny_adapter_dir, monkeypatch):
    adapter = tmp_path / "adapter"
    shutil.copytree(tiny_adapter_dir, adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "outputs/sft"}))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"names its base as outputs/sft, a folder relative to where its training ran"):
        merge_adapter(str(adapter), str(tmp_path / "merged"))
