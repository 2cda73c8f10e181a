"""Files and folders written whole or not at all: a temporary file beside the target, then a rename over it; a
finished folder swapped in by renames. JSON is strict: a NaN or inf number is written as null."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

from grpo_cli.errors import UserError


def write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` atomically (a killed process leaves the old file or none, never half a file)."""
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` atomically, as `write_text` does; a full disk is one UserError saying the file is as it
    was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        readable_as_umask_says(tmp)
        os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if is_disk_full(err):
            intact = f"{path} is as it was" if path.exists() else "nothing was written"
            raise UserError(disk_full_message(path, intact)) from None
        raise


DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "PytorchStreamWriter failed writing file")


def is_disk_full(err: BaseException) -> bool:
    """Whether `err` (or an error it came from) says the disk is full: an OSError with ENOSPC or EDQUOT, or torch's
    and safetensors' messages for it."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(text in str(err) for text in DISK_FULL_TEXTS):
            return True
        err = err.__cause__ or err.__context__
    return False


def disk_full_message(path: str | Path, intact: str) -> str:
    """One message for a command that ran out of disk space writing `path`: the space left, and what is intact."""
    folder = next((p for p in Path(path).absolute().parents if p.exists()), Path.cwd())
    free = shutil.disk_usage(folder).free / 2**30
    return f"out of disk space writing {path} ({free:.1f} GiB free now): {intact} - free some space or write it elsewhere"


def readable_as_umask_says(path: str | Path, folder: bool = False) -> None:
    """Give a file or folder made by `tempfile` (mode 0600 or 0700, private) the mode a plain `open` or `mkdir` gives
    under this process's umask, so that what grpo writes is as readable as any other file the user makes."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, (0o777 if folder else 0o666) & ~mask)


def readable_tree(folder: str | Path) -> None:
    """`readable_as_umask_says` for a folder and everything in it (libraries save some files private: safetensors'
    weights are 0600)."""
    folder = Path(folder)
    readable_as_umask_says(folder, folder=True)
    for item in folder.rglob("*"):
        if not item.is_symlink():
            readable_as_umask_says(item, folder=item.is_dir())


def old_folder_name(target: Path) -> Path:
    """Where `replace_folder` parks the folder it replaces (hidden, named after `target` and this process, so that a
    later run can tell a killed swap's leftover from a running one's)."""
    return target.with_name(f".{target.name}.old-{os.getpid()}")


def replace_folder(staging: str | Path, target: str | Path) -> None:
    """Put the finished folder `staging` at `target` (beside it, on the same file system): an existing `target` is
    renamed away first and removed only after the swap, so at every moment `target` is the old folder or the new
    one, whole."""
    staging, target = Path(staging), Path(target)
    old = None
    if target.exists():
        old = old_folder_name(target)
        os.replace(target, old)
    os.replace(staging, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


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


def write_rows(path: str | Path, make_rows, force: bool = False, option: str = "--out") -> list[dict]:
    """The rows `make_rows()` returns, written to a .jsonl file atomically: the path is checked before any work, and
    an existing file is replaced only with `force`."""
    if not str(path).endswith(".jsonl"):
        raise UserError(f"{option}: '{path}' must be a .jsonl file")
    check_writable(path, option)
    refuse_to_replace(path, option, force)
    rows = make_rows()
    write_jsonl(path, rows)
    return rows


def refuse_to_replace(path: str | Path, option: str, force: bool) -> None:
    """Every command that writes a file keeps one that exists unless told `--force` (as `grpo merge` keeps a folder)."""
    target = Path(path).expanduser()
    if target.is_file() and not force:
        raise UserError(f"{option} {path} already exists - choose another path, or pass --force to replace it")


def check_writable(path: str | Path, option: str, folder: bool = False) -> None:
    """Refuse, before any work, an output path that cannot be written: a folder where a file goes (or a file where a
    folder goes), a path under a file, a folder that is not writable. `option` names it in the message."""
    target = Path(path).expanduser().absolute()
    if target.exists() and target.is_dir() != folder:
        kind = "a file" if folder else "a folder"
        raise UserError(f"{option} {path} is {kind} - give a {'folder' if folder else 'file'} path")
    for parent in target.parents:
        if not parent.exists():
            continue
        if not parent.is_dir():
            raise UserError(f"{option} {path} is under {parent}, which is a file - give another path")
        writable = target if target.exists() and folder else parent
        if not os.access(writable, os.W_OK | os.X_OK):
            raise UserError(f"{option} {path}: {writable} is not writable - give a path you can write to")
        return
