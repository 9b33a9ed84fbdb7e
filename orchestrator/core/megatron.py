"""Which Megatron-LM this project is tested against: the one place that names the commit.

Why in core: the rules' sources (plan/), preflight on the node (job/) and the evidence bundle all name it,
and each of them may import only core. Stdlib only.

TESTED_COMMIT is Megatron-LM's dev branch at the commit every Megatron file:line in this project cites
(`dev X:L`): the argv, the legality rules and the CPU checks were checked against it. Preflight compares a
cluster's checkout with it (a warning that names both commits when they differ).
"""

from __future__ import annotations

TESTED_COMMIT = "d48bd6be0a85cc0d6d3cc71e8750cf357cc6bdb1"
TESTED_BRANCH = "dev"
SHORT = 12  # how many hex digits a cited commit shows (d48bd6be0a85)


def short(commit: str | None) -> str:
    """A commit as this project cites it: its first SHORT hex digits ("?" when unknown)."""
    return commit[:SHORT] if commit else "?"


TESTED = f"Megatron-LM {TESTED_BRANCH} {short(TESTED_COMMIT)}"


def same_commit(a: str | None, b: str | None) -> bool:
    """Two commit ids name the same commit: one is a prefix of the other (either may be abbreviated)."""
    if not a or not b:
        return False
    a, b = a.lower(), b.lower()
    return a.startswith(b) or b.startswith(a)
