"""Bad input through the real CLI: one `error:` line, exit 2, and nothing created (no ledger file, no sweep
row, no folder). Each command runs in a subprocess from an empty working folder, so whatever it would write
by default (./ledger.sqlite, ./runs, reports/) lands where the test can see it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect

from orchestrator.core.states import CandidateStatus
from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import FAST_TWIN, cli, ledger_url, sweep_args

STAGE = ["+stage=smoke", "cluster=local", *FAST_TWIN]


def run(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def refused(cwd: Path, *args: str, env: dict | None = None) -> str:
    """The one `error:` line of a command that must exit 2 (no traceback, nothing on stdout)."""
    r = run(cwd, *args, env=env)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (r.returncode, r.stderr[-2000:])
    assert r.stdout == "", r.stdout
    return lines[0]


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    """An empty working folder inside an otherwise empty tmp_path (traversal targets land in tmp_path)."""
    d = tmp_path / "work" / "here"
    d.mkdir(parents=True)
    return d


# ------------------------------------------------------------------------------------------- names
@pytest.mark.long
@pytest.mark.parametrize("name", ["../../etc", "..", "ABSOLUTE", "a" * 201, "run%j", "run%A"])
def test_an_unsafe_sweep_name_is_refused_before_anything_is_written(cwd, tmp_path, name):
    if name == "ABSOLUTE":
        name = str(tmp_path / "abs")
    line = refused(cwd, "sweep", *STAGE, f"sweep.name={name}", "--plain")
    assert "sweep.name" in line and ("not a safe name" in line or "at most 100" in line), line
    assert tree(tmp_path) == {"work", "work/here"}  # no ledger, no runs/, nothing outside cluster.folder


@pytest.mark.long
def test_a_long_name_leaves_no_sweep_row_on_either_engine(cwd, tmp_path, ledger_url):
    refused(cwd, "sweep", *STAGE, "sweep.name=" + "n" * 250, f"ledger.url={ledger_url}", "--plain")
    if ledger_url.startswith("sqlite"):
        assert not (tmp_path / "ledger.sqlite").exists()
    else:  # the PostgreSQL database is as empty as the fixture made it: no schema, so no sweep row
        engine = create_engine(ledger_url)
        try:
            assert inspect(engine).get_table_names() == []
        finally:
            engine.dispose()


@pytest.mark.long
def test_a_default_name_from_an_unsafe_model_name_is_refused(cwd, tmp_path):
    line = refused(cwd, "sweep", *STAGE, "model.name=../evil", "--plain")
    assert "default sweep name" in line and "smoke-../evil-h200" in line
    assert tree(tmp_path) == {"work", "work/here"}


@pytest.mark.long
def test_resume_run_one_and_report_check_the_name_too(cwd, tmp_path):
    assert "not a safe name" in refused(cwd, "resume", "../../etc", "--plain")
    assert "not a safe name" in refused(cwd, "run-one", *STAGE, "sweep.name=../x")
    assert "not a safe name" in refused(cwd, "report", "../../x")
    assert tree(tmp_path) == {"work", "work/here"}


@pytest.mark.long
def test_report_never_writes_outside_reports(cwd, tmp_path):
    assert "outside reports/" in refused(cwd, "report", "s1", "--out", str(tmp_path / "elsewhere"))
    assert "outside reports/" in refused(cwd, "report", "s1", "--out", "reports/../../x")
    (cwd / "reports").mkdir()
    (cwd / "reports" / "link").symlink_to(tmp_path, target_is_directory=True)  # a way out through a symlink
    assert "outside reports/" in refused(cwd, "report", "s1", "--out", "reports/link/x")
    assert tree(tmp_path) == {"work", "work/here", "work/here/reports", "work/here/reports/link"}


# ------------------------------------------------------------------------------------------ ledger URLs
@pytest.mark.long
def test_status_resume_cancel_never_create_a_ledger(cwd, tmp_path):
    url = f"ledger.url=sqlite:///{cwd / 'typo.sqlite'}"
    for args in (["status"], ["status", "s1"], ["resume", "s1", "--plain"], ["cancel", "s1"], ["compare"]):
        assert "no ledger at" in refused(cwd, *args, url)
    assert "no ledger at" in refused(cwd, "status")  # the default ./ledger.sqlite
    assert tree(tmp_path) == {"work", "work/here"}


@pytest.mark.long
def test_a_missing_folder_is_an_error_unless_asked(cwd, tmp_path):
    url = f"ledger.url=sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'l.sqlite'}"
    line = refused(cwd, "sweep", *STAGE, url, "--plain")
    assert "does not exist" in line and "ledger.create_dir=true" in line
    assert "does not exist" in refused(cwd, "db", "upgrade", url)
    assert tree(tmp_path) == {"work", "work/here"}
    r = run(cwd, "db", "current", url)
    assert r.returncode == 0 and "no file yet" in r.stdout, r.stderr
    r = run(cwd, "db", "upgrade", url, "ledger.create_dir=true")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "no" / "such" / "dir" / "l.sqlite").is_file()


@pytest.mark.long
def test_a_device_or_a_folder_is_not_a_ledger(cwd, tmp_path):
    before = set(os.listdir("/dev"))
    for url in ("sqlite:////dev/null", f"sqlite:///{cwd}"):
        for args in (["status"], ["db", "upgrade"], ["sweep", *STAGE, "--plain"]):
            assert "is not a regular file" in refused(cwd, *args, f"ledger.url={url}")
    assert set(os.listdir("/dev")) == before  # no null-journal, null.migrate-lock, ...
    assert tree(tmp_path) == {"work", "work/here"}


def test_a_port_that_is_not_a_number_is_one_error_line(cwd):
    line = refused(cwd, "status", "ledger.url=postgresql+psycopg://u:Hunter2@db.example:abc/ledger")
    assert "port that is not a number" in line and "Hunter2" not in line


@pytest.mark.parametrize("password", ["pa,ss", "pa'ss"])
def test_hydra_parse_errors_never_print_the_password(cwd, password):
    secret = f"Sw0rd{password}Fish"
    line = refused(cwd, "status", f"ledger.url=postgresql+psycopg://orch:{secret}@db.example:5432/ledger")
    assert "invalid override" in line and secret not in line and "Sw0rd" not in line and "***" in line
    assert "PGPASSWORD" in line  # says how to keep the password out of the command line


# --------------------------------------------------------------------------------------------- compare
@pytest.mark.parametrize("flag", [["--limit", "99999999999999999999"], ["--round", "99999999999"], ["--round", "-1"]])
def test_compare_numbers_out_of_range_are_usage_errors(cwd, flag):
    line = refused(cwd, "compare", *flag)
    assert f"argument {flag[0]}" in line and "out of range" in line


# ------------------------------------------------------------------------------------ workload.command
@pytest.mark.long
def test_a_broken_workload_command_is_refused_before_round_0(cwd, tmp_path):
    plain = tmp_path / "work" / "not-executable.sh"
    plain.write_text("#!/bin/sh\nexit 0\n")
    plain.chmod(stat.S_IRUSR | stat.S_IWUSR)
    cases = {
        "[]": "is empty",
        "[no-such-binary-xyz]": "not on PATH",
        f"[{tmp_path / 'missing'}]": "does not exist",
        f"[{plain}]": "is not executable",
        "[./relative.sh]": "relative path",
        "[python,tests/workloads/cliffs.py]": "script tests/workloads/cliffs.py is a relative path",
        f"[python,-u,{tmp_path / 'missing.py'}]": "does not exist",
        "[bash,relative.sh]": "relative path",
    }
    for command, why in cases.items():
        assert why in refused(cwd, "sweep", *STAGE, f"workload.command={command}", "--plain")
    line = refused(cwd, "sweep", *STAGE, "++workload.in_process=true", f"workload.command=[python,{tmp_path}/x.py]")
    assert "entry script" in line
    assert "is empty" in refused(cwd, "run-one", *STAGE, "workload.command=[]")
    assert tree(tmp_path) == {"work", "work/here", "work/not-executable.sh"}


@pytest.mark.long
def test_a_failing_workload_leaves_its_stderr_in_the_ledger_and_the_sweep_exits_1(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import sys\nprint('fatal: dataset /data/x is missing', file=sys.stderr)\nsys.exit(3)\n")
    args = sweep_args(
        tmp_path,
        "fails",
        f"workload.command=[python,{script}]",
        "policy.schedule.round0_size=2",
        "stage.budget.max_rounds=1",
    )
    proc = cli("sweep", *args, "--plain", timeout=300)
    assert proc.returncode == 1 and "sweep fails measured nothing (2 attempt(s))" in proc.stderr, proc.stderr[-2000:]
    with Ledger.open(ledger_url(tmp_path), create=False) as led:
        cands = led.candidates("fails")
        assert len(cands) == 2 and {c.status for c in cands} == {CandidateStatus.FAILED}
        for c in cands:
            (a,) = led.attempts(c.id)
            assert a.failure_class == "CRASH" and "stderr: fatal: dataset /data/x is missing" in a.failure_detail


# ------------------------------------------------------------------------------------- Hydra's messages
@pytest.mark.long
def test_a_stage_without_plus_says_to_write_plus(cwd, tmp_path):
    line = refused(cwd, "sweep", "stage=1k", "cluster=local", "--plain")
    assert "write +stage=1k" in line, line
    assert tree(tmp_path) == {"work", "work/here"}


@pytest.mark.parametrize(
    ("typo", "key"), [("polcy.name=x", "policy.name"), ("stage.gpu=3", "stage.gpus"), ("+polcy.name=x", "policy")]
)
def test_a_typo_in_a_key_suggests_the_nearest_key(cwd, typo, key):
    line = refused(cwd, "plan", "+stage=1k", typo)
    assert f"did you mean '{key}'?" in line, line


@pytest.mark.long
@pytest.mark.parametrize(
    ("args", "fix"),
    [(["+stage=1K"], "+stage=1k"), (["+stage=1k", "hardware=h300"], "hardware=h"), (["+stage=8K", "cluster=locl"], "")],
)
def test_a_mistyped_group_option_suggests_one_that_then_works(cwd, args, fix):
    """The suggested option is applied in place of the typo and the command then succeeds (exit 0)."""
    line = refused(cwd, "plan", *args)
    suggestion = line.rsplit("did you mean ", 1)[1].rstrip("?")
    assert suggestion.startswith(fix), line
    group = suggestion.lstrip("+").split("=", 1)[0]
    fixed = [suggestion if a.lstrip("+").startswith(f"{group}=") else a for a in args]
    while "did you mean" in (r := run(cwd, "plan", *fixed, "--top", "1")).stderr:  # one typo fixed a time
        suggestion = r.stderr.strip().rsplit("did you mean ", 1)[1].rstrip("?")
        group = suggestion.lstrip("+").split("=", 1)[0]
        fixed = [suggestion if a.lstrip("+").startswith(f"{group}=") else a for a in fixed]
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.long
def test_a_sweep_without_a_stage_shows_a_sweep_example(cwd, tmp_path):
    line = refused(cwd, "sweep", "cluster=local", "--plain")
    assert "no stage given" in line and "`python -m orchestrator sweep +stage=1k" in line and " plan " not in line
    assert tree(tmp_path) == {"work", "work/here"}


# ------------------------------------------------------------------------------------------- ranges
@pytest.mark.long
@pytest.mark.parametrize(
    "override",
    [
        "stage.screen.resolution=0",
        "stage.gpus=-8",
        "stage.search.pp=[]",
        "ledger.lease_ttl_s=nan",
        "stage.budget.max_gpu_hours=0",
        "stage.budget.max_runs=-1",
    ],
)
def test_a_value_out_of_range_is_one_error_line_and_nothing_is_written(cwd, tmp_path, override):
    line = refused(cwd, "sweep", *STAGE, override, "--plain")
    assert f"error: {override.split('=')[0]}=" in line and "is out of range: it must be" in line, line
    assert tree(tmp_path) == {"work", "work/here"}  # no ledger file, so no sweep row; no job folder


@pytest.mark.long
@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_an_in_memory_ledger_is_refused_before_the_sweep_runs(cwd, tmp_path, url):
    line = refused(cwd, "sweep", *STAGE, f"ledger.url={url}", "--plain")
    assert "in-memory database" in line and "ledger.url=sqlite:///./ledger.sqlite" in line, line
    assert tree(tmp_path) == {"work", "work/here"}  # no job folder: round 0 never ran


@pytest.mark.long
@pytest.mark.parametrize(
    ("url", "says", "fix"),
    [  # issue 45 item 4: the first ran every job into a database that vanished; the second wrote `ro.sqlite?mode=ro`
        ("sqlite:///file::memory:?cache=shared&uri=true", "is an in-memory database", "sqlite:///./ledger.sqlite"),
        ("sqlite:///RO?mode=ro&uri=true", "opens a file literally named 'ro.sqlite?mode=ro'", "sqlite:///RO"),
        ("sqlite:///file:RO?mode=ro&uri=true", "opens the ledger read-only (mode=ro)", "sqlite:///RO"),
        ("sqlite:///file:RO?immutable=1&uri=true", "opens the ledger read-only (immutable=1)", "sqlite:///RO"),
        ("sqlite:///RO?mode=ro", "SQLite ignores without uri=true", "sqlite:///RO"),
    ],
)
def test_a_uri_mode_url_that_opens_no_plain_writable_file_is_refused_before_anything_launches(
    cwd, tmp_path, url, says, fix
):
    ro = tmp_path / "ro.sqlite"
    with Ledger.open(f"sqlite:///{ro}"):
        pass
    before, files = ro.read_bytes(), tree(tmp_path)
    url, fix = url.replace("RO", str(ro)), fix.replace("RO", str(ro))
    line = refused(cwd, "sweep", *STAGE, f'ledger.url="{url}"', "--plain")
    assert says in line and f"ledger.url={fix}" in line, line
    assert tree(tmp_path) == files  # no job folder, no `ro.sqlite?mode=ro`
    assert ro.read_bytes() == before


@pytest.mark.long
@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["plan", "+stage=smoke", "cluster.env.FOO=1"], "write ++cluster.env.FOO=1 (cluster.env is a mapping"),
        (["plan", "+stage=smoke", "cluster.slurm.sbatch_extra.reservation=r"], "write ++cluster.slurm.sbatch_extra"),
        (["status", "stage.gpus=3"], "stage.gpus=3: no stage is chosen"),  # was a traceback
    ],
)
def test_a_key_the_composed_config_lacks_names_the_plus_plus_fix(cwd, args, hint):
    line = refused(cwd, *args)
    assert hint in line and "did you mean" not in line, line


@pytest.mark.long
def test_a_negative_stage_size_names_the_fix_that_then_plans(cwd):
    """stage.gpus=-8 on a stage with a size says to leave it out (not "has no size"), and that plan succeeds."""
    line = refused(cwd, "plan", "+stage=1k", "stage.gpus=-8")
    assert "has no size" not in line and "`+stage=1k`" in line, line
    fix = line.rsplit("`", 2)[1].split()
    assert run(cwd, "plan", *fix, "--top", "1").returncode == 0
