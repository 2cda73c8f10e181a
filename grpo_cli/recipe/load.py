"""Read a recipe: YAML file + command-line overrides -> typed values, each remembering where it came from.

A recipe is one flat YAML mapping, as TrlParser reads it: keys of `trl.ModelConfig`, of `GRPOConfig` (for `grpo rl`)
or `SFTConfig` (for `grpo sft`), and of grpo's own dataclasses, plus an optional `env:` mapping of environment
variables. Keys given after the recipe on the command line (`--learning_rate 1e-6`) override the file.
Every problem found is collected and reported at once. The machine's defaults (`grpo_cli.recipe.hardware`) are
decided as the recipe is loaded; from then on it is read-only, and what `grpo check` prints is what runs.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from grpo_cli.arguments import (
    HealthArguments,
    KernelArguments,
    MemoryArguments,
    RewardArguments,
    RolloutArguments,
    SamplingArguments,
    TaskArguments,
    TrackingArguments,
)
from grpo_cli.errors import UserError
from grpo_cli.hub import SOURCE_VARIABLE
from grpo_cli.problems import Problem, listing
from grpo_cli.recipe import schema
from grpo_cli.recipe.hardware import Hardware, detect_hardware, hardware_defaults

COMMAND_NAMES = {"rl": "grpo rl", "sft": "grpo sft"}
TRUE, FALSE = {"true", "yes", "1", "on"}, {"false", "no", "0", "off"}

# Defaults grpo uses where TRL's own do not suit a command-line tool; a recipe or override always wins.
PROJECT_DEFAULTS = {
    "report_to": "none",  # tracking goes through our own SwanLab integration (`swanlab: true`)
    "logging_steps": 1,
    "save_strategy": "steps",
    "save_steps": 50,
    "save_total_limit": 3,
    "disable_tqdm": True,  # grpo draws its own progress bar
    "log_completions": False,  # grpo prints sample completions itself
}
PROJECT_SOURCE = "grpo default"


@dataclass(frozen=True)
class Recipe:
    """A loaded recipe: values set by the file, the command line, grpo's defaults and the machine's, and where each
    came from (`where`). Read-only: values and locations are read-only mappings, and no field can be set again."""

    command: str
    path: Path | None
    values: Mapping[str, Any]
    locations: Mapping[str, str]
    env: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    hardware: Hardware | None = None  # the machine its defaults were decided for
    lines: Mapping[str, int] = field(default_factory=dict)  # the recipe file's line of each key whose value it set

    def __post_init__(self):
        for name in ("values", "locations", "env", "lines"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        object.__setattr__(self, "warnings", tuple(self.warnings))

    @property
    def name(self) -> str:
        return self.path.stem if self.path else "recipe"

    @property
    def folder(self) -> str | None:
        """Where relative `file.py:function` reward paths are looked for when the working directory has no such file:
        the recipe file's folder (every command resolves them the same way)."""
        return str(self.path.parent) if self.path else None

    def resolved(self) -> dict[str, Any]:
        """Every key's value: set by the recipe, or the library's default."""
        defaults = {key: spec.get("default") for key, spec in schema.keys(self.command).items()}
        return {**defaults, **self.values}

    def where(self, key: str) -> str:
        """Where the key's value came from: `file:line`, `command line`, `grpo default`, `hardware default (why)`,
        or `default` (the library's own)."""
        return self.locations.get(key, "default")

    def _build(self, cls: type, **extra: Any) -> Any:
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        # copies: what a config does with a list it was given stays out of the recipe
        return cls(**{k: copy.deepcopy(v) for k, v in self.values.items() if k in names}, **extra)

    @property
    def task(self) -> TaskArguments:
        return self._build(TaskArguments)

    @property
    def reward(self) -> RewardArguments:
        return self._build(RewardArguments)

    @property
    def tracking(self) -> TrackingArguments:
        return self._build(TrackingArguments)

    @property
    def memory(self) -> MemoryArguments:
        return self._build(MemoryArguments)

    @property
    def kernels(self) -> KernelArguments:
        return self._build(KernelArguments)

    @property
    def health(self) -> HealthArguments:
        return self._build(HealthArguments)

    @property
    def sampling(self) -> SamplingArguments:
        return self._build(SamplingArguments)

    @property
    def rollout(self) -> RolloutArguments:
        return self._build(RolloutArguments)

    def model_config(self):
        """TRL's ModelConfig for this recipe (imports trl)."""
        from trl import ModelConfig

        return self._build(ModelConfig)

    def training_config(self):
        """TRL's GRPOConfig or SFTConfig for this recipe (imports trl)."""
        from trl import GRPOConfig, SFTConfig

        return self._build(GRPOConfig if self.command == "rl" else SFTConfig)

    def apply_env(self) -> None:
        """Set the recipe's `env:` section in the environment, as TrlParser does, and its `model_source`, which every
        look-up of a Hub id reads from there (`grpo_cli.hub`)."""
        os.environ.update(self.env)
        if self.values.get("model_source"):
            os.environ[SOURCE_VARIABLE] = self.values["model_source"]

    def to_yaml(self) -> str:
        """The resolved recipe as YAML (what a rerun with the same settings needs)."""
        doc = dict(sorted(self.values.items()))
        if self.env:
            doc["env"] = dict(self.env)
        return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def recipe_dirs() -> list[Path]:
    """Where built-in recipes live: inside an installed wheel, or at the top of a source checkout."""
    package = Path(__file__).resolve().parent.parent
    return [d for d in (package / "_recipes", package.parent / "recipes") if d.is_dir()]


