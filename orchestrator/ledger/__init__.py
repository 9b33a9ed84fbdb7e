"""The ledger: every sweep, candidate, attempt and measured result, in SQLite or PostgreSQL.

Public entry point: `orchestrator.ledger.ledger.Ledger.open(url)`; its parts are `ledger.leases` and
`ledger.evidence`, over one shared `Store`. Queries for `compare`/`best` live in `orchestrator.ledger.queries`,
exports in `orchestrator.ledger.export`. Nothing here imports anything of orchestrator/ but core/: the ledger
knows Megatron and Slurm only through column names.
"""

from orchestrator.ledger.errors import LeaseHeld, LedgerError

__all__ = ["LeaseHeld", "LedgerError"]
