"""The knob registry (orchestrator/core/knobs.py) against every consumer: Layout, SearchConfig, the ledger's
columns, argv (both ways), the `compare` keys, the plan command's and the report's tables. Then the
claim itself: a knob added to the registry reaches all of them, and only a migration is left to write.
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import Boolean, Double, Integer, String

from orchestrator.commands import plan as plan_cmd
from orchestrator.config import ConfigError, compose
from orchestrator.core import knobs
from orchestrator.core.knobs import KNOB, KNOBS, Layout
from orchestrator.core.schema import ModelConfig, SearchConfig, StageConfig
from orchestrator.ledger import models as m
from orchestrator.ledger import queries
from orchestrator.ledger.ledger import Ledger
from orchestrator.ledger.rows import CandidateIn
from orchestrator.plan import argv as A
from orchestrator.plan import flags as F
from orchestrator.plan import flops, pipeline, space
from orchestrator.plan.planner import Planned
from orchestrator.report import data as report_data
from orchestrator.report import sections as report_sections

ROOT = Path(__file__).resolve().parents[2]
MODEL, STAGE = ModelConfig(), StageConfig()
BASE = Layout(pp=8, ep=64)
# One value off the default for every knob (a knob with parts sets them together). A knob added to the
# registry fails test_samples_cover_the_registry until it has one here.
SAMPLES: dict[str, dict[str, object]] = {
    "tp": {"tp": 2},
    "pp": {"pp": 4},
    "vpp": {"vpp": 2},
    "cp": {"cp": 2},
    "ep": {"ep": 32},
    "etp": {"etp": 2},
    "mbs": {"mbs": 2},
    "recompute": {"recompute": ("mhc", "mla_up_proj")},
    "offload": {"offload": ("expert_fc1",)},
    "dispatcher": {"dispatcher": "flex", "flex_backend": "hybridep"},
    "flex_backend": {"dispatcher": "flex", "flex_backend": "ncclep"},
    "capacity_factor": {"capacity_factor": 1.5},
    "use_tp_pp_dp_mapping": {"use_tp_pp_dp_mapping": True},
    "optim": {"optim": "bf16_moments"},
    "precision": {"precision": "fp8"},
}


def sample(name: str) -> Layout:
    return dataclasses.replace(BASE, **SAMPLES[name])


def argv_of(lay: Layout) -> list[str]:
    costs, first, last = flops.block_costs(MODEL, STAGE.seq_length)
    split = pipeline.split_blocks(len(costs), lay.pp * lay.vpp, costs, first, last)
    return A.megatron_argv(MODEL, STAGE, lay, layer_pattern=pipeline.layer_pattern(MODEL, split), train_iters=1)


def test_samples_cover_the_registry():
    assert set(SAMPLES) == set(KNOB)
    for name in KNOB:
        assert sample(name) != BASE and getattr(sample(name), name) != getattr(BASE, name), name


def test_registry_is_layout_and_each_entry_is_whole():
    searched = [k for k in KNOBS if k.search is not None or k.declared is not None]
    assert sorted(k.walk for k in searched) == list(range(len(searched)))  # a walk level each, no gaps
    for k in KNOBS:
        assert k.base in (int, float, bool, str, tuple), k.name
        assert k.normalise(k.default) == (k.default if k.parse is None else k.parse(k.default)), k.name
        assert k.flags and all(f in F.FLAGS for f in k.flags), k.name  # argv knows (and dates) every flag
        assert (k.search is None and k.declared is None) == (k.walk is None) == (k.part_of is not None), k.name
        assert k.search is None or k.declared is None, k.name  # numerics: the recipe's list, never a stage's
        assert k.part_of is None or KNOB[k.part_of].part_of is None, k.name
        assert (k.parse is not None) == (len(knobs.FIELDS.get(k.name, ())) > 1), k.name
        assert (k.label is None) == (k.part_of is not None), k.name
    assert [KNOB[n].walk for n in space.KNOBS] == list(range(len(searched)))  # the planner walks in this order


def test_search_config_is_the_registrys():
    """SearchConfig: one typed list per searched knob with the registry's default; OmegaConf types it."""
    searched = [k for k in KNOBS if k.search is not None]
    assert [f.name for f in dataclasses.fields(SearchConfig)] == [k.name for k in searched]
    default = SearchConfig()
    for k in searched:
        assert [k.normalise(v) for v in getattr(default, k.name)] == [k.normalise(v) for v in k.search], k.name
    assert compose(["+stage=1k"]).cfg.stage.search.dispatcher == ["alltoall", "flex:deepep", "flex:hybridep"]
    with pytest.raises(ConfigError, match="stage.search.ep"):
        compose(["+stage=1k", "stage.search.ep=[sixty-four]"])


