"""A parallel layout's group arithmetic, its ledger identity and what the models predict for it.

`Layout` itself (one point of the search space) is declared with the knob registry, orchestrator/core/knobs.py.

Group arithmetic follows the guide's MoE Parallel Folding identity (no GTP):

    N / PP = TP x CP x D_a = ETP x EP x D_e

D_a is the attention (dense) data-parallel size, D_e the expert data-parallel size. EP is never
multiplied into the GPU count: it is a second way of grouping the same N / PP GPUs of a stage.
m = B / (b x D_a) microbatches are accumulated per update.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache

from orchestrator.core.knobs import Layout as Layout  # the knobs of one candidate: the registry owns them
from orchestrator.core.prediction import Prediction as Prediction  # what the models say: a ledger record too


@dataclass(frozen=True)
class Groups:
    """Derived group sizes for a layout on N GPUs with global batch B (guide names)."""

    n: int
    per_stage: int  # N / PP
    d_a: int | None  # attention DP; None when N / PP is not divisible by TP x CP
    d_e: int | None  # expert DP; None when N / PP is not divisible by ETP x EP
    m: int | None  # microbatches per update; None when B is not divisible by b x D_a

    @property
    def legal(self) -> bool:
        return self.d_a is not None and self.d_e is not None and self.m is not None

    def sizes(self) -> tuple[int, int, int]:
        """(D_a, D_e, m) of a legal layout; ValueError for one the group rules reject."""
        if self.d_a is None or self.d_e is None or self.m is None:
            raise ValueError(f"N={self.n} does not split into D_a, D_e and m for this layout")
        return self.d_a, self.d_e, self.m


def groups(layout: Layout, n_gpus: int, global_batch: int) -> Groups:
    """Apply N/PP = TP*CP*D_a = ETP*EP*D_e and m = B/(b*D_a); None marks a non-integer result."""
    per_stage = n_gpus // layout.pp if n_gpus % layout.pp == 0 else 0
    d_a = per_stage // (layout.tp * layout.cp) if per_stage and per_stage % (layout.tp * layout.cp) == 0 else None
    d_e = per_stage // (layout.etp * layout.ep) if per_stage and per_stage % (layout.etp * layout.ep) == 0 else None
    m = None
    if d_a:
        denom = layout.mbs * d_a
        m = global_batch // denom if global_batch % denom == 0 and global_batch >= denom else None
    return Groups(n=n_gpus, per_stage=per_stage, d_a=d_a or None, d_e=d_e or None, m=m)


@lru_cache(maxsize=1 << 16)
def canonical_key(layout: Layout, *, model: str, stage: str, hardware: str, workload: str) -> str:
    """Stable identity of a candidate: sha256 of the normalized layout + model + stage + hardware + workload.

    Used by the ledger's unique constraint so re-running a sweep is idempotent. Memoised: a sweep asks the key of
    the same layouts round after round (a Layout is frozen, so its key never changes).
    """
    payload = {"layout": layout.to_dict(), "model": model, "stage": stage, "hardware": hardware, "workload": workload}
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]
