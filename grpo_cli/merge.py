"""`grpo merge`: fold a LoRA adapter into its base model and write a standalone, verified model folder.

The merged folder is built beside the target and renamed into place only after it reloaded on its own and
matched the base+adapter model on a probe, so a failed merge never leaves a half-written output.
"""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grpo_cli.atomic import check_writable, disk_full_message, is_disk_full, readable_tree, replace_folder
from grpo_cli.errors import UserError
from grpo_cli.models import load_tokenizer, resolve_model
from grpo_cli.quiet import quiet_progress_bars
from grpo_cli.run_folder import find_adapter

DTYPES = ("bfloat16", "float16", "float32")
# Largest allowed |merged - unmerged| logit difference, relative to the probe's largest logit: merging reorders
# the arithmetic, so 16-bit weights round differently from the unmerged model.
TOLERANCE = {"float32": 1e-4, "float16": 5e-2, "bfloat16": 1e-1}
PROBE = [
    {"role": "user", "content": "Using the numbers 3, 5 and 7, make 22. Show your reasoning."},
    {"role": "assistant", "content": "<think>3 * 5 = 15, 15 + 7 = 22</think>\n<answer>3 * 5 + 7</answer>"},
]
_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model")


@dataclass
class MergeReport:
    """What a merge wrote and how it was checked."""

    output: str
    adapter: str
    adapter_label: str
    base: str
    dtype: str
    tokenizer_from: str
    lora_modules: int
    changed_modules: int
    probe_tokens: int
    max_logit_diff: float
    tolerance: float
    adapter_logit_effect: float
    same_top1: float
    files: list[str] = field(default_factory=list)


def check_output(output: Path, force: bool, protected: list[Path]) -> None:
    """Refuse an output that is a file, a non-empty folder (without force), or one holding the inputs."""
    target = output.resolve()
    for path in protected:
        path = path.resolve()
        if target == path or target in path.parents:
            raise UserError(
                f"--output {output} would replace {path}, an input of the merge - choose another folder"
            )
    check_writable(output, "--output", folder=True)
    if output.is_dir() and any(output.iterdir()) and not force:
        raise UserError(
            f"--output {output} already exists and is not empty - choose another folder or pass --force"
        )


