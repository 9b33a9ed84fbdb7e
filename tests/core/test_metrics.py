"""The metric registry (orchestrator/core/metrics.py) against its consumers: JobResult, the ledger's result
columns, `compare`'s keys and sort directions, the report's table, the units things print in. Then the claim:
a metric added to the registry (and to JobResult, which the evidence fills) reaches all of them, and only a
migration is left to write.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import JSON, Boolean, Double, Integer, String, Text

from orchestrator.core import metrics
from orchestrator.core.metrics import METRIC, METRICS
from orchestrator.core.result import JobResult
from orchestrator.ledger import models as m
from orchestrator.ledger import queries
from orchestrator.report import data as report_data

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"id", "attempt_id", "candidate_id", "created_at"}  # the result row's keys and its timestamp
SQL = {"float": Double, "int": Integer, "bool": Boolean, "str": String, "text": Text, "json": JSON}


def test_every_result_column_is_a_metric_and_every_metric_a_result_column():
    table = m.Result.__table__
    assert {c.name for c in table.columns} - KEYS == set(METRIC)
    for k in METRICS:
        col = table.c[k.name]
        assert isinstance(col.type, SQL[k.sql]) and col.nullable == k.nullable, k.name
        if k.sql == "str":
            assert col.type.length == k.length, k.name
    assert {c for c in vars(m.ResultColumns) if not c.startswith("_")} == set(METRIC)
    assert tuple(METRIC) == m.RESULT_METRICS


def test_every_metric_is_a_job_result_field_with_the_same_default():
    fields = {f.name: f for f in dataclasses.fields(JobResult)}
    for k in METRICS:
        assert k.name in fields, f"{k.name}: JobResult has no such field (the evidence fills it there)"
        f = fields[k.name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if not k.required:
            assert default == (k.default if k.default is not None else None), k.name
    assert all(k.label and k.source for k in METRICS)
    assert {k.better for k in METRICS} <= {None, "lower", "higher"}


def test_compare_the_report_and_labels_come_from_the_registry():
    for k in METRICS:
        if k.scalar:
            assert k.name in queries.COLUMNS and k.name in report_data.TABLE_COLUMNS, k.name
        if k.alias:
            assert queries.resolve(k.alias) == k.name
    assert {k.name for k in METRICS if k.better == "higher"} <= queries.HIGHER_IS_BETTER
    assert not {k.name for k in METRICS if k.better == "lower"} & queries.HIGHER_IS_BETTER
    assert [c for c in queries.DEFAULT_COLUMNS if queries.resolve(c) in METRIC] == [
        *(k.key for k in METRICS if k.shown and k.name != "simulated"),
        "simulated",
    ]


def test_values_print_in_their_unit():
    assert metrics.text("step_p50_s", 1.23456) == "1.235 s"
    assert metrics.text("peak_reserved_gb", 61.24) == "61.2 GB"
    assert metrics.text("token_drop_fraction", 0.0123) == "1.23%"
    assert metrics.text("mfu", None) == "-"
    assert metrics.peak_gb({"peak_reserved_gb": None, "peak_allocated_gb": 50.0}) == 50.0
    assert metrics.peak_gb({"peak_reserved_gb": 60.0, "peak_allocated_gb": 50.0}) == 60.0


def test_registry_imports_only_the_standard_library():
    watched = {"orchestrator", "omegaconf", "hydra", "sqlalchemy", "numpy", "yaml"}
    loaded = f"sorted(m for m in sys.modules if m.partition('.')[0] in {watched!r})"
    code = f"import sys, orchestrator.core.metrics; print({loaded})"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['orchestrator', 'orchestrator.core', 'orchestrator.core.metrics']"


NEW_METRIC = """
    Metric("nccl_busbw_gb_s", "float", "GB/s", "bus GB/s", "NCCL's bus bandwidth of the EP all-to-all", "higher"),
"""
NEW_FIELD = "    nccl_busbw_gb_s: float | None = None\n"
PROBE = """
import sys, types
from pathlib import Path
import orchestrator.core


def patched(name, path, anchor, new):
    src = Path(path).read_text()
    assert anchor in src, (path, anchor)
    mod = types.ModuleType(name)
    mod.__file__ = path
    sys.modules[name] = mod
    setattr(orchestrator.core, name.rsplit(".", 1)[1], mod)
    exec(compile(src.replace(anchor, new + anchor, 1), path, "exec"), mod.__dict__)


patched("orchestrator.core.metrics", "orchestrator/core/metrics.py", "    # Raw evidence kept whole", NEW_METRIC)
patched("orchestrator.core.result", "orchestrator/core/result.py", "    # Provenance", NEW_FIELD)

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine

from orchestrator.core.result import JobResult
from orchestrator.ledger import engine as E
from orchestrator.ledger import models as m, queries
from orchestrator.ledger.ledger import CandidateIn, Ledger
from orchestrator.report import data as report_data

checks = {
    "ledger": "nccl_busbw_gb_s" in m.Result.__table__.c,
    "compare": "nccl_busbw_gb_s" in queries.COLUMNS and "nccl_busbw_gb_s" in queries.HIGHER_IS_BETTER,
    "report": "nccl_busbw_gb_s" in report_data.TABLE_COLUMNS,
}
eng = create_engine("sqlite:///" + sys.argv[1])
E.upgrade(eng)
with eng.connect() as conn:
    diff = compare_metadata(MigrationContext.configure(conn), m.Base.metadata)
checks["migration"] = [(d[0], d[2], d[3].name) for d in diff] == [("add_column", "result", "nccl_busbw_gb_s")]
with eng.begin() as conn:  # the revision left to write: one column
    conn.exec_driver_sql("ALTER TABLE result ADD COLUMN nccl_busbw_gb_s FLOAT")
led = Ledger.open("sqlite:///" + sys.argv[1])
led.create_or_get_sweep("p", stage="s", config_yaml="", model="m", hardware="h", workload="w", provenance={})
(c,) = led.add_candidates("p", [CandidateIn(key="k", layout={})])
a = led.new_attempt(c.id, job_id="1", job_dir="-", simulated=True)
res = JobResult(ok=True, simulated=True, measure_iters=1, step_p50_s=1.0, nccl_busbw_gb_s=42.0)
led.evidence.record_result(a.id, res.to_dict())
checks["stored"] = led.evidence.result(a.id)["nccl_busbw_gb_s"] == 42.0
checks["best"] = queries.best(led, sweep="p")["metrics"]["nccl_busbw_gb_s"] == 42.0
rows = queries.compare(led, sweep="p", sort="nccl_busbw_gb_s", columns=["key", "nccl_busbw_gb_s"])
checks["sorted"] = rows == [{"key": "k", "nccl_busbw_gb_s": 42.0}]
print(sorted(k for k, ok in checks.items() if not ok))
"""


@pytest.mark.long
def test_a_new_metric_needs_the_registry_its_field_and_a_migration_only(tmp_path):
    """One row added to the registry (an NCCL bus bandwidth) and its JobResult field reach the ledger model,
    `compare` (sorted best first), `best`'s evidence and the report; what is left is one Alembic revision adding
    its column (and the evidence code that measures it)."""
    code = f"NEW_METRIC = {NEW_METRIC!r}\nNEW_FIELD = {NEW_FIELD!r}\n" + textwrap.dedent(PROBE)
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "probe.sqlite")], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
