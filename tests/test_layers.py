"""Imports point down the data flow: data types at the bottom; tasks and rewards below the recipe, the trainer and
the commands; the recipe below the trainer; the engine (sampling, memory levers) below training and eval. Read from
the source (every `import`, lazy ones inside functions too). And TRL's private names stay in grpo_cli/trl_private.py,
the one module a TRL upgrade has to read."""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "grpo_cli"

# module -> the grpo_cli modules it must never import (each with what is below it); "grpo_cli" alone: none at all
RULES = {
    "grpo_cli.arguments": ("grpo_cli",),  # the standard library only
    "grpo_cli.trl_private": ("grpo_cli",),  # TRL's private names behind our own: below everything that uses them
    "grpo_cli.errors": ("grpo_cli",),
    "grpo_cli.once": ("grpo_cli",),  # say-it-once messages: the standard library only
    "grpo_cli.problems": ("grpo_cli",),  # the checks' problem type: tasks, the hub and the recipe all return it
    "grpo_cli.diagnosis": ("grpo_cli",),  # pure: the console and `grpo report` both read it
    "grpo_cli.quiet": ("grpo_cli",),  # library noise: imported before the libraries themselves
    # what a run folder holds, and the checks of weights: below the models, training, eval and merge that use them
    "grpo_cli.weights": ("grpo_cli.models", "grpo_cli.demo_model", "grpo_cli.run_folder", "grpo_cli.recipe",
                         "grpo_cli.train", "grpo_cli.eval", "grpo_cli.merge", "grpo_cli.cli", "grpo_cli.report"),
    "grpo_cli.run_folder": ("grpo_cli.models", "grpo_cli.demo_model", "grpo_cli.weights", "grpo_cli.recipe",
                            "grpo_cli.train", "grpo_cli.eval", "grpo_cli.merge", "grpo_cli.cli", "grpo_cli.report"),
    "grpo_cli.demo_model": ("grpo_cli.models", "grpo_cli.recipe", "grpo_cli.train", "grpo_cli.eval",
                            "grpo_cli.merge", "grpo_cli.cli", "grpo_cli.report"),
    "grpo_cli.tasks": ("grpo_cli.recipe", "grpo_cli.train", "grpo_cli.launch", "grpo_cli.eval", "grpo_cli.merge",
                       "grpo_cli.cli", "grpo_cli.report"),
    "grpo_cli.rewards": ("grpo_cli.recipe", "grpo_cli.train", "grpo_cli.launch", "grpo_cli.eval", "grpo_cli.merge",
                         "grpo_cli.cli", "grpo_cli.report"),
    "grpo_cli.recipe": ("grpo_cli.train", "grpo_cli.eval", "grpo_cli.merge", "grpo_cli.cli", "grpo_cli.report"),
    # the speed layer under training and eval: models and tensors in, completions out; no recipe, task or command
    "grpo_cli.engine": ("grpo_cli.train", "grpo_cli.recipe", "grpo_cli.tasks", "grpo_cli.rewards", "grpo_cli.models",
                        "grpo_cli.demo_model", "grpo_cli.run_folder",
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


# ------------------------------------------------------------------------------------------------ TRL's private API

ADAPTER = "grpo_cli.trl_private"  # the one module that uses TRL's private names (tests/test_trl_contract.py)


def _is_private(name: str) -> bool:
    return len(name) > 1 and name.startswith("_") and not name.startswith("__")


def _defined(nodes) -> set[str]:
    """The `_` names code defines: functions, classes, globals and what its methods set on `self`."""
    found = set()
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name):
            if node.value.id == "self":
                found.add(node.attr)
        elif isinstance(node, ast.alias) and node.asname:
            found.add(node.asname)
    return {name for name in found if _is_private(name)}


@functools.cache
def trl_private_names() -> frozenset[str]:
    """Every `_` name the installed TRL defines, and the transformers Trainer its trainers subclass (read from their
    sources, imported by neither)."""
    trl = Path(importlib.util.find_spec("trl").origin).parent
    trainer = Path(importlib.util.find_spec("transformers").origin).parent / "trainer.py"
    names = set()
    for path in [*trl.rglob("*.py"), trainer]:
        names |= _defined(ast.walk(ast.parse(path.read_text(encoding="utf-8"))))
    return frozenset(names)


def private_trl_uses(path: Path, private: frozenset[str]) -> set[str]:
    """Where a module uses TRL's private API: it imports a `_` name from TRL, reads one off a TRL module or class,
    overrides or sets one in a subclass of a TRL class, or names one of TRL's (attribute or string) that it does not
    define itself."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    from_trl, found = set(), set()  # the names bound to TRL's modules and classes; the uses
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported = [(alias.name, alias) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported = [(f"{node.module}.{alias.name}", alias) for alias in node.names]
        else:
            continue
        for dotted, alias in imported:
            if dotted.split(".")[0] == "trl":
                from_trl.add(alias.asname or alias.name.split(".")[0])
                if any(_is_private(part) for part in dotted.split(".")):
                    found.add(f"line {node.lineno}: imports {dotted}")
    subclass_nodes = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(
            isinstance(base, ast.Name) and base.id in from_trl for base in node.bases
        ):
            for inner in ast.walk(node):
                name = getattr(inner, "name", None) if isinstance(inner, ast.FunctionDef) else None
                if isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store):
                    name = inner.attr
                if name in private:
                    found.add(f"line {inner.lineno}: {node.name} overrides or sets TRL's {name}")
                subclass_nodes.add(inner)
    theirs = private - _defined(node for node in ast.walk(tree) if node not in subclass_nodes)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            if node.attr in theirs or (isinstance(node.value, ast.Name) and node.value.id in from_trl):
                found.add(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in theirs:
            found.add(f"line {node.lineno}: {node.value!r}")
    return found


def test_only_the_adapter_uses_trls_private_names():
    private = trl_private_names()
    assert {"_logs", "_tokenize_prompts", "_ChunkedLogProbFunction", "_backward_tile"} <= private  # the reader works
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if module_name(path) != ADAPTER and (uses := private_trl_uses(path, private)):
            found[module_name(path)] = sorted(uses)
    assert found == {}, f"TRL's private names outside {ADAPTER}: reach them through it instead"


def test_the_private_name_reader_sees_imports_overrides_and_strings(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from trl import GRPOTrainer\nfrom trl.trainer.utils import _ChunkedLogProbFunction\n"
        "from trl.kernels import chunked_logprob as k\n\n"
        "def _own():\n    return k._anything\n\n"
        "class T(GRPOTrainer):\n    def _generate(self, prompts):\n        self._mine = 1\n        return self._logs\n\n"
        "class Other:\n    def _own_method(self):\n        return getattr(self, '_is_vlm', None), self._own_method\n"
    )
    uses = private_trl_uses(probe, frozenset({"_ChunkedLogProbFunction", "_generate", "_logs", "_is_vlm", "_own"}))
    assert uses == {
        "line 2: imports trl.trainer.utils._ChunkedLogProbFunction",
        "line 6: ._anything",
        "line 9: T overrides or sets TRL's _generate",
        "line 11: ._logs",
        "line 15: '_is_vlm'",
    }
