"""Which keys a recipe may hold, with their types and choices.

The keys come from TRL's `ModelConfig`, `GRPOConfig` / `SFTConfig` and our own dataclasses. Importing TRL costs
seconds (it imports torch), so the schema is read once from the installed TRL and kept in `schema.json`; it is read
live again whenever the installed trl or transformers version differs from the one recorded there.
`python -m grpo_cli.recipe.schema` rewrites the file.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path

from grpo_cli.arguments import OWN_ARGUMENTS

SNAPSHOT = Path(__file__).with_name("schema.json")
COMMANDS = ("rl", "sft")

# Keys that old tutorials use and TRL 1.x removed or renamed: key -> what to use instead.
RENAMED = {
    "max_prompt_length": "removed in TRL 1.x: GRPOTrainer no longer truncates prompts; delete the key "
    "(the task's prompts are short) or shorten `system_prompt`",
    "vllm_device": "removed in TRL 1.x: use `use_vllm: true` with `vllm_mode: colocate` (same GPUs) or "
    "`vllm_mode: server` (a separate `trl vllm-serve` process, see `vllm_server_host`)",
    "torch_dtype": "renamed to `dtype` in TRL 1.x (without it the model loads in float32)",
    "max_seq_length": "renamed to `max_length` in TRL 1.x",
    "use_liger_loss": "removed in TRL 1.x: use `use_liger_kernel: true`",
    "warmup_ratio": "removed in transformers 5: use `warmup_steps` (a value below 1 is a share of the steps, "
    "e.g. `warmup_steps: 0.03`)",
}


# Choices TRL checks only deep inside the trainer (or not at all): checked here before anything loads.
RL_CHOICES = {
    "loss_type": ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"],
    "importance_sampling_level": ["token", "sequence"],
    "scale_rewards": ["group", "batch", "none", True, False],
    "vllm_mode": ["server", "colocate"],
    "multi_objective_aggregation": ["sum_then_normalize", "normalize_then_sum"],
}


def _versions() -> dict[str, str]:
    return {"trl": version("trl"), "transformers": version("transformers")}


def _field_spec(tp: object, meta: dict) -> dict:
    """Reduce a dataclass field's annotation to {type, item?, optional, choices?}."""
    spec: dict = {"optional": False}
    choices = meta.get("choices")
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        spec["optional"] = len(args) < len(typing.get_args(tp))
        enums = [a for a in args if isinstance(a, type) and issubclass(a, enum.Enum)]
        literals = [a for a in args if typing.get_origin(a) is typing.Literal]
        if enums:
            choices = choices or [e.value for e in enums[0]]
        if literals:
            choices = choices or list(typing.get_args(literals[0]))
        plain = [a for a in args if a not in enums and a not in literals]
        if enums or literals:
            plain = [a for a in plain if a is not str]
            tp = plain[0] if len(plain) == 1 and choices is None else (str if not plain else object)
        elif len(args) == 1:
            tp = args[0]
        else:
            kinds = {_field_spec(a, {})["type"] for a in args}
            tp = {frozenset({"int", "float"}): float}.get(frozenset(kinds), object)
        origin = typing.get_origin(tp)
    if origin is typing.Literal:
        choices = list(typing.get_args(tp))
        tp = type(choices[0])
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        choices = [e.value for e in tp]
        tp = str
    if origin in (list, tuple) or tp in (list, tuple):
        spec["type"] = "list"
        item = (typing.get_args(tp) or [object])[0]
        spec["item"] = {bool: "bool", int: "int", float: "float", str: "str"}.get(item, "any")
    elif origin is dict or tp is dict:
        spec["type"] = "dict"
    else:
        spec["type"] = {bool: "bool", int: "int", float: "float", str: "str"}.get(tp, "any")
    if choices is not None:
        spec["choices"] = [c.value if isinstance(c, enum.Enum) else c for c in choices]
    return spec


def _fields(cls: type) -> dict[str, dict]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        spec = _field_spec(hints.get(f.name, object), dict(f.metadata))
        spec["help"] = " ".join(str(f.metadata.get("help", "")).split())[:300]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if isinstance(default, enum.Enum):
            default = default.value
        if default is None or isinstance(default, (bool, int, float, str, list, dict)):
            spec["default"] = default
        out[f.name] = spec
    return out


def read_live() -> dict:
    """Introspect the installed TRL (slow: imports torch)."""
    from trl import GRPOConfig, ModelConfig, SFTConfig

    model = _fields(ModelConfig)
    own = {group: _fields(cls) for group, cls in OWN_ARGUMENTS.items()}
    commands = {}
    for command, config in (("rl", GRPOConfig), ("sft", SFTConfig)):
        groups = {
            "model": model,
            "training": _fields(config),
            "task": own["task"],
            "hub": own["hub"],
            "tracking": own["tracking"],
            "kernels": own["kernels"],
            "health": own["health"],
        }
        if command == "rl":
            groups["reward"] = own["reward"]
            groups["memory"] = own["memory"]  # for sft, SFTConfig has the same key
            groups["sampling"] = own["sampling"]
            groups["rollout"] = own["rollout"]
            for name, choices in RL_CHOICES.items():
                groups["training"][name]["choices"] = choices
        keys: dict[str, dict] = {}
        for group, fields in groups.items():
            for name, spec in fields.items():
                keys.setdefault(name, dict(spec, group=group))
        commands[command] = keys
    return {"versions": _versions(), "commands": commands}


@lru_cache(maxsize=1)
def load_schema() -> dict:
    """The schema of the installed TRL: the snapshot when its versions match, else read live."""
    if SNAPSHOT.exists():
        snapshot = json.loads(SNAPSHOT.read_text())
        if snapshot.get("versions") == _versions():
            return snapshot
    return read_live()


def keys(command: str) -> dict[str, dict]:
    """All keys a recipe for `command` ("rl" or "sft") may hold."""
    return load_schema()["commands"][command]


def write_snapshot() -> Path:
    schema = read_live()
    tmp = SNAPSHOT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    tmp.replace(SNAPSHOT)
    return SNAPSHOT


if __name__ == "__main__":
    print(f"wrote {write_snapshot()}")
