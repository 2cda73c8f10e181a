"""Checks of a model's weights before they are used: a damaged or cut-short file, non-finite values, an embedding
shorter than its tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

from grpo_cli.errors import UserError


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
