"""The recipe key reference of docs/recipes.md, written from what `grpo recipes keys` lists: grpo's own keys
(the dataclasses of `grpo_cli/arguments.py`, through the schema) and the defaults grpo gives TRL's keys.

`python -m grpo_cli.recipe.reference` (`make docs`) rewrites the part of docs/recipes.md between the markers;
tests/test_docs.py fails when that part is not what this module writes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from grpo_cli.arguments import OWN_ARGUMENTS
from grpo_cli.recipe import schema
from grpo_cli.recipe.load import PROJECT_DEFAULTS

DOC = Path(__file__).resolve().parents[2] / "docs" / "recipes.md"
BEGIN = "<!-- keys: written by `make docs` from grpo_cli/arguments.py; edit the dataclasses there -->"
END = "<!-- end of keys -->"
HEADER = ["| key | type | default | commands | meaning |", "| --- | --- | --- | --- | --- |"]


def _value(value: object) -> str:
    """A default as a recipe would write it."""
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _kind(spec: dict) -> str:
    if "choices" in spec:
        return "one of " + ", ".join(f"`{_value(c)}`" for c in spec["choices"])
    return spec["type"] + (f" of {spec['item']}" if "item" in spec else "")


def _row(*cells: str) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def markdown() -> str:
    """grpo's own keys, one table per dataclass of `grpo_cli/arguments.py` in its order, then grpo's defaults
    for TRL's keys."""
    commands = {command: schema.keys(command) for command in schema.COMMANDS}
    lines = [BEGIN, ""]
    for group, cls in OWN_ARGUMENTS.items():
        lines += [f"### {group}", "", " ".join((cls.__doc__ or "").split()), "", *HEADER]
        for key in (f.name for f in dataclasses.fields(cls)):  # in the dataclass's order
            spec = commands["rl"][key]
            in_group = [c for c, keys in commands.items() if keys.get(key, {}).get("group") == group]
            used = ", ".join(f"`{c}`" for c in in_group)
            default = f"`{_value(spec.get('default'))}`"
            lines.append(_row(f"`{key}`", _kind(spec), default, used, spec.get("help", "")))
        lines.append("")
    lines += [
        "### grpo's defaults for TRL's keys",
        "",
        "Where a recipe leaves these TRL keys unset, grpo sets them (`grpo check` says `grpo default`):",
        "",
        "| key | grpo's default |",
        "| --- | --- |",
        *(f"| `{key}` | `{_value(value)}` |" for key, value in PROJECT_DEFAULTS.items()),
        "",
        END,
    ]
    return "\n".join(lines) + "\n"


def updated(text: str) -> str:
    """`text` (docs/recipes.md) with the part between the markers written anew."""
    start, end = text.index(BEGIN), text.index(END) + len(END) + 1
    return text[:start] + markdown() + text[end:]


if __name__ == "__main__":
    DOC.write_text(updated(DOC.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote {DOC}")
