"""A torch stand-in for Dao-AILab's fast_hadamard_transform, for the one-GPU Tier B run (tests/gpu/device.sh).

Why: every CSA ratio-4 layer of DeepSeek-V4 rotates its indexer activations with
`hadamard_transform(x, scale=hidden**-0.5)` and asserts the package is importable
(megatron/core/transformer/experimental_attention_variant/dsa.py:264-268 at dev d48bd6be0a85). Its sdist
on the package index downloads its CUDA sources at build time, and the lent GPU machine has no network.
This is the same linear map (x times the Sylvester-ordered Hadamard matrix along the last dimension, times
`scale`; a last dimension that is not a power of two is zero-padded and cut back, as the CUDA kernel does),
written with torch ops so autograd gives its backward (the transform is symmetric). It is slower than the
kernel: the figures of a run that uses it time the reference path, and say so.
"""

from __future__ import annotations

import math

import torch

__version__ = "0.0.0+torch-standin"
STANDIN = True  # what device_checks records: this is not the CUDA package


def hadamard_transform(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """x @ H_n.T * scale along the last dimension (n = the next power of two), in x's dtype."""
    dim = x.shape[-1]
    n = 1 << max(0, math.ceil(math.log2(dim))) if dim > 1 else 1
    y = x.float()
    if n != dim:
        y = torch.nn.functional.pad(y, (0, n - dim))
    lead = y.shape[:-1]
    h = 1
    while h < n:  # butterflies: pairs (i, i + h) in blocks of 2h
        y = y.reshape(*lead, n // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2)
        h *= 2
    y = y.reshape(*lead, n)[..., :dim] * scale
    return y.to(x.dtype)