def base_model_of(adapter_dir: Path) -> str | None:
    """The base model recorded in an adapter's adapter_config.json (read directly rather than through peft's
    `PeftConfig.from_pretrained`: no Hub lookup for a local folder, and a damaged file is one message)."""
    try:
        config = json.loads((adapter_dir / "adapter_config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(
            f"cannot read {adapter_dir / 'adapter_config.json'}: {err} - is the adapter complete?"
        ) from err
    return config.get("base_model_name_or_path")


def _check_base_unquantized(base_path: str) -> None:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(base_path)
    except (OSError, ValueError) as err:
        raise UserError(
            f"cannot read the base model's config from {base_path}: {err} - pass --base MODEL"
        ) from err
    quant = getattr(config, "quantization_config", None)
    if quant:
        method = (
            quant.get("quant_method", "?") if isinstance(quant, dict) else getattr(quant, "quant_method", "?")
        )
        raise UserError(
            f"the base model {base_path} is stored quantized ({method}): merging into quantized weights would "
            "round the adapter away or is not supported - pass --base with the original 16-bit model"
        )


def _dtype_name(requested: str | None, base_path: str) -> str:
    if requested:
        if requested not in DTYPES:
            raise UserError(f"--dtype {requested} is not supported - use one of {', '.join(DTYPES)}")
        return requested
    config_file = Path(base_path) / "config.json"
    saved = None
    if config_file.is_file():
        config = json.loads(config_file.read_text())
        saved = config.get("dtype") or config.get("torch_dtype")
    return saved if saved in DTYPES else "float32"


def _fingerprint(weight) -> tuple[int, int]:
    """Exact, order-independent digest of a tensor's bits (integer sums wrap but never round)."""
    import torch

    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[weight.element_size()]
    bits = weight.detach().contiguous().view(ints).to(torch.int64)
    return int(bits.sum()), int((bits * bits).sum())


def _fingerprints(model) -> dict[str, tuple[int, int]]:
    """Digest of each adapted module's base weight, keyed by its name in the merged model."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    prints = {}
    for name, module in model.named_modules():
        if isinstance(module, BaseTunerLayer):
            weight = getattr(module.get_base_layer(), "weight", None)
            if weight is not None:
                prints[name.removeprefix("base_model.model.")] = _fingerprint(weight)
    return prints


def _changed(model, before: dict[str, tuple[int, int]]) -> int:
    """How many of the fingerprinted weights differ now."""
    return sum(_fingerprint(model.get_submodule(name).weight) != digest for name, digest in before.items())


def _logits(model, ids) -> object:
    import torch

    with torch.no_grad():
        return model(input_ids=ids.to(model.device)).logits.float().cpu()


def merge_adapter(
    adapter: str | os.PathLike,
    output: str | os.PathLike,
    base: str | None = None,
    dtype: str | None = None,
    force: bool = False,
) -> MergeReport:
    """Merge the adapter in `adapter` (adapter, checkpoint or run folder) into its base; write `output` atomically."""
    import torch
    from peft import PeftModel

    from grpo_cli.models import load_model
    from grpo_cli.weights import refuse_damaged, refuse_nonfinite

    adapter_dir, label = find_adapter(adapter)
    recorded = base_model_of(adapter_dir)
    base_name = base or recorded
    if not base_name:
        raise UserError(f"{adapter_dir / 'adapter_config.json'} names no base model - pass --base MODEL")
    relative = not base and not Path(recorded).expanduser().is_absolute() and recorded.startswith((".", "outputs/"))
    if relative and not Path(recorded).exists():
        raise UserError(
            f"{adapter_dir / 'adapter_config.json'} names its base as {recorded}, a folder relative to where its "
            f"training ran, and there is none from here ({Path.cwd()}) - run grpo merge from that folder, or pass "
            "--base with the base model's folder"
        )
    base_path = resolve_model(base_name)
    out = Path(output).expanduser()
    protected = [adapter_dir] + ([Path(base_path)] if Path(base_path).exists() else [])
    check_output(out, force, protected)
    _check_base_unquantized(base_path)
    dtype_name = _dtype_name(dtype, base_path)
    has_tokenizer = any((adapter_dir / name).is_file() for name in _TOKENIZER_FILES)
    tokenizer_from = str(adapter_dir) if has_tokenizer else base_path
    tokenizer = load_tokenizer(tokenizer_from)
    ids = tokenizer.apply_chat_template(PROBE, tokenize=True, return_tensors="pt", return_dict=True)[
        "input_ids"
    ]
    ids = ids[:, :128]

    refuse_damaged(adapter_dir)
    with quiet_progress_bars():
        model = load_model(base_path, {"dtype": dtype_name})
    base_logits = _logits(model, ids)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # peft calls deprecated transformers names
            model = PeftModel.from_pretrained(model, str(adapter_dir))
    except (ValueError, KeyError, RuntimeError) as err:
        lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
        mismatches = sum("size mismatch" in line for line in lines)
        what = f"{mismatches} weights of other shapes" if mismatches else (lines[0][:200] if lines else type(err).__name__)
        raise UserError(
            f"the adapter {adapter_dir} does not fit the base model {base_path} ({what}) - pass the --base it was "
            "trained on"
        ) from None
    refuse_nonfinite(model, f"the adapter {adapter_dir}")
    reference = _logits(model, ids)
    before = _fingerprints(model)
    if not before:
        raise UserError(
            f"{adapter_dir} adapts no weight matrices (peft type without weights) - nothing to merge"
        )
    merged = model.merge_and_unload(safe_merge=True)
    changed = _changed(merged, before)
    if changed == 0:
        raise UserError(
            f"merge changed nothing: the adapter in {adapter_dir} leaves all {len(before)} adapted weight matrices "
            f"equal in {dtype_name} (untrained adapter, lora_B all zeros?) - merge a trained checkpoint"
        )

    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(out)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
    try:
        merged.config.dtype = getattr(torch, dtype_name)
        with quiet_progress_bars():
            merged.save_pretrained(staging, max_shard_size="5GB")
        tokenizer.save_pretrained(staging)
        del merged, model
        gc.collect()
        # Verify what was written: the folder must load alone and behave like base + adapter.
        with quiet_progress_bars():
            reloaded = load_model(str(staging), {"dtype": dtype_name})  # same device placement as the base
        reloaded_logits = _logits(reloaded, ids)
        del reloaded
        diff = float((reloaded_logits - reference).abs().max())
        tolerance = TOLERANCE[dtype_name] * max(1.0, float(reference.abs().max()))
        same_top1 = float((reloaded_logits.argmax(-1) == reference.argmax(-1)).float().mean())
        if not diff <= tolerance:
            raise UserError(
                f"the merged model's logits differ from base + adapter by {diff:.4g} (tolerance {tolerance:.4g} in "
                f"{dtype_name}) - try --dtype float32, or check that --base is the model the adapter was trained on"
            )
        report = MergeReport(
            output=str(out),
            adapter=str(adapter_dir),
            adapter_label=label,
            base=base_name,
            dtype=dtype_name,
            tokenizer_from=tokenizer_from,
            lora_modules=len(before),
            changed_modules=changed,
            probe_tokens=int(ids.shape[1]),
            max_logit_diff=diff,
            tolerance=tolerance,
            adapter_logit_effect=float((reference - base_logits).abs().max()),
            same_top1=same_top1,
        )
        report.files = sorted(p.name for p in staging.iterdir()) + ["merge.json"]
        (staging / "merge.json").write_text(json.dumps(asdict(report), indent=1) + "\n")
        readable_tree(staging)  # a server running as another user reads the merged model
        replace_folder(staging, out)  # an existing output (allowed by --force) goes only after the swap
    except BaseException as err:
        shutil.rmtree(staging, ignore_errors=True)
        if is_disk_full(err):
            intact = f"{out} is as it was" if out.exists() else f"nothing was left at {out}"
            raise UserError(disk_full_message(out, f"{intact}, and the adapter is untouched")) from None
        raise
    return report


def _remove_leftovers(out: Path) -> None:
    """Remove what merges into `out` killed before they finished left beside it (a staging folder, the old output
    being swapped out): hidden folders named after `out` whose process no longer runs."""
    for leftover in out.parent.glob(f".{out.name}.*"):
        match = re.fullmatch(rf"\.{re.escape(out.name)}\.(?:tmp-(\d+)-.*|old-(\d+))", leftover.name)
        if not match or not leftover.is_dir():
            continue
        pid = int(match.group(1) or match.group(2))
        if pid != os.getpid() and not _running(pid):
            shutil.rmtree(leftover, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def print_report(report: MergeReport) -> None:
    """Show the merge and its verification on the console."""
    from rich.table import Table

    from grpo_cli.console import console, escape, output

    table = Table(title="merge", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("adapter", escape(report.adapter_label))
    table.add_row("base", escape(report.base))
    table.add_row("dtype", report.dtype)
    table.add_row("tokenizer from", escape(report.tokenizer_from))
    table.add_row("weights changed", f"{report.changed_modules} of {report.lora_modules} adapted matrices")
    table.add_row(
        "probe logits",
        f"max |merged - base+adapter| = {report.max_logit_diff:.3g} (tolerance {report.tolerance:.3g}), "
        f"same top-1 token on {report.same_top1:.0%} of {report.probe_tokens} positions",
    )
    table.add_row("adapter effect", f"max |base+adapter - base| = {report.adapter_logit_effect:.3g}")
    table.add_row("output", escape(report.output))
    output.print(table)
    console.print(
        f"[bold green]merged[/] {escape(report.output)} - loads with AutoModelForCausalLM and AutoTokenizer alone"
    )
