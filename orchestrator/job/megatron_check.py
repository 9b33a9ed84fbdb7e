"""Megatron's own "training-ready" check of one candidate's flags, on any machine (no GPU needed).

Why: a training value that is missing or inconsistent (no --lr: the LR scheduler does float(None),
megatron/core/optimizer_param_scheduler.py:158 at dev d48bd6be0a85) must fail here in a second, not on
128 nodes after hours in the queue. `check_candidate` runs, in Megatron's own code, what pretrain() runs
before the first iteration: parse_args + validate_args (megatron/training/arguments.py), the optimizer
config and the LR / weight-decay scheduler exactly as megatron/training/training.py builds them
(get_megatron_optimizer_config, get_optimizer_param_scheduler), and the TransformerConfig
(core_transformer_config_from_args) where CUDA answers: its kernel checks (cuDNN DSA, fused permute) need
a GPU and Transformer Engine.

Which Megatron: whatever `import megatron` finds (a dev checkout first on sys.path, or the megatron-core
wheel). When that parser predates the V4 path (no --csa-compress-ratios), the flags argv.py marks dev-only
are dropped and the dev hybrid symbols C/H/W become D (same layer count, same '|' segments), so everything
else is still checked against it: that is for checking against the wheel on a CPU machine. `strict` (what
preflight asks of a node's checkout, which is what the job runs) gives the parser the argv as it is, so a
checkout without the V4 path refuses it (PR #6756, "merge main into dev", drops --csa-compress-ratios and
makes dsv4_hybrid an invalid choice).

On a machine without CUDA, `import_megatron` makes megatron-core importable (a stand-in for the one module
that imports triton, Python 3.12's typing.override on 3.11) and `as_arch` answers Megatron's GPU queries as
the target GPU would (9 = Hopper) while the check runs. `as_te` makes Megatron see a given Transformer Engine
version (megatron/core/utils.py:296-336 at dev d48bd6be0a85 caches it in `_te_version`): its checks gate on it
(fine-grained offloading with TE >= 2.10 asserts NVTE_CPU_OFFLOAD_V1=1, megatron/training/arguments.py:2126-2133),
so "whatever is installed" (none here) is not the version a node has. `env` is the job's environment, applied
while Megatron reads it. torch and megatron are imported only inside
functions: this module imports on a bare orchestrator install.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import os
import sys
import types
import typing
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from orchestrator.plan.flags import DEV_PATTERN_SYMBOLS, split_dev

PAGED_STASH = "megatron.core.transformer.moe.ops.paged_stash"  # imports triton unconditionally
HOPPER_ARCH = 9  # get_device_arch_version() on H100/H200
NODE_TE = "2.13.0"  # the Transformer Engine a V4 node needs (--moe-router-fusion with sqrtsoftplus, preflight)
V4_PARSER_FLAG = "--csa-compress-ratios"  # a parser that knows it takes the V4 flags as they are
PATTERN_FLAG = "--hybrid-layer-pattern"


def _stub_paged_stash() -> None:
    """Without triton, a stand-in for the paged-stash kernels module (never used without a GPU)."""
    if PAGED_STASH in sys.modules or importlib.util.find_spec("triton") is not None:
        return
    stub = types.ModuleType(PAGED_STASH)
    stub.__doc__ = "Stand-in without triton: the real module's kernels need triton and a GPU."
    stub.GLOBAL_BLOCK_SIZE = 1024  # type: ignore[attr-defined]  # the real module's value

    def _no_triton(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("paged stash kernels need triton and a GPU (stand-in without triton)")

    stub.paged_stash_copy_kernel = _no_triton  # type: ignore[attr-defined]
    stub.paged_stash_pop_kernel = _no_triton  # type: ignore[attr-defined]
    sys.modules[PAGED_STASH] = stub


def import_megatron() -> types.ModuleType:
    """Import megatron.core and megatron.training.arguments here (CPU, Python 3.11 too); return `megatron`."""
    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override  # type: ignore[attr-defined]
    _stub_paged_stash()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "TE/Apex not installed" noise
        importlib.import_module("megatron.core")
        importlib.import_module("megatron.training.arguments")
    return sys.modules["megatron"]


@contextlib.contextmanager
def as_arch(arch: int = HOPPER_ARCH) -> Iterator[None]:
    """While active, Megatron's GPU queries answer as a GPU of compute capability `arch`.0 would, with
    CUDA_DEVICE_MAX_CONNECTIONS=1 (validate_args asserts it for TP/CP > 1 before Blackwell). Nothing is
    patched when CUDA is available: the real GPU answers."""
    import torch

    arguments = sys.modules["megatron.training.arguments"]
    if torch.cuda.is_available():
        yield
        return
    saved = (arguments.get_device_arch_version, torch.cuda.get_device_capability)
    saved_env = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    setattr(arguments, "get_device_arch_version", lambda: arch)  # noqa: B010 - a module attribute, patched
    torch.cuda.get_device_capability = lambda device=None: (arch, 0)
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    try:
        yield
    finally:
        setattr(arguments, "get_device_arch_version", saved[0])  # noqa: B010
        torch.cuda.get_device_capability = saved[1]
        _restore_env("CUDA_DEVICE_MAX_CONNECTIONS", saved_env)


@contextlib.contextmanager
def as_te(version: str | None) -> Iterator[None]:
    """While active, Megatron's is_te_min_version answers as Transformer Engine `version` would (None: the
    installed one, nothing patched)."""
    if version is None:
        yield
        return
    from packaging.version import Version

    utils: Any = importlib.import_module("megatron.core.utils")
    saved = utils._te_version  # get_te_version()'s cache (megatron/core/utils.py:318-324 at dev d48bd6be0a85)
    utils._te_version = Version(version)
    try:
        yield
    finally:
        utils._te_version = saved


@contextlib.contextmanager
def job_env(env: dict[str, str] | None) -> Iterator[None]:
    """While active, os.environ carries the job's environment (what validate_args reads with os.getenv)."""
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update({k: str(v) for k, v in (env or {}).items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            _restore_env(k, v)


def _restore_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def for_parser(argv: Sequence[str], *, strict: bool = False) -> tuple[list[str], list[str]]:
    """(the argv the imported Megatron's parser can take, the dev-only flags dropped for it); strict: as given."""
    if strict:
        return list(argv), []
    arguments = sys.modules["megatron.training.arguments"]
    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    known = {opt for action in parser._actions for opt in action.option_strings}
    if V4_PARSER_FLAG in known:
        return list(argv), []
    keep, dropped = split_dev(argv)
    if PATTERN_FLAG in keep:
        i = keep.index(PATTERN_FLAG) + 1
        table: dict[str, str | int | None] = dict.fromkeys(DEV_PATTERN_SYMBOLS, "D")
        keep[i] = keep[i].translate(str.maketrans(table))
    return keep, dropped


def _message(exc: BaseException, stderr: str) -> str:
    """Megatron's own words: argparse's error line, or the exception with where it was raised."""
    if isinstance(exc, SystemExit):
        lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        return lines[-1] if lines else f"SystemExit({exc.code})"
    text = str(exc).strip()
    if not text:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None:
            text = f"at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
    return f"{type(exc).__name__}: {text}"


def validated_args(
    argv: Sequence[str],
    world_size: int,
    *,
    arch: int = HOPPER_ARCH,
    te_version: str | None = None,
    env: dict[str, str] | None = None,
) -> argparse.Namespace:
    """Megatron's parse_args + validate_args on `argv` (as given) with WORLD_SIZE=world_size and RANK=0,
    as pretrain does, in the job's `env`, seeing Transformer Engine `te_version` (None: the installed one);
    raises what Megatron raises. stdout (validate_args' report) is swallowed."""
    arguments = sys.modules["megatron.training.arguments"]
    saved = (sys.argv, os.environ.get("WORLD_SIZE"), os.environ.get("RANK"))
    sys.argv = ["pretrain_hybrid.py", *argv]
    os.environ["WORLD_SIZE"], os.environ["RANK"] = str(world_size), "0"
    try:
        with contextlib.redirect_stdout(io.StringIO()), as_arch(arch), as_te(te_version), job_env(env):
            args = arguments.parse_args()
            arguments.validate_args(args)
        return args
    finally:
        sys.argv = saved[0]
        _restore_env("WORLD_SIZE", saved[1])
        _restore_env("RANK", saved[2])


def training_setup(args: argparse.Namespace, *, transformer_config: bool, arch: int = HOPPER_ARCH) -> Any:
    """What training.py builds from the parsed args before the first step: the optimizer config and the
    LR / weight-decay scheduler (training.get_megatron_optimizer_config, get_optimizer_param_scheduler;
    the scheduler drives a stand-in optimizer's param_groups), and optionally the TransformerConfig.
    Returns the optimizer config; raises what Megatron raises."""
    arguments = importlib.import_module("megatron.training.arguments")
    global_vars = importlib.import_module("megatron.training.global_vars")
    training = importlib.import_module("megatron.training.training")
    previous = global_vars._GLOBAL_ARGS
    global_vars.set_args(args)
    try:
        with contextlib.redirect_stdout(io.StringIO()), as_arch(arch):
            optimizer_config, _overrides = training.get_megatron_optimizer_config(args)
            training.get_optimizer_param_scheduler(types.SimpleNamespace(param_groups=[{}]))
            if transformer_config:
                home = arguments if hasattr(arguments, "core_transformer_config_from_args") else None
                if home is None:  # megatron-core 0.19.2 keeps it in argument_utils
                    home = importlib.import_module("megatron.training.argument_utils")
                home.core_transformer_config_from_args(args)
        return optimizer_config
    finally:
        global_vars.set_args(previous)


def check_candidate(
    argv: Sequence[str],
    world_size: int,
    *,
    arch: int = HOPPER_ARCH,
    transformer_config: bool | None = None,
    te_version: str | None = None,
    env: dict[str, str] | None = None,
    strict: bool = False,
) -> str | None:
    """None when Megatron would start training with `argv` on `world_size` GPUs, else Megatron's message.

    transformer_config: also build the TransformerConfig (None: only where CUDA is available, since its
    kernel checks need a GPU). te_version: the Transformer Engine Megatron sees (None: the installed one);
    env: the job's environment (JobSpec.env); strict: no dev-only flag dropped for an older parser (for_parser).
    Imports Megatron on first use (import_megatron)."""
    import_megatron()
    import torch

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = validated_args(
                for_parser(argv, strict=strict)[0], world_size, arch=arch, te_version=te_version, env=env
            )
            build_tc = torch.cuda.is_available() if transformer_config is None else transformer_config
            training_setup(args, transformer_config=build_tc, arch=arch)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any failure is the candidate's verdict
        return _message(exc, stderr.getvalue())
    return None
