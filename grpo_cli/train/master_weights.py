"""Float32 master weights for a model whose weights train in bfloat16.

An optimizer that updates bfloat16 weights in place rounds each update to the weight's 8 significant bits: an update
smaller than half a unit in the last place of the weight is lost. With AdamW a step moves a weight by about the
learning rate, so at the learning rates of GRPO (1e-6 and below) nearly every update of a full fine-tuning vanishes
and the run learns little or nothing while every number stays finite. DeepSpeed keeps float32 copies of the weights
for that reason; without it, `MasterWeights` does the same for any torch optimizer: the optimizer steps float32 copies
(its state is then float32 too) and each result is rounded into the model's weights, which the forward, backward and
the sampler keep using. The copies are part of the optimizer's state, so a checkpoint resumes them exactly.
"""

from __future__ import annotations

import torch

MASTER = "master"  # the optimizer-state key under which a checkpoint keeps a weight's float32 copy


class MasterWeights:
    """Makes `optimizer` update float32 copies of its bfloat16 parameters: the copies take the place of those
    parameters in its groups (its state is float32 then), each step hands them the model's gradients in float32, and
    rounds their new values into the model's weights in place (the same storage: the sampler's CUDA graphs read it).
    The model's parameters keep their dtype and autograd identity, so DDP's gradient hooks stay as they were. Costs 4
    bytes a parameter for the copy, 4 more for the float32 optimizer state, and 2 during the step."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.model_params: dict[torch.Tensor, torch.nn.Parameter] = {}  # copy -> the model's parameter
        for group in optimizer.param_groups:
            group["params"] = [self._copy_of(p) if p.dtype == torch.bfloat16 else p for p in group["params"]]
        optimizer.register_step_pre_hook(self._before_step)
        optimizer.register_step_post_hook(self._after_step)
        optimizer.register_load_state_dict_post_hook(self._after_load)

    def _copy_of(self, param: torch.nn.Parameter) -> torch.Tensor:
        master = param.detach().float().requires_grad_(param.requires_grad)
        self.model_params[master] = param
        return master

    def model_param(self, param: torch.Tensor) -> torch.Tensor:
        """The model's parameter a tensor of the optimizer stands for."""
        return self.model_params.get(param, param)

    def _before_step(self, optimizer, args, kwargs) -> None:
        """Each copy's gradient: its parameter's, in float32 (the bfloat16 one is let go). A parameter without one
        (a skipped step drops them all) leaves its copy without one too: the optimizer then leaves it alone."""
        for master, param in self.model_params.items():
            master.grad = None if param.grad is None else param.grad.float()
            param.grad = None

    @torch.no_grad()
    def _after_step(self, optimizer, args, kwargs) -> None:
        """Round the updated copies into the model's weights; keep each copy in the state, for checkpoints."""
        for master, param in self.model_params.items():
            if master.grad is None:
                continue
            param.copy_(master)
            master.grad = None
            optimizer.state[master][MASTER] = master

    @torch.no_grad()
    def _after_load(self, optimizer) -> None:
        """A resumed checkpoint's copies replace the ones made from its (rounded) weights."""
        for master in self.model_params:
            saved = optimizer.state[master].get(MASTER) if master in optimizer.state else None
            if saved is not None:
                master.copy_(saved)
                optimizer.state[master][MASTER] = master


class MasterWeightsSteps:
    """Mixin for a transformers Trainer built with `master_weights` (default False): its optimizer updates float32
    copies of the model's bfloat16 weights (`MasterWeights`). Not for DeepSpeed, which keeps copies of its own, nor
    FSDP (the recipe check refuses both)."""

    def __init__(self, *args, master_weights: bool = False, **kwargs):
        self.master_weights = master_weights
        super().__init__(*args, **kwargs)

    def create_optimizer(self, *args, **kwargs):
        optimizer = super().create_optimizer(*args, **kwargs)
        if self.master_weights and not isinstance(getattr(optimizer, "master_weights", None), MasterWeights):
            optimizer.master_weights = MasterWeights(optimizer)
        return optimizer
