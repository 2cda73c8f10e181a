"""Who holds GPU memory: allocations grouped by the line of code that made them, from torch's memory history.

`grpo_bench.py --memory CONFIG` records a configuration's allocations from its start (torch's
`torch.cuda.memory._record_memory_history`, Python stacks) and writes, beside the JSON, what is allocated between
two optimizer steps and at the peak of the last step, each grouped by allocation site. The functions here read
torch's snapshot dictionaries; they need no GPU.
"""

from __future__ import annotations

from collections import defaultdict

# Frames inside these are how an allocation happened, not who asked for it.
_MACHINERY = ("/torch/", "/contextlib.py", "/functools.py", "/threading.py", "<frozen ")
# The first frame in these says which part of a step an allocation belongs to.
_CALLERS = ("/grpo_cli/", "/trl/", "/accelerate/", "/transformers/trainer", "/peft/", "/liger_kernel/")


def _short(frame: dict) -> str:
    name = frame.get("filename", "?")
    if "site-packages/" in name:
        name = name.split("site-packages/", 1)[1]
    else:
        for package in ("grpo_cli", "benchmarks"):
            if f"/{package}/" in name:
                name = package + "/" + name.split(f"/{package}/", 1)[1]
                break
    return f"{name}:{frame.get('line', '?')} {frame.get('name', '')}".strip()


def site(frames: list[dict]) -> str:
    """Where an allocation was asked for: the innermost frame outside torch's machinery, and the first frame of
    the training code that led there (`site <- caller`)."""
    if not frames:
        return "(no Python stack: allocated before recording, or by C++ alone)"
    inner = next((f for f in frames if not any(m in f.get("filename", "") for m in _MACHINERY)), frames[0])
    caller = next((f for f in frames if any(m in f.get("filename", "") for m in _CALLERS)), None)
    where = _short(inner)
    if caller is not None and caller is not inner:
        where += " <- " + _short(caller)
    return where


def _grouped(items, top: int) -> list[dict]:
    sizes: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for where, size in items:
        sizes[where][0] += size
        sizes[where][1] += 1
    ranked = sorted(sizes.items(), key=lambda kv: -kv[1][0])
    rows = [{"where": w, "gib": b / 2**30, "count": n} for w, (b, n) in ranked[:top]]
    rest = ranked[top:]
    if rest:
        rows.append(
            {
                "where": f"({len(rest)} other sites)",
                "gib": sum(b for _, (b, _) in rest) / 2**30,
                "count": sum(n for _, (_, n) in rest),
            }
        )
    return rows


def live_blocks(snapshot: dict, top: int = 15) -> dict:
    """Allocated blocks of a snapshot (`torch.cuda.memory._snapshot()`), grouped by site."""
    items = [
        (site(block.get("frames", [])), block["size"])
        for segment in snapshot.get("segments", [])
        for block in segment.get("blocks", [])
        if block.get("state") == "active_allocated"
    ]
    return {"allocated_gib": sum(s for _, s in items) / 2**30, "sites": _grouped(items, top)}


def _replay(trace: list[dict]):
    """Yield, after each allocation or free, its index, the bytes then allocated and the live allocations
    (address -> (size, event); the same dict throughout, updated in place)."""
    live: dict[int, tuple[int, dict]] = {}
    total = 0
    for index, event in enumerate(trace):
        action = event.get("action")
        if action == "alloc":
            live[event["addr"]] = (event["size"], event)
            total += event["size"]
        elif action == "free_completed" and event["addr"] in live:
            total -= live.pop(event["addr"])[0]
        yield index, total, live


def peak(trace: list[dict], start: int = 0, top: int = 15) -> dict:
    """Replay a device trace (allocations and frees since recording began) and group what was allocated at the
    highest point reached at or after event `start`."""
    best, at = 0, -1
    for index, total, _ in _replay(trace):
        if index >= start and total > best:
            best, at = total, index
    live: dict = {}
    for index, _, live in _replay(trace[: at + 1]):  # again, up to the peak: what was live there
        pass
    items = [(site(event.get("frames", [])), size) for size, event in live.values()]
    return {"peak_gib": best / 2**30, "sites": _grouped(items, top)}