def builtin_recipes() -> dict[str, Path]:
    """Built-in recipes by name (`countdown`, `demo/countdown-rl`, ...)."""
    found: dict[str, Path] = {}
    for root in recipe_dirs():
        for path in sorted(root.rglob("*.yaml")):
            found.setdefault(path.relative_to(root).with_suffix("").as_posix(), path)
    return found


def find_recipe(path_or_name: str) -> Path:
    """A recipe file path, or the name of a built-in recipe."""
    path = Path(path_or_name).expanduser()
    try:
        if path.is_file():
            return path
        if path.is_dir():
            raise UserError(f"{path_or_name} is a folder - give a recipe's YAML file, e.g. {path_or_name}/recipe.yaml")
    except OSError as err:
        raise UserError(f"recipe {path_or_name[:80]}...: {err.strerror} - give a shorter path") from None
    builtin = builtin_recipes()
    if path_or_name in builtin:
        return builtin[path_or_name]
    hint = difflib.get_close_matches(path_or_name, list(builtin), n=1)
    suggestion = f"did you mean `{hint[0]}`? " if hint else ""
    raise UserError(
        f"recipe not found: {path_or_name} - {suggestion}give a YAML file path or a built-in name (`grpo recipes list`)"
    )


YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the same safe loader, in C where libyaml is there
MAX_RECIPE_BYTES = 1 << 20  # a recipe is a page of keys; a file this large is something else


def recipe_text(path: Path) -> str:
    """A recipe file's text; one clear problem when it is not readable UTF-8 text of a recipe's size."""
    try:
        size = path.stat().st_size
        if size > MAX_RECIPE_BYTES:
            raise UserError(
                f"{path}: {size / 2**20:.1f} MiB is not a recipe (a short YAML file of `key: value` lines, "
                f"at most {MAX_RECIPE_BYTES // 2**20} MiB) - is it a dataset? Datasets go in `dataset_name`"
            )
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        line = err.object[: err.start].count(b"\n") + 1
        raise UserError(
            f"{path}:{line}: not UTF-8 text (byte 0x{err.object[err.start]:02x}) - a recipe is a YAML text file; "
            "save it as UTF-8"
        ) from None
    except OSError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror})") from None


MAX_YAML_VALUES = 100_000  # values a recipe's YAML may expand to, aliases counted each time they are used


def _expanded_size(node, sizes: dict) -> int:
    """How many values `node` holds once every alias is expanded (each distinct node sized once: an alias bomb of a
    few lines is sized in as many steps, not in the 10^9 values it would build)."""
    if id(node) in sizes:
        return sizes[id(node)]
    sizes[id(node)] = 1  # a node that holds itself counts once
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(child, sizes) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, sizes) + _expanded_size(v, sizes) for k, v in node.value)
    else:
        size = 1
    sizes[id(node)] = size
    return size


