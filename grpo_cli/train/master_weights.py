"""Float32 master weights for a model whose weights train in bfloat16.

An optimizer that updates bfloat16 weights in place rounds each update to the weight's 8 significant bits: an update
smaller than half a unit in the last place of the weight is lost. With AdamW a step moves a weight by about the
learning rate, so at the learning rates of GRPO (1e-6 and below) nearly every update of a full fine-tuning vanishes
and the run learns little or nothing while every number stays finite. DeepSpeed keeps float32 copies of the weights
for that reason; without it, `MasterWeights` does the same for any torch optimizer: the optimizer steps float32 copies
(its state is then float32 too) and each result is rounded into the model's weights, which the forward, backward and
the sampler keep using. The copies are part of the optimizer's state, so a checkpoint resumes them exactly.

Rounding a copy to the nearest bfloat16 value (`rounding="nearest"`) hides its updates from the model until they add
up to half a bfloat16 unit of the weight: a weight that starts on the bfloat16 grid (a checkpoint stored in bfloat16)
stays where it is for the first steps, as float32 weights under bfloat16 autocast do. Stochastic rounding (the
default) rounds up or down with the probabilities that keep the copy's value on average, so the model's weights follow
their copies from the first step.
"""

from __future__ import annotations

import torch

MASTER = "master"  # the optimizer-state key under which a checkpoint keeps a weight's float32 copy
ROUNDINGS = ("nearest", "stochastic")
_CHUNK = 1 << 24  # elements rounded at once: the random bits of a chunk take 4 bytes each


def stochastic_round_(out: torch.Tensor, value: torch.Tensor, generator: torch.Generator) -> None:
    """Write the float32 `value` into the bfloat16 `out`, each element rounded to one of its two bfloat16 neighbours
    with a probability proportional to its closeness to it: the result's expectation is `value`. A bfloat16 number is
    the upper half of a float32's bits, so adding 16 random bits to the lower half and dropping it does that."""
    source = value.detach().contiguous().view(-1).view(torch.int32)
    target = out.view(-1) if out.is_contiguous() else torch.empty(out.numel(), dtype=out.dtype, device=out.device)
    for start in range(0, source.numel(), _CHUNK):
        bits = source[start:start + _CHUNK]
        noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=bits.device, generator=generator)
        target[start:start + _CHUNK] = ((bits + noise) & -(1 << 16)).view(torch.float32)  # exact in bfloat16
    if target.data_ptr() != out.data_ptr():
        out.copy_(target.view(out.shape))


class MasterWeights:
    """Makes `optimizer` update float32 copies of its bfloat16 parameters: the copies take the place of those
    parameters in its groups (its state is float32 then), each step hands them the model's gradients in float32, and
    rounds their new values into the model's weights in place (the same storage: the sampler's CUDA graphs read it).
    The model's parameters keep their dtype and autograd identity, so DDP's gradient hooks stay as they were. Costs 4
    bytes a parameter for the copy, 4 more for the float32 optimizer state, and 2 during the step."""

    def __init__(self, optimizer: torch.optim.Optimizer, rounding: str = "stochastic", seed: int = 0):
        """`rounding`: "stochastic" (from a generator seeded with `seed` and the optimizer's step, so every process
        of a DDP run rounds alike and a resumed run as the uninterrupted one) or "nearest"."""
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding {rounding!r}: one of {', '.join(ROUNDINGS)}")
        self.optimizer = optimizer
        self.rounding, self.seed = rounding, seed
        self.steps = 0  # steps this object has seen, where the optimizer keeps no step count of its own
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
        self.steps += 1
        generators: dict[torch.device, torch.Generator] = {}
        for master, param in self.model_params.items():
            if master.grad is None:
                continue
            if self.rounding == "stochastic":
                if master.device not in generators:
                    generators[master.device] = torch.Generator(master.device).manual_seed(self._step_seed())
                stochastic_round_(param, master, generators[master.device])
            else:
                param.copy_(master)
            master.grad = None
            optimizer.state[master][MASTER] = master

    def _step_seed(self) -> int:
        """The stochastic rounding's seed for this step: the run's seed and the optimizer's own step count (a
        checkpoint keeps it), else the steps seen here."""
        step = next((state["step"] for state in self.optimizer.state.values() if "step" in state), self.steps)
        return self.seed * 1_000_003 + int(step)

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
    copies of the model's bfloat16 weights (`MasterWeights`), rounded into them as `master_weights_rounding` says.
    Not for DeepSpeed, which keeps copies of its own, nor FSDP (the recipe check refuses both)."""

    def __init__(self, *args, master_weights: bool = False, master_weights_rounding: str = "stochastic", **kwargs):
        self.master_weights = master_weights
        self.master_weights_rounding = master_weights_rounding
        super().__init__(*args, **kwargs)

    def create_optimizer(self, *args, **kwargs):
        optimizer = super().create_optimizer(*args, **kwargs)
        if self.master_weights and not isinstance(getattr(optimizer, "master_weights", None), MasterWeights):
            optimizer.master_weights = MasterWeights(optimizer, self.master_weights_rounding, self.args.seed)
        return optimizer
