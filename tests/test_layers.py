"""Imports point down the data flow: data types at the bottom; tasks and rewards below the recipe, the trainer and
the commands; the recipe below the trainer; the engine (sampling, memory levers) below training and eval. Read from
the source (every `import`, lazy ones inside functions too)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "grpo_cli"

# module -> the grpo_cli modules it must never import (each with what is below it); "grpo_cli" alone: none at all
RULES = {
    "grpo_cli.arguments": ("grpo_cli",),  # the standard library only
    "grpo_cli.errors": ("grpo_cli",),
    "grpo_cli.diagnosis": ("grpo_cli",),  # pure: the console and `grpo report` both read it
    "grpo_cli.tasks": ("grpo_cli.recipe", "grpo_cli.train", "grpo_cli.launch", "grpo_cli.eval", "grpo_cli.merge",
                       "grpo_cli.cli", "grpo_cli.report"),
    "grpo_cli.rewards": ("grpo_cli.recipe", "grpo_cli.train", "grpo_cli.launch", "grpo_cli.eval", "grpo_cli.merge",
                         "grpo_cli.cli", "grpo_cli.report"),
    "grpo_cli.recipe": ("grpo_cli.train", "grpo_cli.eval", "grpo_cli.merge", "grpo_cli.cli", "grpo_cli.report"),
    # the speed layer under training and eval: models and tensors in, completions out; no recipe, task or command
    "grpo_cli.engine": ("grpo_cli.train", "grpo_cli.recipe", "grpo_cli.tasks", "grpo_cli.rewards", "grpo_cli.models",
                        "grpo_cli.eval", "grpo_cli.merge", "grpo_cli.cli", "grpo_cli.launch", "grpo_cli.report"),
    "grpo_cli.eval": ("grpo_cli.train", "grpo_cli.cli"),  # it samples through the engine, as training does
}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def imports_of(path: Path, module: str) -> set[str]:
    """Every grpo_cli module the file of `module` imports, at the top or inside functions."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            found.add(".".join(base + ([node.module] if node.module else [])))
    return {name for name in found if name == "grpo_cli" or name.startswith("grpo_cli.")}


def breaks(name: str, forbidden: tuple[str, ...]) -> bool:
    return any(f == "grpo_cli" or name == f or name.startswith(f + ".") for f in forbidden)


def violations() -> set[tuple[str, str]]:
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        for prefix, forbidden in RULES.items():
            if module == prefix or module.startswith(prefix + "."):
                found |= {(module, name) for name in imports_of(path, module) if breaks(name, forbidden)}
    return found


def test_imports_point_down():
    assert violations() == set()


def test_the_reader_sees_lazy_and_relative_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nfrom grpo_cli.errors import UserError\nfrom . import load\n\n"
                     "def f():\n    from grpo_cli.train import run\n")
    assert imports_of(probe, "grpo_cli.recipe.probe") == {"grpo_cli.errors", "grpo_cli.recipe", "grpo_cli.train"}
    assert breaks("grpo_cli.train.run", RULES["grpo_cli.recipe"]) and not breaks("grpo_cli.tasks", RULES["grpo_cli.recipe"])
