"""The evidence bundle of a winner: beside its flags, what it ran with and whether it computes the right thing.

Why: flags alone do not reproduce a measurement. A recipe that lists VPP=4 while the measured run resolved
it to None is what a hand-tuned recipe loses; the bundle keeps, for the measured best: the Megatron commit,
the container image digest, the Transformer Engine / DeepEP / NCCL versions, the job's node list, the
NCCL/NVTE environment and the parity verdict. `best --flags` and the report's decision print it (one owner
of its fields and wording: this module).

Where each field comes from, evidence first (what the job's ranks reported, orchestrator.job.node via the
sidecars into the result's `versions` / `run_env`), then the sweep's provenance (preflight's node, the
configured image): `source` says which. On the twin every version reads "simulated" and the bundle says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.core.megatron import TESTED, TESTED_COMMIT, same_commit, short

SIMULATED = "simulated"


@dataclass(frozen=True)
class Bundle:
    simulated: bool
    megatron_commit: str | None
    megatron_commit_source: str  # "job" (the ranks' sidecars), "preflight" (its node) or "" (unknown)
    container_image: str | None
    container_digest: str | None
    versions: dict[str, str]  # transformer_engine, deep_ep, nccl, torch, cuda, megatron_core
    nodes: str | None  # Slurm's node list of the measuring job (sacct)
    env: dict[str, str]  # NCCL_* / NVTE_* / ... as the ranks saw them
    parity: str  # the verdict, in words
    tested_commit: str = TESTED_COMMIT
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def rows(self) -> list[tuple[str, str]]:
        """(field, value) lines, as `best` and the report print them."""
        sim = f" ({SIMULATED}: the twin runs no Megatron)" if self.simulated else ""

        def ver(name: str) -> str:
            return self.versions.get(name) or "-"

        commit = self.megatron_commit or "unrecorded"
        if self.megatron_commit and self.megatron_commit != SIMULATED:
            same = same_commit(self.megatron_commit, TESTED_COMMIT)
            commit += " (the tested commit)" if same else f" (not the tested {short(TESTED_COMMIT)}, {TESTED})"
            commit += f" [from the {self.megatron_commit_source}]" if self.megatron_commit_source else ""
        image = self.container_image or "none (no container)"
        if self.container_image:
            image += f" @ {self.container_digest}" if self.container_digest else " (no digest: unpinned)"
        env = " ".join(f"{k}={v}" for k, v in sorted(self.env.items())) or "-"
        return [
            ("Megatron commit", commit + sim),
            ("container", image),
            ("Transformer Engine", ver("transformer_engine") + sim),
            ("DeepEP", ver("deep_ep") + sim),
            ("NCCL", ver("nccl") + sim),
            ("nodes", self.nodes or "-"),
            ("NCCL/NVTE env", env),
            ("parity", self.parity),
        ]


def parity_verdict(rows: Sequence[Any], *, enabled: bool | None = None) -> str:
    """The latest parity row in words (ledger ParityRow or its dict); none: whether the gate was on."""
    if not rows:
        if enabled is False:
            return "not run (parity.enabled=false): the correctness gate was off"
        return "not run: no parity check of this candidate"
    r = rows[-1]
    get = r.get if isinstance(r, Mapping) else lambda k: getattr(r, k)
    ref = str(get("reference_key") or "")[:10]
    if not ref:  # the gate had no other layout to compare with (the candidate is the reference itself)
        return f"not checked: {get('detail')}"
    verdict = "passed" if get("passed") else "FAILED"
    return f"{verdict} vs reference {ref} over {get('steps')} steps: {get('detail')}"


def _part(provenance: Mapping[str, Any], key: str) -> dict[str, Any]:
    """provenance[key] when it is a mapping (an older sweep may hold a word there), else {}."""
    value = provenance.get(key)
    return dict(value) if isinstance(value, Mapping) else {}


def of_best(
    hit: Mapping[str, Any],
    *,
    parity: Sequence[Any] = (),
    provenance: Mapping[str, Any] | None = None,
    parity_enabled: bool | None = None,
) -> Bundle:
    """The bundle of `orchestrator.ledger.queries.best`'s answer, with the candidate's parity rows and the
    sweep's provenance (its `megatron` and `container` parts)."""
    metrics = hit.get("metrics") or {}
    versions = {str(k): str(v) for k, v in (metrics.get("versions") or {}).items()}
    env = {str(k): str(v) for k, v in (metrics.get("run_env") or {}).items()}
    prov = dict(provenance or {})
    node_megatron, container = _part(prov, "megatron"), _part(prov, "container")
    notes = []
    commit, source = versions.pop("megatron_commit", None), "job"
    if not commit:
        commit, source = node_megatron.get("commit"), "preflight" if node_megatron.get("commit") else ""
    elif node_megatron.get("commit") and not same_commit(commit, node_megatron["commit"]):
        notes.append(f"the job ran {short(commit)}, preflight's node had {short(node_megatron['commit'])}")
    image = versions.pop("container_image", None) or container.get("image")
    digest = versions.pop("container_digest", None) or container.get("digest")
    return Bundle(
        simulated=bool(hit.get("simulated")),
        megatron_commit=commit,
        megatron_commit_source=source,
        container_image=image,
        container_digest=digest,
        versions=versions,
        nodes=(hit.get("attempt") or {}).get("node_list"),
        env=env,
        parity=parity_verdict(parity, enabled=parity_enabled),
        notes=notes,
    )
