"""Where Hub ids of models and datasets come from: the Hugging Face Hub (transformers and datasets fetch those
themselves) or ModelScope, whose snapshots are fetched here, through the `modelscope` package, into its own cache
(MODELSCOPE_CACHE, default ~/.cache/modelscope) and then loaded as local folders.

The recipe key `model_source`, or GRPO_MODEL_SOURCE when the recipe leaves it unset, picks the source for every
command. A snapshot already complete in the cache is used without the network.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from grpo_cli.errors import UserError
from grpo_cli.problems import Problem, listing

SOURCES = ("huggingface", "modelscope")
SOURCE_VARIABLE = "GRPO_MODEL_SOURCE"
INSTALL = "pip install 'grpo-cli[modelscope]'"
_WEIGHTS = (".safetensors", ".bin")

_resolved: dict[tuple, str] = {}  # one look-up per id and process: tokenizer, config and model share it
HUB_CONNECT_TIMEOUT_S = 3.0
_ON = ("1", "true", "yes", "on")


def model_source() -> str:
    """The source of Hub ids for this process: GRPO_MODEL_SOURCE (a recipe's `model_source` sets it), else huggingface."""
    value = os.environ.get(SOURCE_VARIABLE, "").strip().lower() or "huggingface"
    if value not in SOURCES:
        raise UserError(f"{SOURCE_VARIABLE}={value} is not a model source - set it to huggingface or modelscope")
    return value


def source_problems(recipe_value: str | None = None) -> list[Problem]:
    """What stops the chosen source from working, found without loading anything: an unknown GRPO_MODEL_SOURCE, or
    ModelScope without its package (about the recipe's `model_source` where it set one)."""
    try:
        source = recipe_value or model_source()
    except UserError as err:
        return [Problem(None, problem) for problem in err.problems]
    if source == "modelscope" and importlib.util.find_spec("modelscope") is None:
        where = "model_source: modelscope" if recipe_value else f"{SOURCE_VARIABLE}=modelscope"
        message = f"{where} needs the modelscope package, which is not installed - {INSTALL}, or use model_source: huggingface"
        return [Problem("model_source" if recipe_value else None, message)]
    return []


def _complete_model(folder: Path) -> bool:
    """A model snapshot with its config and every weight file its index names (a download cut short has not)."""
    if not (folder / "config.json").is_file():
        return False
    for index in folder.glob("*.index.json"):
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError):
            return False
        if not all((folder / shard).is_file() for shard in shards):
            return False
    return any(path.suffix in _WEIGHTS for path in folder.iterdir())


def _complete(folder: Path, kind: str) -> bool:
    if not folder.is_dir():
        return False
    if kind == "model":
        return _complete_model(folder)
    return any(path.is_file() for path in folder.rglob("*"))


def _modelscope_key(repo_id: str, kind: str, revision: str | None) -> tuple[str | None, tuple]:
    """ModelScope's revision for `revision` (main, Hugging Face's default, is ModelScope's master: None) and the key
    of the folder found for it in this process."""
    revision = None if revision in (None, "", "main") else revision
    return revision, (kind, repo_id, revision, os.environ.get("MODELSCOPE_CACHE"))


def modelscope_cached(repo_id: str, kind: str = "model", revision: str | None = None) -> str | None:
    """The local folder of a ModelScope model or dataset where its cache holds it complete, else None (nothing is
    downloaded)."""
    if problems := source_problems("modelscope"):
        raise UserError(*listing(problems))
    revision, cache_key = _modelscope_key(repo_id, kind, revision)
    if cache_key in _resolved:
        return _resolved[cache_key]
    from modelscope import snapshot_download

    repo_type = "dataset" if kind == "dataset" else "model"
    try:
        cached = snapshot_download(repo_id=repo_id, repo_type=repo_type, revision=revision, local_files_only=True)
    except Exception:  # noqa: BLE001 - not in the cache (modelscope raises its own types)
        return None
    if cached and _complete(Path(cached), kind):
        _resolved[cache_key] = str(cached)
        return str(cached)
    return None


