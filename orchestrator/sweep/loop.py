"""The sweep loop: plan -> select within budget -> submit -> poll -> ingest -> decide, until done; then the
finalists (parity gate, long-run window).

Every job is an attempt, and every attempt (a measurement at its fidelity, a finalist's parity or long-run
job) goes out through ONE launch path, `Driver._launch`. Every decision reads the ledger (never memory
carried from a previous process), and every side effect is written to the ledger right around it: an
attempt is stored as a launch intent (its token is the Slurm job name) before sbatch, its job id as soon as
sbatch returns, before anything waits on it; a result is recorded (idempotently, per attempt) before the
candidate's status moves or a finalist's verdict is drawn from it. So `kill -9` at any point, then `resume`
(which adopts a launched intent by its token), loses no result and submits nothing twice. The lease is
renewed by a thread (orchestrator.ledger.leases.LeaseKeeper), so no wait here can lose it.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import history
from orchestrator.core.errors import Interrupted, UserError
from orchestrator.core.failures import Failure
from orchestrator.core.paths import JobPaths, folder_writes
from orchestrator.core.schema import RootConfig
from orchestrator.core.states import AttemptRole, AttemptState, CandidateStatus, EventKind, Fidelity, SweepStatus
from orchestrator.ledger.errors import LedgerStopped
from orchestrator.ledger.leases import LeaseKeeper, holder_id
from orchestrator.ledger.ledger import AttemptRow, CandidateRow, Ledger, SweepRow
from orchestrator.schedule import Schedule
from orchestrator.search import make_policy
from orchestrator.search.env import PlanEnv
from orchestrator.sweep import cutoff
from orchestrator.sweep.decide import next_round
from orchestrator.sweep.faults import fault_point
from orchestrator.sweep.launches import Launch, planned_from_row
from orchestrator.sweep.retry import retry_attempts
from orchestrator.sweep.view import Snapshot, View

if TYPE_CHECKING:
    from orchestrator.sweep.finalists import Finalists


@dataclass
class Options:
    retry: set[str] = field(default_factory=set)  # extra failure classes to retry (--retry oom)
    max_wall_s: float | None = None  # stop driving (not the jobs) after this long: tests, demos
    skip_preflight: bool = False  # real workloads: launch without preflight (recorded in the ledger)


@dataclass
class Outcome:
    sweep: str
    reason: str  # why the loop stopped
    rounds: int
    best: dict | None
    spent: history.Spent


class Driver:
    """Drives one sweep while holding its lease."""

    def __init__(
        self, ledger: Ledger, cfg: RootConfig, sweep: SweepRow, launcher, view: View, options: Options | None = None
    ):
        self.ledger, self.cfg, self.sweep, self.launcher, self.view = ledger, cfg, sweep, launcher, view
        self.opts = options or Options()
        self.name = sweep.name
        self.holder = holder_id()
        self.policy = make_policy(cfg.policy)  # the searcher: which layouts
        self.schedule = Schedule(cfg.policy)  # the rungs: at which fidelity, how many per round
        self.stage = cfg.required_stage()
        self.env = PlanEnv(cfg.model, cfg.hardware, self.stage, cfg.workload.name, cfg.workload.recipe)
        self.poll_s = float(cfg.cluster.poll_interval_s)
        self.ttl = float(cfg.ledger.lease_ttl_s)
        self._t0 = time.monotonic()
        self.stats = {"polls": 0, "sleep_s": 0.0, "submitted": 0}  # for `make bench`: control-plane time
        self._dirty = True  # something changed since the view was last drawn
        self._unfit: list[tuple[int, str]] = []  # (round, layout) of the probes that did not fit, said per round
        self._uncut: set[int] = set()  # attempts the early cut no longer reads (past their line, or no line)
        self._cut_sent: set[int] = set()  # attempts this driver cut (their event logged)
        self.finalists: Finalists | None = None  # set once the search has stopped (see _finalists)

    # ---- lease ------------------------------------------------------------------------------------
    def run(self) -> Outcome:
        self._take_lease()
        self.keeper = LeaseKeeper(self.ledger.store, self.name, self.holder, self.ttl).start()
        reachable = True
        try:
            self.ledger.set_sweep_status(self.name, SweepStatus.RUNNING)
            self.ledger.log_event(
                self.name, EventKind.DRIVER, f"{self.holder} drives the sweep on {self.launcher.kind}"
            )
            reason = self._drive()
            self.ledger.log_event(self.name, EventKind.STOP, reason)
            final = (
                SweepStatus.INTERRUPTED
                if reason.startswith("wall")
                else SweepStatus.CANCELLED
                if reason.startswith("cancel")
                else SweepStatus.DONE
            )
            self.ledger.set_sweep_status(self.name, final)
            return self._outcome(reason)
        except BaseException as exc:  # a signal or an error: jobs keep running, `resume NAME` continues
            # A ledger out of reach (locked past its wait, its connection lost) would make each write below wait
            # out its timeout again before the line that names the cause; `resume` takes the lease back anyway.
            reachable = not isinstance(exc, LedgerStopped)
            why = f"driver stopped: {exc.name if isinstance(exc, Interrupted) else type(exc).__name__}"
            if reachable:
                self._safely(lambda: self.ledger.log_event(self.name, EventKind.STOP, why))
            if reachable and self.keeper.lost is None:  # a lost lease: the sweep's status is its new driver's
                self._safely(lambda: self.ledger.set_sweep_status(self.name, SweepStatus.INTERRUPTED))
            raise
        finally:
            self.keeper.stop()
            if reachable and self.keeper.lost is None:
                self._safely(lambda: self.ledger.leases.release_lease(self.name, self.holder))

    @staticmethod
    def _safely(fn) -> None:
        """Best-effort bookkeeping on the way out; the original error is what the user must see."""
        try:
            fn()
        except Exception:  # noqa: BLE001
            pass

    def _take_lease(self) -> None:
        """Take the sweep's lease. A live holder is refused (LeaseHeld names it); a holder that is a dead
        process on this host (an orchestrator killed with -9) is taken over at once (orchestrator.ledger.leases)."""
        self.ledger.leases.acquire_lease(self.name, self.holder, self.ttl)

    def _heartbeat(self) -> None:
        """The keeper thread renews the lease; the loop only learns here that another holder took it."""
        keeper = getattr(self, "keeper", None)
        if keeper is not None:
            keeper.check()

    # ---- the loop ---------------------------------------------------------------------------------
    def _drive(self) -> str:
        self._reconcile()
        while True:
            self._submit_planned()
            stopped = self._wait()
            self._say_unfit()
            if stopped:
                return stopped
            if self._cancelled():  # `cancel` ran as the round ended: decide no round after it
                self._cancel_own_jobs()
                return "cancelled (orchestrator cancel)"
            reason = self._decide()
            if reason:
                return self._finalists() or reason

    def _finalists(self) -> str | None:
        """Once the search stops: the correctness gate and the long-run window for the top measured candidates.
        Their jobs are attempts like any other (orchestrator/sweep/finalists.py says which are still needed and
        records the verdicts): `_submit_planned` launches them through the one launch path and `_wait` polls,
        collects and retries them. Returns why the driving stopped early (wall limit, cancel), else None."""
        if not (self.cfg.parity.enabled or self.cfg.effective.long_run):
            return None
        from orchestrator.sweep.finalists import Finalists

        parts = [
            w
            for w, on in (("parity gate", self.cfg.parity.enabled), ("long-run window", self.cfg.effective.long_run))
            if on
        ]
        self.view.event("finalists: " + " + ".join(parts))
        from orchestrator.history import effective_config

        cfg = effective_config(self.ledger, self.cfg, self.name)  # the GPUs' measured capacity, not the config's
        self.finalists = Finalists(cfg, self.ledger, self.name, self._retry)
        self._submit_planned()
        return self._wait()  # returns None once nothing is launched or live: every verdict recorded

    def _cancelled(self) -> bool:
        sweep = self.ledger.get_sweep(self.name)
        return sweep is not None and sweep.status == SweepStatus.CANCELLED

    def _cancel_own_jobs(self) -> None:
        """`cancel NAME` ran in another process: stop the jobs this process started or re-attached (`cancel`
        leaves a live driver's local jobs to it; on Slurm a second scancel is harmless), and every job still live:
        one this process launched while the cancel ran (a round it decided meanwhile) would otherwise run on unseen."""
        live = [a for a in self.ledger.live_attempts(self.name) if a.job_id]
        ids = [
            str(a.job_id)
            for c in self._cands()
            if c.status == CandidateStatus.CANCELLED
            for a in self.ledger.attempts(c.id)
            if a.job_id and a.end_time is None
        ]
        ids = list(dict.fromkeys([*ids, *(str(a.job_id) for a in live)]))
        if ids:
            self.launcher.cancel(ids)
            self.view.event(f"sweep cancelled: stopped {len(ids)} job(s)")
        why = "cancelled by `orchestrator cancel`"
        for a in live:
            self.ledger.update_attempt(
                a.id, state=AttemptState.CANCELLED, failure_class=Failure.CANCELLED, failure_detail=why
            )
        for c in self.ledger.candidates(self.name, status=CandidateStatus.LIVE):
            self.ledger.set_candidate_status(c.id, CandidateStatus.CANCELLED, why)

    def _cands(self) -> list[CandidateRow]:
        return self.ledger.candidates(self.name)

    def _reconcile(self) -> None:
        """After a restart: re-attach to live jobs by stored id, settle attempts that ended while nobody
        watched, release claims that never reached the cluster."""
        from orchestrator.launch import Submitted

        self._adopt()
        live = self.ledger.live_attempts(self.name)
        self.launcher.attach(
            [Submitted(job_id=a.job_id, array_index=a.array_index, folder=a.job_dir) for a in live if a.job_id]
        )
        for c in self._cands():
            if c.status not in CandidateStatus.IN_FLIGHT:
                continue
            atts = self.ledger.attempts(c.id)
            last = atts[-1] if atts else None
            if c.status == CandidateStatus.CLAIMED and (last is None or last.terminal or last.job_id is None):
                # claimed, then killed before sbatch returned: nothing of this claim is on the cluster
                self.ledger.set_candidate_status(c.id, CandidateStatus.PLANNED, "orphan claim released on resume")
            elif last is not None and last.terminal:
                self._settle(c, last)
            elif last is not None:
                self.view.event(f"re-attached to job {last.job_id} ({c.layout.short()})")

    def _adopt(self) -> None:
        """Launch intents without a job id (killed, or the record failed, between sbatch and the record): ask
        the cluster for their tokens in one query; adopt a job it knows, release the candidate of a launch
        that never ran or was cancelled (a new attempt, in a new folder, goes out instead)."""
        intents = [a for a in self.ledger.live_attempts(self.name) if a.job_id is None and a.launch_token]
        if not intents:
            return
        from orchestrator.launch import LaunchError

        since = min(a.created_at for a in intents)
        try:
            found = self.launcher.find([(a.launch_token, a.array_index, a.job_dir) for a in intents], since)
        except LaunchError as exc:  # "absent" is a verdict only from a cluster that answered
            raise UserError(
                f"{len(intents)} launch(es) of sweep {self.name} have no stored job id and the cluster cannot say "
                f"whether they run ({exc}); resume again once {self.launcher.kind} answers"
            ) from None
        for a in intents:
            job = found.get((a.launch_token or "", a.array_index))
            if job is not None and job.state != AttemptState.CANCELLED:
                self.ledger.launched([(a.id, job.job_id, a.array_index)], "job {job_id} adopted on resume")
                self.view.event(f"adopted job {job.job_id} (launched, its id never recorded)")
                continue
            why = f"job {job.job_id} was cancelled before its id was recorded" if job else "no job reached the cluster"
            self.ledger.update_attempt(a.id, state=AttemptState.CANCELLED, failure_detail=f"launch aborted: {why}")
            if a.measures:  # a finalist's job is asked for again by the finalists' next step
                self.ledger.set_candidate_status(a.candidate_id, CandidateStatus.PLANNED, f"launch aborted ({why})")
            self.view.event(f"launch intent {a.launch_token} released: {why}")

    def _submit_planned(self) -> int:
        """Claim every planned candidate (their measurements at the fidelity their decision names) and, once the
        search has stopped, the finalists' jobs still needed; launch them all through `_launch`."""
        from orchestrator.runspec import attempt_dir, build_spec, warm_start_flags
        from orchestrator.schedule.fidelity import decision_window
        from orchestrator.sweep import seeding

        launches: list[Launch] = []
        wait = seeding.waiting(self.ledger, self.sweep, self.stage)  # the seed first (warm start)
        for c in self.ledger.claim_for_submission(self.name, 10_000, self.holder, skip=wait):
            atts = self.ledger.attempts(c.id)
            # numbered over every role, after the highest stored number (a ledger rebuilt by `ledger ingest`
            # may lack a failed attempt whose folder is still on disk)
            attempt = max((x.attempt_no for x in self.ledger.attempts(c.id, roles=None)), default=0) + 1
            # A retry after NODE_FAIL keeps off the node(s) it failed on ("retried on healthy nodes").
            failed = [x for x in atts if not x.aborted]
            exclude = (failed[-1].node_list or "") if failed and failed[-1].failure_class == Failure.NODE_FAIL else ""
            folder = attempt_dir(self.cfg, self.name, c.key, attempt, number=c.id, layout=c.layout)
            fid, win = decision_window(self.stage, c.decision)  # screen, probe or the stage's full window
            spec = build_spec(
                self.cfg,
                planned_from_row(c),
                sweep=self.name,
                attempt=attempt,
                job_dir=folder,
                window=win,
                fidelity=fid,
                probe_ranks=c.decision.probed_ranks() if fid == Fidelity.PROBE else (),
                # the seed's save, or the load of it (stage.warm_start); a probe's decision carries neither
                extra_argv=warm_start_flags(c.decision, folder, sum(win)) if fid != Fidelity.PROBE else (),
            )
            spec.round, spec.decision = c.round, c.decision.to_dict() if c.decision.stored else None
            launches.append(Launch(c.id, spec, exclude))
        if self.finalists is not None:
            step = self.finalists.step()
            for note in step.notes:
                self.view.event(note)
            self._dirty = self._dirty or bool(step.notes)
            launches += step.launches
        return self._launch(launches)

    def _launch(self, launches: Sequence[Launch]) -> int:
        """THE launch path of every attempt (measure, screen, probe, parity, long-run): submit them as arrays.
        Crash-consistent: each attempt is first written as an intent whose token names the Slurm job (`_adopt`
        finds it after a kill), and each job id is stored the moment its array exists; a record that fails
        cancels every job of the call."""
        from orchestrator.runspec import launch_task

        if not launches:
            return 0
        resume = f"python -m orchestrator resume {self.name}"
        tasks = [launch_task(self.cfg, x.spec, exclude=x.exclude) for x in launches]
        self.launcher.check_fits(tasks)  # a job the partition can never run: refused before any intent
        bound = self.ledger.bind_launcher(self.name, self.launcher.kind)  # once a job launches, never before
        if bound != self.launcher.kind:  # bound_launcher refused it already; a second driver's binding
            raise UserError(f"sweep '{self.name}' runs its jobs on {bound}, not {self.launcher.kind}: resume it")
        groups = self.launcher.arrays(tasks)
        for group in groups:  # each array's token goes into its tasks and their job.json (`ledger ingest` reads it)
            token = f"{self.name}.{secrets.token_hex(4)}"
            for i in group:
                tasks[i].token = launches[i].spec.launch_token = token
        keys = {c.id: c.key for c in self._cands()}
        for x in launches:
            x.spec.sweep_config, x.spec.owner_key = self.sweep.config_yaml, keys.get(x.candidate_id, "")
            with folder_writes(x.spec.job_dir, resume):
                x.spec.save(JobPaths(x.spec.job_dir).spec)
        intents: list[AttemptRow] = [None] * len(tasks)  # type: ignore[list-item]  # every slot is filled below
        for group in groups:
            token = tasks[group[0]].token
            for i, index in zip(group, self.launcher.array_indexes(tasks, group)):  # a rank probe: its first task's
                intents[i] = self.ledger.new_attempt(
                    launches[i].candidate_id,
                    array_index=index,
                    job_dir=tasks[i].folder,
                    simulated=self.cfg.workload.simulated,
                    launch_token=token,
                    fidelity=launches[i].spec.fidelity,
                    role=launches[i].spec.role,
                )
        # tests inject a crash between the intents and sbatch, or sbatch and the record (`finalists-` for a call
        # that launches a finalist's job: it comes after the search's launches)
        where = "" if all(x.spec.role == AttemptRole.MEASURE for x in launches) else "finalists-"
        fault_point(f"{where}intent")

        said = [0]

        def record(pairs) -> None:  # called as each array exists: its job ids into the ledger before any waiting
            fault_point(f"{where}record")
            self.ledger.launched([(intents[i].id, str(sub.job_id), sub.array_index) for i, sub in pairs])
            said[0] += len(pairs)  # said as they exist: local jobs run (and end) while submit() waits for a slot
            ids = ", ".join(str(sub.job_id) for _, sub in pairs[:8]) + (" ..." if len(pairs) > 8 else "")
            self.view.event(f"submitted {len(pairs)} job(s): {ids} ({said[0]}/{len(tasks)} of this call)")
            if getattr(self.launcher, "starts_on_submit", False):  # local jobs run (and end) while submit() waits
                self._poll(self.ledger.live_attempts(self.name))
                self._show()

        with folder_writes(self.cfg.cluster.folder, resume):
            subs = self.launcher.submit(tasks, on_submitted=record)  # Slurm: one array, one sbatch
        self.stats["submitted"] += len(subs)
        self._dirty = True
        if said[0] < len(subs):  # a launcher that told no submission as it went
            ids = ", ".join(str(s.job_id) for s in subs[said[0] :][:8]) + (" ..." if len(subs) - said[0] > 8 else "")
            self.view.event(f"submitted {len(subs) - said[0]} job(s): {ids}")
        return len(subs)

    def _wait(self) -> str | None:
        """Poll (one launcher.poll for every live job) and ingest until nothing of this round is live."""
        while True:
            self._heartbeat()
            if self._cancelled():
                self._cancel_own_jobs()
                return "cancelled (orchestrator cancel)"
            live = self.ledger.live_attempts(self.name)
            if live:
                self._poll(live)
            if self._submit_planned():  # retries go out as soon as they are decided
                continue
            self._show()
            if not self.ledger.live_attempts(self.name):
                return None
            if self.opts.max_wall_s is not None and time.monotonic() - self._t0 > self.opts.max_wall_s:
                return f"wall limit {self.opts.max_wall_s:.0f}s reached; jobs left running, resume to continue"
            time.sleep(self.poll_s)
            self.stats["sleep_s"] += self.poll_s

    def _poll(self, live: Sequence[AttemptRow]) -> None:
        states = self.launcher.poll([a.job_id for a in live if a.job_id])
        self.stats["polls"] += 1
        cands = {c.id: c for c in self._cands()}  # one read per poll, not one per job
        # the early cut's running line (cutoff.check): the best read once a poll, while a launch may still be cut
        cuttable = any(a.measures and a.id not in self._uncut for a in live)
        best_s = history.best_step_s(self.ledger, self.name) if cuttable else None
        for a in live:
            st = states.get(a.job_id) if a.job_id else None
            if st is None:
                continue
            changes = {}
            if st.state and st.state != a.state and not st.terminal:
                changes["state"] = st.state
            for attr, col in (("start", "start_time"), ("end", "end_time"), ("node_list", "node_list")):
                v = getattr(st, attr, None)
                if v and (getattr(a, col) is None or (col == "node_list" and v != a.node_list)):
                    changes[col] = v  # the node: the latest run's (a requeued job moves), as sacct lists it
            if changes:
                a = self.ledger.update_attempt(a.id, **changes)
                self._dirty = True
            if st.terminal:
                self._ingest(a, st, cands[a.candidate_id])
            elif st.state == AttemptState.RUNNING and a.measures:
                c = cands[a.candidate_id]
                if c.status == CandidateStatus.SUBMITTED:
                    self.ledger.set_candidate_status(
                        c.id, CandidateStatus.RUNNING, f"job {a.job_id} on {st.node_list or '?'}"
                    )
                self._cut(a, c, best_s)

    def _cut(self, a: AttemptRow, c: CandidateRow, best_s: float | None) -> None:
        """The early cut (sweep/cutoff.py): stop a running launch whose first iterations are over its line (as the
        sweep's best full-window p50 `best_s` lowers it)."""
        if a.id in self._uncut:
            return
        found = cutoff.check(a, c, self.stage, best_s)
        if found is None or found.done:
            self._uncut.add(a.id)
            return
        if found.median_s is None:
            return
        # Marked already: by this driver at an earlier poll (the job still runs: a scancel that did not take is
        # sent again, a second one is harmless) or by a driver that died before its cancel.
        if found.mark is not None:
            mark = found.mark
        else:
            mark = cutoff.mark(a, found)
            fault_point("cut-marked")
        self.launcher.cancel([str(a.job_id)])
        if a.id in self._cut_sent:
            return
        self._cut_sent.add(a.id)
        why = cutoff.log(
            self.ledger, self.name, c.id, a.job_id, mark, how="marked before a restart" if found.marked else ""
        )
        self.view.event(f"job {a.job_id} {why} ({c.layout.short()})")

    def _ingest(self, a: AttemptRow, st, c: CandidateRow) -> None:
        """Collect the job folder into a JobResult, store it (idempotent per attempt), settle the candidate."""
        from orchestrator.evidence.collect import collect

        lost = bool(st.reason and "lost" in st.reason)  # re-attached, outcome unknown: the folder decides
        if a.measures:  # a cut launch: the screen of what it ran, before its result is stored
            a = cutoff.settle(self.ledger, a)
        res = collect(
            Path(a.job_dir), slurm_state=None if lost else st.state, exit_code=None if lost else st.exit_code, lost=lost
        )
        self.ledger.evidence.record_result(a.id, res.to_dict())
        self._dirty = True
        if not a.measures:  # a finalist's job: its verdict is the finalists' next step (retries too)
            what = "done" if res.ok else f"{res.failure_class or a.state}"
            self.view.event(f"{a.role} job {a.job_id} {what} ({c.layout.short()})")
            return
        atts = self.ledger.attempts(a.candidate_id)
        self._settle(c, next(x for x in atts if x.id == a.id), atts)

    def _settle(self, c: CandidateRow, a: AttemptRow, atts: list[AttemptRow] | None = None) -> None:
        """A terminal attempt decides its candidate: done, retried (new attempt later) or failed."""
        lay = c.layout.short()
        if self.ledger.evidence.result(a.id) is not None:
            self.ledger.set_candidate_status(c.id, CandidateStatus.DONE, f"job {a.job_id} measured")
            return
        fc = a.failure_class or a.state
        retry, why = self._retry(fc, atts if atts is not None else self.ledger.attempts(c.id))
        if retry:
            self.ledger.set_candidate_status(c.id, CandidateStatus.PLANNED, f"retry after {fc} ({why})")
            self.ledger.log_event(
                self.name,
                EventKind.RETRY,
                f"{fc}: resubmitting {lay}",
                candidate_id=c.id,
                data={"job_id": a.job_id, "failure_class": fc},
            )
            self.view.event(f"job {a.job_id} {fc}: retrying ({why})")
        elif fc == Failure.OOM and a.fidelity == Fidelity.PROBE:  # a fit probe's answer, not a failure
            self.ledger.set_candidate_status(
                c.id, CandidateStatus.FAILED, f"{fc}: does not fit (probe, job {a.job_id})"
            )
            self._unfit.append((c.round, lay))
        else:
            status = CandidateStatus.CANCELLED if fc == Failure.CANCELLED else CandidateStatus.FAILED
            self.ledger.set_candidate_status(c.id, status, f"{fc}: {why}")
            self.view.event(f"job {a.job_id} {fc}: not retried ({why}) {lay}")

    def _say_unfit(self) -> None:
        """One line per round for its probes that ran out of memory (issue 49 item 6: one OOM line per attempt,
        each under its fit probe's "predicted ... GB, HBM within the model's error band", read as failures): a
        probe that does not fit is the answer it was launched for. Each is in the ledger (`status NAME`)."""
        for rnd in sorted({r for r, _ in self._unfit}):
            lays = [lay for r, lay in self._unfit if r == rnd]
            more = f" and {len(lays) - 2} more" if len(lays) > 2 else ""
            self.view.event(f"round {rnd}: {len(lays)} layout(s) do not fit (probe): {'; '.join(lays[:2])}{more}")
        self._unfit.clear()

    def _retry(self, fc: str, atts: list[AttemptRow]) -> tuple:
        return retry_attempts(fc, atts, self.cfg.policy, asked=self.opts.retry)

    # ---- deciding the next round ------------------------------------------------------------------
    def _decide(self) -> str | None:
        return next_round(self.ledger, self.cfg, self.sweep, self.policy, self.env, self.view, self.schedule)

    # ---- output -----------------------------------------------------------------------------------
    def _show(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        cands = self._cands()
        spent = history.spent(self.ledger, self.name, stage=self.stage)
        self.view.update(
            Snapshot(
                sweep=self.name,
                round=self._round(cands),
                counts=history.status_counts(cands),
                best=history.best_of(self.ledger, self.name),
                gpu_hours=spent.gpu_hours,
                simulated=spent.simulated,
            )
        )

    def _round(self, cands: Sequence[CandidateRow]) -> int:
        """The round under way: the latest round event's (a round of confirms alone adds no candidate, so the
        newest candidate's round said "round 0" while round 1 ran: issue 49 item 6)."""
        newest = max((c.round for c in cands), default=0)
        said = self.ledger.events(self.name, kind=EventKind.ROUND)
        if not said:
            return newest
        data, words = said[-1].data or {}, said[-1].message.split(":", 1)[0].split()
        last = data.get("round", int(words[1]) if len(words) == 2 and words[1].isdigit() else newest)
        return max(newest, int(last))

    def _outcome(self, reason: str) -> Outcome:
        cands = self._cands()
        return Outcome(
            sweep=self.name,
            reason=reason,
            rounds=max((c.round for c in cands), default=-1) + 1,
            best=history.best_of(self.ledger, self.name),
            spent=history.spent(self.ledger, self.name, stage=self.stage),
        )
