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
