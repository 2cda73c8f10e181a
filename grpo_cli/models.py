"""Where models come from: short names (the demo model, grpo_cli/demo_model.py), local folders and Hub ids, load
kwargs, tokenizers and prompts, and models with their trained adapters.

This is the one module that turns a model name and a `trl.ModelConfig` into `from_pretrained` calls.
Heavy libraries are imported inside functions so `grpo --help` stays fast.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo_cli.demo_model import DEMO_MODELS, prepare_demo_model
from grpo_cli.errors import UserError
from grpo_cli.run_folder import find_adapter
from grpo_cli.weights import refuse_damaged, refuse_nonfinite

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

_DTYPES = ("auto", "bfloat16", "float16", "float32")


# ----------------------------------------------------------------------------------------------------- names


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


def model_config(name_or_path: str, revision: str | None = None, trust_remote_code: bool = False):
    """The model's transformers config, read without loading, converting or downloading its weights: from a local
    folder, a prepared demo model, the Hub (config.json alone; the Hugging Face cache alone where the Hub cannot be
    reached, without retries) or a ModelScope model's cached snapshot. What cannot be read so is one UserError saying
    why and what to do."""
    from transformers import AutoConfig

    from grpo_cli.demo_model import demo_model_dir, is_prepared
    from grpo_cli.hub import hub_unreachable, model_source, modelscope_cached

    name = str(name_or_path or "").strip()
    unreachable = None  # why the Hub cannot be reached, where the config would come from it: the cache alone then
    path = Path(name).expanduser()
    recorded = path.name in DEMO_MODELS and path.parent.name == "models"  # a demo model's cache folder, elsewhere
    demo = name.lower() if name.lower() in DEMO_MODELS else path.name if recorded else None
    if demo and not path.exists():
        source = str(demo_model_dir(demo))
        if not is_prepared(Path(source)):
            raise UserError(f"the demo model {demo} is not prepared yet - `grpo models prepare {demo}` converts it")
    elif path.exists() or is_local_path(name):
        source = resolve_model(name, revision)  # a local folder, checked: nothing is fetched
    elif model_source() == "modelscope":
        source = modelscope_cached(name, "model", revision)
        if source is None:
            raise UserError(f"{name} is not in ModelScope's cache yet: its config is read once a run has downloaded it")
    else:
        source, unreachable = name, hub_unreachable()
    try:
        return AutoConfig.from_pretrained(
            source, revision=revision, trust_remote_code=trust_remote_code, local_files_only=unreachable is not None
        )
    except (OSError, ValueError) as err:
        why = unreachable or (str(err).strip().splitlines() or [type(err).__name__])[0]
        cache = ", and its config.json is not in the Hugging Face cache" if unreachable else ""
        raise UserError(f"the config of {name} could not be read ({why}{cache})") from None



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


def model_kwargs(
    model_args, for_training: bool = False, trust_remote_code: bool | None = None, device=None
) -> dict:
    """`from_pretrained` kwargs from a trl.ModelConfig: dtype, attention, revision, k-bit quantization, remote code;
    the weights onto `device` where one is given (else, for training, on the CPU: the trainer moves them)."""
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
    elif device is not None:
        kwargs["device_map"] = {"": device}
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
    if _get(args, "flash_attention"):
        problems.append(f"flash_attention: true runs a CUDA GPU's FlashAttention kernel - set flash_attention: false {fix}")
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


def load_model(
    name_or_path: str, model_args=None, for_training: bool = False, adapter: str | None = None, device=None
):
    """Causal LM from a short name, folder or Hub id, with an optional LoRA adapter on top (eval mode unless training);
    a training model's weights onto `device` where one is given (`model_kwargs`)."""
    from transformers import AutoModelForCausalLM

    path = resolve_model(name_or_path, _get(model_args, "model_revision"))
    kwargs = model_kwargs(model_args, for_training, device=device) if model_args is not None else {"dtype": "auto"}
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
