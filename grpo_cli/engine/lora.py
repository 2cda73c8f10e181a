"""A LoRA layer's training forward/backward in fewer, leaner kernels than PEFT's (`fused_lora`).

Under bfloat16 autocast, PEFT's forward of a LoRA `Linear` with float32 adapters casts its input to float32, applies
dropout in float32, casts it back to bfloat16 for each of the two products, scales the update and adds it to the base
output: about eight kernels a layer, most of which read and write a whole activation, and as many again backward.
`LoRALinear` computes the same layer in the compute dtype the base product runs in: the base product, dropout with a
one-byte mask, the low-rank product and the update added into the base output in place (the scaling folded into B);
its backward is five matrix products. The adapters stay float32 parameters and get float32 gradients. The results
are PEFT's under autocast up to where the bfloat16 roundings fall (`tests/test_lora.py`).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from grpo_cli.engine.rollout import foldable_adapters
from grpo_cli.once import SayOnce

logger = logging.getLogger(__name__)


class LoRALinear(torch.autograd.Function):
    """y = x W^T + bias + s * (dropout(x) A^T) B^T for a frozen base weight W and trainable A, B; `mask` (bool, x's
    shape, or None) is the dropout's keep mask and `keep` its keep probability."""

    @staticmethod
    def forward(ctx, x, weight, bias, a, b, scaling: float, mask, keep: float):
        out = F.linear(x, weight, bias)  # under autocast: in its compute dtype
        dtype = out.dtype
        dropped = x.to(dtype)
        if mask is not None:
            dropped = dropped * mask * (1.0 / keep)
        a_c, b_c = a.to(dtype), (b * scaling).to(dtype)  # the scaling folded in before rounding
        low = F.linear(dropped, a_c)
        out.view(-1, out.shape[-1]).addmm_(low.view(-1, low.shape[-1]), b_c.t())
        ctx.save_for_backward(dropped, mask, weight, a_c, b_c, low)
        ctx.scaling, ctx.keep, ctx.x_shape = scaling, keep, x.shape
        ctx.dtypes = (x.dtype, None if bias is None else bias.dtype, a.dtype, b.dtype)
        return out

    @staticmethod
    def backward(ctx, grad):
        dropped, mask, weight, a_c, b_c, low = ctx.saved_tensors
        x_dtype, bias_dtype, a_dtype, b_dtype = ctx.dtypes
        needs_x, _, needs_bias, needs_a, needs_b = ctx.needs_input_grad[:5]
        g = grad.reshape(-1, grad.shape[-1])
        x2 = dropped.reshape(-1, dropped.shape[-1])
        to_low = g.mm(b_c)  # the loss's gradient at the low-rank product
        grad_x = grad_bias = grad_a = grad_b = None
        if needs_x:
            grad_x = g.mm(weight.to(g.dtype))
            if mask is None:
                grad_x.addmm_(to_low, a_c)
            else:
                grad_x += to_low.mm(a_c) * mask.reshape(x2.shape) * (1.0 / ctx.keep)
            grad_x = grad_x.view(ctx.x_shape).to(x_dtype)
        if needs_bias:
            grad_bias = g.sum(0).to(bias_dtype)
        if needs_a:
            grad_a = to_low.t().mm(x2).to(a_dtype)
        if needs_b:
            grad_b = g.t().mm(low.reshape(-1, low.shape[-1])).to(b_dtype) * ctx.scaling
        return grad_x, None, grad_bias, grad_a, grad_b, None, None, None


def fusable_adapter(layer) -> tuple[str | None, str | None]:
    """(the adapter, None) where `LoRALinear` computes this PEFT LoRA layer, else (None, why PEFT's forward must);
    the reason is None for a merged or disabled adapter, whose forward is the base layer's alone."""
    if layer.merged or layer.disable_adapters:
        return None, None
    adapters = foldable_adapters(layer)
    if adapters is None:
        return None, "DoRA, another LoRA variant, an adapter bias or a quantized base layer"
    if len(adapters) > 1:
        return None, "several adapters active at once"
    name = adapters[0]
    weights = (layer.base_layer.weight, layer.lora_A[name].weight, layer.lora_B[name].weight)
    if any(hasattr(w, "ds_id") for w in weights):
        return None, "DeepSpeed ZeRO-3 gathers the layer's weights module by module"
    if layer.base_layer.weight.requires_grad:
        return None, "the base weight trains too"
    return name, None


def fused_forward(layer, x, name: str):
    """A PEFT LoRA `Linear`'s forward through `LoRALinear`, for its adapter `name` (`fusable_adapter`)."""
    dropout = layer.lora_dropout[name]
    p = dropout.p if isinstance(dropout, torch.nn.Dropout) and dropout.training else 0.0
    mask = None
    if p > 0:
        mask = torch.empty(x.shape, dtype=torch.bool, device=x.device).bernoulli_(1.0 - p)
    base, a, b = layer.base_layer, layer.lora_A[name].weight, layer.lora_B[name].weight
    return LoRALinear.apply(x, base.weight, base.bias, a, b, layer.scaling[name], mask, 1.0 - p)


@contextmanager
def fused_lora():
    """PEFT's LoRA `Linear` layers compute through `LoRALinear` while this lasts, where they can (`fusable_adapter`;
    a call with more than the input goes to PEFT); the first layer left to PEFT's forward for a reason is said once,
    with the reason."""
    from peft.tuners.lora import layer as lora_layer

    original = lora_layer.Linear.forward
    said = SayOnce()

    def forward(self, x, *args, **kwargs):
        if type(self) is lora_layer.Linear and not args and not kwargs:
            name, reason = fusable_adapter(self)
            if name is not None:
                return fused_forward(self, x, name)
            if reason:
                said.warning(logger, "unfused", "fused_lora: some LoRA layers run PEFT's own forward (%s)", reason)
        return original(self, x, *args, **kwargs)

    lora_layer.Linear.forward = forward
    try:
        yield
    finally:
        lora_layer.Linear.forward = original
