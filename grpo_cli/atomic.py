"""Files written whole or not at all: a temporary file beside the target, then a rename over it. JSON is strict:
a NaN or inf number is written as null."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path


def write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` atomically (a killed process leaves the old file or none, never half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def finite(value):
    """`value` with every NaN and inf float as None (nested in dicts, lists and tuples)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def json_text(value, indent: int | None = None) -> str:
    """Strict JSON of `value` (NaN and inf as null), non-ASCII kept."""
    return json.dumps(finite(value), ensure_ascii=False, indent=indent, allow_nan=False)


def write_jsonl(path: str | Path, rows: list[dict]) -> None:
    """Write rows as strict JSON lines atomically."""
    write_text(path, "".join(json_text(row) + "\n" for row in rows))