def test_values_normalise_to_one_spelling():
    values = space.knob_values(
        SearchConfig(
            recompute=[["mhc", "mla_up_proj"], ["mla_up_proj", "mhc", "mhc"]],
            dispatcher=["flex", "flex:deepep", "alltoall"],
            capacity_factor=[None, 1, 1.0],
            tp=["2", 2],
        )
    )
    assert values["recompute"] == [("mhc", "mla_up_proj")]
    assert values["dispatcher"] == [("flex", "deepep"), ("alltoall", None)]
    assert values["capacity_factor"] == [None, 1.0] and values["tp"] == [2]


@pytest.mark.parametrize("name", sorted(KNOB))
def test_argv_round_trip_for_every_knob(name):
    """layout -> Megatron flags -> layout for a value off the default of each knob, and its flag is there."""
    lay = sample(name)
    argv = argv_of(lay)
    assert A.layout_from_argv(argv) == lay
    assert KNOB[name].flags[0] in argv
    assert A.layout_from_argv(argv_of(BASE)) == BASE


def test_ledger_has_a_column_per_knob_and_no_other_knob_column():
    table = m.Candidate.__table__
    sql = {"int": Integer, "float": Double, "bool": Boolean, "str": String}
    for k in KNOBS:
        col = table.c[k.column]
        assert isinstance(col.type, sql[k.sql]) and col.nullable == k.nullable, k.name
        if k.sql == "str":
            assert col.type.length == k.length
    mixin = {c for c in vars(m.KnobColumns) if not c.startswith("_")}
    assert mixin == {k.column for k in KNOBS}
    assert set(knobs.ledger_columns(sample("offload").to_dict())) == mixin


def test_compare_filters_on_every_knob(ledger_url):
    """Every knob is a `compare` key (an SQL filter on its column), the dispatcher read as "flex:hybridep"."""
    led = Ledger.open(ledger_url)
    led.create_or_get_sweep("k", stage="1k", config_yaml="", model="m", hardware="h", workload="w", provenance={})
    lays = {name: sample(name) for name in KNOB}
    led.add_candidates("k", [CandidateIn(key=name, layout=lay.to_dict()) for name, lay in lays.items()])
    for k in KNOBS:
        assert k.column in queries.COLUMNS, k.name
        shown = knobs.display(lays[k.name]).get(k.name, getattr(lays[k.name], k.name))
        value = knobs.text(shown) if k.sql == "str" else str(shown).lower()
        rows = queries.compare(led, sweep="k", where=[f"{k.column}={value}"], columns=["key", k.column])
        assert k.name in {r["key"] for r in rows}, (k.name, value, rows)
    rows = queries.compare(led, sweep="k", where=["dispatcher=flex:hybridep"], columns=["key", "dispatcher"])
    assert [r["key"] for r in rows] == ["dispatcher"] and rows[0]["dispatcher"] == "flex:hybridep"
    assert [c for c in queries.DEFAULT_COLUMNS if c in queries.KNOB_COLUMNS] == knobs.columns()


def test_plan_command_rows_and_columns_come_from_the_registry():
    pred = _prediction()
    row = plan_cmd.row(0, Planned(sample("dispatcher"), pred, key="x"))
    assert [c for c in row if c in knobs.FIELDS] == list(knobs.FIELDS)  # every knob, registry order
    assert row["dispatcher"] == "flex:hybridep" and "flex_backend" not in row
    assert plan_cmd.TABLE_COLUMNS[1 : 1 + len(knobs.columns())] == knobs.columns()
    assert "capacity_factor" not in knobs.columns() and "capacity_factor" in knobs.columns(["capacity_factor"])


