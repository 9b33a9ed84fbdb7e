"""`export --tensorboard DIR` (issue 21 item 11): each measured run as TensorBoard event files, the layout as
hparams and p50/p99, peak memory, tokens/s/GPU and MFU as metrics; without a writer, one `error:` line and
nothing written."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core import metrics
from orchestrator.ledger import queries
from orchestrator.ledger.ledger import Ledger
from orchestrator.report import tensorboard as TB
from tests.report.test_report import _fill

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    """A SummaryWriter stand-in that keeps what it was given (the exporter's contract with both writers)."""

    runs: dict[str, dict] = {}

    def __init__(self, logdir: str) -> None:
        self.logdir = logdir
        Recorder.runs[logdir] = {"scalars": {}, "hparams": None, "closed": False}

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        Recorder.runs[self.logdir]["scalars"][tag] = (value, global_step)

    def add_hparams(self, hp: dict, metric: dict, name: str) -> None:
        Recorder.runs[self.logdir]["hparams"] = (hp, metric, name)

    def close(self) -> None:
        Recorder.runs[self.logdir]["closed"] = True


@pytest.mark.long
def test_every_measured_run_with_its_layout_and_metrics(tmp_path):
    Recorder.runs = {}
    with Ledger.open(f"sqlite:///{tmp_path / 'l.sqlite'}") as ledger:
        _fill(ledger)
        out = TB.export(ledger, "s1", tmp_path / "tb", Recorder)
        cols = ["candidate_id", "pp", "ep", "cp", "step_p50_s", "peak_reserved_gb", "peak_allocated_gb"]
        rows = {r["candidate_id"]: r for r in queries.compare(ledger, sweep="s1", columns=cols) if r["step_p50_s"]}
    assert out.runs == len(rows) == 7 and len(Recorder.runs) == 7  # the OOM candidate has no measurement
    for logdir, got in Recorder.runs.items():
        cid = int(Path(logdir).name.split("-")[0][1:])
        assert Path(logdir).parent == tmp_path / "tb" / "s1" and got["closed"]
        hp, metric, name = got["hparams"]
        assert hp["pp"] == rows[cid]["pp"] and hp["ep"] == rows[cid]["ep"] and hp["cp"] == rows[cid]["cp"]
        assert metric["hparam/step_p50_s"] == pytest.approx(rows[cid]["step_p50_s"]) and name == TB.HPARAMS_RUN
        assert {"step_p50_s", "step_p99_s", "tokens_per_s_per_gpu", "mfu", TB.PEAK_GB} <= set(got["scalars"])
        assert got["scalars"][TB.PEAK_GB][0] == pytest.approx(metrics.peak_gb(rows[cid]))


def _events(folder: Path) -> list:
    """Every Event of the TFRecord event files under folder (length, crc, data, crc per record)."""
    from tensorboardX.proto import event_pb2

    out = []
    for path in folder.rglob("events.out.tfevents.*"):
        data = path.read_bytes()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i : i + 8])
            e = event_pb2.Event()
            e.ParseFromString(data[i + 12 : i + 12 + n])
            out.append(e)
            i += 12 + n + 4
    return out


def test_the_event_files_hold_the_metrics_and_the_hparams(tmp_path):
    """With a real writer (tensorboardX, the `tensorboard` extra): the files TensorBoard reads carry them."""
    pytest.importorskip("tensorboardX", reason="the optional `tensorboard` extra is not installed")
    from tensorboardX import SummaryWriter

    with Ledger.open(f"sqlite:///{tmp_path / 'l.sqlite'}") as ledger:
        _fill(ledger)
        TB.export(ledger, "s1", tmp_path / "tb", SummaryWriter)
        want = sorted(
            r["step_p50_s"] for r in queries.compare(ledger, sweep="s1", columns=["step_p50_s"]) if r["step_p50_s"]
        )
    events = _events(tmp_path / "tb" / "s1")
    tags = {v.tag for e in events for v in e.summary.value}
    assert {"step_p50_s", "step_p99_s", "mfu", "tokens_per_s_per_gpu", TB.PEAK_GB} <= tags
    assert "_hparams_/experiment" in tags and "_hparams_/session_start_info" in tags
    p50s = [v.simple_value for e in events for v in e.summary.value if v.tag == "step_p50_s"]
    assert sorted(p50s) == pytest.approx(want) and len(want) == 7  # float32 in the file


@pytest.mark.long
def test_without_a_writer_one_error_line_and_nothing_written(tmp_path):
    probe = (
        "import sys; sys.modules['tensorboardX'] = None; sys.modules['torch.utils.tensorboard'] = None\n"
        "from orchestrator import cli; raise SystemExit(cli.main(sys.argv[1:]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, "export", "--tensorboard", str(tmp_path / "tb")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: TensorBoard export needs"), out
    assert "tensorboardX" in lines[0] and not (tmp_path / "tb").exists()