def _read_yaml(path: Path) -> tuple[dict, dict[str, int], list[Problem]]:
    """Top-level mapping of a YAML file, the line of each key, and problems (duplicates)."""
    text = recipe_text(path)
    loader = YAML_LOADER(text)  # the safe loader (libyaml's where it is built); the text is parsed once
    try:
        node = loader.get_single_node()  # the key nodes hold their lines
        if node is not None and _expanded_size(node, {}) > MAX_YAML_VALUES:
            raise UserError(
                f"{path}: its aliases (`*name`) expand to more than {MAX_YAML_VALUES:,} values - a recipe holds "
                "flat `key: value` lines; write the values out"
            )
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"{path}{line}: not valid YAML ({problem}) - fix the syntax") from None
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to read - a recipe holds flat `key: value` lines") from None
    finally:
        loader.dispose()
    if data is None:
        return {}, {}, []
    if not isinstance(data, dict) or not isinstance(node, yaml.MappingNode):
        raise UserError(f"{path}:1: a recipe is a mapping of `key: value` lines - found a {type(data).__name__}")
    lines: dict[str, int] = {}
    problems = []
    for key_node, _ in node.value:
        key = str(key_node.value)
        line = key_node.start_mark.line + 1
        if key in lines:
            twice = f"`{key}` is set twice (first on line {lines[key]}) - keep one"
            problems.append(Problem(key, twice, f"{path}:{line}", line))
        lines[key] = line
    return {str(k): v for k, v in data.items()}, lines, problems


def _split_overrides(tokens: list[str]) -> tuple[list[tuple[str, list[str]]], list[Problem]]:
    """`--key value`, `--key=value`, `--flag`, `--key v1 v2` -> [(key, [values])]."""
    pairs: list[tuple[str, list[str]]] = []
    problems = []
    for token in tokens:
        if token.startswith("--") and len(token) > 2:
            key, eq, value = token[2:].partition("=")
            pairs.append((key.replace("-", "_"), [value] if eq else []))
        elif pairs:
            pairs[-1][1].append(token)
        else:
            text = f"`{token}` is not an option - overrides look like `--learning_rate 1e-6`"
            problems.append(Problem(None, text, "command line"))
    return pairs, problems


def _convert_text(text: str, kind: str) -> Any:
    """A command-line string as the key's type (raises ValueError)."""
    if kind == "bool":
        low = text.lower()
        if low in TRUE | FALSE:
            return low in TRUE
        raise ValueError
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "str":
        return None if text.lower() in ("none", "null") else text
    return yaml.safe_load(text)


def _override_value(key: str, spec: dict, texts: list[str]) -> Any:
    kind = spec["type"]
    if kind == "bool" and not texts:
        return True
    if not texts:
        raise ValueError
    if kind == "list":
        if len(texts) == 1 and texts[0].lstrip().startswith("["):
            return yaml.safe_load(texts[0])
        return [_convert_text(t, spec.get("item", "any")) for t in texts]
    if len(texts) > 1:
        raise ValueError
    return _convert_text(texts[0], kind)


def _type_name(spec: dict) -> str:
    if spec["type"] == "list":
        return f"a list of {spec.get('item', 'any')}"
    return {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string", "dict": "a mapping"}.get(
        spec["type"], "a value"
    )


def coerce(value: Any, spec: dict) -> Any:
    """Check a value against its key's spec; returns it converted (e.g. YAML's string `1e-6` -> float), or raises
    ValueError with what was expected."""
    choices = spec.get("choices")
    if value is None:
        return None
    if choices is not None and value in choices:
        return value
    kind = spec["type"]
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "float" and not isinstance(value, bool):
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    if kind == "str" and choices is None and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    if kind == "list":
        items = value if isinstance(value, list) else [value]
        item_spec = {"type": spec.get("item", "any")}
        return [coerce(item, item_spec) for item in items]
    if kind == "dict" and isinstance(value, dict):
        return value
    if kind == "any":
        return value
    if choices is not None:
        raise ValueError("one of " + ", ".join(str(c) for c in choices))
    raise ValueError(_type_name(spec))


