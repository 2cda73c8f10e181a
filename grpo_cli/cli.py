"""The `grpo` command line: parses options, calls one function per command, turns UserError into exit code 2.

Heavy libraries (torch, transformers, trl) are imported inside the commands, never at module level, so
`grpo --help` starts fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from grpo_cli import __version__
from grpo_cli.errors import UserError

app = typer.Typer(
    name="grpo",
    help="Post-train language models with reinforcement learning from verifiable rewards.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

RECIPE_OPTION = typer.Option("--config", "-c", help="Recipe YAML file, or the name of a built-in recipe.")
EXTRA_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"grpo {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        Optional[bool], typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = None,
) -> None:
    """Post-train language models with reinforcement learning from verifiable rewards."""


def main() -> None:
    """Entry point of the `grpo` console script and of `python -m grpo_cli`."""
    try:
        app()
    except UserError as err:
        from grpo_cli.console import print_problems

        print_problems(err.problems)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


# --- recipes -----------------------------------------------------------------------------------------------------

recipes_app = typer.Typer(help="Built-in recipes: list them, print one to copy, list the keys a recipe may hold.")
app.add_typer(recipes_app, name="recipes")


@recipes_app.command("list")
def recipes_list() -> None:
    """List the built-in recipes with a one-line description."""
    from grpo_cli.recipe.show import print_recipe_list

    print_recipe_list()


@recipes_app.command("show")
def recipes_show(name: Annotated[str, typer.Argument(help="Built-in recipe name, e.g. countdown.")]) -> None:
    """Print a built-in recipe (redirect it to a file to start your own)."""
    from grpo_cli.recipe import find_recipe

    sys.stdout.write(find_recipe(name).read_text(encoding="utf-8"))


@recipes_app.command("keys")
def recipes_keys(
    command: Annotated[str, typer.Argument(help="rl or sft.")] = "rl",
    search: Annotated[Optional[str], typer.Option("--search", "-s", help="Only keys containing this text.")] = None,
) -> None:
    """List the keys a recipe for `grpo rl` or `grpo sft` may hold, with type, default and help."""
    from grpo_cli.recipe.show import print_keys

    print_keys(command, search)


# --- training ----------------------------------------------------------------------------------------------------

NUM_PROCESSES = typer.Option(
    "--num-processes", help="Run on N processes (GPUs): grpo re-launches itself through `accelerate launch`."
)
ACCELERATE_CONFIG = typer.Option(
    "--accelerate-config", help="accelerate config (a file, or a name from configs/accelerate such as zero3)."
)


def _train(
    command: str,
    ctx: typer.Context,
    config: str,
    dry_run: bool,
    resume: bool,
    overwrite: bool,
    num_processes: Optional[int],
    accelerate_config: Optional[str],
) -> None:
    from grpo_cli import launch
    from grpo_cli.recipe.show import check_and_show

    relaunch = launch.should_relaunch(num_processes, accelerate_config) and not dry_run
    show = launch.is_main_process() and not relaunch  # a re-launched run prints its plan itself
    recipe, _ = check_and_show(config, ctx.args, command, num_processes, accelerate_config, show=show)
    if dry_run:
        return
    if relaunch:
        processes = launch.num_processes(accelerate_config, num_processes)
        raise typer.Exit(launch.run_relaunch(launch.relaunch_command(sys.argv[1:], processes, accelerate_config)))
    if command == "rl":
        from grpo_cli.train.rl import run_rl as run
    else:
        from grpo_cli.train.sft import run_sft as run
    run(recipe, resume=resume, overwrite=overwrite)


@app.command(context_settings=EXTRA_ARGS)
def rl(
    ctx: typer.Context,
    config: Annotated[str, RECIPE_OPTION],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the recipe and print the plan; train nothing.")] = False,
    resume: Annotated[
        bool, typer.Option("--resume/--no-resume", help="Continue from the output folder's latest checkpoint.")
    ] = True,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="With --no-resume: delete the output folder's old checkpoints.")
    ] = False,
    num_processes: Annotated[Optional[int], NUM_PROCESSES] = None,
    accelerate_config: Annotated[Optional[str], ACCELERATE_CONFIG] = None,
) -> None:
    """Train with GRPO: the recipe's task builds prompts, its rewards score completions, TRL's GRPOTrainer learns.

    Keys after the recipe override it: `grpo rl -c countdown --learning_rate 1e-6 --max_steps 10`.
    """
    _train("rl", ctx, config, dry_run, resume, overwrite, num_processes, accelerate_config)


@app.command(context_settings=EXTRA_ARGS)
def sft(
    ctx: typer.Context,
    config: Annotated[str, RECIPE_OPTION],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the recipe and print the plan; train nothing.")] = False,
    resume: Annotated[
        bool, typer.Option("--resume/--no-resume", help="Continue from the output folder's latest checkpoint.")
    ] = True,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="With --no-resume: delete the output folder's old checkpoints.")
    ] = False,
    num_processes: Annotated[Optional[int], NUM_PROCESSES] = None,
    accelerate_config: Annotated[Optional[str], ACCELERATE_CONFIG] = None,
) -> None:
    """Supervised cold start: teach the task's output format from reference solutions (TRL's SFTTrainer).

    Keys after the recipe override it: `grpo sft -c demo/countdown-sft --max_steps 20`.
    """
    _train("sft", ctx, config, dry_run, resume, overwrite, num_processes, accelerate_config)


# --- check -------------------------------------------------------------------------------------------------------


@app.command(context_settings=EXTRA_ARGS)
def check(
    ctx: typer.Context,
    config: Annotated[str, RECIPE_OPTION],
    command: Annotated[
        Optional[str], typer.Option("--command", help="Check as an `rl` or `sft` recipe (default: guessed from its keys).")
    ] = None,
    num_processes: Annotated[
        Optional[int], typer.Option("--num-processes", help="Processes the run will use (default: from the environment or 1).")
    ] = None,
    accelerate_config: Annotated[
        Optional[str], typer.Option("--accelerate-config", help="accelerate config file the run will use.")
    ] = None,
) -> None:
    """Validate a recipe without loading a model or a dataset, and print the resolved plan.

    Keys after the recipe override it: `grpo check -c countdown --learning_rate 1e-6`.
    """
    from grpo_cli.recipe.show import check_and_show, guess_command

    check_and_show(config, ctx.args, command or guess_command(config), num_processes, accelerate_config)


# --- merge -------------------------------------------------------------------------------------------------------


@app.command()
def merge(
    adapter: Annotated[
        str,
        typer.Option(
            "--adapter",
            help="Adapter folder, checkpoint folder, or a run's output folder (its final adapter, else its latest "
            "checkpoint).",
        ),
    ],
    output: Annotated[str, typer.Option("--output", "-o", help="Folder for the merged model.")],
    base: Annotated[
        Optional[str], typer.Option("--base", help="Base model (default: the one named in the adapter's config).")
    ] = None,
    dtype: Annotated[
        Optional[str], typer.Option("--dtype", help="bfloat16, float16 or float32 (default: the base model's).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing, non-empty output folder.")] = False,
) -> None:
    """Merge a LoRA adapter into its base model: a standalone model folder, checked against base + adapter."""
    from grpo_cli.merge import merge_adapter, print_report

    print_report(merge_adapter(adapter, output, base=base, dtype=dtype, force=force))


# --- models ------------------------------------------------------------------------------------------------------

models_app = typer.Typer(help="Short model names: the embedded demo model.", no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("prepare")
def models_prepare(
    name: Annotated[str, typer.Argument(help="Short model name.")] = "smollm2-135m-instruct",
    force: Annotated[bool, typer.Option("--force", help="Download and convert again even if prepared.")] = False,
) -> None:
    """Download and convert a short-named model into the cache now (otherwise done on first use); print its folder."""
    from grpo_cli.console import console
    from grpo_cli.models import prepare_demo_model

    path = prepare_demo_model(name, force=force)
    console.print(f"[bold green]ready[/] {name}: {path}")
    typer.echo(str(path))
