"""The rank probe's run-time mode (orchestrator/plan/probe.py `MODE`): what the job wrapper changes in Megatron's
own interpreter so that one rank of an N-GPU job, alone on one GPU under torch's `fake` backend, computes what that
rank computes in the real job.

Why at run time: Megatron's switches cannot give V4 static shapes (any packing scheduler sets
`variable_seq_lengths`, orchestrator/plan/probe.py), and no switch balances a fake expert exchange. So, only while
the default process group's backend is `fake`:
1. `P2PCommunicator._communicate_shapes` answers the packed buffer's static shape instead of receiving an unwritten
   one (the shape every stage of the real job sends: `max_seqlen_per_dp_cp_rank` tokens, / TP with sequence
   parallelism, batch 1, the hidden size x the residual streams with hyper-connections, as
   schedules.get_tensor_shapes and the interleaved schedule size it);
2. every point-to-point receive (`torch.distributed.irecv` and `recv`, which `batch_isend_irecv` calls: the
   pipeline's tensors and gradients, the CP boundary exchange) gets finite values (a seeded normal draw) instead of
   unwritten memory;
3. `MoEAlltoAllTokenDispatcher.preprocess` keeps the rank's own routing for what it sends, and sets what it receives
   to the layout's balanced routing: each local expert gets k x T_group / E tokens (T_group = the rank's tokens x
   ETP x EP), x `skew` where the sweep asks for a hot rank;
4. the dispatcher's `all_to_all` returns as many finite rows as the split sizes say (the rank's own rows, repeated),
   with the autograd of a real exchange (the gradient goes back to the rows it came from), whatever the torch
   version's fake all-to-all does with uneven splits.

Each point is named with its file:line in Megatron-LM dev d48bd6be0a85 (`POINTS`). `check_tree` reads a checkout's
code (ast, no import) and says what moved; `install` refuses (ProbeModeError, one line with the fix) on a Megatron
whose code points moved or a torch without the fake backend. Imports stay stdlib at module level.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core.megatron import TESTED
from orchestrator.plan import probe

P2P = "megatron/core/pipeline_parallel/p2p_communication.py"
DISPATCH = "megatron/core/transformer/moe/token_dispatcher.py"


@dataclass(frozen=True)
class Point:
    """One place in Megatron's code the mode depends on: a method (with its parameters) in a class of a file,
    whose body must still contain `calls` (names it calls or attributes it assigns)."""

    file: str
    cls: str
    method: str
    params: tuple[str, ...]
    lines: str  # where it is at TESTED_COMMIT
    calls: tuple[str, ...] = ()

    def where(self) -> str:
        return f"{self.file}:{self.lines} {self.cls}.{self.method}"


POINTS: tuple[Point, ...] = (
    Point(
        P2P,
        "P2PCommunicator",
        "_communicate_shapes",
        ("self", "tensor_send_next", "tensor_send_prev", "recv_prev", "recv_next"),
        "186-273",
    ),
    Point(P2P, "P2PCommunicator", "_communicate", ("self",), "275-442", calls=("_communicate_shapes",)),
    Point(
        DISPATCH,
        "MoEAlltoAllTokenDispatcher",
        "preprocess",
        ("self", "routing_map"),
        "517-638",
        calls=("output_splits", "output_splits_tp", "num_global_tokens_per_local_expert"),
    ),
    Point(
        DISPATCH,
        "MoEAlltoAllTokenDispatcher",
        "token_dispatch",
        ("self", "permutated_local_input_tokens", "permuted_probs"),
        "709-753",
        calls=("all_to_all",),
    ),
    Point(DISPATCH, "MoEAlltoAllTokenDispatcher", "token_combine", ("self",), "864-901", calls=("all_to_all",)),
)


class ProbeModeError(RuntimeError):
    """The mode cannot be installed as it was checked: one line naming what moved and a fix."""


def _fix() -> str:
    return (
        f"run the probe on {TESTED} (the tested Megatron-LM), or set workload.probe_mode={probe.OFF} to run this "
        "Megatron's fake process group as it is"
    )


# --------------------------------------------------------------------------------------------- code points
def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    return None


def _names(fn: ast.FunctionDef) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.Name):
            out.add(node.id)
    return out


def point_problem(source: str, point: Point) -> str | None:
    """What moved at `point` in a file's source (None: it is as the mode expects)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return f"{point.file} does not parse ({exc.msg})"
    fn = _method(tree, point.cls, point.method)
    if fn is None:
        return f"{point.cls}.{point.method} is gone from {point.file} (dev {point.lines})"
    params = tuple(a.arg for a in fn.args.args)
    if params[: len(point.params)] != point.params:
        return f"{point.where()} takes ({', '.join(params)}), not ({', '.join(point.params)})"
    missing = [c for c in point.calls if c not in _names(fn)]
    if missing:
        return f"{point.where()} no longer uses {', '.join(missing)}"
    return None


