"""What a Slurm partition can ever run, and the pending reasons that never clear.

Why: a job that asks for more nodes, CPUs or GPUs per node, or more time than its partition has is accepted by
sbatch (unless EnforcePartLimits is set) and then pends forever with reason PartitionConfig,
PartitionNodeLimit or PartitionTimeLimit; a sweep that waits on it waits for nothing. So every request is
compared with the partition before sbatch (`refusal`), and while jobs pend their reason (squeue %r) is read
(`pending_reasons`): one that never clears stops the caller with the fix. Reasons and their meaning:
https://slurm.schedmd.com/job_reason_codes.html; the partition's fields: https://slurm.schedmd.com/scontrol.html.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, replace

# sinfo %t states of nodes that take no new job until an admin acts (https://slurm.schedmd.com/sinfo.html)
UNUSABLE = ("down", "drain", "drng", "drained", "draining", "fail", "failg", "maint", "inval", "futr", "futu")

# Pending reasons that never clear by waiting (https://slurm.schedmd.com/job_reason_codes.html), with the fix.
# ReqNodeNotAvail is here only for a partition with no usable node (`fatal_reason`): elsewhere it clears once a
# reservation or a node's maintenance ends.
NEVER_CLEARS = {
    "PartitionConfig": "it asks for more than the partition has (nodes, CPUs or GPUs per node): ask for what it has "
    "(stage.gpus, stage.gpus_per_node, cluster.cpus_per_task) or use another (cluster.slurm.partition=NAME)",
    "PartitionNodeLimit": "it asks for more nodes than the partition's MaxNodes allows: use a smaller stage "
    "(stage.gpus=N) or another partition (cluster.slurm.partition=NAME)",
    "PartitionTimeLimit": "it asks for more time than the partition's MaxTime: shorten stage.warmup_iters / "
    "measure_iters or use another partition (cluster.slurm.partition=NAME)",
    "ReqNodeNotAvail": "every node of the partition is drained or down: ask the admins to resume them "
    "(scontrol update nodename=... state=resume) or use another partition",
    "BadConstraints": "no node of the partition has the requested features: fix cluster.slurm.constraint",
    "InvalidAccount": "the account is not one of yours: fix cluster.slurm.account (sacctmgr show assoc)",
    "InvalidQOS": "the QoS is not one you may use: fix cluster.slurm.qos (sacctmgr show assoc)",
}


@dataclass(frozen=True)
class Partition:
    """One partition as `scontrol show partition -o` and `sinfo` describe it (None: no limit, or not said)."""

    name: str
    nodes: int  # TotalNodes
    usable_nodes: int  # nodes not drained, down or failed
    cpus_per_node: int | None  # the smallest node's CPUs
    gpus_per_node: int | None  # the smallest node's `gpu` gres count
    max_time_min: int | None  # MaxTime; None = UNLIMITED
    max_nodes: int | None  # MaxNodes per job; None = UNLIMITED
    state: str = "UP"
    mem_mb: int | None = None  # the smallest node's memory (sinfo %m), for a shared task's share

    def size(self) -> str:
        """`partition debug: 4 nodes x 8 CPUs x 8 GPUs, MaxTime UNLIMITED` (the words of every refusal)."""
        usable = f" ({self.usable_nodes} usable)" if self.usable_nodes < self.nodes else ""
        cpus = f" x {self.cpus_per_node} CPUs" if self.cpus_per_node is not None else ""
        gpus = f" x {self.gpus_per_node} GPUs" if self.gpus_per_node is not None else ""
        time = f"{self.max_time_min} min" if self.max_time_min is not None else "UNLIMITED"
        cap = f", MaxNodes {self.max_nodes}" if self.max_nodes is not None else ""
        return f"partition {self.name}: {self.nodes} nodes{usable}{cpus}{gpus}, MaxTime {time}{cap}"


@dataclass(frozen=True)
class Request:
    """What one job asks for, per node as Slurm allocates it."""

    what: str  # "stage 1k's jobs", a job name
    nodes: int
    cpus_per_node: int  # cpus_per_task x tasks per node
    gpus_per_node: int
    time_min: int = 0  # 0: not known yet (not compared)


def slurm_minutes(text: str) -> int | None:
    """Slurm's time format (`infinite`, `MM`, `MM:SS`, `HH:MM:SS`, `D-HH[:MM[:SS]]`) -> minutes; None = no limit."""
    text = text.strip()
    if not text or text.lower() in ("infinite", "unlimited", "partition_limit", "n/a", "none"):
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:
        h, m = [*parts, 0, 0][:2]
        return int(days) * 1440 + h * 60 + m
    if len(parts) == 3:
        return parts[0] * 60 + parts[1] + (1 if parts[2] else 0)
    return parts[0] + (1 if len(parts) == 2 and parts[1] else 0)


def gres_gpus(gres: str) -> int | None:
    m = re.search(r"gpu(?::[\w.-]+)?:(\d+)", gres)
    return int(m.group(1)) if m else None


