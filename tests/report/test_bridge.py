"""`export --bridge FILE` (issue 49 item 3): the measured best as a Megatron-Bridge recipe override, every field
one that Bridge's config classes have, every value the one the winner's job ran with."""

from __future__ import annotations

import shlex

import pytest
import yaml

from orchestrator.core.knobs import Layout
from orchestrator.report import bridge
from tests.report import bridge_fields
from tests.sweeplib import cli, ledger_url, sweep_args


def _split(path: str) -> tuple[str, str]:
    section, name = path.split(".", 1)
    return section, name


def test_every_override_field_is_a_field_of_bridges_config_classes():
    """Against the record of Bridge's fields (tests/fixtures/bridge_fields.json), section by section."""
    sections = bridge_fields.recorded()["sections"]
    missing = [p for p in bridge.PATHS if _split(p)[1] not in sections.get(_split(p)[0], [])]
    assert not missing, f"not fields of Bridge's ConfigContainer: {missing}"
    assert "tensor_parallel_size" not in sections["model"]  # the check can fail: a near miss is not a field


@pytest.mark.skipif(not bridge_fields.available(), reason="the Megatron-Bridge / Megatron-LM mirrors are not here")
def test_the_record_is_what_the_bridge_source_says():
    """The record is Bridge's classes as its source has them (ast over the mirrors), not a list typed by hand."""
    assert bridge_fields.resolve() == bridge_fields.recorded()
    model = bridge_fields.fields(*bridge_fields.SECTIONS["model"])
    # inherited through MLATransformerConfig -> TransformerConfig -> Megatron Core's ModelParallelConfig
    assert {"tensor_model_parallel_size", "moe_flex_dispatcher_backend", "q_lora_rank"} <= model


def test_the_override_carries_the_flags_and_the_off_values_of_the_layout():
    argv = [
        "--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "4",
        "--context-parallel-size", "2", "--cp-comm-type", "a2a", "--expert-model-parallel-size", "16",
        "--expert-tensor-parallel-size", "1", "--micro-batch-size", "1", "--global-batch-size", "256",
        "--seq-length", "8192", "--recompute-granularity", "selective", "--recompute-modules", "mhc", "moe_act",
        "--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep", "--num-layers", "61",
    ]  # fmt: skip
    got = bridge.override(argv, Layout(tp=2, pp=4, vpp=2, cp=2, ep=16))
    m = got["model"]
    assert m["tensor_model_parallel_size"] == 2 and m["sequence_parallel"] is True
    assert m["pipeline_model_parallel_size"] == 4 and m["virtual_pipeline_model_parallel_size"] == 2
    assert m["context_parallel_size"] == 2 and m["cp_comm_type"] == "a2a" and m["expert_model_parallel_size"] == 16
    assert m["recompute_granularity"] == "selective" and m["recompute_modules"] == ["mhc", "moe_act"]
    assert m["moe_token_dispatcher_type"] == "flex" and m["moe_flex_dispatcher_backend"] == "hybridep"
    assert got["train"] == {"micro_batch_size": 1, "global_batch_size": 256, "manual_gc": False}
    assert m["seq_length"] == got["dataset"]["seq_length"] == 8192
    assert "num_layers" not in m  # the model's shape is the recipe's (its HF config), never overridden
    # a layout knob the flags leave out is written off, so the recipe's own choice does not replace it
    plain = bridge.override(["--tensor-model-parallel-size", "1"], Layout())["model"]
    assert plain["recompute_granularity"] is None and plain["sequence_parallel"] is False
    assert plain["virtual_pipeline_model_parallel_size"] is None and plain["moe_flex_dispatcher_backend"] is None
    assert "model.recompute_modules=[mhc,moe_act]" in bridge.dotted(got)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bridge")
    out = cli("sweep", *sweep_args(tmp, "b1", "stage.budget.max_runs=3", "policy.schedule.round0_size=3"), "--plain")
    assert out.returncode == 0, out.stderr[-3000:]
    return tmp, f"ledger.url={ledger_url(tmp)}"


@pytest.mark.long
def test_export_bridge_writes_the_winners_layout_as_bridge_spells_it(swept):
    tmp, url = swept
    path = tmp / "out" / "dsv4-best.yaml"
    got = cli("export", "--bridge", str(path), url)
    assert got.returncode == 0, got.stderr
    assert f"-> Megatron-Bridge override {path}" in got.stdout
    text = path.read_text()
    values = yaml.safe_load(text)
    flags = cli("best", "--sweep", "b1", "--flags", url)
    assert flags.returncode == 0, flags.stderr
    argv = shlex.split(flags.stdout.replace("\\\n", " "))

    def flag(name: str) -> int:
        return int(argv[argv.index(name) + 1])

    m = values["model"]
    assert m["tensor_model_parallel_size"] == flag("--tensor-model-parallel-size")
    assert m["pipeline_model_parallel_size"] == flag("--pipeline-model-parallel-size")
    assert m["expert_model_parallel_size"] == flag("--expert-model-parallel-size")
    assert m["context_parallel_size"] == flag("--context-parallel-size")
    assert values["train"]["micro_batch_size"] == flag("--micro-batch-size")
    assert values["train"]["global_batch_size"] == flag("--global-batch-size")
    assert m["moe_token_dispatcher_type"] == argv[argv.index("--moe-token-dispatcher-type") + 1]
    sections = bridge_fields.recorded()["sections"]
    assert all(k in sections[sec] for sec, fields in values.items() for k in fields)
    assert "SIMULATED" in text.splitlines()[0]  # a twin winner says so at the top
    assert f"run_recipe.py --recipe {bridge.RECIPE} model.tensor_model_parallel_size=" in text


@pytest.mark.long
def test_export_bridge_of_a_sweep_without_a_result_is_one_error_and_no_file(tmp_path):
    from orchestrator.ledger.ledger import Ledger
    from tests.report.test_report import _sweep

    with Ledger.open(ledger_url(tmp_path)) as ledger:
        _sweep(ledger, "empty", "smoke", 8)
    path = tmp_path / "o.yaml"
    got = cli("export", "--bridge", str(path), "--sweep", "empty", f"ledger.url={ledger_url(tmp_path)}")
    lines = got.stderr.strip().splitlines()
    assert got.returncode == 2 and len(lines) == 1 and "no successful, non-partial measured result" in lines[0]
    assert not path.exists()
