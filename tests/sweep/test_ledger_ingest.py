"""`ledger ingest FOLDER` (issue 22 item 3): the results a sweep's jobs left in their folders after its ledger
was deleted under it are stored into a fresh ledger, each exactly once (0 lost, 0 duplicated), and `best`,
`status` and `resume` work from those rows. Only a job's own, complete evidence is stored: a folder without
its exit marker, with another launch's marker, without a launch token, or with a partial window is listed as
skipped. A bad FOLDER is one `error:` line, exit 2, nothing written. And `resume` collects a result on disk
whose attempt row lacks it (re-attachment reads the job's own exit marker)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.core import proc as process
from orchestrator.core.paths import JobPaths
from orchestrator.core.states import AttemptRole, AttemptState, CandidateStatus
from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import FINALISTS_SWEEP, ROOT, all_attempts, sweep_args, wait_for

TINY = ("policy.schedule.round0_size=2", "stage.budget.max_rounds=2")


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


def _folders(runs: Path) -> list[Path]:
    return sorted(p.parent for p in runs.rglob(JobPaths.SPEC) if JobPaths.SUBMITIT not in p.parts)


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def _finished(runs: Path) -> set[str]:
    """The job folders whose job ended well by itself (its own exit marker): every measured result on disk."""
    marks = [JobPaths(f).exited for f in _folders(runs)]
    return {str(m.parent) for m in marks if m.exists() and _read(m)["outcome"] == "ok"}


def _no_job_alive(runs: Path) -> bool:
    """Every job that started has ended (its task, `pid:start` in its start record, is gone; a bare pid could
    name another process by now): the folders are final."""
    return not any(
        process.running(_read(JobPaths(f).started)["task"]) for f in _folders(runs) if JobPaths(f).started.exists()
    )


def _stored(url: str, sweep: str) -> list[str]:
    """The job folder of every stored measurement (a measure attempt with a result), one entry per result."""
    with Ledger.open(url, create=False) as led:
        return [a.job_dir for a in all_attempts(led, sweep) if a.measures and led.evidence.result(a.id) is not None]


def _ingest(capsys, folder: Path | str, url: str) -> tuple[int, list[str], list[str]]:
    rc = main(["ledger", "ingest", str(folder), f"ledger.url={url}"])
    out = capsys.readouterr()
    return rc, out.out.splitlines(), [ln for ln in out.err.splitlines() if ln]


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory) -> Path:
    """A tiny sweep run to its end (2 rounds of the twin); its ledger then deleted. Returns its tmp folder."""
    tmp = tmp_path_factory.mktemp("ingest")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", str(ROOT))
        assert main(["sweep", *sweep_args(tmp, "done", *TINY), "--plain"]) == 0
    for f in tmp.glob("ledger.sqlite*"):
        f.unlink()
    return tmp


@pytest.mark.long
def test_a_ledger_deleted_mid_sweep_is_rebuilt_from_the_job_folders_with_nothing_lost_or_doubled(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    real = Ledger.launched
    calls = []

    def delete_in_round_1(self, rows, *a, **kw):
        calls.append(rows)
        if len(calls) == 3:  # round 0 launched 2 jobs (measured, collected); round 1's first job has just started
            for f in tmp_path.glob("ledger.sqlite*"):
                f.unlink()
        return real(self, rows, *a, **kw)

    monkeypatch.setattr(Ledger, "launched", delete_in_round_1)
    assert main(["sweep", *sweep_args(tmp_path, "pulled", *TINY), "--plain"]) == 2
    assert "was deleted while this process used it" in capsys.readouterr().err
    monkeypatch.setattr(Ledger, "launched", real)
    runs = tmp_path / "runs" / "pulled"
    wait_for(lambda: _no_job_alive(runs), 60, "the jobs the stopped sweep left to end")
    on_disk = _finished(runs)
    assert len(on_disk) >= 2  # round 0's two results at least: in no ledger now

    url = _url(tmp_path / "rebuilt.sqlite")
    rc, out, err = _ingest(capsys, runs, url)
    assert rc == 0 and not err, err
    skipped = len(_folders(runs)) - len(on_disk)
    n = len(on_disk)
    assert out[0].startswith(
        f"ingested {n} result(s) ({n} measured, 0 failed, 0 finalists' jobs), 0 already present, {skipped} skipped"
    ), out
    stored = _stored(url, "pulled")
    assert sorted(stored) == sorted(on_disk)  # every result on disk, each exactly once

    rc, out, _ = _ingest(capsys, runs, url)  # again: nothing added
    assert rc == 0 and out[0].startswith(
        f"ingested 0 result(s) (0 measured, 0 failed, 0 finalists' jobs), {n} already"
    ), out
    assert sorted(_stored(url, "pulled")) == sorted(on_disk)

    assert main(["best", "--sweep", "pulled", "--format", "json", f"ledger.url={url}"]) == 0
    best = json.loads(capsys.readouterr().out)
    with Ledger.open(url, create=False) as led:
        sweep = led.get_sweep("pulled")
        assert sweep is not None and "ingested" in sweep.provenance
        keys = {c.key for c in led.candidates("pulled")}
        assert best["key"] in keys
        assert all(c.status == CandidateStatus.DONE for c in led.candidates("pulled"))
    assert main(["status", "pulled", f"ledger.url={url}"]) == 0

    # resume goes on from the ingested rows: nothing measured again, every folder one attempt
    assert main(["resume", "pulled", f"ledger.url={url}", "--plain"]) == 0
    capsys.readouterr()
    with Ledger.open(url, create=False) as led:
        atts = all_attempts(led, "pulled")
        dirs = [a.job_dir for a in atts]
        assert len(dirs) == len(set(dirs))
        for c in led.candidates("pulled"):
            full = [a for a in led.attempts(c.id) if a.fidelity == "full" and led.evidence.result(a.id) is not None]
            assert len(full) <= 1, (c.key, [a.job_dir for a in full])


@pytest.mark.long
def test_only_a_jobs_own_complete_evidence_is_stored(finished_sweep, tmp_path, capsys):
    """Copies of measured folders, each with one thing wrong, and one intact: only the intact one is stored."""
    runs = finished_sweep / "runs" / "done"
    good = _folders(runs)
    assert len(good) >= 5
    root = tmp_path / "done"
    cases = {}
    for name, src in zip(("intact", "no-token", "no-exit", "other-launch", "partial"), good, strict=False):
        dst = root / name / "attempt-1"
        shutil.copytree(src, dst)
        paths = JobPaths(dst)
        spec = _read(paths.spec)
        if name == "no-token":
            spec["launch_token"] = ""
        elif name == "no-exit":  # a stray result.json stays: it is never evidence
            paths.exited.unlink()
        elif name == "other-launch":
            paths.exited.write_text(json.dumps({**_read(paths.exited), "token": "someone.else"}))
        elif name == "partial":  # the job measured fewer iterations than its window asks
            spec["measure_iters"] = int(spec["measure_iters"] or spec["stage"]["measure_iters"]) + 5
        paths.spec.write_text(json.dumps(spec))
        cases[name] = str(dst.resolve())
    url = _url(tmp_path / "ledger.sqlite")
    rc, out, err = _ingest(capsys, root, url)
    assert rc == 0 and not err, err
    assert out[0].startswith(
        "ingested 1 result(s) (1 measured, 0 failed, 0 finalists' jobs), 0 already present, 4 skipped"
    ), out
    why = {ln.split(": ", 1)[0].split()[-1]: ln.split(": ", 1)[1] for ln in out[1:] if ln.startswith("  skipped ")}
    assert "no launch token" in why[cases["no-token"]]
    assert "no exit marker" in why[cases["no-exit"]]
    assert "another launch's evidence" in why[cases["other-launch"]]
    assert why[cases["partial"]].startswith("partial: ")
    assert _stored(url, "done") == [cases["intact"]]


@pytest.mark.long
def test_a_finalists_job_is_an_attempt_of_its_role_and_needs_its_candidate_in_the_ledger(
    finished_sweep, tmp_path, capsys
):
    """A finalist's job alone (its candidate in no ledger) is skipped and writes no ledger; beside its
    candidate's measurement it comes back as an attempt of its role, never the candidate's measurement."""
    src = _folders(finished_sweep / "runs" / "done")[0]
    meas = tmp_path / "done" / "c" / "attempt-1"
    shutil.copytree(src, meas)
    dst = tmp_path / "done" / "c" / "parity-2"
    shutil.copytree(src, dst)
    spec = _read(JobPaths(dst).spec)
    JobPaths(dst).spec.write_text(json.dumps({**spec, "role": str(AttemptRole.PARITY), "attempt": 2}))
    url = _url(tmp_path / "ledger.sqlite")
    rc, out, _ = _ingest(capsys, dst, url)
    assert rc == 0 and out[0].startswith("ingested 0 result(s) (0 measured, 0 failed, 0 finalists' jobs), 0 already"), (
        out
    )
    assert "its candidate is in no ledger" in out[1]
    assert not (tmp_path / "ledger.sqlite").exists()  # nothing to store: no ledger written

    rc, out, _ = _ingest(capsys, tmp_path / "done", url)
    assert rc == 0 and out[0].startswith("ingested 2 result(s) (1 measured, 0 failed, 1 finalists' jobs)"), out
    assert _stored(url, "done") == [str(meas.resolve())]  # the parity job is no measurement
    with Ledger.open(url, create=False) as led:
        (c,) = led.candidates("done")
        assert [(a.role, a.attempt_no) for a in led.attempts(c.id, roles=None)] == [("measure", 1), ("parity", 2)]
        assert c.status == CandidateStatus.DONE and c.latest_result_id is not None


@pytest.mark.long
def test_a_failure_is_stored_only_when_its_folder_alone_proves_it(finished_sweep, tmp_path, capsys):
    """Copies of measured folders whose job raised (exit marker outcome 'error'): a plain non-zero exit is a
    CRASH, stored as the driver would (the candidate failed); a rank killed by a signal, a marker without the
    rank's exit status, or a job that got Slurm's time-limit warning is skipped (Slurm's word would decide)."""
    good = _folders(finished_sweep / "runs" / "done")
    root = tmp_path / "done"
    cases = {}
    for name, src in zip(("crash", "signal", "no-status", "time-limit"), good, strict=False):
        dst = root / name / "attempt-1"
        shutil.copytree(src, dst)
        paths = JobPaths(dst)
        marker = {**_read(paths.exited), "outcome": "error", "returncode": {"signal": -15}.get(name, 1)}
        if name == "no-status":  # an older orchestrator's marker
            del marker["returncode"]
        elif name == "time-limit":
            paths.time_limit_mark(0).write_text("signal 12\n")
        paths.exited.write_text(json.dumps(marker))
        cases[name] = str(dst.resolve())
    url = _url(tmp_path / "ledger.sqlite")
    rc, out, err = _ingest(capsys, root, url)
    assert rc == 0 and not err, err
    assert out[0].startswith(
        "ingested 1 result(s) (0 measured, 1 failed, 0 finalists' jobs), 0 already present, 3 skipped"
    ), out
    why = {ln.split(": ", 1)[0].split()[-1]: ln.split(": ", 1)[1] for ln in out[1:] if ln.startswith("  skipped ")}
    assert "failed with CRASH" in why[cases["signal"]] and "killed by a signal" in why[cases["signal"]]
    assert "no exit status recorded" in why[cases["no-status"]]
    assert "time limit was near" in why[cases["time-limit"]]
    with Ledger.open(url, create=False) as led:
        (c,) = led.candidates("done")
        (a,) = led.attempts(c.id)
        assert a.job_dir == cases["crash"] and a.failure_class == "CRASH" and a.state == AttemptState.FAILED
        assert c.status == CandidateStatus.FAILED and c.reason.startswith("CRASH: ")
        assert led.evidence.result(a.id) is None
    rc, out, _ = _ingest(capsys, root, url)  # again: nothing added
    assert rc == 0 and out[0].startswith("ingested 0 result(s) (0 measured, 0 failed, 0 finalists' jobs), 1 already"), (
        out
    )


@pytest.mark.long
def test_a_sweeps_folder_named_like_another_sweep_of_the_ledger_is_refused_and_nothing_written(
    finished_sweep, ledger_url, capsys
):
    """Issue 45 item 1: the ledger holds a 1k sweep named `done`; the smoke sweep's folders (same name) are
    another sweep: exit 2, one `error:` line naming what differs and a ledger of its own as the fix, and every
    row of the ledger as it was. With that fix, the folders are ingested."""
    from orchestrator.config import compose
    from tests.ledger.test_ledger import job_result, make_items
    from tests.sweeplib import ledger_rows, new_sweep

    with Ledger.open(ledger_url, create=True) as led:  # a 1k sweep `done` with a measured candidate
        new_sweep(led, "done", compose(["+stage=1k", "cluster=local"]))
        (c,) = led.add_candidates("done", make_items(1))
        a = led.new_attempt(c.id, job_dir="/runs/done/c/attempt-1", simulated=True, launch_token="done.1k")
        led.evidence.record_result(a.id, job_result(12.0))
    before = ledger_rows(ledger_url)
    runs = finished_sweep / "runs" / "done"
    rc, out, err = _ingest(capsys, runs, ledger_url)
    assert rc == 2 and not out and len(err) == 1 and err[0].startswith("error: "), (out, err)
    assert "of another sweep named done: stage smoke (not 1k)" in err[0] and "gpus 32 (not 1024)" in err[0], err
    assert ledger_rows(ledger_url) == before
    fix = err[0].rsplit("(", 1)[1].rstrip(")")  # the fix it names: a ledger of its own
    assert fix.startswith("ledger.url=sqlite:///"), fix
    own = fix.replace("sqlite:///", f"sqlite:///{finished_sweep}/", 1)  # in this test's folder, not the cwd
    rc, out, err = _ingest(capsys, runs, own.split("=", 1)[1])
    assert rc == 0 and not err and out[0].startswith("ingested "), (out, err)
    assert ledger_rows(ledger_url) == before


@pytest.mark.long
def test_ingest_binds_the_sweep_to_the_launcher_its_folders_name(finished_sweep, tmp_path, capsys):
    """Issue 45 item 3: the job's own records name the launcher that ran it (launch/task.RunInFolder); ingest
    binds the rebuilt sweep to it, even where its config snapshot says cluster.kind auto. A folder that names
    none (an older job: no launcher in its records, no launch.json, a snapshot's auto) leaves it unbound."""
    src = _folders(finished_sweep / "runs" / "done")[0]
    marks = [_read(JobPaths(src).started), _read(JobPaths(src).exited)]
    assert [m.get("launcher") for m in marks] == ["local", "local"]
    for name, older in (("named", False), ("older", True)):
        dst = tmp_path / name / "done" / "c" / "attempt-1"
        shutil.copytree(src, dst)
        paths = JobPaths(dst)
        spec = _read(paths.spec)
        assert "kind: local" in spec["sweep_config"]
        paths.spec.write_text(
            json.dumps({**spec, "sweep_config": spec["sweep_config"].replace("kind: local", "kind: auto")})
        )
        if older:
            for mark in (paths.started, paths.exited):
                mark.write_text(json.dumps({k: v for k, v in _read(mark).items() if k != "launcher"}))
            paths.launch.unlink()
        url = _url(tmp_path / f"{name}.sqlite")
        rc, out, err = _ingest(capsys, dst.parent.parent, url)
        assert rc == 0 and not err and out[0].startswith("ingested 1 result(s)"), (out, err)
        with Ledger.open(url, create=False) as led:
            assert led.get_sweep("done").provenance.get("launcher") == (None if older else "local"), name


def _move_aside(tmp: Path) -> str:
    """The sweep's ledger moved out of the way (what the driver recorded, to compare with): its URL there."""
    kept = tmp / "before"
    kept.mkdir()
    for f in tmp.glob("ledger.sqlite*"):
        f.rename(kept / f.name)
    return _url(kept / "ledger.sqlite")


def _verdicts(url: str, sweep: str) -> dict:
    """Per candidate key: status, the failure classes of its measure attempts, its parity rows, its long-run
    figures; and the sweep's stated GPU capacity: what `status`, `report` and `best` show."""
    out: dict = {}
    with Ledger.open(url, create=False) as led:
        for c in led.candidates(sweep):
            runs = [
                (ev.data["ok"], ev.data.get("q_effective"))
                for ev in led.events(sweep, kind="long-run", candidate_id=c.id)
            ]
            out[c.key] = (
                c.status,
                [a.failure_class for a in led.attempts(c.id)],
                [(p.passed, p.reference_key, p.steps, p.max_loss_diff, p.detail) for p in led.evidence.parity(c.id)],
                runs,
            )
        out["capacity"] = [(x.gb, x.source) for x in led.evidence.gpu_capacities(sweep)]
    return out


@pytest.mark.long
def test_a_sweep_of_ooms_comes_back_failed_as_the_driver_recorded_it(tmp_path, monkeypatch, capsys):
    """Every job OOMs (the twin's force_oom); the ledger is lost. Ingest brings each back FAILED with class OOM,
    its message and the capacity it states, as the driver recorded them; the search's observations see the
    OOMs; a second ingest adds nothing; resume runs none of them again."""
    from orchestrator import history
    from orchestrator.config import root_from_yaml
    from orchestrator.search.env import PlanEnv

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    args = sweep_args(tmp_path, "ooms", "++workload.twin.force_oom=true", *TINY)
    assert main(["sweep", *args, "--plain"]) == 1  # measured nothing
    capsys.readouterr()
    before = _move_aside(tmp_path)
    runs = tmp_path / "runs" / "ooms"
    url = _url(tmp_path / "rebuilt.sqlite")
    rc, out, err = _ingest(capsys, runs, url)
    n = len(_folders(runs))
    assert rc == 0 and not err and n >= 2, err
    assert out[0].startswith(f"ingested {n} result(s) (0 measured, {n} failed, 0 finalists' jobs), 0 already"), out
    was, now = _verdicts(before, "ooms"), _verdicts(url, "ooms")
    assert now == was and all(v[:2] == (CandidateStatus.FAILED, ["OOM"]) for k, v in now.items() if k != "capacity")
    assert now["capacity"] and all(src == "OOM message" for _, src in now["capacity"])  # the OOM's own words
    with Ledger.open(url, create=False) as led:
        sweep = led.get_sweep("ooms")
        cfg = root_from_yaml(sweep.config_yaml)
        env = PlanEnv(cfg.model, cfg.hardware, cfg.required_stage(), cfg.workload.name)
        obs = history.observations(led, [sweep], env)
        assert len(obs) == n and {o.failure_class for o in obs} == {"OOM"}  # what oom_dominated and calibration read
        details = {a.job_dir: a.failure_detail for a in all_attempts(led, "ooms")}
        assert all("CUDA out of memory" in d for d in details.values()), details

    rc, out, _ = _ingest(capsys, runs, url)  # again: nothing added
    assert rc == 0 and out[0].startswith(
        f"ingested 0 result(s) (0 measured, 0 failed, 0 finalists' jobs), {n} already"
    ), out
    assert _verdicts(url, "ooms") == now

    assert main(["resume", "ooms", f"ledger.url={url}", "--plain"]) in (0, 1)
    capsys.readouterr()
    with Ledger.open(url, create=False) as led:  # no OOMed layout launched again
        for c in led.candidates("ooms"):
            if c.key in was:
                assert len(led.attempts(c.id, roles=None)) == 1, c.key


@pytest.mark.parametrize(
    "bad", ["missing", "empty", "a file", "escaping link", "unsafe sweep name", "the filesystem's root", "too deep"]
)
@pytest.mark.long
def test_a_bad_folder_is_one_error_line_and_nothing_written(finished_sweep, tmp_path, capsys, bad):
    folder = tmp_path / "runs"
    if bad == "the filesystem's root":  # `ledger ingest /` walked every folder into a PermissionError traceback
        folder = Path("/")
    elif bad == "too deep":  # a job folder 4 folders down is in no sweep's tree (cluster.folder/sweep/c/attempt-n)
        shutil.copytree(_folders(finished_sweep / "runs" / "done")[0], folder / "a" / "b" / "c" / "attempt-1")
    elif bad == "empty":
        folder.mkdir()
    elif bad == "a file":
        folder.write_text("x")
    elif bad == "escaping link":
        folder.mkdir()
        (folder / "elsewhere").symlink_to(_folders(finished_sweep / "runs" / "done")[0])
    elif bad == "unsafe sweep name":  # a name that would lead folders and rows out of place
        job = folder / "c1" / "attempt-1"
        shutil.copytree(_folders(finished_sweep / "runs" / "done")[0], job)
        JobPaths(job).spec.write_text(json.dumps({**_read(JobPaths(job).spec), "sweep": "../../etc"}))
    url = _url(tmp_path / "ledger.sqlite")
    rc, out, err = _ingest(capsys, folder, url)
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert not out
    assert not (tmp_path / "ledger.sqlite").exists()
    what = {"missing": "does not exist", "empty": "holds no job folder", "a file": "is not a folder"}
    what |= {"escaping link": "outside", "unsafe sweep name": "is not a safe name"}
    what |= {"the filesystem's root": "is the filesystem's root", "too deep": "up to 3 folders under it"}
    assert what[bad] in err[0], err


@pytest.mark.long
def test_a_folder_that_cannot_be_read_is_skipped_with_its_reason_never_a_traceback(
    finished_sweep, tmp_path, monkeypatch, capsys
):
    """Issue 45 item 6: a link that cannot be followed (/proc/<pid>/cwd of another user's process: readlink is
    EACCES, which Path.resolve raised) and a folder that cannot be listed are each one `skipped` line with the
    reason; the readable job folder beside them is ingested. Root reads everything here, so the kernel's
    refusals are stood in for by raising them where the walk asks."""
    root = tmp_path / "runs"
    shutil.copytree(_folders(finished_sweep / "runs" / "done")[0], root / "done" / "c" / "attempt-1")
    (root / "proc").mkdir()
    (root / "proc" / "cwd").symlink_to(root / "done")
    (root / "locked").mkdir()
    real_readlink, real_scandir = os.readlink, os.scandir

    def readlink(path, *a, **kw):
        if str(path).endswith("proc/cwd"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_readlink(path, *a, **kw)

    def scandir(path="."):
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "readlink", readlink)
    monkeypatch.setattr(os, "scandir", scandir)
    rc, out, err = _ingest(capsys, root, _url(tmp_path / "ledger.sqlite"))
    assert rc == 0 and not err, err
    assert out[0].startswith("ingested 1 result(s) (1 measured, 0 failed, 0 finalists' jobs), 0 already present, 2 "), (
        out
    )
    skipped = sorted(ln for ln in out if ln.startswith("  skipped "))
    assert skipped == [
        f"  skipped {root.resolve() / 'locked'}: cannot be read (Permission denied)",
        f"  skipped {root.resolve() / 'proc' / 'cwd'}: cannot be read (Permission denied)",
    ], out


@pytest.mark.long
def test_the_ingest_hint_names_the_folder_the_sweep_ran_in(finished_sweep, tmp_path, monkeypatch, capsys):
    """Issue 45 item 6: `resume` of a sweep the ledger lacks (or on a ledger that is gone) names `ledger ingest`
    with the sweep's real job folder, not ./runs/NAME of the current folder: the folder beside the SQLite
    ledger, or another sweep's cluster.folder of that ledger; where none holds its job folders, it says so."""
    from orchestrator.config import compose
    from tests.sweeplib import new_sweep

    monkeypatch.chdir(tmp_path)  # ./runs here holds nothing
    runs = (finished_sweep / "runs").resolve()

    def hint(*args: str) -> str:
        assert main(["resume", "done", *args, "--plain"]) == 2
        (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
        return line.split("if its ledger was lost: ", 1)[1]

    gone = f"ledger.url=sqlite:///{finished_sweep}/ledger.sqlite"  # the sweep's own ledger, deleted
    assert hint(gone) == f"python -m orchestrator ledger ingest {runs / 'done'} (same ledger.url)"
    other = f"sqlite:///{tmp_path}/other.sqlite"  # a ledger that lost `done`, with a sweep of the same cluster.folder
    with Ledger.open(other, create=True) as led:
        new_sweep(led, "other", compose(["+stage=smoke", f"cluster.folder={runs}"]))
    assert hint(f"ledger.url={other}") == f"python -m orchestrator ledger ingest {runs / 'done'} (same ledger.url)"
    assert hint(f"ledger.url={other}", f"cluster.folder={runs}").startswith(
        f"python -m orchestrator ledger ingest {runs / 'done'} "
    )
    nowhere = f"ledger.url=sqlite:///{tmp_path}/none.sqlite"
    assert hint(nowhere) == (
        "python -m orchestrator ledger ingest <the cluster.folder it ran with>/done (same ledger.url; no job "
        f"folder of it in {tmp_path.resolve() / 'runs' / 'done'})"
    )


@pytest.mark.long
def test_resume_collects_a_result_on_disk_whose_attempt_row_lacks_it(tmp_path, monkeypatch, capsys):
    """The driver died after a job ended but before its result was recorded: the attempt row is still RUNNING
    without a result. `resume` re-attaches to it, reads the job's own exit marker and collects the folder
    (Driver._reconcile -> LocalLauncher._reattached_state -> Driver._ingest); nothing is launched again."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    args = sweep_args(tmp_path, "uncollected", "policy.schedule.round0_size=2", "stage.budget.max_rounds=1")
    assert main(["sweep", *args, "--plain"]) == 0
    path = tmp_path / "ledger.sqlite"
    with Ledger.open(_url(path), create=False) as led:
        victim = next(a for a in all_attempts(led, "uncollected") if led.evidence.result(a.id) is not None)
        before = len(all_attempts(led, "uncollected"))
    con = sqlite3.connect(path)  # what a kill between the job's end and its record leaves
    with con:
        for table in ("result", "step_sample", "rank_memory"):
            con.execute(f"DELETE FROM {table} WHERE attempt_id = ?", (victim.id,))
        con.execute("UPDATE attempt SET state = ?, end_time = NULL WHERE id = ?", (AttemptState.RUNNING, victim.id))
        con.execute(
            "UPDATE candidate SET status = ?, latest_result_id = NULL WHERE id = ?",
            (CandidateStatus.RUNNING, victim.candidate_id),
        )
        con.execute("UPDATE sweep SET status = 'interrupted'")
    con.close()
    assert main(["resume", "uncollected", f"ledger.url={_url(path)}", "--plain"]) == 0
    capsys.readouterr()
    with Ledger.open(_url(path), create=False) as led:
        assert led.evidence.result(victim.id) is not None
        assert len(all_attempts(led, "uncollected")) == before  # collected, not launched again
        cand = next(c for c in led.candidates("uncollected") if c.id == victim.candidate_id)
        assert cand.status == CandidateStatus.DONE


FINALISTS = (  # tests/sweep/test_finalists_killed.py's sweep, on a fast twin
    *FINALISTS_SWEEP,
    "++workload.twin.diverge_when={cp: 2}",  # round 0's CP2 finalists fail the gate against their CP1 references
)


@pytest.mark.long
def test_the_finalists_jobs_come_back_with_their_verdicts_and_resume_runs_none_again(tmp_path, monkeypatch, capsys):
    """A sweep ran to its end through the finalists (parity, a shared parity reference, long-run save and
    restore); its ledger is lost. Ingest brings every finalist job back as an attempt of its role, the verdicts
    shown are the ones the driver recorded (parity rows, the excluded candidate, the long-run figures, `best`),
    and resume launches no finalist's job again."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    assert main(["sweep", *sweep_args(tmp_path, "fin", *FINALISTS, stage="slice"), "--plain"]) == 0
    capsys.readouterr()
    before = _move_aside(tmp_path)
    assert main(["best", "--sweep", "fin", "--format", "json", f"ledger.url={before}"]) == 0
    best = json.loads(capsys.readouterr().out)["key"]
    with Ledger.open(before, create=False) as led:
        roles = sorted(a.role for a in all_attempts(led, "fin"))
    assert {AttemptRole.PARITY, AttemptRole.PARITY_REFERENCE, AttemptRole.LONG_RUN_RESTORE} <= set(roles), roles

    runs = tmp_path / "runs" / "fin"
    url = _url(tmp_path / "rebuilt.sqlite")
    rc, out, err = _ingest(capsys, runs, url)
    assert rc == 0 and not err, err
    n_fin = sum(1 for r in roles if r != AttemptRole.MEASURE)
    assert f"({len(roles) - n_fin} measured, 0 failed, {n_fin} finalists' jobs), 0 already present, 0 skipped" in out[0]
    assert any(ln.startswith("  finalists: parity ") for ln in out), out
    was, now = _verdicts(before, "fin"), _verdicts(url, "fin")
    assert now == was
    assert any(v[0] == CandidateStatus.EXCLUDED and not v[2][0][0] for v in now.values() if isinstance(v, tuple))
    assert sum(1 for v in now.values() if isinstance(v, tuple) and v[3] and v[3][0][0]) >= 1  # long-run figures
    with Ledger.open(url, create=False) as led:
        assert sorted(a.role for a in all_attempts(led, "fin")) == roles
        measures = {a.id for a in all_attempts(led, "fin") if a.measures}  # a finalist's job is no measurement
        assert {m.attempt_id for m in led.evidence.measured(sweep="fin")} <= measures
    assert main(["best", "--sweep", "fin", "--format", "json", f"ledger.url={url}"]) == 0
    assert json.loads(capsys.readouterr().out)["key"] == best

    rc, out, _ = _ingest(capsys, runs, url)  # again: nothing added
    assert rc == 0 and out[0].startswith(
        f"ingested 0 result(s) (0 measured, 0 failed, 0 finalists' jobs), {len(roles)}"
    )
    assert main(["resume", "fin", f"ledger.url={url}", "--plain"]) == 0
    capsys.readouterr()
    with Ledger.open(url, create=False) as led:  # nothing launched again, nothing measured again
        assert sorted(a.role for a in all_attempts(led, "fin")) == roles
    assert _verdicts(url, "fin") == was