def ask(cmd: list[str]) -> str | None:
    """stdout of a Slurm client command, or None when it is missing or fails."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def parse(scontrol: str, sinfo: str) -> Partition | None:
    """A Partition from one `scontrol show partition -o NAME` line and `sinfo -h -p NAME -o %c|%G|%t|%D` lines."""
    line = next((x for x in scontrol.splitlines() if x.startswith("PartitionName=")), None)
    if line is None:
        return None
    fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
    rows = [r.split("|") for r in sinfo.splitlines() if r.count("|") == 3]
    cpus = [int(r[0].rstrip("+")) for r in rows if r[0].rstrip("+").isdigit()]
    gpus = [g for r in rows if (g := gres_gpus(r[1])) is not None]
    total = int(fields.get("TotalNodes", "0") or 0) or sum(int(r[3]) for r in rows if r[3].isdigit())
    bad = sum(int(r[3]) for r in rows if r[3].isdigit() and r[2].rstrip("*~#!%$@^-").lower() in UNUSABLE)
    max_nodes = fields.get("MaxNodes", "UNLIMITED")
    return Partition(
        name=fields["PartitionName"],
        nodes=total,
        usable_nodes=max(0, total - bad),
        cpus_per_node=min(cpus) if cpus else None,
        gpus_per_node=min(gpus) if gpus else None,
        max_time_min=slurm_minutes(fields.get("MaxTime", "UNLIMITED")),
        max_nodes=int(max_nodes) if max_nodes.isdigit() else None,
        state=fields.get("State", "UP"),
    )


def read(name: str | None) -> Partition | None:
    """The named partition (else the default one) as Slurm says now; None when Slurm does not answer."""
    if not name:
        info = ask(["sinfo", "-h", "-o", "%P"]) or ""
        names = [x.strip() for x in info.splitlines() if x.strip()]
        name = next((n.rstrip("*") for n in names if n.endswith("*")), names[0].rstrip("*") if names else "")
        if not name:
            return None
    show = ask(["scontrol", "show", "partition", "-o", name])
    nodes = ask(["sinfo", "-h", "-p", name, "-o", "%c|%G|%t|%D"])
    if show is None or nodes is None:
        return None
    part = parse(show, nodes)
    words = (ask(["sinfo", "-h", "-p", name, "-o", "%m"]) or "").split()
    mems = [int(w.rstrip("+")) for w in words if w.rstrip("+").isdigit()]
    return replace(part, mem_mb=min(mems)) if part is not None and mems else part


def misfits(req: Request, part: Partition) -> list[tuple[str, str]]:
    """(what does not fit, its fix) for each limit `req` exceeds; [] when the partition can run it."""
    out = []
    hold = min(part.nodes, part.max_nodes) if part.max_nodes is not None else part.nodes
    if req.nodes > hold:
        gpn = part.gpus_per_node or req.gpus_per_node
        out.append(
            (
                f"{req.nodes} nodes",
                f"use a partition with at least {req.nodes} nodes (cluster.slurm.partition=NAME) or a stage of at "
                f"most {hold * gpn} GPUs that has a legal layout there",
            )
        )
    elif req.nodes > part.usable_nodes:
        out.append((f"{req.nodes} nodes", f"only {part.usable_nodes} are usable (drained or down): ask the admins"))
    if part.gpus_per_node is not None and req.gpus_per_node > part.gpus_per_node:
        out.append(
            (f"{req.gpus_per_node} GPUs per node", f"set stage.gpus_per_node={part.gpus_per_node} (or hardware=...)")
        )
    if part.cpus_per_node is not None and req.cpus_per_node > part.cpus_per_node:
        per_task = max(1, part.cpus_per_node // max(1, req.gpus_per_node))
        out.append((f"{req.cpus_per_node} CPUs per node", f"set cluster.cpus_per_task={per_task}"))
    if req.time_min and part.max_time_min is not None and req.time_min > part.max_time_min:
        out.append(
            (
                f"{req.time_min} min",
                "shorten stage.warmup_iters/measure_iters or use a partition with more MaxTime",
            )
        )
    return out


def refusal(requests: Sequence[Request], part: Partition) -> str | None:
    """One line naming the partition's size, what the first request that cannot fit asks for, and the fixes."""
    for req in requests:
        bad = misfits(req, part)
        if bad:
            asks = ", ".join(what for what, _ in bad)
            fixes = "; ".join(fix for _, fix in bad)
            return f"{req.what} ask for {asks}, more than {part.size()} can ever give: {fixes}"
    return None


def pending_reasons(job_ids: Sequence[str]) -> dict[str, str]:
    """job id -> Slurm's reason for each of `job_ids` still pending (squeue %r, arrays one line per task)."""
    ids = sorted({str(j).split("_")[0] for j in job_ids})
    if not ids:
        return {}
    out = ask(["squeue", "-h", "-r", "-t", "PD", "-j", ",".join(ids), "-o", "%i|%r"]) or ""
    rows = [line.split("|", 1) for line in out.splitlines() if "|" in line]
    return {jid.strip(): why.strip() for jid, why in rows}


def fatal_reason(reason: str, part: Partition | None) -> str | None:
    """Why a job pending for `reason` never starts, or None when waiting may still help. ReqNodeNotAvail is
    fatal only on a partition with no usable node (`part` read now): elsewhere a reservation or a node's
    maintenance ends."""
    word = reason.split("(", 1)[0].split(",", 1)[0].strip()
    if word not in NEVER_CLEARS:
        return None
    if word == "ReqNodeNotAvail" and (part is None or part.usable_nodes > 0):
        return None
    return NEVER_CLEARS[word]
