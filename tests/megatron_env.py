"""Make the installed megatron-core 0.19.2 importable on this CPU / Python 3.11 machine, for tests.

The shims live in orchestrator/job/megatron_check.py (the training-ready check runs on machines without a GPU
too): a stand-in for the one module that imports triton, Python 3.12's typing.override, and GPU queries
answered as an H100 (sm_90) while validate_args runs (`as_hopper`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType

from orchestrator.job import megatron_check


def import_megatron() -> ModuleType:
    """Import megatron.core and megatron.training on CPU; return the `megatron` package."""
    return megatron_check.import_megatron()


@contextlib.contextmanager
def as_hopper() -> Iterator[None]:
    """While active, Megatron's GPU queries answer as an H100 (sm_90) with CUDA_DEVICE_MAX_CONNECTIONS=1."""
    with megatron_check.as_arch(megatron_check.HOPPER_ARCH):
        yield


def megatron_available() -> bool:
    try:
        import_megatron()
    except Exception:  # noqa: BLE001 - any import failure means "not installed here"
        return False
    return True