def modelscope_snapshot(repo_id: str, kind: str = "model", revision: str | None = None, key: str = "") -> str:
    """The local folder of a ModelScope model or dataset (`kind`): from its cache when complete there, else downloaded.

    `key` names the recipe key in messages (model_name_or_path, dataset_name).
    """
    cached = modelscope_cached(repo_id, kind, revision)
    if cached:
        return cached
    revision, cache_key = _modelscope_key(repo_id, kind, revision)
    from modelscope import snapshot_download

    repo_type = "dataset" if kind == "dataset" else "model"
    try:
        folder = snapshot_download(repo_id=repo_id, repo_type=repo_type, revision=revision)
    except Exception as err:  # noqa: BLE001 - offline, unknown id, no access: all the user's to fix
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
        where = f"{key}: " if key else ""
        raise UserError(
            f"{where}cannot get the {kind} {repo_id} from ModelScope ({type(err).__name__}: {first}) - check the id and "
            f"the network (ModelScope's cache: {os.environ.get('MODELSCOPE_CACHE') or '~/.cache/modelscope'}), or "
            "use model_source: huggingface"
        ) from None
    if not _complete(Path(folder), kind):
        raise UserError(
            f"{key + ': ' if key else ''}the ModelScope {kind} {repo_id} downloaded to {folder} holds no "
            + ("config.json and weights" if kind == "model" else "files")
            + " - check the id"
        )
    _resolved[cache_key] = str(folder)
    return str(folder)


@functools.cache
def hub_unreachable() -> str | None:
    """Why the Hugging Face Hub (HF_ENDPOINT) cannot be reached from this machine, from one connection attempt of at
    most a few seconds; None where it can, in offline mode, or behind a proxy (which decides for itself)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _ON:
        return None
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    parts = urlsplit(endpoint)
    try:
        port = parts.port or (80 if parts.scheme == "http" else 443)
        socket.create_connection((parts.hostname or "", port), timeout=HUB_CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as err:
        reason = getattr(err, "strerror", None) or err
        return f"the Hugging Face Hub ({endpoint}) is not reachable from this machine ({reason})"
    return None


def hub_model(repo_id: str, revision: str | None = None) -> str:
    """A Hub model id as transformers should load it: the id itself where the Hub can be reached; else its complete
    snapshot in the Hugging Face cache, as a local folder (no retries against an unreachable Hub); else one
    UserError with the ways out."""
    why = hub_unreachable()
    if why is None:
        return repo_id
    cache_key = ("hf-cache", repo_id, revision)
    if cache_key in _resolved:
        return _resolved[cache_key]
    from huggingface_hub import constants, snapshot_download

    try:
        folder = snapshot_download(repo_id, revision=revision or None, local_files_only=True)
    except Exception:  # noqa: BLE001 - not in the cache, whatever huggingface_hub calls it
        folder = None
    if folder and _complete_model(Path(folder)):
        _say_cached(why, repo_id, "the cache", folder)
        _resolved[cache_key] = str(folder)
        return str(folder)
    raise UserError(
        f"model {repo_id}: {why}, and the model is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) - "
        "download it where the Hub can be reached and give its folder as model_name_or_path, point HF_ENDPOINT at a "
        "mirror, or use model_source: modelscope; HF_HUB_OFFLINE=1 loads only what the cache holds"
    )


def hub_dataset(repo_id: str, ways_out: str) -> contextlib.AbstractContextManager:
    """Where `datasets.load_dataset(repo_id, ...)` runs: as it is where the Hub can be reached; else in datasets'
    offline mode over the copy it prepared before (HF_DATASETS_CACHE), without the library's retries; else (nothing
    cached) one UserError with `ways_out` and the Hub's own."""
    why = hub_unreachable()
    if why is None:
        return contextlib.nullcontext()
    from datasets import config
    from datasets.naming import camelcase_to_snakecase

    *namespace, name = repo_id.split("/")
    folder = Path(config.HF_DATASETS_CACHE).expanduser() / "___".join([*namespace, camelcase_to_snakecase(name)])
    if not any(path.is_dir() for path in folder.glob("*/*/*")):  # <config>/<version>/<hash>, as datasets keeps them
        raise UserError(
            f"dataset_name: cannot load '{repo_id}': {why}, and it is not in the datasets cache - {ways_out}, point "
            "HF_ENDPOINT at a mirror, or use model_source: modelscope"
        )
    _say_cached(why, repo_id, "the datasets cache", folder)
    return _datasets_offline()


@contextlib.contextmanager
def _datasets_offline() -> Iterator[None]:
    """datasets' offline mode (what HF_HUB_OFFLINE=1 sets as it is imported) for the calls inside only."""
    from datasets import config

    before = config.HF_HUB_OFFLINE
    config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        config.HF_HUB_OFFLINE = before


def _say_cached(why: str, repo_id: str, cache: str, folder) -> None:
    """Once, on the console: the Hub cannot be reached, and `repo_id` comes from `cache` (its `folder`)."""
    from grpo_cli.console import console, escape

    console.print(f"{escape(why)}: loading {escape(repo_id)} from {cache} ({escape(str(folder))})", soft_wrap=True)
