"""What `grpo rl` and `grpo sft` share: set-up before the trainer exists, and training, stopping and saving after."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Self

from grpo_cli.atomic import is_disk_full, json_text, readable_tree, replace_folder, write_text
from grpo_cli.console import console, escape
from grpo_cli.engine.attention import cudnn_attention, flash_attention, packed_attention
from grpo_cli.engine.lm_head import lean_lm_head
from grpo_cli.engine.lora import fused_lora
from grpo_cli.errors import UserError
from grpo_cli.launch import accelerate_config_from_env, is_main_process, process_rank, world_size
from grpo_cli.models import gpu_problems, load_model, load_tokenizer, render_prompt
from grpo_cli.quiet import quiet_libraries
from grpo_cli.recipe import Recipe
from grpo_cli.recipe.check import tracking_problems
from grpo_cli.recipe.hardware import detect_hardware, loads_onto_gpu
from grpo_cli.run_folder import RunLock, latest_checkpoint
from grpo_cli.train.checkpoints import (
    GracefulStop,
    ReadableCheckpoints,
    ResumedSchedule,
    StoppedBySignal,
    disk_full_problem,
    resume_point,
)
from grpo_cli.train.health import NonFiniteStop, StepGuard, stability_advice
from grpo_cli.train.prediction import predicted
from grpo_cli.train.progress import RunConsole, remove_default_printers
from grpo_cli.train.stall import StallWatch
from grpo_cli.train.tracking import swanlab_callback
from grpo_cli.weights import first_nonfinite, refuse_short_embedding


def _peak_gpu_memory(trainer) -> list[float] | None:
    """Peak GPU memory of every process in GiB (all processes must call this), or None on CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    peak = torch.tensor([torch.cuda.max_memory_allocated() / 2**30], device=trainer.accelerator.device)
    return [round(x, 2) for x in trainer.accelerator.gather(peak).tolist()]


