"""What `grpo check` and `grpo recipes` print: plans, recipe lists and key tables, for people (stderr)."""

from __future__ import annotations

from pathlib import Path

import yaml
from rich.table import Table

from grpo_cli.console import console, escape, output
from grpo_cli.errors import UserError
from grpo_cli.recipe import schema
from grpo_cli.recipe.check import Plan, check_recipe
from grpo_cli.recipe.load import (
    YAML_LOADER,
    Recipe,
    builtin_recipes,
    command_of,
    find_recipe,
    read_recipe,
    recipe_text,
)


def description(path: Path) -> str:
    """A recipe's description: its first comment line."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
        if line.strip():
            break
    return ""


def guess_command(path_or_name: str) -> str:
    """The command a recipe file's keys suggest (`command_of`), for the list of recipes."""
    try:
        data = yaml.load(recipe_text(find_recipe(path_or_name)), Loader=YAML_LOADER)
    except (yaml.YAMLError, RecursionError, UserError):
        return "rl"  # loading the recipe as `rl` says what is wrong with it
    return command_of(data) if isinstance(data, dict) else "rl"


def print_recipe_list() -> None:
    table = Table(title="Built-in recipes", title_justify="left")
    table.add_column("name", style="bold cyan")
    table.add_column("command")
    table.add_column("description")
    for name, path in builtin_recipes().items():
        table.add_row(name, f"grpo {guess_command(str(path))}", description(path))
    output.print(table)
    console.print("Run one with `grpo rl --config NAME`; copy one with `grpo recipes show NAME > my.yaml`.")


def print_keys(command: str, search: str | None) -> None:
    if command not in schema.COMMANDS:
        raise UserError(f"unknown command `{command}` - use rl or sft")
    table = Table(title=f"Recipe keys of grpo {command}", title_justify="left")
    table.add_column("key", no_wrap=True)  # whole key names, for grep
    for column in ("from", "type", "default", "help"):
        table.add_column(column, overflow="fold")
    for key, spec in sorted(schema.keys(command).items(), key=lambda kv: (kv[1]["group"], kv[0])):
        if search and search not in key:
            continue
        kind = spec["type"] + (f" of {spec['item']}" if "item" in spec else "")
        if "choices" in spec:
            kind = " | ".join(map(str, spec["choices"][:8])) + (" | ..." if len(spec["choices"]) > 8 else "")
        text = spec.get("help", "")
        if not search and len(text) > 120:  # the whole list stays compact; a search shows the key's whole help
            text = text[:120].rsplit(" ", 1)[0] + " ..."
        table.add_row(key, spec["group"], kind, repr(spec.get("default")), text)
    output.print(table)


def print_plan(recipe: Recipe, plan: Plan) -> None:
    """The plan as a table: what, its value, and where the value came from (file:line, command line, grpo's or the
    machine's default, or the library's `default`)."""
    table = Table(title=f"Plan: {escape(recipe.name)}", title_justify="left")
    table.add_column("", style="bold")
    table.add_column("value", overflow="fold")
    table.add_column("from", overflow="fold", style="dim")
    for what, value in plan.rows:
        table.add_row(what, escape(value), escape(plan.sources.get(what, "")))  # paths and text, never markup
    output.print(table)
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)


def check_and_show(
    config: str | None,
    overrides: list[str],
    command: str | None,
    num_processes: int | None = None,
    accelerate_config: str | None = None,
    show: bool = True,
    predict_memory: bool = False,
    gpu: str | None = None,
    gpu_memory: float | None = None,
) -> tuple[Recipe, Plan]:
    """Load a recipe with this machine's defaults for the run's processes and accelerate config, check it, print its
    plan (what the run will use) and, with `predict_memory`, the predicted peak memory and step time of a `grpo rl`
    run on the card `gpu` or `gpu_memory` names (else this machine's); raises UserError with every problem found."""
    from grpo_cli.launch import load_accelerate_config
    from grpo_cli.launch import num_processes as count_processes
    from grpo_cli.recipe.hardware import detect_hardware

    if command is not None and command not in schema.COMMANDS:
        raise UserError(f"--command {command} is not a training command - use {' or '.join(schema.COMMANDS)}")
    processes = count_processes(accelerate_config, num_processes)
    launch_config = load_accelerate_config(accelerate_config)
    recipe, problems = read_recipe(config, overrides, command, detect_hardware(processes, launch_config))
    plan = check_recipe(recipe, processes, launch_config, problems)
    if show:
        print_plan(recipe, plan)
    if predict_memory:
        show_memory_plan(recipe, processes, launch_config, gpu, gpu_memory)
    return recipe, plan