# Keys TRL types as optional whose null no run can use: a recipe must give them a value or leave them out.
NEEDS_A_VALUE = frozenset({"model_name_or_path", "output_dir", "num_generations", "max_completion_length", "task"})


def _shown_default(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


MAX_UNKNOWN_KEYS = 20  # named one by one; more are counted


def _unknown_key_problem(key: str, command: str) -> str:
    if key in schema.RENAMED:
        return f"`{key}` was {schema.RENAMED[key]}"
    other = "sft" if command == "rl" else "rl"
    if key in schema.keys(other):
        return (
            f"`{key}` is a `{COMMAND_NAMES[other]}` key, not a `{COMMAND_NAMES[command]}` one - "
            f"remove it, or run the recipe with `{COMMAND_NAMES[other]}`"
        )
    close = difflib.get_close_matches(key, list(schema.keys(command)), n=1, cutoff=0.75)
    hint = f"did you mean `{close[0]}`?" if close else f"`grpo recipes keys {command}` lists them"
    return f"unknown key `{key}` - {hint}"


def command_of(keys) -> str:
    """`sft` when a recipe's keys hold more SFT-only keys than GRPO-only keys, else `rl`."""
    rl, sft = set(schema.keys("rl")), set(schema.keys("sft"))
    keys = set(keys)
    return "sft" if len(keys & (sft - rl)) > len(keys & (rl - sft)) else "rl"


def load_recipe(
    path_or_name: str | None,
    overrides: list[str] | None = None,
    command: str | None = "rl",
    hardware: Hardware | None = None,
) -> Recipe:
    """Load and type-check a recipe (no model, no dataset) with the defaults of `hardware` (default: this machine);
    `command` None: the one its keys suggest (`command_of`). Raises UserError listing every problem found."""
    recipe, problems = read_recipe(path_or_name, overrides, command, hardware)
    if problems:
        raise UserError(*listing(problems))
    return recipe


def read_recipe(
    path_or_name: str | None,
    overrides: list[str] | None = None,
    command: str | None = "rl",
    hardware: Hardware | None = None,
) -> tuple[Recipe, list[Problem]]:
    """Load a recipe, keeping the keys that are valid, with the defaults of `hardware` (default: this machine, as
    `detect_hardware` sees it); returns it with the problems of the others. `command` None: the one the recipe's
    keys suggest. Each problem says where it is (an unknown key has no place in the recipe's locations)."""
    if command is not None and command not in schema.COMMANDS:
        raise ValueError(f"unknown command {command!r}")
    problems: list[Problem] = []
    raw: dict[str, Any] = {}
    locations: dict[str, str] = {}
    lines: dict[str, int] = {}  # the recipe file's line of each key it sets
    env: dict[str, str] = {}
    path = None
    data: dict[str, Any] = {}
    if path_or_name:
        path = find_recipe(path_or_name)
        data, lines, problems = _read_yaml(path)
    command = command or command_of(data)
    keys = schema.keys(command)
    if path_or_name:
        env_section = data.pop("env", None) or {}
        env_line = lines.pop("env", 1)
        if not isinstance(env_section, dict):
            problems.append(Problem("env", "`env` must be a mapping of NAME: value", f"{path}:{env_line}", env_line))
        else:
            for name, value in env_section.items():
                if isinstance(value, bool):
                    value = str(value).lower()  # `on: true` means what a shell would read: true
                if not isinstance(value, (str, int, float)):
                    shown = "null" if value is None else type(value).__name__
                    problems.append(Problem(
                        "env",
                        f"`env` {name}: {shown} is not a value an environment variable can hold - give a string or "
                        'a number (quote it, e.g. "")',
                        f"{path}:{env_line}",
                        env_line,
                    ))
                    continue
                env[str(name)] = str(value)
        for key, value in data.items():
            raw[key] = value
            lines.setdefault(key, 1)
            locations[key] = f"{path}:{lines[key]}"
    pairs, cli_problems = _split_overrides(list(overrides or []))
    problems += cli_problems
    for key, texts in pairs:
        where = f"command line `--{key}`"
        if key not in keys:
            problems.append(Problem(key, _unknown_key_problem(key, command), where))
            continue
        try:
            raw[key] = _override_value(key, keys[key], texts)
        except (ValueError, yaml.YAMLError):
            expected = f"expected {_type_name(keys[key])}, got {' '.join(texts) or 'nothing'}"
            problems.append(Problem(key, expected, where))
            continue
        locations[key] = "command line"
        lines.pop(key, None)

    values: dict[str, Any] = {}
    unknown = 0
    for key, value in raw.items():
        where = locations[key] if locations[key] != "command line" else f"command line `--{key}`"
        if key not in keys:
            unknown += 1
            if unknown <= MAX_UNKNOWN_KEYS:  # named with a suggestion each; past that, counted
                problems.append(Problem(key, _unknown_key_problem(key, command), where, lines.get(key)))
            continue
        if value is None and (not keys[key].get("optional") or key in NEEDS_A_VALUE):
            default = keys[key].get("default")
            fix = "" if default is None else f", or remove the line for the default ({_shown_default(default)})"
            problem = f"`{key}` has no value (null) - give {_type_name(keys[key])}{fix}"
            problems.append(Problem(key, problem, where, lines.get(key)))
            continue
        try:
            values[key] = coerce(value, keys[key])
        except ValueError as err:
            problems.append(Problem(key, f"`{key}` must be {err}, got {value!r}", where, lines.get(key)))

    if unknown > MAX_UNKNOWN_KEYS:
        problems.append(Problem(None, f"... and {unknown - MAX_UNKNOWN_KEYS} more unknown keys", str(path or "recipe")))
    for key, value in PROJECT_DEFAULTS.items():
        if key in keys and key not in values:
            values[key] = value
            locations[key] = PROJECT_SOURCE
    if "output_dir" not in values:
        values["output_dir"] = str(Path("outputs") / (path.stem if path else "run"))
        locations["output_dir"] = PROJECT_SOURCE
    if hardware is None:
        hardware = detect_hardware()
    chosen, notes = hardware_defaults(command, values, hardware, env)
    for key, (value, why) in chosen.items():
        values[key] = value
        locations[key] = f"hardware default ({why})"
        lines.pop(key, None)
    lines = {key: line for key, line in lines.items() if key in values}
    problems += _unread_override_problems(values, locations, keys)
    recipe = Recipe(command, path, values, locations, env, tuple(notes), hardware, lines)
    return recipe, problems


# Keys given on the command line that another key of the recipe leaves unread: (the keys, the other key, whether it
# does with the run's values, what the run does instead, how to read them).
LORA_KEYS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_target_parameters",
             "lora_modules_to_save", "use_rslora", "use_dora")  # fmt: skip
