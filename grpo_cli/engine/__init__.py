"""The speed layer under training and evaluation: the static-cache sampler, the lean LM-head backward,
layer-input offloading, and where a run ran out of GPU memory."""
