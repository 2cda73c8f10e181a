"""A healthy run: no NaN or inf reaches the weights, and a run that goes bad stops with one clear message.

Every optimizer step is checked where its numbers first appear: the token probabilities of grpo's rollouts, the
rewards and advantages of a GRPO batch when it is scored, each micro-batch's loss, and the gradients after clipping
(one device sync per optimizer step, none per micro-batch). A step with any of them non-finite applies no update:
every gradient is dropped before the optimizer step, so neither the weights nor the optimizer's state see it (the
learning-rate schedule still advances). The step is named on the console at once; `nonfinite_patience` such steps in
a row stop the run with exit code 2, saving nothing more. The weights are checked again before every checkpoint and
before the final save, and a resumed checkpoint's weights and optimizer state when they are loaded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from transformers import TrainerCallback

from grpo_cli.console import console
from grpo_cli.errors import RunStopped, UserError
from grpo_cli.run_folder import latest_checkpoint
from grpo_cli.trl_private import BeforeClipping
from grpo_cli.weights import first_nonfinite

# What can go non-finite in a step, in the order the step computes it.
STAGES = ("rollout probabilities", "rewards", "advantages", "loss", "gradient norm")


class NonFiniteStop(RunStopped):
    """The run stopped on non-finite numbers; the message says what, when, and how to go on (exit code 2)."""


class GuardedSteps(BeforeClipping):
    """Mixin for a transformers Trainer built with the run's `step_guard` (None: none): each micro-batch's loss, and
    the step's gradients before they are clipped, go to it. Built, the trainer hands itself to the callbacks that
    read it (those with a `bind` method: the guard, the run's console, the tracker)."""

    def __init__(self, *args, step_guard: StepGuard | None = None, **kwargs):
        self.step_guard = step_guard
        super().__init__(*args, **kwargs)
        for callback in self.callback_handler.callbacks:
            if callable(getattr(callback, "bind", None)):
                callback.bind(self)

    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        if self.step_guard is not None:
            self.step_guard.watch_loss(loss)
        return loss

    def before_clipping(self, model) -> None:
        if self.step_guard is not None:
            self.step_guard.watch_gradients(model)


@dataclass
class BadStep:
    step: int
    what: list[str] = field(default_factory=list)
    gradients: dict | None = None  # which gradients were non-finite before clipping (`nonfinite_gradients`)


def gradient_flags(model):
    """(names, device flags): whether each parameter's gradient is finite, read from the per-tensor norms of one
    fused kernel (no sync). None where the gradients are not plain tensors on one device (DeepSpeed keeps none,
    FSDP shards them)."""
    import torch

    named = [(name, p.grad) for name, p in model.named_parameters() if p.grad is not None]
    grads = [grad for _, grad in named]
    if not grads or any(type(g) is not torch.Tensor for g in grads) or len({g.device for g in grads}) > 1:
        return None
    return [name for name, _ in named], torch.isfinite(torch.stack(torch._foreach_norm(grads)))


def nonfinite_gradients(flags) -> dict | None:
    """How many gradients were non-finite, of how many, and the first and last of them in the model's parameter
    order. The backward pass runs from the loss down through the layers, so where a non-finite value arises in
    one layer's backward, the gradients of that layer and all below it are non-finite: `last` names the highest
    of them, where it arose."""
    if flags is None:
        return None
    names, finite = flags
    bad = [name for name, ok in zip(names, finite.tolist()) if not ok]
    if not bad:
        return None
    return {"non_finite": len(bad), "of": len(names), "first": bad[0], "last": bad[-1]}


def gradients_text(gradients: dict) -> str:
    where = gradients["first"] if gradients["non_finite"] == 1 else f"{gradients['first']} to {gradients['last']}"
    return f"non-finite gradients in {gradients['non_finite']} of {gradients['of']} tensors: {where}"


class StepGuard(TrainerCallback):
    """Skips every optimizer step with a non-finite value and stops the run after `patience` of them in a row.

    The trainer binds itself (`bind`) once built: its accelerator reduces the verdict over processes.
    """

    def __init__(self, patience: int, output_dir: str | Path, advice: list[str] | None = None):
        self.patience = patience
        self.output_dir = Path(output_dir)
        self.advice = advice or []
        self.trainer = None  # the trainer, once it binds itself
        self.skipped: list[BadStep] = []
        self.in_a_row = 0
        self.stopped: str | None = None
        self._noted: list[str] = []  # what this process found non-finite in the step under way
        self._sources: list[str] = []  # the rewards that returned inf, over the whole run
        self._loss_bad = None  # a device flag: some micro-batch's loss of the step under way was non-finite
        self._gradients = None  # `gradient_flags` of the step under way, taken before clipping
        self._this_step: BadStep | None = None
        self._applied = False  # the bad step's update could not be skipped (DeepSpeed steps inside the backward)

    # ------------------------------------------------------------------------------------------ during the step

    def bind(self, trainer) -> None:
        self.trainer = trainer

    def note(self, what: str, source: str | None = None) -> None:
        """Something of the step under way (`STAGES`) was non-finite on this process; `source` names where (a
        reward's name)."""
        if what not in self._noted:
            self._noted.append(what)
        if source and source not in self._sources:
            self._sources.append(source)

    def watch_loss(self, loss) -> None:
        """A micro-batch's loss, kept as a device flag (no sync here)."""
        import torch

        bad = ~torch.isfinite(loss.detach()).all()
        self._loss_bad = bad if self._loss_bad is None else self._loss_bad | bad

    def watch_gradients(self, model) -> None:
        """The step's gradients before clipping, which spreads a non-finite gradient to all of them: which ones are
        finite, kept on the device and read only when the step turns out bad."""
        self._gradients = gradient_flags(model)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        """A resumed checkpoint is loaded by now: refuse one whose weights or optimizer state are not finite."""
        if not state.global_step or model is None:
            return
        name = first_nonfinite(model.named_parameters())
        where = "weights"
        if name is None and optimizer is not None:
            where = "optimizer state"
            name = first_nonfinite(_optimizer_tensors(optimizer, model))
        if name is not None:
            raise UserError(
                f"the checkpoint resumed at step {state.global_step} in {self.output_dir} holds non-finite "
                f"{where} (NaN or inf), first in {name} - delete that checkpoint-{state.global_step} folder to "
                "resume from the one before it, or start over with --no-resume --overwrite"
            )

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        import torch

        trainer = self.trainer
        device = trainer.accelerator.device if trainer is not None else torch.device("cpu")
        flags = torch.zeros(len(STAGES), device=device)
        for what in self._noted:
            flags[STAGES.index(what)] = 1
        if self._loss_bad is not None:
            flags[STAGES.index("loss")] = self._loss_bad.to(device).float()
        if trainer is not None and trainer.is_deepspeed_enabled:
            # DeepSpeed applies the update inside the backward pass: too late to skip, so a bad step stops the run.
            norm = trainer.model_wrapped.get_global_grad_norm()
            grads_bad = norm is not None and not math.isfinite(float(norm))
            flags[STAGES.index("gradient norm")] = float(grads_bad)
        elif trainer is None or getattr(trainer.accelerator, "scaler", None) is None:
            # (fp16's loss scaler skips its own overflowing steps while it finds its scale: those are not counted)
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            if grads:
                norm = torch.nn.utils.get_total_norm(grads)
                flags[STAGES.index("gradient norm")] = (~torch.isfinite(norm)).float().to(device)
        if trainer is not None and trainer.accelerator.num_processes > 1:
            flags = trainer.accelerator.reduce(flags, reduction="sum")
        found = [what for what, flag in zip(STAGES, flags.tolist()) if flag]  # the step's one sync
        gradients, self._gradients = self._gradients, None
        self._noted, self._loss_bad = [], None
        if not found:
            self._this_step = None
            return
        gradients = nonfinite_gradients(gradients) if "gradient norm" in found else None
        for p in model.parameters():
            p.grad = None  # the optimizer skips parameters without a gradient: no update, no state change
        self._this_step = BadStep(state.global_step + 1, found, gradients)
        self._applied = trainer is not None and trainer.is_deepspeed_enabled  # the update went in: stop now

    def on_step_end(self, args, state, control, model=None, **kwargs):
        bad, self._this_step = self._this_step, None
        if bad is not None:
            self.skipped.append(bad)
            self.in_a_row += 1
            if state.is_world_process_zero:
                limit = f"the run stops at {self.patience} in a row" if self.patience else "the run goes on"
                where = f"; {gradients_text(bad.gradients)}" if bad.gradients else ""
                console.print(
                    f"[bold red]step {bad.step}: non-finite {' and '.join(bad.what)} - update skipped[/] "
                    f"({self.in_a_row} in a row; {limit}){where}",
                    soft_wrap=True,
                )
            if self._applied or (self.patience and self.in_a_row >= self.patience):
                self.stopped = self.stop_message(state.global_step)
                control.should_training_stop = True
                control.should_save = False
                return control
        else:
            self.in_a_row = 0
        if control.should_save and model is not None:
            name = first_nonfinite(model.named_parameters())
            if name is not None:  # only where a step could not be skipped (DeepSpeed)
                self.stopped = self.stop_message(state.global_step, weights=name)
                control.should_training_stop = True
                control.should_save = False
        return control

    # ------------------------------------------------------------------------------------------ the report

    def stop_message(self, step: int, weights: str | None = None) -> str:
        recent = self.skipped[-self.in_a_row :] if self.in_a_row else self.skipped[-1:]
        steps = ", ".join(str(b.step) for b in recent)
        what = " and ".join(dict.fromkeys(w for b in recent for w in b.what))
        first = self.skipped[0] if self.skipped else None
        if weights:
            head = f"the weights became non-finite (first in {weights}); nothing was saved from them."
        elif self._applied:
            head = (
                f"step {recent[-1].step} had non-finite values ({what}), and DeepSpeed applies an update inside the "
                "backward pass, so it could not be skipped; nothing was saved after it."
            )
        else:
            head = (
                f"{len(recent)} steps in a row ({steps}) had non-finite values ({what}); no update was applied "
                "from them, so every checkpoint holds healthy weights."
            )
        lines = [f"training stopped at step {step}: {head}"]
        if first is not None and first.step != recent[0].step:
            lines.append(f"The first non-finite step was {first.step} ({' and '.join(first.what)}).")
        checkpoint = latest_checkpoint(self.output_dir)
        if checkpoint is not None:
            lines.append(f"The last healthy checkpoint is {checkpoint}: the same command resumes from it, after")
        else:
            lines.append("No checkpoint was saved before it: start over (--no-resume --overwrite) after")
        if {w for b in recent for w in b.what} <= {"rewards", "advantages"}:
            names = ", ".join(self._sources) or "a reward"
            lines.append(f"  fixing {names}: it returned inf, where a reward returns finite numbers (None: not scored)")
        else:
            lines[-1] += " changing what usually helps:"
            lines += [f"  {tip}" for tip in self.advice]
        return "\n".join(lines)

    def summary(self) -> dict:
        """What train_summary.json records of the guard."""
        return {
            "skipped_steps": len(self.skipped),
            "non_finite_steps": [
                {"step": b.step, "non_finite": b.what, **({"gradients": b.gradients} if b.gradients else {})}
                for b in self.skipped
            ],
            "stopped": self.stopped,
        }


def _optimizer_tensors(optimizer, model):
    names = {id(p): name for name, p in model.named_parameters()}
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
    copies = getattr(inner, "master_weights", None)  # float32 copies stand for the model's parameters there
    for param, state in getattr(inner, "state", {}).items():
        param = copies.model_param(param) if copies is not None else param
        for key, value in state.items():
            if hasattr(value, "is_floating_point"):
                yield f"{names.get(id(param), 'a parameter')} ({key})", value


def stability_advice(values: dict) -> list[str]:
    """The recipe keys that usually calm a run that went non-finite, with the values it ran with."""
    lr = values.get("learning_rate")
    tips = []
    if isinstance(lr, (int, float)) and lr > 0:
        tips.append(f"a lower learning rate: --learning_rate {lr / 2:.1e} (now {lr:.1e})")
    norm = values.get("max_grad_norm")
    if isinstance(norm, (int, float)) and norm > 0:
        tips.append(f"tighter gradient clipping: --max_grad_norm {norm / 2:g} (now {norm:g})")
    else:
        tips.append("gradient clipping: --max_grad_norm 1.0 (now off)")
    if values.get("bf16") or values.get("fp16") or values.get("dtype") in ("bfloat16", "float16"):
        tips.append("full precision, if memory allows: --dtype float32 --bf16 false")
    if values.get("beta"):
        tips.append(f"no KL term (its estimate overflows when the policy drifts far): --beta 0 (now {values['beta']})")
    if values.get("cudnn_attention"):
        tips.append("torch's cuDNN attention off (its backward makes NaN gradients on padded batches of some "
                    "lengths): --cudnn_attention false (now true)")
    return tips