def check_tree(root: str | Path) -> list[str]:
    """What moved in the Megatron tree at `root` (holding `megatron/`), one line per point; [] when every point is
    where the mode expects it. Reads files only: preflight runs it where Megatron cannot be imported."""
    root = Path(root)
    problems: list[str] = []
    for point in POINTS:
        path = root / point.file
        if not path.is_file():
            problems.append(f"{point.file} is missing under {root}")
            continue
        if (p := point_problem(path.read_text(errors="replace"), point)) is not None:
            problems.append(p)
    return problems


# --------------------------------------------------------------------------------------------- the mode
@dataclass
class Installed:
    """What the mode changed in this process, and how often each change acted (the sidecar reports it)."""

    mode: str
    skew: float
    torch: str
    megatron: str  # where megatron.core came from
    counts: dict[str, int] = field(default_factory=dict)
    undo: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def hit(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def report(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "skew": self.skew,
            "torch": self.torch,
            "megatron": self.megatron,
            "counts": dict(self.counts),
        }


_INSTALLED: Installed | None = None


def installed() -> Installed | None:
    return _INSTALLED


def _megatron_root(module: Any) -> Path:
    """The tree holding `megatron/` that `module` (megatron.core.<...>) was imported from."""
    return Path(module.__file__).resolve().parents[module.__name__.count(".")]


def _fake(torch: Any) -> bool:
    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized() and dist.get_backend() == "fake")


def static_shape(
    config: Any, pp_rank: int, pp_size: int, *, seq_length: int | None = None, micro_batch_size: int | None = None
) -> list[int]:
    """The [tokens, batch, hidden] a stage sends to the next one in the real job (and receives from the previous).

    Packed (a packing scheduler is set): one packed buffer per CP rank, `max_seqlen_per_dp_cp_rank` tokens, batch 1
    (megatron/core/datasets/data_schedule.py:146-218: dp_balanced packs up to that x CP tokens per microbatch);
    else Megatron's fixed shape, seq_length / CP, micro-batch size (schedules.py:2248-2276). Tokens / TP with
    sequence parallelism; the hidden size x num_residual_streams with hyper-connections between stages
    (schedules.py:1280-1284, 2257-2273)."""
    packed = getattr(config, "sequence_packing_scheduler", None) is not None
    if packed:
        tokens = int(config.max_seqlen_per_dp_cp_rank)
        batch = 1
    else:
        if seq_length is None or micro_batch_size is None:
            raise ProbeModeError(
                "the probe mode needs the sequence length and micro-batch size for a pipeline without packing: "
                + _fix()
            )
        tokens, batch = int(seq_length) // int(config.context_parallel_size), int(micro_batch_size)
    if getattr(config, "sequence_parallel", False):
        tokens //= int(config.tensor_model_parallel_size)
    hidden = int(config.hidden_size)
    if getattr(config, "enable_hyper_connections", False) and pp_size > 1:
        hidden *= int(getattr(config, "num_residual_streams", 1))
    return [tokens, batch, hidden]


