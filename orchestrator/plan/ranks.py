"""Which global ranks form each parallel group, exactly as Megatron's RankGenerator builds them.

Why: whether an EP or CP group stays inside one NVLink node (ep_nodes, cp_nodes) decides if expert
all-to-all and CP exchange cross the network. Megatron lays ranks out on two grids over the same N GPUs
(megatron/core/parallel_state.py, initialize_model_parallel + RankGenerator):

- dense grid, order "tp-cp-ep-dp-pp" with ep=1: sizes TP, CP, D_a, PP;
- expert grid, the same order string with cp=1: sizes ETP, EP, D_e, PP (CP folded into D_e).

`--use-tp-pp-dp-mapping` swaps the last two axes ("tp-cp-ep-pp-dp"). The leftmost axis has stride 1.
A group for a set of axes holds the ranks that differ only along those axes. No GTP (gtp_remat = 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from itertools import product
from math import gcd

from orchestrator.plan.layout import Layout

DEFAULT_ORDER = "tp-cp-ep-dp-pp"
TP_PP_DP_ORDER = "tp-cp-ep-pp-dp"  # --use-tp-pp-dp-mapping
ORDERS = (DEFAULT_ORDER, TP_PP_DP_ORDER)

# Our group name -> (grid, axes in Megatron's token spelling). Dense groups use the names Megatron's
# parallel_state gives them; expert groups are prefixed e (etp, edp) as in Megatron's getters.
DENSE_GROUPS = {
    "tp": "tp",
    "cp": "cp",
    "dp": "dp",
    "pp": "pp",
    "dp-cp": "dp-cp",
    "tp-cp": "tp-cp",
    "tp-pp": "tp-pp",
    "tp-dp": "tp-dp",
    "tp-dp-cp": "tp-dp-cp",
}
EXPERT_GROUPS = {"etp": "tp", "ep": "ep", "edp": "dp", "etp-ep": "tp-ep", "etp-ep-pp": "tp-ep-pp", "epp": "pp"}


def order_for(layout: Layout) -> str:
    return TP_PP_DP_ORDER if layout.use_tp_pp_dp_mapping else DEFAULT_ORDER


def _grid_sizes(layout: Layout, world_size: int, order: str) -> tuple[dict[str, int], dict[str, int]]:
    """Axis sizes of the dense and the expert grid; ValueError when N does not divide."""
    if order not in ORDERS:
        raise ValueError(f"unknown rank order {order!r}; expected one of {ORDERS}")
    dense_model = layout.tp * layout.cp * layout.pp
    expert_model = layout.etp * layout.ep * layout.pp
    if world_size % dense_model or world_size % expert_model:
        raise ValueError(
            f"world size {world_size} is not divisible by TPxCPxPP={dense_model} and ETPxEPxPP={expert_model}"
        )
    dense = {"tp": layout.tp, "cp": layout.cp, "ep": 1, "dp": world_size // dense_model, "pp": layout.pp}
    expert = {"tp": layout.etp, "cp": 1, "ep": layout.ep, "dp": world_size // expert_model, "pp": layout.pp}
    if not order.endswith("pp") and layout.pp > 1 and dense["dp"] != expert["dp"]:
        # initialize_model_parallel asserts this: otherwise the two grids' PP groups differ.
        raise ValueError(f"order {order} with PP>1 needs expert DP ({expert['dp']}) == DP ({dense['dp']})")
    return dense, expert


def _strides(sizes: dict[str, int], order: str) -> dict[str, int]:
    """Rank stride of each axis: the leftmost axis of `order` has stride 1, each next one the product before it."""
    out, stride = {}, 1
    for axis in order.split("-"):
        out[axis] = stride
        stride *= sizes[axis]
    return out


def coords(layout: Layout, world_size: int, rank: int, order: str | None = None) -> dict[str, int]:
    """A global rank's coordinates on the dense grid (tp, cp, ep = 0, dp, pp), in Megatron's rank order:
    rank = sum of coordinate x stride (the inverse of the enumeration rank_groups uses). ValueError when N
    does not divide or the rank is outside it."""
    order = order or order_for(layout)
    dense, _ = _grid_sizes(layout, world_size, order)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    return {axis: rank // stride % dense[axis] for axis, stride in _strides(dense, order).items()}


def _groups(sizes: dict[str, int], order: str, axes: str) -> list[list[int]]:
    """Groups along `axes` on a grid whose axis strides follow `order` (leftmost = stride 1).

    Groups are listed with the remaining axes' index varying leftmost-fastest, and ranks in a group
    with the chosen axes varying leftmost-fastest: the same enumeration as Megatron's
    generate_masked_orthogonal_rank_groups.
    """
    names = order.split("-")
    chosen = set(axes.split("-"))
    strides = _strides(sizes, order)
    inner = [n for n in names if n in chosen]
    outer = [n for n in names if n not in chosen]

    def offsets(axis_names: Sequence[str]) -> list[int]:
        # product() varies its last argument fastest; reverse so the leftmost axis is fastest.
        ranges = [range(0, sizes[n] * strides[n], strides[n]) for n in reversed(axis_names)]
        return [sum(p) for p in product(*ranges)]

    members = offsets(inner)
    return [[base + m for m in members] for base in offsets(outer)]


def rank_groups(layout: Layout, world_size: int, order: str | None = None) -> dict[str, list[list[int]]]:
    """Every dense (tp, cp, dp, pp, dp-cp, tp-cp, tp-pp, ...) and expert (etp, ep, edp, etp-ep, etp-ep-pp,
    epp) group. `order` defaults to the layout's mapping (DEFAULT_ORDER or TP_PP_DP_ORDER)."""
    order = order or order_for(layout)
    dense, expert = _grid_sizes(layout, world_size, order)
    out = {name: _groups(dense, order, axes) for name, axes in DENSE_GROUPS.items()}
    out.update({name: _groups(expert, order, axes) for name, axes in EXPERT_GROUPS.items()})
    return out


