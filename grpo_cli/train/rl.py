"""`grpo rl`: GRPO with the recipe's task and rewards, handed to TRL's GRPOTrainer.

Read top to bottom: check, load tokenizer, data and model, build the trainer, train, save.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from trl import GRPOTrainer

from grpo_cli.engine import is_nonfinite_sampling
from grpo_cli.engine.offload import LayerInputOffload
from grpo_cli.engine.packed import PackedForward
from grpo_cli.recipe import Recipe, reward_funcs, reward_names
from grpo_cli.rewards import accuracy_reward, conversational
from grpo_cli.train.batch_hooks import GuardedScores, RolloutsFile, SolvedGroups
from grpo_cli.train.dynamic_sampling import DynamicSampler
from grpo_cli.train.health import GuardedSteps, NonFiniteStop
from grpo_cli.train.master_weights import MasterWeightsSteps
from grpo_cli.train.memory_fixes import explains_out_of_memory
from grpo_cli.train.micro_batches import LOSS_SCALE, cannot_skip, layout, regroup
from grpo_cli.train.rollout_func import static_rollout
from grpo_cli.train.run import TrainingRun
from grpo_cli.trl_private import BatchSteps, logs_of, metrics_of

logger = logging.getLogger("grpo_cli.train.rl")


class RLTrainer(GuardedSteps, MasterWeightsSteps, BatchSteps, GRPOTrainer):
    """GRPOTrainer that hands each scored training batch to its `after_scoring` hooks
    (`grpo_cli.train.batch_hooks`: solved groups, the step guard's checks, the rollouts file), stops the run when a
    rollout's probabilities are not finite, and with a `dynamic_sampler` trains only on groups whose completions got
    different rewards (`grpo_cli.train.dynamic_sampling`); with `skip_zero_advantage` its micro-batches leave the
    completions whose advantage is zero out of the forward and backward, and with `pack_micro_batches` they are
    filled by tokens (`grpo_cli.train.micro_batches`). It takes over TRL's steps of a generation batch through
    `BatchSteps` (grpo_cli/trl_private.py), under names of our own."""

    last_rewards = None  # the latest scored batch's rewards, gathered from every process: a column per reward
    rows_left_out = None  # the share of the latest generation batch's rows left out (None: none are)
    micro_batches_run = None  # the micro-batches with rows, per optimizer step, of the latest regrouped batch

    def __init__(
        self,
        *args,
        dynamic_sampler: DynamicSampler | None = None,
        after_scoring: list[Callable] | None = None,
        skip_zero_advantage: bool = False,
        pack_micro_batches: bool = False,
        packed_forward: bool = False,
        **kwargs,
    ):
        """GRPOTrainer's arguments (and GuardedSteps' `step_guard`, MasterWeightsSteps' `master_weights`), and:
        `dynamic_sampler`, the recipe's dynamic sampling (None: off); `after_scoring`, what to do with each scored
        training batch, in order (`grpo_cli.train.batch_hooks`); `skip_zero_advantage`, leave zero-advantage
        completions out of the forward and backward where they have no gradient; `pack_micro_batches`, fill each
        step's micro-batches by tokens (grpo_cli/train/micro_batches.py; each said once where it cannot be);
        `packed_forward`, train each micro-batch without its padding, each prompt once (grpo_cli/engine/packed.py;
        its attention calls served inside `grpo_cli.engine.attention.packed_attention`)."""
        # set first: GRPOTrainer's constructor may already call into the methods that read them
        self.dynamic_sampler = dynamic_sampler
        self.after_scoring = list(after_scoring or [])
        self.skip_zero_advantage = self.pack_micro_batches = False
        self.packer = None
        super().__init__(*args, **kwargs)
        reason = cannot_skip(self) if skip_zero_advantage else None
        if reason:
            logger.warning("skip_zero_advantage: every completion goes through the forward and backward (%s)", reason)
        self.skip_zero_advantage = skip_zero_advantage and reason is None
        self.regrouping = layout(self)
        why = self.regrouping[2]
        if pack_micro_batches and why and self.args.gradient_accumulation_steps > 1:
            logger.warning("pack_micro_batches: every micro-batch runs, with at most per_device_train_batch_size "
                           "completions (%s)", why)
        self.pack_micro_batches = pack_micro_batches and why is None
        self.packer = PackedForward(self.model) if packed_forward else None
        if self.packer is not None and not self.packer.stacks:
            logger.warning("packed_forward: the model has no decoder layers it knows, so micro-batches run padded")

    def regroup(self, micro_batches):
        if not (self.skip_zero_advantage or self.pack_micro_batches or self.packer is not None):
            return micro_batches
        group, every, _ = self.regrouping
        micro_batches, left_out = regroup(
            micro_batches,
            self.loss_type,
            group,
            leave_out=self.skip_zero_advantage,
            pack=self.pack_micro_batches,
            every_micro_batch=every,
            processes=self.accelerator if self.accelerator.num_processes > 1 else None,
            pad_to_multiple_of=self.pad_to_multiple_of,
            by_prompt=self.packer is not None,
        )
        self.rows_left_out = left_out if self.skip_zero_advantage else None
        ran = sum(1 for batch in micro_batches if batch["advantages"].size(0))
        self.micro_batches_run = ran * self.args.gradient_accumulation_steps / max(len(micro_batches), 1)
        return micro_batches

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.packer is not None:  # the decoder's training forward of this micro-batch: its prompts' columns
            with self.packer.prompts(inputs["prompt_ids"].size(1)):
                return self._scaled_loss(model, inputs, return_outputs, num_items_in_batch)
        return self._scaled_loss(model, inputs, return_outputs, num_items_in_batch)

    def _scaled_loss(self, model, inputs, return_outputs, num_items_in_batch):
        """TRL's loss of a micro-batch, times its regrouped rows' factor where it has one."""
        if LOSS_SCALE not in inputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs = dict(inputs)  # a buffered micro-batch trains again with more iterations
        scale = inputs.pop(LOSS_SCALE)
        if self.rows_left_out is not None:
            metrics_of(self)["frac_rows_skipped"].append(self.rows_left_out)
        metrics_of(self)["micro_batches_run"].append(self.micro_batches_run)
        if inputs["advantages"].size(0) == 0:  # its rows train in another of the step's micro-batches
            if self.accelerator.sync_gradients and self.accelerator.num_processes > 1:
                raise RuntimeError("a step's regrouping emptied the micro-batch that averages the gradients")
            return torch.zeros((), device=self.accelerator.device, requires_grad=True)
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return loss if scale == 1.0 else loss * scale

    def generate_and_score(self, inputs):
        output = self._score(inputs)
        if self.dynamic_sampler is not None and self.model.training:
            output = self.dynamic_sampler(self, inputs, output, self._score)
        return output

    def calculate_rewards(self, *args, **kwargs):
        rewards = super().calculate_rewards(*args, **kwargs)
        self.last_rewards = rewards
        return rewards

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
                dynamic_sampler=DynamicSampler(recipe.sampling) if recipe.sampling.dynamic_sampling else None,
                after_scoring=after_scoring,
                skip_zero_advantage=recipe.sampling.skip_zero_advantage,
                pack_micro_batches=recipe.sampling.pack_micro_batches,
                packed_forward=recipe.kernels.packed_forward,
                step_guard=run.guard,
                master_weights=recipe.health.master_weights,
                master_weights_rounding=recipe.health.master_weights_rounding,
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
