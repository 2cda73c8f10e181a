"""Files written whole or not at all: a temporary file beside the target, then a rename over it."""

from __future__ import annotations

import json
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


def write_jsonl(path: str | Path, rows: list[dict]) -> None:
    """Write rows as JSON lines atomically."""
    write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
