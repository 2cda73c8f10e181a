"""The `grpo` command line: parses options, calls one function per command, turns UserError into exit code 2.

Heavy libraries (torch, transformers, trl) are imported inside the commands, never at module level, so
`grpo --help` starts fast.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from grpo_cli import __version__
from grpo_cli.errors import RunStopped, UserError

app = typer.Typer(
    name="grpo",
    help="Post-train language models with reinforcement learning from verifiable rewards.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # docstring paragraphs reflow; `code` shows as code
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
        bool | None, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = None,
) -> None:
    """Post-train language models with reinforcement learning from verifiable rewards."""


def _log_to_console() -> None:
    """grpo's own log messages (reward failures, ...) on stderr, tagged with the process's rank when there are several."""
    import logging

    from grpo_cli.launch import rank_prefix

    logger = logging.getLogger("grpo_cli")
    if logger.handlers:  # main() called again in the same process
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"{rank_prefix()}%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def main() -> None:
    """Entry point of the `grpo` console script and of `python -m grpo_cli`."""
    from grpo_cli.launch import rank_prefix

    _log_to_console()
    try:
        app()
    except (UserError, RunStopped) as err:
        from grpo_cli.console import print_problems

        print_problems([rank_prefix() + problem for problem in err.problems])
        sys.exit(err.code if isinstance(err, RunStopped) else 2)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as err:
        if rank_prefix():  # several processes: say which one failed before the traceback
            from grpo_cli.console import console

            console.print(f"{rank_prefix()}failed: {type(err).__name__}: {err}", markup=False, soft_wrap=True)
        raise


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
    search: Annotated[str | None, typer.Option("--search", "-s", help="Only keys containing this text.")] = None,
) -> None:
    """List the keys a recipe for `grpo rl` or `grpo sft` may hold, with type, default and help."""
    from grpo_cli.recipe.show import print_keys

    print_keys(command, search)


# --- training ----------------------------------------------------------------------------------------------------

# The options `grpo rl` and `grpo sft` share.
DryRun = Annotated[bool, typer.Option("--dry-run", help="Check the recipe and print the plan; train nothing.")]
Resume = Annotated[bool, typer.Option("--resume/--no-resume", help="Continue from the output folder's latest checkpoint.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="With --no-resume: delete the output folder's old checkpoints.")]
NumProcesses = Annotated[
    int | None,
    typer.Option("--num-processes", help="Run on N processes (GPUs): grpo re-launches itself through `accelerate launch`."),
]
AccelerateConfig = Annotated[
    str | None,
    typer.Option("--accelerate-config", help="accelerate config (a file, or a name from configs/accelerate such as zero3)."),
]


def _train(
    command: str,
    ctx: typer.Context,
    config: str,
    dry_run: bool,
    resume: bool,
    overwrite: bool,
    num_processes: int | None,
    accelerate_config: str | None,
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
    from grpo_cli.quiet import quiet_libraries

    quiet_libraries()  # before trl, transformers and deepspeed are first imported
    if command == "rl":
        from grpo_cli.train.rl import run_rl as run
    else:
        from grpo_cli.train.sft import run_sft as run
    run(recipe, resume=resume, overwrite=overwrite)


@app.command(context_settings=EXTRA_ARGS)
def rl(
    ctx: typer.Context,
    config: Annotated[str, RECIPE_OPTION],
    dry_run: DryRun = False,
    resume: Resume = True,
    overwrite: Overwrite = False,
    num_processes: NumProcesses = None,
    accelerate_config: AccelerateConfig = None,
) -> None:
    """Train with GRPO: the recipe's task builds prompts, its rewards score completions, TRL's GRPOTrainer learns.

    Keys after the recipe override it: `grpo rl -c countdown --learning_rate 1e-6 --max_steps 10`.
    """
    _train("rl", ctx, config, dry_run, resume, overwrite, num_processes, accelerate_config)


@app.command(context_settings=EXTRA_ARGS)
def sft(
    ctx: typer.Context,
    config: Annotated[str, RECIPE_OPTION],
    dry_run: DryRun = False,
    resume: Resume = True,
    overwrite: Overwrite = False,
    num_processes: NumProcesses = None,
    accelerate_config: AccelerateConfig = None,
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
        str | None, typer.Option("--command", help="Check as an `rl` or `sft` recipe (default: guessed from its keys).")
    ] = None,
    num_processes: Annotated[
        int | None, typer.Option("--num-processes", help="Processes the run will use (default: from the environment or 1).")
    ] = None,
    accelerate_config: Annotated[
        str | None, typer.Option("--accelerate-config", help="accelerate config file the run will use.")
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option("--gpu", help="Predict the peak memory and step time on this card, e.g. H100-80GB, A100-40GB, RTX-4090."),
    ] = None,
    gpu_memory: Annotated[
        float | None, typer.Option("--gpu-memory", help="Predict for a card of this many GiB (with --gpu: that card's speed).")
    ] = None,
) -> None:
    """Validate a recipe and print the resolved plan, loading no model or dataset; predict GPU memory and step time.

    On a GPU, or for the card --gpu / --gpu-memory name: the peak per process, the step time, what would fit.

    Keys after the recipe override it: `grpo check -c countdown --learning_rate 1e-6`.
    """
    from grpo_cli.recipe.hardware import has_cuda
    from grpo_cli.recipe.show import check_and_show

    predict = gpu is not None or gpu_memory is not None or has_cuda()  # without either: this machine's GPU
    check_and_show(
        config, ctx.args, command, num_processes, accelerate_config, predict_memory=predict, gpu=gpu, gpu_memory=gpu_memory
    )


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
        str | None, typer.Option("--base", help="Base model (default: the one named in the adapter's config).")
    ] = None,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="bfloat16, float16 or float32 (default: the base model's).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing, non-empty output folder.")] = False,
) -> None:
    """Merge a LoRA adapter into its base model: a standalone model folder, checked against base + adapter."""
    from grpo_cli.merge import merge_adapter, print_report
    from grpo_cli.quiet import quiet_libraries

    quiet_libraries()
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
    from grpo_cli.console import console, escape
    from grpo_cli.demo_model import prepare_demo_model

    path = prepare_demo_model(name, force=force)
    console.print(f"[bold green]ready[/] {escape(name)}: {escape(str(path))}")
    typer.echo(str(path))


# --- eval --------------------------------------------------------------------------------------------------------


@app.command("eval", context_settings=EXTRA_ARGS)
def eval_(
    ctx: typer.Context,
    config: Annotated[str, RECIPE_OPTION],
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            "-m",
            help="Model to evaluate (short name, folder, Hub id, or a run/adapter folder); repeat to compare. "
            "Default: the recipe's model.",
        ),
    ] = None,
    adapter: Annotated[
        str | None, typer.Option("--adapter", help="LoRA adapter (or run folder) on top of the one --model.")
    ] = None,
    split: Annotated[str | None, typer.Option("--split", help="Split to evaluate (default: the recipe's test split).")] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="Evaluate the first N prompts only.")] = None,
    num_generations: Annotated[
        int, typer.Option("--num-generations", "-k", help="Completions per prompt: 1 is greedy, K > 1 samples.")
    ] = 1,
    temperature: Annotated[
        float | None, typer.Option("--temperature", help="Sampling temperature (default: the recipe's).")
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size", help="Prompts per generation call (default: 8; 64 with grpo's sampler on a GPU)."
        ),
    ] = None,
    max_new_tokens: Annotated[
        int | None, typer.Option("--max-new-tokens", help="Default: the recipe's max_completion_length.")
    ] = None,
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="Folder for summary.json and samples.jsonl (default: OUTPUT_DIR/eval).")
    ] = None,
    vllm: Annotated[bool, typer.Option("--vllm", help="Generate with vLLM (needs it installed and a GPU).")] = False,
) -> None:
    """Score models on the recipe's test split with its task and rewards; compare several side by side.

    Keys after the options override the recipe: `grpo eval -c countdown -m base -m outputs/countdown --dataset_name rows.jsonl`.
    """
    from grpo_cli.eval import run_eval
    from grpo_cli.quiet import quiet_libraries

    quiet_libraries()
    run_eval(
        config,
        ctx.args,
        models=model,
        adapter=adapter,
        split=split,
        limit=limit,
        num_generations=num_generations,
        temperature=temperature,
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
        output=output,
        use_vllm=vllm,
    )


# --- report ------------------------------------------------------------------------------------------------------


@app.command()
def report(
    paths: Annotated[
        list[str],
        typer.Argument(
            help="A run's output folder or checkpoint, or a `grpo eval` output folder; two runs: a baseline, then a "
            "change, on the same axes.",
            show_default=False,
            metavar="PATH",
        ),
    ],
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", help="Folder for the report's PNG and Markdown (default: the last folder given)."),
    ] = None,
) -> None:
    """Draw a run from its own logs (report.png, report.md) and say what they show, each finding with what to change.

    Also run at the end of `grpo rl` and `grpo sft`. `grpo report RUN_A RUN_B` compares two runs; `grpo report OUTPUT_DIR/eval` shows the models of a `grpo eval` side by side.
    """
    from grpo_cli.report import report_run

    report_run(paths, output)


# --- tasks, data and rewards -------------------------------------------------------------------------------------


@app.command("tasks")
def tasks_list() -> None:
    """List the tasks: default dataset, the answer columns they need, their default rewards."""
    from grpo_cli.console import output
    from grpo_cli.tasks import task_table

    output.print(task_table())


data_app = typer.Typer(help="Make training data without a download.", no_args_is_help=True)
app.add_typer(data_app, name="data")


@data_app.command("countdown")
def data_countdown(
    num: Annotated[int, typer.Option("--num", "-n", help="How many tasks.")] = 1000,
    seed: Annotated[int, typer.Option("--seed", help="Random seed: the same seed writes the same tasks.")] = 0,
    out: Annotated[str, typer.Option("--out", "-o", help="Output .jsonl file (nums, target, solution).")] = (
        "countdown.jsonl"
    ),
    min_numbers: Annotated[int, typer.Option("--min-numbers", help="Fewest numbers per task.")] = 3,
    max_numbers: Annotated[int, typer.Option("--max-numbers", help="Most numbers per task.")] = 4,
    max_number: Annotated[int, typer.Option("--max-number", help="Largest given number.")] = 99,
    max_target: Annotated[int, typer.Option("--max-target", help="Largest target.")] = 100,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out file.")] = False,
) -> None:
    """Write solvable Countdown tasks, each with one reference solution (exact arithmetic, integer steps)."""
    from grpo_cli.console import console, escape
    from grpo_cli.tasks.countdown import write_generated

    rows = write_generated(
        out, num, seed, force, min_numbers=min_numbers, max_numbers=max_numbers, max_number=max_number, max_target=max_target
    )
    console.print(f"[bold green]wrote[/] {len(rows)} countdown tasks to {escape(str(out))} (seed {seed})")


@data_app.command("reasoning_gym")
def data_reasoning_gym(
    name: Annotated[
        str | None, typer.Argument(help="reasoning-gym dataset, e.g. gsm_symbolic; none: list the datasets.")
    ] = None,
    num: Annotated[int, typer.Option("--num", "-n", help="How many rows.")] = 1000,
    seed: Annotated[int, typer.Option("--seed", help="Random seed: the same seed writes the same rows.")] = 0,
    config: Annotated[
        list[str] | None,
        typer.Option("--config", help="A config key of the dataset as KEY=VALUE (YAML value), e.g. max_terms=3; repeat."),
    ] = None,
    out: Annotated[str | None, typer.Option("--out", "-o", help="Output .jsonl file. Default: NAME.jsonl.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out file.")] = False,
) -> None:
    """Write rows of a reasoning-gym dataset (question, answer, what its scorer reads) for `task: reasoning_gym`.

    Load them with `dataset_name: NAME.jsonl`.

    Or generate them in the recipe: `dataset_generate: N`, `dataset_generate_name: NAME`, `dataset_generate_config`.
    """
    import yaml

    from grpo_cli.console import console, escape, output
    from grpo_cli.tasks.reasoning_gym import dataset_table, write_generated

    if name is None:
        output.print(dataset_table())
        return
    values = {}
    for item in config or []:
        key, sep, text = item.partition("=")
        try:
            if not sep or not key.strip():
                raise ValueError
            values[key.strip()] = yaml.safe_load(text)
        except (ValueError, yaml.YAMLError):
            raise UserError(f"--config {item!r}: write KEY=VALUE with a YAML value, e.g. --config max_terms=3") from None
    rows = write_generated(out or f"{name}.jsonl", name, num, seed, values, force)
    console.print(f"[bold green]wrote[/] {len(rows)} {escape(name)} rows to {escape(out or f'{name}.jsonl')} (seed {seed})")


@data_app.command("recipe", context_settings=EXTRA_ARGS)
def data_recipe(
    ctx: typer.Context,
    config: Annotated[str, RECIPE_OPTION],
    out: Annotated[str, typer.Option("--out", "-o", help="Output .jsonl file.")],
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out file.")] = False,
) -> None:
    """Write the rows a recipe generates (dataset_generate) to a file, to train where the generator is not installed.

    The same recipe with `--dataset_name FILE --dataset_generate 0` trains on the same rows and holds out the same.

    Keys after the recipe override it: `grpo data recipe -c gsm8k --dataset_generate 4000 -o gsm.jsonl`.
    """
    from grpo_cli.console import console, escape
    from grpo_cli.tasks.dataset import write_generated_rows

    rows, source = write_generated_rows(_recipe_without_model(config, ctx.args).task, out, force)
    console.print(f"[bold green]wrote[/] {len(rows)} rows to {escape(out)}: {escape(source)}")


rewards_app = typer.Typer(help="Reward functions: list them, score completions, test a recipe's set.", no_args_is_help=True)
app.add_typer(rewards_app, name="rewards")


@rewards_app.command("list")
def rewards_list(
    task: Annotated[str | None, typer.Option("--task", help="Only the rewards of this task.")] = None,
) -> None:
    """List the registered rewards: name, task, range, the dataset columns they read, what they check."""
    from grpo_cli.console import output
    from grpo_cli.rewards.registry import reward_table

    if task is not None:
        from grpo_cli.tasks import get_task

        get_task(task)
    output.print(reward_table(task))


def _recipe_without_model(config: str, overrides: list[str]):
    """The recipe of a command that runs no model: the machine's rollout defaults only, no model config to read; its
    env: section and model_source applied, before any dataset is loaded."""
    from grpo_cli.recipe import load_recipe
    from grpo_cli.recipe.hardware import detect_hardware

    recipe = load_recipe(config, overrides, None, detect_hardware(processes=1, training=False))
    recipe.apply_env()
    return recipe


def _reward_setup(config: str, overrides: list[str]):
    from grpo_cli.rewards.scoring import setup_from_recipe

    return setup_from_recipe(_recipe_without_model(config, overrides))


@rewards_app.command("score", context_settings=EXTRA_ARGS)
def rewards_score(
    ctx: typer.Context,
    config: Annotated[str, RECIPE_OPTION],
    input: Annotated[str, typer.Option("--input", "-i", help="JSONL: the task's columns + completion (+ prompt).")],
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="Scored JSONL (default: standard output).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --output file.")] = False,
) -> None:
    """Score completions with the recipe's rewards (no model): one field per reward and the weighted total.

    Keys after the recipe override it: `grpo rewards score -c gsm8k -i completions.jsonl --reward_weights 1 1 1 1 2`.
    """
    from grpo_cli.atomic import json_text
    from grpo_cli.console import console, escape
    from grpo_cli.rewards.scoring import score_file, score_table

    summary = score_file(_reward_setup(config, ctx.args), input, output, force)
    console.print(score_table(summary))
    if output is None:
        for line in summary["lines"]:
            sys.stdout.write(json_text(line) + "\n")
    else:
        console.print(f"[bold green]wrote[/] {len(summary['lines'])} scored lines to {escape(str(output))}")


@rewards_app.command("test", context_settings=EXTRA_ARGS)
def rewards_test(
    ctx: typer.Context,
    config: Annotated[str, RECIPE_OPTION],
    rows: Annotated[int, typer.Option("--rows", help="How many of the dataset's first rows to test.")] = 5,
) -> None:
    """Check the recipe's rewards on its own rows: reference answers must get the top score, malformed ones less.

    For a Hub dataset, point at a local file: `grpo rewards test -c gsm8k --dataset_name tests/data/gsm8k.jsonl`.
    """
    from grpo_cli.console import console, output
    from grpo_cli.rewards.scoring import reward_test_table, run_reward_test

    report = run_reward_test(_reward_setup(config, ctx.args), rows)
    if report.cases:
        output.print(reward_test_table(report))
    if report.skipped_rows:
        console.print(f"{report.skipped_rows} row(s) skipped: no reference answer to write as a completion")
    if report.problems:
        raise UserError(*report.problems)
    console.print(f"[bold green]ok[/] {len(report.cases)} completions scored as expected")