class TrainingRun:
    """One training run of a recipe: everything around the TRL trainer that both commands need."""

    def __init__(self, recipe: Recipe, resume: bool = True, overwrite: bool = False):
        quiet_libraries()
        recipe.apply_env()
        self.recipe = recipe  # with the machine's defaults, as `grpo check` printed it (grpo_cli/recipe/hardware.py)
        problems = gpu_problems(recipe.values, recipe.values) + tracking_problems(recipe.tracking)
        if problems:
            raise UserError(*problems)
        self.model_args = recipe.model_config()
        self.args = recipe.training_config()
        self.output_dir = Path(self.args.output_dir)
        self.main = is_main_process()
        self.lock = RunLock(self.output_dir) if self.main else None  # before anything in the folder is touched
        # process-wide switches the recipe asks for, entered here and left when the run ends (`close`)
        self.switches = contextlib.ExitStack()
        try:
            self._prepare(recipe, resume, overwrite)
        except BaseException:
            self.close()  # refused or failed before training: the folder is free and the process as it was
            raise

    def _prepare(self, recipe: Recipe, resume: bool, overwrite: bool) -> None:
        self.checkpoint = resume_point(
            self.output_dir, resume, overwrite, main=self.main, max_steps=self.args.max_steps, command=recipe.command
        )
        self.tokenizer = load_tokenizer(
            self.model_args.model_name_or_path,
            recipe.task.chat_template,
            revision=self.model_args.model_revision,
            trust_remote_code=bool(getattr(self.args, "trust_remote_code", False)),
        )
        self.stop = GracefulStop()
        self.stall = StallWatch(self.output_dir, recipe.health.stall_timeout, process_rank(), world_size())
        self.stop.before_quit.append(self.stall.remove_if_empty)  # a second Ctrl-C quits without the cleanup
        health = recipe.health
        self.switches.enter_context(cudnn_attention(health.cudnn_attention))
        if recipe.command == "rl" and recipe.memory.lean_lm_head:
            self.switches.enter_context(lean_lm_head())  # for every GRPOTrainer of this process
        if recipe.kernels.fused_lora:
            self.switches.enter_context(fused_lora())  # for every PEFT LoRA layer of this process
        if recipe.kernels.flash_attention:
            self.switches.enter_context(flash_attention())  # for every SDPA attention layer of this process
        if recipe.command == "rl" and recipe.kernels.packed_forward:
            self.switches.enter_context(packed_attention())  # the packed forward's attention calls (RLTrainer)
        self.guard = None
        if health.nonfinite_guard:
            advice = stability_advice(recipe.resolved())
            self.guard = StepGuard(health.nonfinite_patience, self.output_dir, advice)
        self.console = RunConsole(recipe.tracking, values=recipe.resolved(), guard=self.guard)
        # `grpo check`'s prediction of the peak memory and step time, compared with the run's after its first steps
        self.prediction = predicted(recipe, world_size(), accelerate_config_from_env())
        if self.main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            write_text(self.output_dir / "recipe.yaml", recipe.to_yaml())  # what ran, for a rerun

    def prompts_dataset(self):
        """The task's training rows with prompts rendered as text; the conversation stays in `prompt_messages`."""
        from grpo_cli.tasks import load_task_dataset

        rows = load_task_dataset(self.recipe.task, self.recipe.task.dataset_train_split, seed=self.args.seed)
        tokenizer = self.tokenizer
        return rows.map(
            lambda row: {"prompt": render_prompt(tokenizer, row["prompt"]), "prompt_messages": row["prompt"]},
            desc="rendering prompts",
        )

    def load_model(self):
        hardware = self.recipe.hardware or detect_hardware()  # the machine the recipe's defaults were decided for
        device = self.args.device if loads_onto_gpu(self.recipe.resolved(), hardware) else None
        with console.status(f"loading {self.model_args.model_name_or_path}"):
            model = load_model(self.model_args.model_name_or_path, self.model_args, for_training=True, device=device)
        refuse_short_embedding(model, self.tokenizer, self.model_args.model_name_or_path)
        return model

    def peft_config(self):
        from trl import get_peft_config

        return get_peft_config(self.model_args)

    def callbacks(self) -> list:
        # The guard comes after the others: it has the last word on whether a step's checkpoint is saved.
        callbacks = [self.console, self.stop, ResumedSchedule(), ReadableCheckpoints()]
        callbacks += [self.guard] if self.guard else []
        callbacks += [self.prediction] if self.prediction else []
        name = self.args.run_name or self.output_dir.name
        # what the console says of the run goes to SwanLab too
        tracker = swanlab_callback(
            self.recipe.tracking, str(self.output_dir), name, self.recipe.values, findings=self.console.findings
        )
        return callbacks + ([tracker] if tracker else []) + [self.stall]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """The run is over, however it ended: its output folder free for another run, the process-wide switches as
        they were before it."""
        self.switches.close()
        if self.lock is not None:
            self.lock.release()

    def train(self, trainer) -> Path:
        """Train (resuming when there is a checkpoint), save the final model with its tokenizer, return its folder."""
        remove_default_printers(trainer)
        self.stop.install()
        try:
            result = trainer.train(resume_from_checkpoint=str(self.checkpoint) if self.checkpoint else None)
        except NonFiniteStop as stop:
            self.console.close()
            raise NonFiniteStop(*stop.problems, *self._resume_lines()) from None
        except Exception as err:
            if is_disk_full(err):
                self.console.close()
                raise UserError(disk_full_problem(self.output_dir)) from None
            if self.checkpoint is not None and "size mismatch" in str(err):
                self.console.close()
                raise UserError(
                    f"{self.checkpoint} does not fit {self.model_args.model_name_or_path}: its weights have other "
                    "shapes (it was trained from another model) - resume with the model it was trained from, or "
                    "give this run another --output_dir"
                ) from None
            raise
        finally:
            self.stop.uninstall()
            self.stall.close()
        if self.guard is not None and self.guard.stopped:
            self._write_summary(trainer, None)
            self._report(trainer)
            raise NonFiniteStop(self.guard.stopped)
        if self.guard is not None and self.guard.skipped and trainer.accelerator.is_main_process:
            steps = ", ".join(str(bad.step) for bad in self.guard.skipped[:10])
            more = "" if len(self.guard.skipped) <= 10 else ", ..."
            console.print(
                f"[yellow]{len(self.guard.skipped)} step(s) applied no update (non-finite values): {steps}{more}[/]"
            )
        if self.stop.requested:
            console.print(
                f"stopped at step {trainer.state.global_step}; the checkpoint is in {self.output_dir}. "
                "Run the same command again to resume."
            )
            raise StoppedBySignal(self.stop.signum)
        try:
            self._save_final(trainer)
            self._write_summary(trainer, result.metrics)
        except Exception as err:
            if not is_disk_full(err):
                raise
            raise UserError(disk_full_problem(self.output_dir)) from None
        if trainer.accelerator.is_main_process:
            console.print(f"[bold green]saved[/] {escape(str(self.output_dir))}")
        self._report(trainer)
        return self.output_dir

    def _report(self, trainer) -> None:
        """`grpo report` of the finished run; a report that cannot be drawn is a one-line warning, never a failure."""
        if not trainer.accelerator.is_main_process:
            return
        try:
            from grpo_cli.report import report_run

            report_run([self.output_dir])
        except Exception as err:  # noqa: BLE001 - the run is saved: a report problem must not fail it
            from rich.markup import escape

            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            console.print(
                f"[yellow]warning:[/] {escape(f'no report drawn ({type(err).__name__}: {first[:200]})')} - the run "
                f"is saved; {escape(f'`grpo report {self.output_dir}`')} tries again",
                soft_wrap=True,
            )

    def _write_summary(self, trainer, metrics: dict | None) -> None:
        peaks = _peak_gpu_memory(trainer)
        if not trainer.accelerator.is_main_process:
            return
        summary = {
            "global_step": trainer.state.global_step,
            "num_processes": trainer.accelerator.num_processes,
            "peak_gpu_memory_gib": peaks,
            **({"prediction": self.prediction.result} if self.prediction and self.prediction.result else {}),
            **(self.guard.summary() if self.guard is not None else {}),
            "metrics": metrics,
            "log_history": trainer.state.log_history,
        }
        write_text(self.output_dir / "train_summary.json", json_text(summary, indent=1))

    def _resume_lines(self) -> list[str]:
        checkpoint = latest_checkpoint(self.output_dir)
        if checkpoint is None:
            return ["No checkpoint was saved before it."]
        return [f"The last healthy checkpoint is {checkpoint}: the same command resumes from it."]

    def _save_final(self, trainer) -> None:
        """Save into a temporary folder first, then move the files in, so a kill never leaves a half-written model."""
        if self.guard is not None:
            name = first_nonfinite(trainer.model.named_parameters())
            if name is not None:
                raise NonFiniteStop(
                    f"the trained weights hold NaN or inf (first in {name}): the final model was not saved",
                    *self._resume_lines(),
                )
        staging = self.output_dir / ".final.tmp"
        if trainer.accelerator.is_main_process:
            shutil.rmtree(staging, ignore_errors=True)
        trainer.accelerator.wait_for_everyone()
        trainer.save_model(str(staging))
        if trainer.accelerator.is_main_process:
            self.tokenizer.save_pretrained(str(staging))
            readable_tree(staging)  # the final model, as readable as the user's umask makes their own files
            for item in staging.iterdir():
                target = self.output_dir / item.name
                if item.is_dir() and target.is_dir() and not target.is_symlink():
                    replace_folder(item, target)
                else:
                    if target.is_dir() and not target.is_symlink():
                        shutil.rmtree(target)  # a folder where the model now has a file
                    os.replace(item, target)
            staging.rmdir()
        trainer.accelerator.wait_for_everyone()