UNREAD_WITH = (
    (("dataset_name",), "dataset_generate", lambda v: (v.get("dataset_generate") or 0) > 0,
     "the recipe generates its rows", "add `--dataset_generate 0` to train on it"),
    (("num_train_epochs",), "max_steps", lambda v: (v.get("max_steps") or -1) > 0,
     "the run stops at `max_steps`", "add `--max_steps -1` to train by epochs"),
    (LORA_KEYS, "use_peft", lambda v: not v.get("use_peft"),
     "the recipe trains every weight, with no LoRA adapter", "add `--use_peft true` to train one"),
)  # fmt: skip


def _unread_override_problems(
    values: Mapping[str, Any], locations: Mapping[str, str], specs: Mapping[str, dict]
) -> list[Problem]:
    """Keys given on the command line that the recipe's other keys leave unread (`UNREAD_WITH`): a run would go on
    without them. Not where the other key is on the command line too: both were asked for."""
    problems = []
    for keys, other, unread, instead, fix in UNREAD_WITH:
        if other not in specs or locations.get(other) == "command line" or not unread(values):
            continue
        shown = _shown_default(values.get(other, specs[other].get("default")))
        for key in keys:
            if locations.get(key) == "command line":
                problems.append(Problem(
                    key,
                    f"not read: {instead} (`{other}: {shown}`, {locations.get(other, 'default')}) - {fix}",
                    f"command line `--{key}`",
                ))
    return problems
