"""Which kernels torch's scaled_dot_product_attention may use in training.

With an explicit attention mask (every padded batch), torch's cuDNN attention backward on H100/H200 (the default
kernel there since torch 2.11) returns NaN query gradients when the padded sequence length is 64 modulo 128 and a
query row's logsumexp is under about -88.7: a row the mask lets see no key at all (the left padding of a shorter
prompt, which every GRPO batch has), or one whose scores are all far below zero (pytorch/pytorch issue 196678). The
forward pass and the key and value gradients stay finite, so the step's loss looks healthy while every gradient
below that layer is NaN. The memory-efficient and math kernels, which torch picks when cuDNN's is off, compute the
same attention without it.
"""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def cudnn_attention(enabled: bool):
    """Inside the block, scaled_dot_product_attention may (or may not) pick its cuDNN kernels; after it, as before."""
    import torch

    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(enabled)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
