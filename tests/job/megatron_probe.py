"""Megatron's own verdict on argvs, with a given Megatron tree first on sys.path (one tree per process).

`python -m tests.job.megatron_probe <tree> <cases.json> [--no-preflight] [--stand-in-triton]`
(tests/megatron_env.run_in_tree): each case is {"key", "argv", "world", "env", "te"} and optionally "arch" (the
GPU's compute capability Megatron sees, 9 when absent; 10 for MXFP8 on Blackwell); every case goes through
orchestrator.job.megatron_check.check_candidate (parse_args + validate_args in the job's env, seeing Transformer
Engine `te`, then the optimizer config and the LR scheduler) and, as preflight runs it (strict: the argv as the
job gets it), through orchestrator.job.preflight.validate_candidates; --no-preflight skips the second.
--stand-in-triton serves `triton` as import-time stand-ins, for a tree that imports it unconditionally (PR
#6756's) on this machine without it. Prints one JSON line: {"megatron": where megatron.core came from,
"verdicts": {key: message or null}, "preflight": the summary row, "rejected": preflight's rejected map}.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
import types
from dataclasses import asdict
from pathlib import Path


class _Anything:
    """Stands for any triton object at import time: a decorator returns what it decorates, anything else
    returns another stand-in. Kernels are never launched here (no GPU): only the module must import."""

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs and not isinstance(args[0], _Anything):
            return args[0]
        return _Anything()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __getitem__(self, key):
        return _Anything()


def _module_attr(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Anything()


class _TritonStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `triton` and every `triton.*` submodule as a module of stand-ins (--stand-in-triton): newer
    Megatron trees import triton unconditionally in modules the parser imports."""

    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []  # a package: submodules resolve through this finder
        module.__getattr__ = _module_attr  # type: ignore[method-assign]
        return module

    def exec_module(self, module):
        module.__version__ = "0.0.0+stand-in"


def main(tree: Path, cases_file: Path, *, preflight: bool = True, stand_in_triton: bool = False) -> dict:
    sys.path.insert(0, str(tree))
    if stand_in_triton:
        import torch._inductor.compile_fx  # noqa: F401
        import torch.distributed.tensor  # noqa: F401 - torch decides here whether triton exists: it does not
        import torch.utils.flop_counter  # noqa: F401

        sys.meta_path.insert(0, _TritonStandIn())
    from orchestrator.job import megatron_check
    from orchestrator.job import preflight as job

    megatron_check.import_megatron()
    core = sys.modules["megatron.core"].__file__
    cases = json.loads(cases_file.read_text())
    verdicts = {
        c["key"]: megatron_check.check_candidate(
            c["argv"],
            c["world"],
            env=c.get("env"),
            te_version=c.get("te"),
            arch=c.get("arch", megatron_check.HOPPER_ARCH),
        )
        for c in cases
    }
    if not preflight:
        return {"megatron": core, "verdicts": verdicts}
    te = {c.get("te") for c in cases}
    req = job.PreflightRequest(
        entry_script=str(tree / "pretrain_hybrid.py"),
        gpus_per_node=8,
        candidates=[job.CandidateArgv(c["key"], c["argv"], c["world"], c.get("env") or {}) for c in cases],
    )
    row, rejected = job.validate_candidates(req, [tree], te_version=te.pop() if len(te) == 1 else None)
    return {"megatron": core, "verdicts": verdicts, "preflight": asdict(row), "rejected": rejected}


if __name__ == "__main__":
    opts = sys.argv[3:]
    out = main(
        Path(sys.argv[1]).resolve(),
        Path(sys.argv[2]),
        preflight="--no-preflight" not in opts,
        stand_in_triton="--stand-in-triton" in opts,
    )
    print(json.dumps(out, default=str))
