"""The ledger: every sweep, candidate, attempt and measured result, in SQLite or PostgreSQL.

Public entry point: `db.ledger.Ledger.open(url)`. Queries for `compare`/`best` live in
`db.queries`, exports in `db.export`. Nothing here imports orchestrator/ or jobs/: the ledger
knows Megatron and Slurm only through column names.
"""

from db.errors import LeaseHeld, LedgerError

__all__ = ["LeaseHeld", "LedgerError"]
