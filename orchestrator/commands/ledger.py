"""`ledger export|sweeps|events|ingest`: the ledger outside a sweep (exports for notebooks, audit log), and
`ledger ingest FOLDER`: the results of job folders (measurements, trusted failures such as an OOM, the
finalists' jobs) stored into a ledger that lost them (docs/faults.md)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from orchestrator.commands._shared import open_ledger, print_table, split_verb
from orchestrator.config import compose
from orchestrator.core.errors import UserError

NAME = "ledger"
HELP = (
    "Ledger utilities: `ledger export --out FILE.csv|.parquet`, `ledger sweeps`, `ledger events --sweep NAME`, "
    "`ledger ingest FOLDER` (a sweep's job folders into the ledger, e.g. after it was deleted)."
)
VERBS = ("export", "sweeps", "events", "ingest")


def add_arguments(parser) -> None:
    parser.add_argument("--out", help="export: output file (.csv or .parquet)")
    parser.add_argument(
        "--format",
        choices=["csv", "parquet", "table", "json"],
        default=None,
        help="export: csv|parquet (default from --out); sweeps/events: table|json",
    )
    parser.add_argument("--table", default=None, help="export one raw table instead of the joined view")
    parser.add_argument("--sweep", default=None)
    parser.add_argument("--stage", default=None)
    parser.add_argument("--where", action="append", default=[], metavar="KEY OP VALUE")


def run(args, overrides) -> int:
    words = [o for o in overrides if "=" not in o]
    if words[:1] == ["ingest"]:
        if len(words) != 2:
            raise UserError(f"usage: python -m orchestrator {NAME} ingest FOLDER [ledger.url=...]")
        return ingest(words[1], [o for o in overrides if "=" in o])
    verb, overrides = split_verb(overrides, VERBS, NAME)
    with open_ledger(overrides) as ledger:
        if verb == "export":
            from orchestrator.ledger.export import export

            if not args.out:
                raise UserError("ledger export needs --out FILE.csv or FILE.parquet")
            fmt = args.format if args.format in ("csv", "parquet") else None
            kw = {} if args.table else {"sweep": args.sweep, "stage": args.stage, "where": args.where}
            n = export(ledger, args.out, fmt, table=args.table, **kw)
            print(f"wrote {n} rows to {args.out} (ledger {ledger.url})")
            return 0
        if verb == "sweeps":
            rows = [
                {
                    "name": s.name,
                    "stage": s.stage,
                    "model": s.model,
                    "hardware": s.hardware,
                    "workload": s.workload,
                    "status": s.status,
                    "created_at": s.created_at.isoformat(),
                }
                for s in ledger.list_sweeps()
            ]
        else:
            if not args.sweep:
                raise UserError("ledger events needs --sweep NAME")
            rows = [
                {
                    "id": e.id,
                    "time": e.created_at.isoformat(timespec="seconds"),
                    "kind": e.kind,
                    "candidate_id": e.candidate_id,
                    "message": e.message,
                    **({"data": e.data} if args.format == "json" else {}),  # the detail a log line leaves out
                }
                for e in ledger.events(args.sweep)
            ]
        if args.format == "json":
            json.dump(rows, sys.stdout, indent=1, default=str)
            print()
        else:
            print_table(rows, title=f"ledger {ledger.url}: {verb}")
    return 0


def ingest(folder: str, overrides: list[str]) -> int:
    """Judge every job folder under FOLDER (orchestrator/evidence/ingest.py), store the trusted ones
    (orchestrator/ledger/ingest.py), then record the finalists' verdicts their attempts decide
    (orchestrator/sweep/finalists.py `verdicts`). A bad FOLDER or sweep name is refused before the ledger is
    opened; a folder of skipped jobs writes nothing, and finalists' jobs alone create no ledger."""
    from orchestrator.config import root_from_yaml
    from orchestrator.core.paths import JobPaths, check_name
    from orchestrator.core.spec import JobSpec
    from orchestrator.core.states import AttemptRole
    from orchestrator.evidence.ingest import job_folders, judge
    from orchestrator.ledger.errors import LedgerError
    from orchestrator.ledger.ingest import Summary, Trusted
    from orchestrator.ledger.ingest import ingest as store
    from orchestrator.ledger.ledger import Ledger
    from orchestrator.sweep import cutoff
    from orchestrator.sweep.finalists import verdicts

    cfg = compose(overrides).cfg
    unreadable: list[tuple[Path, str]] = []  # folders the walk could not read: listed as skipped
    folders = job_folders(folder, unreadable)  # UserError: missing, the filesystem's root, no job folder, a link out
    for f in folders:  # a sweep name names folders and ledger rows: an unsafe one is refused before any write
        with contextlib.suppress(OSError, ValueError, TypeError):
            name = JobSpec.load(JobPaths(f).spec).sweep
            check_name(name, source=f"the sweep name in {JobPaths(f).spec}")
    judged = [judge(f) for f in folders]
    found = [Trusted(**x.record()) for x in judged if x.result is not None]
    out, where, notes = Summary(), "not opened: nothing to store", []
    measured = any(x.role == AttemptRole.MEASURE for x in found)
    try:
        ledger = Ledger.from_config(cfg.ledger, create=bool(measured)) if measured or found else None
    except LedgerError as exc:  # finalists' jobs alone: their candidates must be in an existing ledger
        ledger, where = None, f"not opened: {exc}"
        out.skipped += [(x.job_dir, f"a {x.role} job: its candidate is in no ledger") for x in found]
    if ledger is not None:
        with ledger:
            out = store(ledger, found, source=str(Path(folder).expanduser().resolve()))
            done = set(out.ingested)
            for x in found:  # the cut's event, as the driver logged it (`status`, the search path read it)
                if x.cut is not None and x.job_dir in done and (c := ledger.candidate_by_key(x.sweep, x.owner_key)):
                    cutoff.log(ledger, x.sweep, c.id, x.job_id, x.cut, how="rebuilt from its job folder")
            for name in out.finalists:  # the verdicts the lost ledger held, from the attempts now back in it
                sweep = ledger.get_sweep(name)
                notes += verdicts(ledger, name, root_from_yaml(sweep.config_yaml)) if sweep is not None else []
            where = ledger.url
    skipped = [(str(x.folder), x.skipped) for x in judged if x.result is None] + out.skipped
    skipped += [(str(path), why) for path, why in unreadable]
    sweeps = ", ".join(out.sweeps) or "-"
    print(
        f"ingested {out.counts()}, {len(out.present)} already present, {len(skipped)} skipped, "
        f"of {len(judged)} job folder(s) (sweep {sweeps}; ledger {where})"
    )
    for path, why in skipped:
        print(f"  skipped {path}: {why}")
    for note in notes:
        print(f"  finalists: {note}")
    if out.sweeps:
        first = out.sweeps[0]
        print(f"next: python -m orchestrator best --sweep {first}   (or status, report, resume {first})")
    return 0
