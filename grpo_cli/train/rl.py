"""`grpo rl`: GRPO with the recipe's task and rewards, handed to TRL's GRPOTrainer.

Read top to bottom: check, load tokenizer, data and model, build the trainer, train, save.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

from trl import GRPOTrainer

from grpo_cli.atomic import json_text
from grpo_cli.recipe import Recipe, reward_names
from grpo_cli.train.health import GuardedSteps, NonFiniteStop
from grpo_cli.train.lm_head import use_lean_lm_head
from grpo_cli.train.memory import explains_out_of_memory
from grpo_cli.train.offload import LayerInputOffload
from grpo_cli.train.rollout import is_nonfinite_sampling, static_rollout
from grpo_cli.train.run import TrainingRun


class RLTrainer(GuardedSteps, GRPOTrainer):
    """GRPOTrainer that checks each scored batch for non-finite numbers (the run's `StepGuard`) and appends every
    scored rollout (prompt, completion, rewards, advantage) to a JSONL file."""

    rollouts_path: Path | None = None

    def _generate_and_score_completions(self, inputs):
        before = len(self._logs["advantages"])
        try:
            output = super()._generate_and_score_completions(inputs)
        except RuntimeError as err:
            if not is_nonfinite_sampling(err):
                raise
            # No completions to train on, so no step to skip: the run stops here.
            raise NonFiniteStop(
                f"training stopped at step {self.state.global_step + 1}: the rollout's token probabilities are not "
                f"finite ({err}) - the model's forward pass overflows in {self.model.dtype}; nothing was saved "
                "from this step"
            ) from None
        count = len(self._logs["advantages"]) - before or len(self._logs["advantages"])
        if self.model.training and self.step_guard is not None:
            self._check_scores(output["advantages"], count)
        if self.rollouts_path is not None and self.accelerator.is_main_process and self.model.training:
            self._write_rollouts(count)
        return output

    def _check_scores(self, advantages, count: int) -> None:
        """Tell the guard about infinite rewards (NaN is a reward that did not apply) and non-finite advantages."""
        import torch

        start = len(self._logs["advantages"]) - count
        for name, values in self._logs["rewards"].items():
            if any(math.isinf(v) for v in list(values)[start:]):
                self.step_guard.note("rewards", name)
        if not bool(torch.isfinite(advantages).all()):
            self.step_guard.note("advantages")

    def _write_rollouts(self, count: int) -> None:
        # The trainer keeps the latest generation batch, gathered from every process, in `_logs`.
        logs = self._logs
        start = len(logs["advantages"]) - count
        rewards = {name: list(values)[start:] for name, values in logs["rewards"].items()}
        with open(self.rollouts_path, "a", encoding="utf-8") as out:
            for i, (prompt, completion, advantage) in enumerate(
                zip(list(logs["prompt"])[start:], list(logs["completion"])[start:], list(logs["advantages"])[start:])
            ):
                row = {
                    "step": self.state.global_step,
                    "prompt": prompt,
                    "completion": completion,
                    # NaN (a reward that did not apply) is written as null
                    "rewards": {name: float(values[i]) for name, values in rewards.items()},
                    "advantage": float(advantage),
                }
                out.write(json_text(row) + "\n")


def conversational(reward_func):
    """Give a reward the task's conversational view of a rendered text prompt (prefill included)."""

    def scored(prompts, completions, prompt_messages, **columns):
        chats = [[{"role": "assistant", "content": text}] for text in completions]
        return reward_func(prompts=prompt_messages, completions=chats, **columns)

    scored.__name__ = reward_func.__name__
    return scored


@explains_out_of_memory
def run_rl(recipe: Recipe, resume: bool = True, overwrite: bool = False) -> Path:
    """Train the recipe's model with GRPO; returns the folder holding the final model or adapter."""
    from grpo_cli.rewards import build_reward_funcs

    run = TrainingRun(recipe, resume=resume, overwrite=overwrite)
    prompts = run.prompts_dataset()
    names = reward_names(recipe)
    rewards = [conversational(f) for f in build_reward_funcs(names, recipe.reward.reward_timeout)]
    model = run.load_model()
    if recipe.memory.lean_lm_head:
        use_lean_lm_head()  # for every GRPOTrainer of this process

    with warnings.catch_warnings():
        # The rollout function is grpo's own, not an experiment of the user's: TRL's warning about it is noise.
        warnings.filterwarnings("ignore", message="You are using 'rollout_func'")
        # TRL 1.16 still applies liger's kernels through `use_liger_kernel` (grpo's GPU default); its notice that
        # the flag will change in TRL 2 is for library users, not for a grpo run.
        warnings.filterwarnings("ignore", message="`use_liger_kernel=True` is deprecated")
        trainer = RLTrainer(
            model=model,
            reward_funcs=rewards,
            args=run.args,
            train_dataset=prompts,
            processing_class=run.tokenizer,
            peft_config=run.peft_config(),
            callbacks=run.callbacks(),
            rollout_func=static_rollout(run.args, model),  # None: TRL's own generation
        )
    if recipe.memory.activation_offloading:
        LayerInputOffload(trainer.model)  # lives in the hooks it puts on the model
    if trainer.accelerator.is_main_process:
        trainer.rollouts_path = Path(run.args.output_dir) / "rollouts.jsonl"
        resumed_at = int(run.checkpoint.name.rpartition("-")[2]) if run.checkpoint else 0
        keep_rollouts_before(trainer.rollouts_path, resumed_at)
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
