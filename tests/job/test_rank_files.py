"""No per-rank file explosion: only evidence ranks keep files of their own; the others' output lands,
labelled and bounded, in their node's log, where collect still finds a failing rank's traceback."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from orchestrator.core.paths import JobPaths
from orchestrator.core.schema import HardwareConfig, ModelConfig, StageConfig, WorkloadConfig
from orchestrator.core.spec import JobSpec
from orchestrator.evidence.collect import collect
from orchestrator.evidence.parse import parse_file
from orchestrator.job import ranklog
from orchestrator.job.entry import TaskFailed, is_evidence_rank, rank_env, run_task
from orchestrator.plan import ranks
from orchestrator.plan.layout import Layout

SCRIPT = textwrap.dedent(
    """
    import os, sys
    rank = int(os.environ["RANK"])
    print(f"hello from rank {rank}")
    print("UserWarning: something every rank says", file=sys.stderr)
    sys.stderr.write("x" * int(os.environ.get("NOISE_BYTES", "0")) + "\\n")
    if os.environ.get("FAIL_RANK") == str(rank):
        raise RuntimeError(f"boom on rank {rank}")
    """
)


@pytest.mark.parametrize(
    "layout, n",
    [
        (Layout(tp=1, pp=8, cp=1, ep=64, etp=1, mbs=1), 1024),
        (Layout(tp=2, pp=4, cp=2, ep=8, etp=1, mbs=1), 256),
        (Layout(tp=2, pp=4, cp=2, ep=4, etp=1, mbs=1, use_tp_pp_dp_mapping=True), 256),
        (Layout(tp=1, pp=16, cp=1, ep=64, etp=1, mbs=1), 16384),
    ],
)
def test_evidence_ranks_cover_what_megatron_logs(layout, n):
    """First and last rank, a DP-rank-0 rank per PP stage, and one whole EP group per PP stage; bounded."""
    ev = ranks.evidence_ranks(layout, n)
    assert {0, n - 1} <= ev
    assert len(ev) <= layout.pp * (layout.ep + 1) + 2 < n
    stages = {ranks.coords(layout, n, r)["pp"] for r in ev if ranks.coords(layout, n, r)["dp"] == 0}
    assert stages == set(range(layout.pp))
    if n <= 1024:  # Megatron's own EP groups (RankGenerator enumeration): one is kept whole per PP stage
        groups = ranks.rank_groups(layout, n)
        whole = [g for g in groups["ep"] if set(g) <= ev]
        assert {ranks.coords(layout, n, g[0])["pp"] for g in whole} == set(range(layout.pp))


def spec_for(tmp_path: Path, n: int = 16, **env: str) -> JobSpec:
    script = tmp_path / "rank_echo.py"
    script.write_text(SCRIPT)
    return JobSpec(
        sweep="t",
        candidate_key="k",
        attempt=1,
        layout=Layout(tp=1, pp=2, cp=1, ep=2, etp=1, mbs=1).to_dict(),
        model=ModelConfig(),
        stage=StageConfig(gpus=n, gpus_per_node=8),
        hardware=HardwareConfig(),
        workload=WorkloadConfig(name="echo", command=["python", str(script)], simulated=False, env=env),
        job_dir=str(tmp_path / "job"),
        n_gpus=n,
        gpus_per_node=8,
    )


def as_slurm_rank(monkeypatch, rank: int, n: int = 16, node: str = "n1") -> None:
    for k, v in {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": "77",
        "SLURM_NTASKS": str(n),
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank % 8),
        "SLURM_NODEID": str(rank // 8),
        "SLURM_JOB_NUM_NODES": str(n // 8),
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURMD_NODENAME": node,
    }.items():
        monkeypatch.setenv(k, v)


def test_only_evidence_ranks_write_rank_files(tmp_path, monkeypatch):
    spec = spec_for(tmp_path)
    lay, folder = Layout.from_dict(spec.layout), JobPaths(spec.job_dir)
    evidence = ranks.evidence_ranks(lay, 16)
    quiet = sorted(set(range(8)) - evidence)
    assert quiet, "the test needs a non-evidence rank on node n1"
    for r in range(8):
        as_slurm_rank(monkeypatch, r)
        assert is_evidence_rank(spec, rank_env(spec)) == (r in evidence)
        run_task(spec)
    written = {JobPaths.rank_of(p) for p in folder.rank_logs()}
    assert written == {r for r in range(8) if r in evidence}
    node = parse_file(folder.node_log("n1"))
    text = folder.node_log("n1").read_text()
    for r in quiet:
        assert f"{r}: hello from rank {r}\n" in text and f"{r}: UserWarning" in text
    assert node.source_rank is None and node.garbage_lines == 0


def test_failing_quiet_rank_is_found_in_its_node_log(tmp_path, monkeypatch):
    spec = spec_for(tmp_path, FAIL_RANK="3")
    as_slurm_rank(monkeypatch, 3)
    assert not is_evidence_rank(spec, rank_env(spec))
    with pytest.raises(TaskFailed, match=r"rank 3 exited with code 1; see .*node-n1\.log"):
        run_task(spec)
    result = collect(spec.job_dir, slurm_state="FAILED", exit_code=1)
    assert not result.ok and "boom on rank 3" in (result.failure_detail or "")


def test_node_log_is_bounded_per_rank(tmp_path, monkeypatch):
    """A rank that floods stderr keeps its first HEAD_BYTES and its last TAIL_BYTES, and says what it dropped."""
    monkeypatch.setattr(ranklog, "HEAD_BYTES", 4096)
    monkeypatch.setattr(ranklog, "TAIL_BYTES", 2048)
    folder = JobPaths(tmp_path)
    monkeypatch.setenv("SLURMD_NODENAME", "n9")
    sink = ranklog.NodeLog(folder, 5, head=4096, tail=2048)
    for i in range(2000):
        sink.writer.write(f"line {i:05d} {'y' * 40}\n".encode())
    sink.writer.write(b"last words without newline")
    sink.close()
    text = folder.node_log("n9").read_text()
    assert len(text) < 4096 + 2048 + 512
    assert text.startswith("5: line 00000") and "5: last words without newline\n" in text
    assert "bytes of output dropped" in text and "5: line 01999" in text


def test_collect_reads_evidence_ranks_and_node_logs(tmp_path):
    """A folder with rank files only for evidence ranks still yields iterations, memory and node-log errors."""
    folder = JobPaths(tmp_path)
    fixture = Path(__file__).parent.parent / "fixtures" / "logs" / "megatron_full.log"
    folder.stdout(15).write_bytes(fixture.read_bytes())
    folder.node_log("n1").write_text("3: [rank3]: NCCL WARN something\n4: UserWarning: fine\n")
    logs = [parse_file(p) for p in folder.rank_logs() + folder.node_logs()]
    assert any(log.iterations for log in logs)
    assert json.dumps([log.path for log in logs]).count("node-n1.log") == 1