def balanced_counts(
    tokens: int, topk: int, experts: int, sources: int, local: list[int], skew: float = 1.0
) -> list[list[int]]:
    """[source][local expert] tokens each of `sources` ranks (ETP x EP) sends to each of this rank's `local`
    experts under balanced routing: each source routes k x tokens assignments evenly over the E experts (the
    remainder one each to the first experts), x `skew` for a hot rank."""
    per_rank = topk * tokens
    base, extra = divmod(per_rank, experts)
    out = []
    for _src in range(sources):
        row = []
        for e in local:
            n = base + (1 if e < extra else 0)
            row.append(round(n * skew))
        out.append(row)
    return out


def _fill(torch: Any, tensor: Any, state: dict[str, Any]) -> None:
    """Finite values in a receive buffer: a seeded normal draw for floating point, zeros otherwise."""
    with torch.no_grad():
        if tensor.is_floating_point():
            gen = state.get(tensor.device)
            if gen is None:
                gen = state[tensor.device] = torch.Generator(device=tensor.device)
                gen.manual_seed(int(os.environ.get("RANK", "0")))
            tensor.normal_(generator=gen)
        else:
            tensor.zero_()


def install(
    mode: str = probe.MODE, *, skew: float = 1.0, seq_length: int | None = None, micro_batch_size: int | None = None
) -> Installed:
    """Install `mode` into this interpreter's Megatron (imported here) and torch; refuses with ProbeModeError when a
    code point moved or torch has no fake backend. Idempotent: a second call returns the first install."""
    global _INSTALLED
    if _INSTALLED is not None:
        return _INSTALLED
    if mode != probe.MODE:
        raise ProbeModeError(f"unknown probe mode {mode!r}: this job knows {probe.MODE}")
    import torch
    import torch.distributed as dist

    if not dist.is_available() or "fake" not in {str(b) for b in dist.Backend.backend_list}:
        raise ProbeModeError(f"torch {torch.__version__} has no 'fake' process-group backend: " + _fix())
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: F401 - dev initialize.py:343-350
    except ImportError as exc:
        raise ProbeModeError(f"torch {torch.__version__} lacks FakeStore ({exc}): " + _fix()) from None
    from megatron.core.pipeline_parallel import p2p_communication as p2p
    from megatron.core.transformer.moe import token_dispatcher as td

    root = _megatron_root(p2p)
    problems = check_tree(root)
    if problems:
        raise ProbeModeError(f"probe mode {mode} cannot install on the Megatron at {root}: {problems[0]}: " + _fix())

    done = Installed(mode=mode, skew=float(skew), torch=str(torch.__version__), megatron=str(root))
    fills: dict[str, Any] = {}

    def patch(owner: Any, name: str, new: Any) -> None:
        old = getattr(owner, name)
        setattr(owner, name, new)
        done.undo.append(lambda: setattr(owner, name, old))

    # 1. static shapes (p2p_communication.py:186-273, used at :322-325)
    original_shapes = p2p.P2PCommunicator._communicate_shapes

    def _communicate_shapes(self, tensor_send_next, tensor_send_prev, recv_prev, recv_next):
        if not _fake(torch):
            return original_shapes(self, tensor_send_next, tensor_send_prev, recv_prev, recv_next)
        shape = static_shape(
            self.config,
            self.pp_group.rank(),
            self.pp_group.size(),
            seq_length=seq_length,
            micro_batch_size=micro_batch_size,
        )
        done.hit("static_shapes")
        return (list(shape) if recv_prev else [0, 0, 0]), (list(shape) if recv_next else [0, 0, 0])

    patch(p2p.P2PCommunicator, "_communicate_shapes", _communicate_shapes)

    # 2. finite receive buffers: every point-to-point receive under the fake backend
    def receiving(fn: Callable[..., Any], pick: Callable[[tuple, dict], list]) -> Callable[..., Any]:
        def wrapper(*args, **kwargs):
            out = fn(*args, **kwargs)
            if _fake(torch):
                for tensor in pick(args, kwargs):
                    _fill(torch, tensor, fills)
                    done.hit("receives_filled")
            return out

        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    def _tensor_arg(args: tuple, kwargs: dict) -> list:
        t = kwargs.get("tensor", args[0] if args else None)
        return [t] if t is not None else []

    # batch_isend_irecv calls each P2POp's own function, and P2POp accepts only distributed_c10d's module-level
    # isend / irecv (`_check_op`): the wrapper replaces the function under both names, so a batched receive is
    # filled as a single one is.
    c10d = dist.distributed_c10d
    for name in ("irecv", "recv"):
        fn: Callable[..., Any] = getattr(dist, name)
        if getattr(c10d, name, None) is not fn:
            raise ProbeModeError(
                f"torch {torch.__version__}: torch.distributed.{name} is not distributed_c10d's: " + _fix()
            )
        wrapped = receiving(fn, _tensor_arg)
        patch(dist, name, wrapped)
        patch(c10d, name, wrapped)

    # 3. balanced expert counts (token_dispatcher.py:517-638)
    original_preprocess = td.MoEAlltoAllTokenDispatcher.preprocess

    def preprocess(self, routing_map):
        counts = original_preprocess(self, routing_map)
        if not _fake(torch) or self.drop_and_pad or (self.ep_size == 1 and self.tp_size == 1):
            return counts  # capacity-padded counts do not depend on the exchange; one rank exchanges nothing
        local = list(self.local_expert_indices)
        rows = balanced_counts(
            routing_map.size(0),
            self.config.moe_router_topk,
            self.num_experts,
            self.tp_size * self.ep_size,
            local,
            done.skew,
        )
        dev = routing_map.device
        # [tp, ep, local] in the order the original builds it (:588-594): source rank = ep x tp + tp_rank
        grid = torch.tensor(rows, dtype=torch.long, device=dev).reshape(self.ep_size, self.tp_size, len(local))
        grid = grid.transpose(0, 1).contiguous()
        per_rank = grid.sum(dim=2)  # [tp, ep]
        self.output_splits = per_rank[self.tp_rank]
        self.output_splits_tp = per_rank.sum(dim=1)
        if self.num_local_experts > 1:
            self.num_global_tokens_per_local_expert = grid.view(-1, self.num_local_experts).to(self.permute_idx_device)
        done.hit("dispatches_balanced")
        return grid.sum(dim=(0, 1)).to(counts.device)

    patch(td.MoEAlltoAllTokenDispatcher, "preprocess", preprocess)

    # 4. the exchange itself: as many rows as the splits say, from the rank's own (token_dispatcher.py:732-891)
    original_a2a = td.all_to_all

    def all_to_all(group, input_, output_split_sizes_=None, input_split_sizes=None, use_nccl_stream=False):
        if not _fake(torch) or group.size() == 1:
            return original_a2a(group, input_, output_split_sizes_, input_split_sizes, use_nccl_stream)
        rows = int(input_.size(0)) if output_split_sizes_ is None else int(sum(int(x) for x in output_split_sizes_))
        done.hit("exchanges")
        if input_.size(0) == 0:
            return input_.new_zeros((rows, *input_.shape[1:])) + input_.sum() * 0
        index = torch.arange(rows, device=input_.device) % input_.size(0)
        return input_.index_select(0, index)

    patch(td, "all_to_all", all_to_all)

    _INSTALLED = done
    return done


def uninstall() -> None:
    """Undo `install` (tests; a job process simply ends)."""
    global _INSTALLED
    if _INSTALLED is None:
        return
    for undo in reversed(_INSTALLED.undo):
        undo()
    _INSTALLED = None


def from_env(environ: dict[str, str] | None = None) -> tuple[str | None, float]:
    """(the mode this job was asked for, its skew) from MODE_ENV / SKEW_ENV; (None, 1.0) when none."""
    env = os.environ if environ is None else environ
    mode = env.get(probe.MODE_ENV) or None
    return (None if mode == probe.OFF else mode), float(env.get(probe.SKEW_ENV) or 1.0)


def describe() -> str:
    """The line a probe's job prints first (plan/probe.mode_line): the mode in effect in this process."""
    done = _INSTALLED
    if done is None:
        return probe.mode_line(None)
    return probe.mode_line(done.mode, f"torch {done.torch}, megatron from {done.megatron}; tested with {TESTED}")
