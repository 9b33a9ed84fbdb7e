"""What the Slurm cluster lets a stage run, asked from the login node: preflight's Slurm rows (the backend's
`limits`) and the one-line refusal of a stage its partition can never run (the backend's `refusal`).

Partition, node shape, account and QoS from sinfo and sacctmgr: MaxTime against each candidate's time limit,
GPUs and CPUs per node, node count. A missing answer is a warning row, never a crash; a candidate that asks for
more time than the partition allows is rejected (never launched)."""

from __future__ import annotations

import getpass
import re
from collections.abc import Mapping

from orchestrator.core.schema import ClusterConfig, StageConfig
from orchestrator.launch.registry import Answer, Row
from orchestrator.launch.slurm import partition
from orchestrator.launch.slurm.partition import ask, gres_gpus, slurm_minutes


def rows(cluster: ClusterConfig, stage: StageConfig, limits: Mapping[str, int]) -> Answer:
    """Partition, node shape, account and QoS rows; the candidates whose time limit no partition allows."""
    info = ask(
        ["sinfo", "-h", "-o", "%P|%l|%G|%c|%D"] + (["-p", cluster.slurm.partition] if cluster.slurm.partition else [])
    )
    if info is None:
        return Answer((Row("Slurm partition", "warn", "sinfo gave no answer", "check Slurm from this host"),))
    table = [line.split("|") for line in info.splitlines() if line.count("|") == 4]
    default = [r for r in table if r[0].endswith("*")]
    part = cluster.slurm.partition or (
        default[0][0].rstrip("*") if default else table[0][0].rstrip("*") if table else ""
    )
    mine = [r for r in table if r[0].rstrip("*") == part]
    if not mine:
        return Answer((Row("Slurm partition", "fail", f"no partition {part!r}", "set cluster.slurm.partition"),))
    out: list[Row] = []
    rejected: dict[str, str] = {}
    max_time = slurm_minutes(mine[0][1])
    longest = max(limits.values(), default=0)
    if max_time is not None:
        rejected = {
            k: f"asks for {t} min > partition {part} MaxTime {max_time} min" for k, t in limits.items() if t > max_time
        }
    out.append(
        Row(
            f"partition {part} MaxTime",
            "fail" if limits and len(rejected) == len(limits) else "warn" if rejected else "pass",
            f"{mine[0][1]} vs the longest candidate's {longest} min; {len(rejected)} over it (never launched)",
            "" if not rejected else "shorten stage.warmup_iters/measure_iters or use a partition with more time",
        )
    )
    gpus = {g for r in mine if (g := gres_gpus(r[2])) is not None}
    if not gpus:
        out.append(Row("GPUs per node", "warn", f"sinfo Gres {mine[0][2]!r}: no gpu count", ""))
    else:
        ok = min(gpus) >= stage.gpus_per_node
        out.append(
            Row(
                "GPUs per node (Slurm)",
                "pass" if ok else "fail",
                f"nodes have {sorted(gpus)}, stage.gpus_per_node={stage.gpus_per_node}",
                "" if ok else f"set stage.gpus_per_node={min(gpus)} or choose another partition",
            )
        )
    cpus = min(int(r[3].rstrip("+")) for r in mine if r[3].rstrip("+").isdigit()) if mine else 0
    need_cpus = (cluster.cpus_per_task or 1) * stage.gpus_per_node
    out.append(
        Row(
            "CPUs per node",
            "pass" if cpus >= need_cpus else "fail",
            f"{cpus} per node, {need_cpus} asked (cpus_per_task x gpus_per_node)",
            "" if cpus >= need_cpus else f"set cluster.cpus_per_task={max(1, cpus // stage.gpus_per_node)}",
        )
    )
    nodes = sum(int(r[4]) for r in mine if r[4].isdigit())
    need = -(-stage.gpus // stage.gpus_per_node)
    out.append(
        Row(
            "nodes",
            "pass" if nodes >= need else "fail",
            f"partition {part} has {nodes}, the stage needs {need}",
            "" if nodes >= need else "use a bigger partition or a smaller stage",
        )
    )
    out += _account_rows(cluster, need, longest)
    return Answer(tuple(out), rejected)


def _account_rows(cluster: ClusterConfig, nodes: int, minutes: int) -> list[Row]:
    user = getpass.getuser()
    assoc = ask(["sacctmgr", "-nP", "show", "assoc", "where", f"user={user}", "format=account,qos,maxnodes,maxwall"])
    if assoc is None:
        return [Row("account / QoS", "warn", "sacctmgr gave no answer", "ask the admins for your limits")]
    table = [line.split("|") for line in assoc.splitlines() if line.count("|") == 3]
    accounts = {r[0] for r in table}
    out = []
    if cluster.slurm.account and cluster.slurm.account not in accounts:
        out.append(
            Row(
                "account",
                "fail",
                f"{user} has no association with {cluster.slurm.account}",
                f"set cluster.slurm.account to one of {sorted(accounts)}",
            )
        )
    else:
        out.append(Row("account", "pass", cluster.slurm.account or f"default ({', '.join(sorted(accounts)) or '-'})"))
    qos = cluster.slurm.qos
    if qos:
        q = ask(["sacctmgr", "-nP", "show", "qos", "where", f"name={qos}", "format=name,maxwall,maxtresperjob"])
        row = (q or "").splitlines()[0].split("|") if q and q.strip() else None
        if row is None or len(row) < 3:
            out.append(
                Row(
                    f"QoS {qos}",
                    "fail" if q is not None else "warn",
                    "unknown QoS" if q is not None else "sacctmgr gave no answer",
                    "set cluster.slurm.qos",
                )
            )
        else:
            wall = slurm_minutes(row[1]) if row[1] else None
            m = re.search(r"node=(\d+)", row[2])
            max_nodes = int(m.group(1)) if m else None
            bad = (wall is not None and minutes > wall) or (max_nodes is not None and nodes > max_nodes)
            out.append(
                Row(
                    f"QoS {qos}",
                    "fail" if bad else "pass",
                    f"MaxWall {row[1] or '-'}, MaxTRESPerJob {row[2] or '-'}; needs {nodes} nodes, {minutes} min",
                    "use a QoS that allows the stage" if bad else "",
                )
            )
    return out


def refusal(cluster: ClusterConfig, stage: StageConfig) -> str | None:
    """One line when the stage's jobs can never run on the partition (its size and the fix), else None (also when
    Slurm does not answer)."""
    part = partition.read(cluster.slurm.partition)
    if part is None:
        return None
    gpn = stage.gpus_per_node
    req = partition.Request(
        what=f"stage {stage.name}'s jobs",
        nodes=-(-stage.gpus // gpn),
        cpus_per_node=(cluster.cpus_per_task or 1) * min(gpn, stage.gpus),
        gpus_per_node=min(gpn, stage.gpus),
    )
    return partition.refusal([req], part)
