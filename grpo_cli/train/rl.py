"""`grpo rl`: GRPO with the recipe's task and rewards, handed to TRL's GRPOTrainer.

Read top to bottom: check, load tokenizer, data and model, build the trainer, train, save.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path

from trl import GRPOTrainer

from grpo_cli.arguments import SamplingArguments
from grpo_cli.console import console
from grpo_cli.engine import is_nonfinite_sampling
from grpo_cli.engine.offload import LayerInputOffload
from grpo_cli.errors import UserError
from grpo_cli.once import SayOnce
from grpo_cli.recipe import Recipe, reward_funcs, reward_names
from grpo_cli.rewards import accuracy_reward
from grpo_cli.tasks import as_chats
from grpo_cli.train.batch_hooks import GuardedScores, RolloutsFile, SolvedGroups
from grpo_cli.train.dynamic_sampling import FreshPrompts, choose, flat_groups, is_short, merge, prompt_key
from grpo_cli.train.health import GuardedSteps, NonFiniteStop
from grpo_cli.train.memory_fixes import explains_out_of_memory
from grpo_cli.train.rollout_func import static_rollout
from grpo_cli.train.run import TrainingRun
from grpo_cli.trl_private import (
    BatchSteps,
    logs_of,
    metrics_of,
    prepared_micro_batches,
    text_tokenizer,
    training_columns,
)


class RLTrainer(GuardedSteps, BatchSteps, GRPOTrainer):
    """GRPOTrainer that hands each scored training batch to its `after_scoring` hooks
    (`grpo_cli.train.batch_hooks`: solved groups, the step guard's checks, the rollouts file), stops the run when a
    rollout's probabilities are not finite, and with `sampling.dynamic_sampling` trains only on groups whose
    completions got different rewards (`grpo_cli.train.dynamic_sampling`). It takes over TRL's steps of a generation
    batch through `BatchSteps` (grpo_cli/trl_private.py), under names of our own."""

    last_rewards = None  # the latest scored batch's rewards, gathered from every process: a column per reward

    def __init__(
        self,
        *args,
        sampling: SamplingArguments | None = None,
        after_scoring: list[Callable] | None = None,
        **kwargs,
    ):
        """GRPOTrainer's arguments (and GuardedSteps' `step_guard`), and: `sampling`, the recipe's dynamic sampling
        keys; `after_scoring`, what to do with each scored training batch, in order (`grpo_cli.train.batch_hooks`)."""
        # set first: GRPOTrainer's constructor may already call into the methods that read them
        self.said = SayOnce()
        self.sampling = sampling
        self.after_scoring = list(after_scoring or [])
        super().__init__(*args, **kwargs)

    def generate_and_score(self, inputs):
        output = self._score(inputs)
        if self.sampling is not None and self.sampling.dynamic_sampling and self.model.training:
            output = self._sample_dynamically(inputs, output)
        return output

    def calculate_rewards(self, *args, **kwargs):
        rewards = super().calculate_rewards(*args, **kwargs)
        self.last_rewards = rewards
        return rewards

    def _flat_groups(self) -> list[bool]:
        return flat_groups(self.last_rewards, self.reward_weights, self.num_generations, self.multi_objective_aggregation)

    def _sample_dynamically(self, inputs: list[dict], output: dict) -> dict:
        """Drop the flat groups of a scored generation batch and refill it from fresh prompts' groups."""
        n, processes, process = self.num_generations, self.accelerator.num_processes, self.accelerator.process_index
        if len(inputs) % n:
            raise UserError(
                f"`dynamic_sampling` keeps or drops whole groups on each process, and this process holds "
                f"{len(inputs)} completions, not a multiple of `num_generations` ({n}) - make "
                "per_device_train_batch_size x gradient_accumulation_steps a multiple of it"
            )
        groups = len(inputs) // n
        batches, flat = [output], [self._flat_groups()]
        metrics = metrics_of(self)
        if not any(flat[0]):
            metrics["dynamic_sampling/dropped_share"].append(0.0)
            metrics["dynamic_sampling/rounds"].append(0.0)
            metrics["dynamic_sampling/filled_share"].append(0.0)
            return output
        fresh = None
        while len(batches) <= self.sampling.dynamic_sampling_max_rounds and is_short(flat, processes, groups):
            if fresh is None:
                # seeded by the generation batch's place in the run, so a resumed run draws the same prompts
                step = [self.args.seed, self.state.global_step,
                        prepared_micro_batches(self) % self.args.gradient_accumulation_steps]
                seen = {prompt_key(prompt) for prompt in logs_of(self)["prompt"]}  # this batch's, from every process
                fresh = FreshPrompts(self._fresh_dataset(), step, seen)
            drawn = fresh.take(groups * processes)[process * groups : (process + 1) * groups]
            batches.append(self._score([dict(row) for row in drawn for _ in range(n)]))
            flat.append(self._flat_groups())
        choice = choose(flat, process, groups)
        per_sequence = frozenset()
        if str(getattr(self, "vllm_importance_sampling_mode", "")).startswith("sequence"):
            per_sequence = frozenset({"importance_sampling_ratio"})
        pad = text_tokenizer(self).pad_token_id
        merged = merge(batches, choice.picks, n, pad, self.pad_to_multiple_of, per_sequence)
        loss_mask = merged["completion_mask"] * merged["tool_mask"] if "tool_mask" in merged else merged["completion_mask"]
        merged["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        rounds = len(batches) - 1
        filled = sum(choose(flat, p, groups).filled for p in range(processes))
        metrics["dynamic_sampling/dropped_share"].append(sum(map(sum, flat)) / (len(flat) * groups * processes))
        metrics["dynamic_sampling/rounds"].append(float(rounds))
        metrics["dynamic_sampling/filled_share"].append(filled / (groups * processes))
        if filled and self.accelerator.is_main_process and self.said.first("short-after-dynamic-sampling"):
            console.print(
                f"[yellow]dynamic sampling: after {rounds} extra generation round{'s' * (rounds != 1)}, {filled} of "
                f"{groups * processes} groups of the batch at step {self.state.global_step + 1} still gave all their "
                "completions the same reward; dropped groups fill the batch (they add no gradient) - raise "
                "`dynamic_sampling_max_rounds`, or train on prompts nearer the model's level (said once; "
                "`dynamic_sampling/filled_share` in the logs counts them)[/]",
                soft_wrap=True,
            )
        return merged

    def _fresh_dataset(self):
        """The training set as the train dataloader reads it, for drawing fresh prompts by index."""
        import datasets

        if getattr(self, "_fresh_rows", None) is not None:
            return self._fresh_rows
        if not isinstance(self.train_dataset, datasets.Dataset):
            raise UserError(
                "`dynamic_sampling` draws fresh prompts by index, and this training set is a streaming dataset - "
                "load it as a regular dataset, or set `dynamic_sampling: false`"
            )
        self._fresh_rows = training_columns(self, self.train_dataset, "training")
        return self._fresh_rows

    def _score(self, inputs):
        """The parent's generation and scoring of `inputs`, then (training) the `after_scoring` hooks."""
        before = len(logs_of(self)["advantages"])
        try:
            output = super().generate_and_score(inputs)
        except RuntimeError as err:
            if not is_nonfinite_sampling(err):
                raise
            # No completions to train on, so no step to skip: the run stops here.
            raise NonFiniteStop(
                f"training stopped at step {self.state.global_step + 1}: the rollout's token probabilities are not "
                f"finite ({err}) - the model's forward pass overflows in {self.model.dtype}; nothing was saved "
                "from this step"
            ) from None
        count = len(logs_of(self)["advantages"]) - before or len(logs_of(self)["advantages"])
        if self.model.training:
            for hook in self.after_scoring:
                hook(self, output, count)
        return output


def conversational(reward_func):
    """Give a reward the task's conversational view of a rendered text prompt (prefill included)."""

    def scored(prompts, completions, prompt_messages, **columns):
        return reward_func(prompts=prompt_messages, completions=as_chats(completions), **columns)

    scored.__name__ = reward_func.__name__
    return scored


@explains_out_of_memory
def run_rl(recipe: Recipe, resume: bool = True, overwrite: bool = False) -> Path:
    """Train the recipe's model with GRPO; returns the folder holding the final model or adapter."""
    with TrainingRun(recipe, resume=resume, overwrite=overwrite) as run:  # left however the run ends
        prompts = run.prompts_dataset()
        rewards = [conversational(f) for f in reward_funcs(recipe)]
        names = reward_names(recipe)
        chosen = accuracy_reward(recipe.task.task, names)
        after_scoring = [SolvedGroups(names.index(chosen[0]), chosen[1])] if chosen else []
        after_scoring += [GuardedScores(run.guard)] if run.guard else []
        if run.main:  # one process writes the rollouts; a resumed run does the steps after its checkpoint again
            rollouts = Path(run.args.output_dir) / "rollouts.jsonl"
            keep_rollouts_before(rollouts, int(run.checkpoint.name.rpartition("-")[2]) if run.checkpoint else 0)
            after_scoring.append(RolloutsFile(rollouts))
        model = run.load_model()
        with warnings.catch_warnings():
            # The rollout function is grpo's own, not an experiment of the user's: TRL's warning about it is noise.
            warnings.filterwarnings("ignore", message="You are using 'rollout_func'")
            # TRL applies liger's kernels through `use_liger_kernel` (grpo's GPU default); its notice that the flag
            # will change is for library users, not for a grpo run.
            warnings.filterwarnings("ignore", message="`use_liger_kernel=True` is deprecated")
            trainer = RLTrainer(
                model=model,
                reward_funcs=rewards,
                args=run.args,
                train_dataset=prompts,
                processing_class=run.tokenizer,
                peft_config=run.peft_config(),
                callbacks=run.callbacks(),
                rollout_func=static_rollout(run.args, recipe.rollout.rollout_engine, model),  # None: TRL's own generation
                sampling=recipe.sampling,
                after_scoring=after_scoring,
                step_guard=run.guard,
            )
        if recipe.memory.activation_offloading:
            LayerInputOffload(trainer.model)  # lives in the hooks it puts on the model
        return run.train(trainer)


def keep_rollouts_before(path: Path, step: int) -> None:
    """Drop the rollouts of steps from `step` on (a resumed run does them again; a fresh run, step 0, starts the file
    anew). A row's `step` is the number of steps done when it was generated."""
    if not path.exists():
        return
    if step == 0:
        path.unlink()
        return
    staging = path.with_name(f".{path.name}.tmp")
    with open(path, encoding="utf-8") as rows, open(staging, "w", encoding="utf-8") as kept:
        for line in rows:
            try:
                done = json.loads(line).get("step")
            except ValueError:
                continue  # a line cut short by a kill
            if isinstance(done, int) and done < step:
                kept.write(line if line.endswith("\n") else line + "\n")
    os.replace(staging, path)