def show_memory_plan(
    recipe: Recipe, processes: int, launch_config: dict | None, gpu: str | None, gpu_memory: float | None
) -> None:
    """The predicted peak GPU memory per process, split by part, the verdict on the card, and the changes that would
    fit a run that does not; one line instead where nothing can be predicted."""
    from grpo_cli.engine.estimate import GIB
    from grpo_cli.recipe.memory import PROMPT_TOKENS, card_for, memory_plan

    card = card_for(gpu, gpu_memory)  # a bad --gpu is the user's mistake: exit 2
    if recipe.command != "rl":
        console.print("memory: predicted for `grpo rl` recipes only")
        return
    if card is None:
        console.print("memory: no GPU here - `--gpu NAME` or `--gpu-memory GIB` predicts the peak for a card")
        return
    try:
        mp = memory_plan(recipe, processes, launch_config, card)
    except UserError as err:
        console.print(f"[yellow]memory: not predicted:[/] {escape(str(err))}", soft_wrap=True)
        return
    result = mp.estimate
    table = Table(
        title=f"Predicted GPU memory per process, {escape(card.name)} ({card.memory_gib:.1f} GiB)",
        title_justify="left",
    )
    table.add_column("part")
    table.add_column("GiB", justify="right")
    for part, size in result.parts.items():
        table.add_row(part, f"{size / GIB:.2f}")
    table.add_row(f"peak, {result.peak_moment}", f"{result.peak / GIB:.2f}", style="bold")
    output.print(table)
    run = mp.shape
    def seconds(value: float) -> str:
        return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"

    output.print(
        f"step: about {seconds(result.step_s)} ({seconds(result.generation_s)} sampling {run.rollout_rows} completions "
        f"of up to {run.completion_tokens} tokens, {seconds(result.train_s)} forward/backward), prompts of "
        f"{PROMPT_TOKENS} tokens assumed; the model's config.json read, nothing loaded",
        soft_wrap=True,
    )
    peak, memory = result.peak / GIB, card.memory_gib
    if mp.parts > 1:
        output.print(
            f"sampled in {mp.parts} parts of {mp.part_rows} completions: the cache of all {run.rollout_rows} at once "
            "would not fit (the same completions, longer steps)",
            soft_wrap=True,
        )
    if mp.verdict == "fits":
        output.print(f"[green]fits[/]: {peak:.1f} GiB of {memory:.1f}")
        if mp.larger:
            what, after = mp.larger
            output.print(
                f"  fits too with {escape(what)}: {after.peak / GIB:.1f} GiB, a step about {seconds(after.step_s)} - "
                "the same completions in fewer forward/backward passes, each of which costs the launch of its "
                "kernels (docs/performance.md#micro-batches)",
                soft_wrap=True,
            )
        return
    if mp.verdict == "tight":
        output.print(
            f"[yellow]may not fit[/]: {peak:.1f} GiB predicted, {memory:.1f} on the card: closer to the card's size "
            "than the prediction's error (docs/troubleshooting.md#out-of-gpu-memory)",
            soft_wrap=True,
        )
    else:
        output.print(f"[red]does not fit[/]: {peak:.1f} GiB predicted, {memory:.1f} on the card")
    if not mp.fixes:
        output.print("no single change fits it: a smaller model, or several of LoRA, ZeRO-3 and shorter completions")
    for what, after in mp.fixes:
        output.print(f"  fits with {escape(what)}: {after.peak / GIB:.1f} GiB", soft_wrap=True)
