"""Activation offloading for checkpointed decoder layers (`activation_offloading: true`).

With gradient checkpointing, what a micro-batch keeps on the GPU between its forward and backward passes is mostly
one tensor per decoder layer: the layer's input, from which the backward pass recomputes the layer. This moves
exactly those tensors to pinned CPU memory as the forward pass makes them, on a copy stream of their own, and brings
each one back a layer ahead of the backward pass that needs it, so the copies overlap the layers' compute. Nothing
else moves: the recomputed activations, the LM head's and the loss's tensors stay where they are.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

MIN_BYTES = 1 << 20  # smaller layer inputs are not worth a copy each way
BUFFER_ALIGN = 1 << 20


class _Offloaded:
    """One layer input in CPU memory; `gpu` holds it again once a copy back has been issued."""

    __slots__ = ("__weakref__", "cpu", "gpu", "index", "ready")

    def __init__(self, index: int, cpu: torch.Tensor):
        self.index, self.cpu, self.gpu, self.ready = index, cpu, None, None


class LayerInputOffload:
    """Saved-tensor hooks around the decoder stack's layers. Gradient checkpointing saves each layer's input under
    these hooks and what the layer computes under its own, so the layer inputs are what these hooks receive (the
    hooks end before the final norm: its tensors are the first the backward pass needs)."""

    def __init__(self, model: nn.Module, min_bytes: int = MIN_BYTES):
        self.stacks = decoder_stacks(model)
        self.min_bytes = min_bytes
        self.offloaded = 0  # tensors moved so far; each one's index in pack order
        self.buffers = 0  # CPU buffers allocated so far (each serves many micro-batches)
        self.released = 0  # of them, those let go for a larger one (micro-batches grow as well as shrink)
        self._free: list[torch.Tensor] = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._active = False
        # Inputs not yet brought back, by pack order (an entry vanishes with the graph that saved it).
        self._waiting: weakref.WeakValueDictionary[int, _Offloaded] = weakref.WeakValueDictionary()
        self._stream = None
        self._handles = []
        for stack in self.stacks:
            self._handles.append(stack.register_forward_pre_hook(self._enter))
            self._handles.append(stack.register_forward_hook(self._exit, always_call=True))
            if isinstance(getattr(stack, "norm", None), nn.Module):
                self._handles.append(stack.norm.register_forward_pre_hook(self._exit))

    def remove(self) -> None:
        """Take the hooks off the model."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _enter(self, stack: nn.Module, args) -> None:
        checkpointed = any(getattr(layer, "gradient_checkpointing", False) for layer in stack.layers)
        if checkpointed and stack.training and torch.is_grad_enabled() and not self._active:
            self._hooks.__enter__()
            self._active = True

    def _exit(self, *_) -> None:
        if self._active:
            self._active = False
            self._hooks.__exit__(None, None, None)

    def _copy_stream(self, tensor: torch.Tensor):
        if tensor.device.type != "cuda":
            return None  # CPU: a plain copy, for the tests of the bookkeeping
        if self._stream is None:
            self._stream = torch.cuda.Stream(tensor.device)
        return self._stream

    def _pack(self, tensor: torch.Tensor):
        nbytes = tensor.numel() * tensor.element_size()
        if isinstance(tensor, nn.Parameter) or not tensor.is_floating_point() or nbytes < self.min_bytes:
            return tensor
        stream = self._copy_stream(tensor)
        buffer = self._buffer(nbytes, pinned=stream is not None)
        cpu = buffer[:nbytes].view(tensor.dtype).view(tensor.shape)
        if stream is None:
            cpu.copy_(tensor)
        else:
            stream.wait_stream(torch.cuda.current_stream(tensor.device))
            with torch.cuda.stream(stream):
                cpu.copy_(tensor, non_blocking=True)
            tensor.record_stream(stream)  # its memory is not reused before the copy has read it
        entry = _Offloaded(self.offloaded, cpu)
        # The buffer serves again once the graph lets go of the entry: every copy in or out of it runs on the one
        # copy stream, so the next copy into it starts after the last copy out of it.
        weakref.finalize(entry, self._free.append, buffer)
        self._waiting[entry.index] = entry
        self.offloaded += 1
        return entry

    def _buffer(self, nbytes: int, pinned: bool) -> torch.Tensor:
        """A free CPU buffer of at least `nbytes`: the smallest that fits, else a new one with room to spare (the
        layer inputs of the next micro-batch differ by their padded length and, with `skip_zero_advantage`, by their
        rows). Pinned buffers are kept until a larger one replaces them: allocating and freeing pinned memory
        synchronizes with the GPU and takes milliseconds."""
        fits = [i for i, buffer in enumerate(self._free) if buffer.numel() >= nbytes]
        if fits:
            return self._free.pop(min(fits, key=lambda i: self._free[i].numel()))
        if self._free:  # the new one takes the place of the largest too small, so they do not pile up
            self._free.remove(max(self._free, key=lambda buffer: buffer.numel()))
            self.released += 1
        self.buffers += 1
        size = -(-nbytes * 9 // 8 // BUFFER_ALIGN) * BUFFER_ALIGN
        return torch.empty(size, dtype=torch.uint8, pin_memory=pinned)

    def _unpack(self, entry):
        if not isinstance(entry, _Offloaded):
            return entry
        self._bring_back(entry)
        if entry.ready is not None:
            torch.cuda.current_stream(self._stream.device).wait_event(entry.ready)
        tensor, entry.gpu, entry.ready = entry.gpu, None, None
        self._waiting.pop(entry.index, None)
        previous = self._waiting.get(entry.index - 1)  # the layer the backward pass reaches next
        if previous is not None:
            self._bring_back(previous)
        return tensor

    def _bring_back(self, entry: _Offloaded) -> None:
        if entry.gpu is not None:
            return
        if self._stream is None:
            entry.gpu = entry.cpu.clone()
            return
        compute = torch.cuda.current_stream(self._stream.device)
        # Allocated on the compute stream, which frees it after use; the copy stream waits for it to be free.
        entry.gpu = torch.empty(entry.cpu.shape, dtype=entry.cpu.dtype, device=self._stream.device)
        self._stream.wait_stream(compute)
        with torch.cuda.stream(self._stream):
            entry.gpu.copy_(entry.cpu, non_blocking=True)
            entry.ready = self._stream.record_event()


def decoder_stacks(model: nn.Module) -> list[nn.Module]:
    """The modules that run the model's decoder layers (transformers' GradientCheckpointingLayer) in a `layers`
    list: the base model under a causal LM head, under a PEFT wrapper."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [
        module
        for module in model.modules()
        if isinstance(getattr(module, "layers", None), nn.ModuleList)
        and any(isinstance(layer, GradientCheckpointingLayer) for layer in module.layers)
    ]


def layer_input_share(config, micro_batch: int, generation_rows: int) -> float:
    """A micro-batch's layer inputs (what offloading moves: layers x rows x tokens x hidden size) over the KV cache
    the rollout of the whole generation batch holds (layers x rows x tokens x keys and values x their heads' size),
    over the same sequence length. Offloading can lower a GRPO step's peak only where the forward/backward, not the
    rollout, sets it: where this share is high (docs/performance.md has the benchmark shapes' shares, on both
    sides of the rule in `grpo_cli.recipe.hardware`)."""
    from grpo_cli.engine.rollout import cache_width

    return micro_batch * config.hidden_size / (generation_rows * cache_width(config))