@pytest.mark.long
def test_plan_table_shows_a_knob_the_stage_varies():
    cmd = [sys.executable, "-m", "orchestrator", "plan", "+stage=1k", "--top", "2"]
    one = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    two = subprocess.run(
        [*cmd, "++stage.search.capacity_factor=[null,1.5]"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert "capacity_factor" not in one.stdout and "capacity_factor" in two.stdout


def test_report_columns_come_from_the_registry():
    assert {k.column for k in knobs.DISPLAYED} <= set(report_data.TABLE_COLUMNS)
    rows = [{"candidate_id": i, **knobs.display(lay)} for i, lay in enumerate((BASE, sample("offload"), sample("ep")))]
    cells, common = report_sections.split_labels(rows)  # the ranked table's layout cell and its caption
    assert "off=expert_fc1" in cells[1] and "off=" not in cells[0] + cells[2] + common  # offload varies
    assert "EP64" in cells[0] and "EP" in cells[2] and "EP" not in common  # so does EP
    assert common == "TP1 PP8 VPP1 CP1 ETP1 MBS1 rc=none alltoall" and "cf=" not in " ".join(cells)


def test_labels():
    assert Layout().short() == "TP1 PP1 VPP1 CP1 EP1 ETP1 MBS1 rc=none alltoall"
    assert sample("offload").short() == "TP1 PP8 VPP1 CP1 EP64 ETP1 MBS1 rc=none off=expert_fc1 alltoall"
    assert sample("dispatcher").short().endswith("flex:hybridep")
    assert "tp-pp-dp" in sample("use_tp_pp_dp_mapping").short() and "cf=1.5" in sample("capacity_factor").short()
    row = {"tp": 1, "pp": 8, "vpp": 1, "cp": 4, "ep": 128, "etp": 1, "mbs": 1, "recompute": "none"}
    before = dict(row, cp=2, ep=64)
    assert knobs.label(row, before=before) == "TP1 PP8 VPP1 CP2->4 EP64->128 ETP1 MBS1 rc=none alltoall"


def _prediction():
    from orchestrator.plan.layout import Prediction

    return Prediction(
        d_a=1, d_e=1, m=1, bubble=0.0, t_group=1, t_expert=1.0, experts_per_rank=1, ep_nodes=1, cp_nodes=1,
        routed_weight_gb=0.0, heaviest_stage=0, memory_gb=1.0, memory_by_stage=(1.0,), feasible=True, step_time_s=1.0,
    )  # fmt: skip


def _knob_lists(path: Path) -> list[str]:
    """Literal lists/tuples/sets of knob names in a file: a knob list (>= 5 names, or >= 3 with vpp). The knobs a
    legality rule declares it reads (an argument of `Rule(...)` in plan/rules.py) are that rule's data, not a copy."""
    names = set(KNOB) | {k.column for k in KNOBS}
    out = []
    tree = ast.parse(path.read_text())
    declared = {
        id(arg)
        for call in ast.walk(tree)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "Rule"
        for arg in call.args
    }
    for node in ast.walk(tree):
        if id(node) in declared:
            continue
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            hits = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names]
            if len(hits) >= 5 or (len(hits) >= 3 and "vpp" in hits):
                out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {hits}")
    return out


def test_no_knob_list_is_written_out_again():
    """Only the registry lists the knobs; tests and the Alembic history (migrations are history) may."""
    found = []
    for top in ("orchestrator",):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == ROOT / "orchestrator" / "core" / "knobs.py" or "versions" in path.parts:
                continue
            found += _knob_lists(path)
    assert not found, (
        "derive these from orchestrator.core.knobs (e.g. k.name for k in KNOBS if k.type is int):\n" + "\n".join(found)
    )


def test_registry_imports_only_the_standard_library():
    code = "import sys, orchestrator.core.knobs; print(sorted(m for m in sys.modules if m.partition('.')[0] in " + repr(
        {"orchestrator", "omegaconf", "hydra", "sqlalchemy", "numpy", "yaml"}
    ) + "))"  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert (
        out.stdout.strip()
        == "['orchestrator', 'orchestrator.core', 'orchestrator.core.bounds', 'orchestrator.core.knobs']"
    )


NEW_KNOB = """
    fp8_recipe: str | None = knob(  # the issue's example of a knob to add
        None, flags=("--fp8-recipe",), label="fp8={}", search=(None,), walk=12, shown=False
    )
"""
PROBE = """
import dataclasses, sys, types
from pathlib import Path
import orchestrator.core
src = Path("orchestrator/core/knobs.py").read_text()
anchor = "\\n    def to_dict(self)"
assert anchor in src
mod = types.ModuleType("orchestrator.core.knobs")
mod.__file__ = "orchestrator/core/knobs.py"
sys.modules["orchestrator.core.knobs"] = orchestrator.core.knobs = mod
exec(compile(src.replace(anchor, NEW_KNOB + anchor, 1), mod.__file__, "exec"), mod.__dict__)

from orchestrator.core.knobs import Layout
from orchestrator.core.schema import SearchConfig, ModelConfig, StageConfig
from orchestrator.plan import argv as A, flops, pipeline, space
from orchestrator.commands import plan as plan_cmd
from orchestrator.report import data as report_data
from orchestrator.ledger import models as m, queries
from alembic.runtime.migration import MigrationContext
from alembic.autogenerate import compare_metadata
from orchestrator.ledger import engine as E
from sqlalchemy import create_engine

from orchestrator.plan.layout import Prediction
PRED = Prediction(
    d_a=1, d_e=1, m=1, bubble=0.0, t_group=1, t_expert=1.0, experts_per_rank=1, ep_nodes=1, cp_nodes=1,
    routed_weight_gb=0.0, heaviest_stage=0, memory_gb=1.0, memory_by_stage=(1.0,), feasible=True, step_time_s=1.0,
)
lay = Layout(pp=8, ep=64, fp8_recipe="tensorwise")
model, stage = ModelConfig(), StageConfig()
costs, first, last = flops.block_costs(model, stage.seq_length)
pattern = pipeline.layer_pattern(model, pipeline.split_blocks(len(costs), 8, costs, first, last))
argv = A.megatron_argv(model, stage, lay, layer_pattern=pattern, train_iters=1)
checks = {
    "search": SearchConfig().fp8_recipe == [None] and "fp8_recipe" in space.knob_values(SearchConfig()),
    "argv": A.layout_from_argv(argv) == lay and argv[argv.index("--fp8-recipe") + 1] == "tensorwise",
    "label": lay.short().endswith("fp8=tensorwise"),
    "ledger": "fp8_recipe" in m.Candidate.__table__.c,
    "compare": "fp8_recipe" in queries.COLUMNS,
    "plan": "fp8_recipe" in plan_cmd.row(0, type("P", (), {"layout": lay, "key": "k", "prediction": PRED})()),
    "report": "fp8_recipe" in report_data.TABLE_COLUMNS,
}
from orchestrator.plan.planner import plan
from orchestrator.core.schema import HardwareConfig
res = plan(model, HardwareConfig(hbm_gb=141.0), stage)  # an H200: some 1k layouts fit
checks["planner"] = bool(res.candidates) and all(p.layout.fp8_recipe is None for p in res.candidates)
eng = create_engine("sqlite:///" + sys.argv[1])
E.upgrade(eng)
with eng.connect() as conn:
    diff = compare_metadata(MigrationContext.configure(conn), m.Base.metadata)
checks["migration"] = [(d[0], d[2], d[3].name) for d in diff] == [("add_column", "candidate", "fp8_recipe")]
print(sorted(k for k, ok in checks.items() if not ok))
"""


@pytest.mark.long
def test_a_new_knob_needs_the_registry_and_a_migration_only(tmp_path):
    """The issue's claim, run: one field added to the registry (an FP8 recipe) reaches SearchConfig, the
    planner and its space, argv both ways, the label, the ledger model, `compare`, the plan rows and the
    report; what is left is exactly one Alembic revision adding its column (and the model terms that read it)."""
    code = f"NEW_KNOB = {NEW_KNOB!r}\n" + textwrap.dedent(PROBE)
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "probe.sqlite")], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
