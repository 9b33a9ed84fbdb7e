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
from orchestrator.core.paths import JobPaths
from orchestrator.core.states import AttemptRole, AttemptState, CandidateStatus
from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import ROOT, all_attempts, sweep_args, wait_for

TINY = ("policy.round0_size=2", "stage.budget.max_rounds=2")


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
    """Every job that started has ended (its process is gone): the folders are final."""
    for f in _folders(runs):
        started = JobPaths(f).started
        if started.exists():
            try:
                os.kill(int(_read(started)["pid"]), 0)
            except (ProcessLookupError, PermissionError):
                continue
            return False
    return True


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
    assert out[0].startswith(f"ingested {len(on_disk)} measured result(s), 0 already present, {skipped} skipped"), out
    stored = _stored(url, "pulled")
    assert sorted(stored) == sorted(on_disk)  # every result on disk, each exactly once

    rc, out, _ = _ingest(capsys, runs, url)  # again: nothing added
    assert rc == 0 and out[0].startswith(f"ingested 0 measured result(s), {len(on_disk)} already present"), out
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
    assert out[0].startswith("ingested 1 measured result(s), 0 already present, 4 skipped"), out
    why = {ln.split(": ", 1)[0].split()[-1]: ln.split(": ", 1)[1] for ln in out[1:] if ln.startswith("  skipped ")}
    assert "no launch token" in why[cases["no-token"]]
    assert "no exit marker" in why[cases["no-exit"]]
    assert "another launch's evidence" in why[cases["other-launch"]]
    assert why[cases["partial"]].startswith("partial: ")
    assert _stored(url, "done") == [cases["intact"]]


def test_a_finalists_job_is_skipped_not_stored_as_a_measurement(finished_sweep, tmp_path, capsys):
    src = _folders(finished_sweep / "runs" / "done")[0]
    dst = tmp_path / "done" / "c" / "parity-2"
    shutil.copytree(src, dst)
    spec = _read(JobPaths(dst).spec)
    JobPaths(dst).spec.write_text(json.dumps({**spec, "role": str(AttemptRole.PARITY)}))
    rc, out, _ = _ingest(capsys, dst, _url(tmp_path / "ledger.sqlite"))
    assert rc == 0 and out[0].startswith("ingested 0 measured result(s), 0 already present, 1 skipped"), out
    assert "not its measurement" in out[1]
    assert not (tmp_path / "ledger.sqlite").exists()  # nothing to store: no ledger written


@pytest.mark.parametrize("bad", ["missing", "empty", "a file", "escaping link", "unsafe sweep name"])
def test_a_bad_folder_is_one_error_line_and_nothing_written(finished_sweep, tmp_path, capsys, bad):
    folder = tmp_path / "runs"
    if bad == "empty":
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
    assert what[bad] in err[0], err


def test_resume_collects_a_result_on_disk_whose_attempt_row_lacks_it(tmp_path, monkeypatch, capsys):
    """The driver died after a job ended but before its result was recorded: the attempt row is still RUNNING
    without a result. `resume` re-attaches to it, reads the job's own exit marker and collects the folder
    (Driver._reconcile -> LocalLauncher._reattached_state -> Driver._ingest); nothing is launched again."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    args = sweep_args(tmp_path, "uncollected", "policy.round0_size=2", "stage.budget.max_rounds=1")
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
