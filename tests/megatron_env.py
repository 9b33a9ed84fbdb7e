"""Make the installed megatron-core 0.19.2 importable on this CPU / Python 3.11 machine, for tests.

Why each step:
- `megatron/core/transformer/moe/ops/paged_stash.py` does `import triton` unconditionally and is pulled in
  by `megatron.core` itself. Installing or faking the whole `triton` package breaks torch._inductor, so a
  stand-in for that one module goes into sys.modules (its kernels raise if anything calls them).
- `megatron.training` uses `typing.override` (Python 3.12); 3.11 gets typing_extensions' version.
- validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1 when TP>1 or CP>1 on pre-Blackwell GPUs and asks
  the GPU for its architecture (get_device_arch_version; torch.cuda.get_device_capability for grouped
  GEMM); `as_hopper()` answers both as an H100 (sm_90) would while validate_args runs.

Use `import_megatron()` (returns the `megatron` package) or `pytest.importorskip`-style via
`megatron_available()`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types
import typing
import warnings

STUB_MODULE = "megatron.core.transformer.moe.ops.paged_stash"
HOPPER_ARCH = 9  # get_device_arch_version() on H100/H200


def _stub_paged_stash() -> None:
    if STUB_MODULE in sys.modules:
        return
    stub = types.ModuleType(STUB_MODULE)
    stub.__doc__ = "CPU test stand-in: the real module needs triton; paged stash is never used on CPU."
    stub.GLOBAL_BLOCK_SIZE = 1024  # the real module's value

    def _no_triton(*_args, **_kwargs):
        raise RuntimeError("paged stash kernels need triton and a GPU (CPU test stand-in)")

    stub.paged_stash_copy_kernel = _no_triton
    stub.paged_stash_pop_kernel = _no_triton
    sys.modules[STUB_MODULE] = stub


def import_megatron():
    """Import megatron.core and megatron.training on CPU; return the `megatron` package."""
    import typing_extensions

    if not hasattr(typing, "override"):
        typing.override = typing_extensions.override
    _stub_paged_stash()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "TE/Apex not installed" noise
        importlib.import_module("megatron.core")
        importlib.import_module("megatron.training.arguments")
    return sys.modules["megatron"]


@contextlib.contextmanager
def as_hopper():
    """While active, Megatron's GPU queries answer as an H100 (sm_90) with CUDA_DEVICE_MAX_CONNECTIONS=1."""
    import torch

    arguments = sys.modules["megatron.training.arguments"]
    saved = (
        arguments.get_device_arch_version,
        torch.cuda.get_device_capability,
        os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
    )
    arguments.get_device_arch_version = lambda: HOPPER_ARCH
    torch.cuda.get_device_capability = lambda device=None: (HOPPER_ARCH, 0)
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    try:
        yield
    finally:
        arguments.get_device_arch_version, torch.cuda.get_device_capability = saved[0], saved[1]
        if saved[2] is None:
            os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        else:
            os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = saved[2]


def megatron_available() -> bool:
    try:
        import_megatron()
    except Exception:  # noqa: BLE001 - any import failure means "not installed here"
        return False
    return True