@lru_cache(maxsize=65536)
def _span(stride: int, size: int, world_size: int, gpus_per_node: int) -> int:
    """Most nodes one group {o + j*stride : j < size} covers, over all groups of that kind.

    In both orders TP/ETP, CP and EP sit left of DP and PP, so a CP (EP) group is an arithmetic
    progression with stride TP (ETP) and its start is o = a + c*stride*size, a < stride. If stride >= g
    (GPUs per node) every member is on its own node. Otherwise consecutive members never skip a node,
    so the group covers floor((o mod g + (size-1)*stride) / g) + 1 nodes: largest for the largest
    reachable o mod g. Residues of c*stride*size repeat with period <= g, so at most g*g starts are
    tried, independent of N.
    """
    if size == 1:
        return 1
    if stride >= gpus_per_node:
        return size
    block = stride * size
    n_blocks = world_size // block
    period = gpus_per_node // gcd(block, gpus_per_node)
    r_max = max((a + c * block) % gpus_per_node for a in range(stride) for c in range(min(n_blocks, period)))
    return (r_max + (size - 1) * stride) // gpus_per_node + 1


def node_spans(layout: Layout, n_gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(ep_nodes, cp_nodes): the most nodes one EP group and one CP group span. Same for both orders."""
    _grid_sizes(layout, n_gpus, DEFAULT_ORDER)  # raises on an illegal layout
    return (
        _span(layout.etp, layout.ep, n_gpus, gpus_per_node),
        _span(layout.tp, layout.cp, n_gpus, gpus_per_node),
    )


def allocated_domain(gpus_per_nvlink_domain: int, gpus_per_node: int) -> int:
    """GPUs of one NVLink domain a job's contiguous ranks fill: whole hosts, a power of two of them, at most the
    domain. An NVL72 rack of 18 four-GPU trays gives a job 16 trays = 64 GPUs (Slurm's topology/block plugin
    allocates racks in power-of-two blocks: slurm.conf TopologyPlugin=topology/block, topology.conf BlockSizes),
    so EP64 fits one domain and EP128 does not; an 8-GPU NVLink node is its own domain."""
    nodes = max(1, gpus_per_nvlink_domain // max(1, gpus_per_node))
    return (1 << (nodes.bit_length() - 1)) * gpus_per_node


def domain_spans(layout: Layout, n_gpus: int, domain_gpus: int) -> tuple[int, int]:
    """(ep_domains, cp_domains): the most NVLink domains of `domain_gpus` consecutive ranks one EP group and one
    CP group span (node_spans with the domain for the node: ranks fill domains in order)."""
    return node_spans(layout, n_gpus, domain_gpus)


def nodes_of(group: Sequence[int], gpus_per_node: int) -> int:
    """Distinct nodes holding the ranks of one group (rank r lives on node r // gpus_per_node)."""
    return len({r // gpus_per_node for r in group})


def evidence_ranks(layout: Layout, world_size: int, order: str | None = None) -> frozenset[int]:
    """The ranks whose output and sidecar a job keeps in files of their own; the others' output goes to a
    shared per-node log (orchestrator.job.entry), so a 16k-GPU job leaves a few hundred files, not 50k.

    Megatron's logging decides who carries evidence: the last rank prints the iteration lines and timers,
    rank 0 the arguments and checkpoint messages, DP-rank-0 ranks the memory lines (their TP/CP peers are
    alike, so the TP-0 CP-0 one per PP stage stands for them). Router load and allocator peaks differ by
    PP stage and by EP rank (the hot EP rank receives the most tokens), so every EP rank of the first
    expert-DP group of each PP stage keeps its sidecar: at most PP x (EP + 1) + 2 ranks."""
    order = order or order_for(layout)
    dense, expert = _grid_sizes(layout, world_size, order)
    d_stride, e_stride = _strides(dense, order), _strides(expert, order)
    out = {0, world_size - 1}
    for p in range(layout.pp):
        out.add(p * d_stride["pp"])
        out.update(p * e_stride["pp"] + e * e_stride["ep"] for e in range(layout.ep))
    return frozenset(out)


def probe_ranks(
    layout: Layout, world_size: int, heaviest_stage: int | None = None, order: str | None = None
) -> list[int]:
    """The ranks that bound a layout's memory, one per pipeline stage that can be the heaviest: the first PP
    stage (the most microbatches in flight), the last (output head, loss, MTP; the last rank, which prints
    Megatron's iteration lines) and `heaviest_stage` (the planner's heaviest), deduplicated, in stage order.
    A one-GPU rank probe (Megatron's --fake-process-group) runs each of them on its own GPU. A stage is
    probed on its TP-0 CP-0 DP-0 rank, which prints Megatron's memory line (report_memory prints on DP-rank 0
    only, dev megatron/training/utils/common_utils.py:311-317); the last stage on the last rank, which
    prints the iteration line (its peak is in its sidecar)."""
    order = order or order_for(layout)
    dense, _ = _grid_sizes(layout, world_size, order)
    stride = _strides(dense, order)["pp"]
    last = layout.pp - 1
    stages = {0, last} | ({min(max(0, int(heaviest_stage)), last)} if heaviest_stage is not None else set())
    return [world_size - 1 if p == last else p * stride for p in sorted(stages)]
