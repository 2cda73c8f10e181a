"""`grpo sft`: the optional cold start that teaches the output format, handed to TRL's SFTTrainer."""

from __future__ import annotations

from pathlib import Path

from grpo_cli.recipe import Recipe
from grpo_cli.train.health import GuardedSteps
from grpo_cli.train.master_weights import MasterWeightsSteps
from grpo_cli.train.memory_fixes import explains_out_of_memory
from grpo_cli.train.run import TrainingRun


@explains_out_of_memory
def run_sft(recipe: Recipe, resume: bool = True, overwrite: bool = False) -> Path:
    """Fine-tune on the task's reference solutions in the target format; returns the folder of the final model."""
    from trl import SFTTrainer

    from grpo_cli.tasks import sft_dataset

    class GuardedSFTTrainer(GuardedSteps, MasterWeightsSteps, SFTTrainer):
        """SFTTrainer whose micro-batch losses go to the run's StepGuard, with float32 master weights where asked."""

    with TrainingRun(recipe, resume=resume, overwrite=overwrite) as run:  # left however the run ends
        examples = sft_dataset(recipe.task, recipe.task.dataset_train_split)
        trainer = GuardedSFTTrainer(
            model=run.load_model(),
            args=run.args,
            train_dataset=examples,
            processing_class=run.tokenizer,
            peft_config=run.peft_config(),
            callbacks=run.callbacks(),
            step_guard=run.guard,
            master_weights=recipe.health.master_weights,
            master_weights_rounding=recipe.health.master_weights_rounding,
        )
        return run.train(trainer)
