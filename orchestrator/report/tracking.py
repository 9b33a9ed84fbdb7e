"""Each measured run of a sweep in an experiment tracker (MLflow, Weights & Biases), where ML teams look.

Why: the engineers who pick a layout compare runs in MLflow or W&B, not in this tool. One run per measured
candidate: its layout as params (the knob registry's names, orchestrator.core.knobs), step p50/p95/p99, the
heaviest rank's peak memory, token drop, tokens/s and MFU as metrics (the metric registry's names,
orchestrator.core.metrics), its evidence bundle (orchestrator.evidence.bundle) as an artifact, and tags a
filter needs: `simulated=true` for a twin run, its fidelity, status, parity verdict, and which run `best` picks.

Idempotent: a run is found again by its tag `orchestrator.run` (a hash of `<sweep>/<candidate id>`, MLflow) or
by its run id (W&B); it is written again only when the candidate has a newer result (`orchestrator.result_id`).
The libraries are an optional extra (`pip install 'dsv4-orchestrator[track]'`); without one, `export` says so
before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.core import knobs
from orchestrator.core.errors import UserError
from orchestrator.core.metrics import STEP_P50, STEP_P99
from orchestrator.evidence import bundle as bundle_mod
from orchestrator.ledger import queries
from orchestrator.report.tensorboard import PEAK_GB

INSTALL = "pip install 'dsv4-orchestrator[track]'"
PROJECT = "dsv4-orchestrator"  # the MLflow experiment / W&B project when neither --project nor WANDB_PROJECT says
METRICS = (STEP_P50, "step_p95_s", STEP_P99, "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "token_drop_fraction")
CANDIDATE_TAG = "orchestrator.candidate"  # `<sweep>/<candidate id>`, as people read it
IDENT_TAG = "orchestrator.run"  # its hex (TrackedRun.ident): how a second MLflow export finds the run again
RESULT_TAG = "orchestrator.result_id"  # the result it carries: a newer one is written, the same one skipped
EVIDENCE = "evidence"  # the artifact folder (MLflow) / artifact type (W&B)


@dataclass(frozen=True)
class TrackedRun:
    """One measured candidate as a tracker sees it."""

    sweep: str
    candidate_id: int
    result_id: int
    round: int
    name: str  # `c<id>-<layout label>`
    params: dict[str, str | int | float]  # numbers stay numbers (W&B plots them); sets and words as text
    metrics: dict[str, float]
    tags: dict[str, str]
    bundle: dict[str, Any] = field(default_factory=dict)  # the evidence bundle (Bundle.to_dict) + its printed rows

    @property
    def key(self) -> str:
        return f"{self.sweep}/{self.candidate_id}"

    @property
    def ident(self) -> str:
        """`key` as hex: safe inside an MLflow filter whatever the sweep's name holds."""
        return hashlib.sha1(self.key.encode()).hexdigest()[:16]

    @property
    def run_id(self) -> str:
        """A W&B run id: stable per candidate, letters, digits, '-' and '_' only (`<sweep>-c<id>`, with a hash of
        the name when it had other characters, so two sweeps never share one)."""
        raw = f"{self.sweep}-c{self.candidate_id}"
        safe = re.sub(r"[^A-Za-z0-9_-]+", "_", raw)
        return safe[:64] if safe == raw else f"{safe[:40]}-{self.ident[:8]}"


@dataclass(frozen=True)
class Exported:
    sweep: str
    written: int
    unchanged: int
    where: str


def _param(value: Any) -> str | int | float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else knobs.text(value)


def parity_word(verdict: str) -> str:
    """The bundle's parity verdict (bundle.parity_verdict) as a tag value: passed, failed, not compared, not run."""
    if verdict.startswith("passed"):
        return "passed"
    if verdict.startswith("FAILED"):
        return "failed"
    return "not compared" if verdict.startswith(("not checked", "not compared")) else "not run"


def _parity_enabled(config_yaml: str) -> bool | None:
    try:
        return bool(((yaml.safe_load(config_yaml) or {}).get("parity") or {}).get("enabled"))
    except (yaml.YAMLError, AttributeError):
        return None


def runs(ledger, sweep: str) -> list[TrackedRun]:
    """Every candidate of `sweep` with a measured step p50 (its latest measurement), oldest candidate first."""
    sweeps = ledger.list_sweeps()
    row = next((s for s in sweeps if s.name == sweep), None)
    if row is None:
        known = ", ".join(s.name for s in sweeps) or "none"
        raise UserError(f"no sweep named '{sweep}' in {ledger.url}; sweeps: {known}")
    best = queries.best(ledger, sweep=sweep)
    best_id = best["candidate_id"] if best else None
    nodes = {
        r["candidate_id"]: r["node_list"]
        for r in queries.compare(ledger, sweep=sweep, columns=["candidate_id", "node_list"])
    }
    enabled = _parity_enabled(row.config_yaml)
    out = []
    for m in ledger.evidence.measured(sweep=sweep):
        if m.metrics.step_p50_s is None:
            continue
        layout = m.layout
        shown = knobs.display(layout)
        params: dict[str, str | int | float] = {k.name: _param(shown.get(k.name)) for k in knobs.DISPLAYED}
        params.update(layout=layout.short(), layer_pattern=m.layer_pattern, stage=m.stage, model=m.model)
        params["hardware"] = m.hardware
        values = {name: float(m.metrics[name]) for name in METRICS if m.metrics.get(name) is not None}
        peak = m.metrics.peak_gb
        if peak is not None:
            values[PEAK_GB] = float(peak)
        parity_rows = ledger.evidence.parity(m.candidate_id)
        hit = {"metrics": m.metrics, "simulated": m.simulated, "attempt": {"node_list": nodes.get(m.candidate_id)}}
        b = bundle_mod.of_best(hit, parity=parity_rows, provenance=row.provenance, parity_enabled=enabled)
        tags = {
            "simulated": str(bool(m.simulated)).lower(),
            "fidelity": str(m.fidelity.value),
            "status": str(m.status.value),
            "parity": parity_word(b.parity),
            "best": str(m.candidate_id == best_id).lower(),
            "partial": str(bool(m.partial)).lower(),
            "sweep": sweep,
            CANDIDATE_TAG: f"{sweep}/{m.candidate_id}",
            RESULT_TAG: str(m.result_id),
            "orchestrator.key": m.key,
        }
        label = re.sub(r"[^A-Za-z0-9=+.-]+", "_", layout.short()).strip("_")
        out.append(
            TrackedRun(
                sweep=sweep,
                candidate_id=m.candidate_id,
                result_id=m.result_id,
                round=m.round,
                name=f"c{m.candidate_id}-{label}",
                params=params,
                metrics=values,
                tags=tags,
                bundle={**b.to_dict(), "rows": dict(b.rows())},
            )
        )
    return out


@contextmanager
def _evidence_file(run: TrackedRun) -> Iterator[Path]:
    """The run's evidence bundle as `bundle.json` in a temporary folder (the trackers copy it)."""
    with tempfile.TemporaryDirectory(prefix="dsv4-evidence-") as tmp:
        path = Path(tmp) / "bundle.json"
        path.write_text(json.dumps(run.bundle, indent=1, sort_keys=True, default=str) + "\n")
        yield path


# MLflow ------------------------------------------------------------------------------------------------------


def mlflow_client() -> Any:
    """mlflow's MlflowClient class, or None without mlflow (mlflow-skinny is enough)."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        return None
    return MlflowClient


def mlflow_store(target: str) -> tuple[str, str | None]:
    """(tracking URI, artifact location for a new experiment): a URL as given (a tracking server, a database),
    a folder as a local store in it: MLflow's SQLite store (`<folder>/mlflow.db`, artifacts in
    `<folder>/artifacts`); MLflow 3 refuses its plain file store ('maintenance mode') without
    MLFLOW_ALLOW_FILE_STORE, so `file:` is used only when given as a URL."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", target) or target.startswith("databricks"):
        return target, None
    folder = Path(target).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}", (folder / "artifacts").as_uri()


def to_mlflow(tracked: Sequence[TrackedRun], target: str, experiment: str, client_class: Any = None) -> Exported:
    """Each run into the experiment `experiment` of the MLflow store `target` (a folder or a tracking URI)."""
    client_class = client_class or mlflow_client()
    if client_class is None:
        raise UserError(f"MLflow export needs mlflow: {INSTALL} (or pip install mlflow-skinny)")
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.exceptions import MlflowException

    from orchestrator.core.redact import redact

    uri, artifacts = mlflow_store(target)
    # MLflow retries an unreachable server for minutes by default; a user's own setting is kept
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    client = client_class(tracking_uri=uri)
    try:
        exp = client.get_experiment_by_name(experiment)
    except MlflowException as e:
        raise UserError(
            f"MLflow at {redact(uri)} did not answer ({redact(str(e).splitlines()[0])[:200]}): check the URL, "
            "or export to a local store: --mlflow DIR"
        ) from None
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(experiment, artifacts)
    written = unchanged = 0
    for run in tracked:
        found = client.search_runs([exp_id], f"tags.`{IDENT_TAG}` = '{run.ident}'", max_results=1)
        if found and found[0].data.tags.get(RESULT_TAG) == str(run.result_id):
            unchanged += 1
            continue
        run_id = found[0].info.run_id if found else client.create_run(exp_id, run_name=run.name).info.run_id
        now = _millis()
        client.log_batch(
            run_id,
            metrics=[Metric(k, v, now, run.round) for k, v in run.metrics.items()],
            params=[] if found else [Param(k, str(v)) for k, v in run.params.items()],
            tags=[RunTag(k, v) for k, v in {**run.tags, IDENT_TAG: run.ident}.items()],
        )
        with _evidence_file(run) as path:
            client.log_artifact(run_id, str(path), EVIDENCE)
        client.set_terminated(run_id)
        written += 1
    return Exported(tracked[0].sweep if tracked else "", written, unchanged, uri)


def _millis() -> int:
    import time

    return int(time.time() * 1000)


# Weights & Biases --------------------------------------------------------------------------------------------


def wandb_module() -> Any:
    try:
        import wandb
    except ImportError:
        return None
    return wandb


def to_wandb(tracked: Sequence[TrackedRun], project: str, root: Path | None = None) -> Exported:
    """Each run into the W&B project `project` (online, or offline under `root`/wandb with WANDB_MODE=offline,
    then `wandb sync`). The run id is the candidate's (TrackedRun.run_id), so a second export resumes it."""
    wandb = wandb_module()
    if wandb is None:
        raise UserError(f"Weights & Biases export needs wandb: {INSTALL} (or pip install wandb)")
    root = Path(root or os.environ.get("WANDB_DIR") or ".").expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    offline = os.environ.get("WANDB_MODE", "").lower() in ("offline", "dryrun")
    written = unchanged = 0
    for run in tracked:
        if _already(wandb, run, project, root, offline):
            unchanged += 1
            continue
        try:
            r = wandb.init(
                project=project,
                id=run.run_id,
                name=run.name,
                dir=str(root),
                config={**run.params, RESULT_TAG: run.result_id, CANDIDATE_TAG: run.key, **_tag_config(run)},
                tags=[f"{k}={v}" for k, v in run.tags.items() if not k.startswith("orchestrator.")],
                group=run.sweep,
                job_type="layout-measurement",
                resume="allow",
                settings=wandb.Settings(silent=True, console="off"),
            )
        except wandb.errors.UsageError as e:
            raise UserError(
                f"Weights & Biases refused the run ({str(e).splitlines()[0]}): `wandb login` or set "
                "WANDB_API_KEY, or export offline with WANDB_MODE=offline and `wandb sync` later"
            ) from None
        try:
            r.log(dict(run.metrics), step=run.round)
            r.summary.update(dict(run.metrics))
            art = wandb.Artifact(f"{EVIDENCE}-{run.run_id}", type=EVIDENCE)
            with _evidence_file(run) as path:
                art.add_file(str(path), name="bundle.json")
                r.log_artifact(art)
        finally:
            r.finish()
        written += 1
    where = str(root / "wandb") if offline else f"project {project}"
    return Exported(tracked[0].sweep if tracked else "", written, unchanged, where)


def _tag_config(run: TrackedRun) -> dict[str, str]:
    """The tags W&B filters on as config keys too (its tags are plain words)."""
    return {k: v for k, v in run.tags.items() if not k.startswith("orchestrator.")}


def _already(wandb: Any, run: TrackedRun, project: str, root: Path, offline: bool) -> bool:
    """This candidate's run already carries this result: an offline run folder of its id whose config says so,
    or the online run's config."""
    if offline:
        return any(
            str(read_offline(path).config.get(RESULT_TAG)) == str(run.result_id)
            for path in sorted((root / "wandb").glob(f"offline-run-*-{run.run_id}"))
        )
    try:
        entity = os.environ.get("WANDB_ENTITY")
        path = f"{entity}/{project}/{run.run_id}" if entity else f"{project}/{run.run_id}"
        return str(wandb.Api().run(path).config.get(RESULT_TAG)) == str(run.result_id)
    except Exception:  # noqa: BLE001 - no such run yet (or no API access): write it; resume="allow" keeps one run
        return False


@dataclass(frozen=True)
class OfflineRun:
    """What an offline W&B run folder holds (its `run-<id>.wandb` records)."""

    run_id: str
    project: str
    tags: list[str]
    config: dict[str, Any]
    summary: dict[str, Any]
    history: list[dict[str, Any]]
    artifacts: list[dict[str, Any]]  # name, type, the manifest's file paths


def _records(data: bytes) -> Iterator[bytes]:
    """The records of a `.wandb` file: a 7-byte header, then LevelDB log blocks of 32 KiB, each record chunk
    with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) (wandb's datastore format)."""
    block, pos, buf = 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if n == 0 and kind == 0:  # block padding
            pos += (block - pos % block) % block
            continue
        buf += data[pos : pos + n]
        pos += n
        if kind in (1, 4):
            yield buf
            buf = b""


def read_offline(folder: Path) -> OfflineRun:
    """An offline run folder (`wandb/offline-run-<time>-<id>`) read back with wandb's own record type."""
    from wandb.proto import wandb_internal_pb2 as pb

    path = next(Path(folder).glob("run-*.wandb"))
    run_id = project = ""
    tags: list[str] = []
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    artifacts: list[dict[str, Any]] = []
    for data in _records(path.read_bytes()):
        rec = pb.Record()  # type: ignore[attr-defined,unused-ignore]
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            run_id, project, tags = rec.run.run_id, rec.run.project, list(rec.run.tags)
            config.update({u.key: json.loads(u.value_json) for u in rec.run.config.update})
        elif kind == "config":
            config.update({u.key: json.loads(u.value_json) for u in rec.config.update})
        elif kind == "summary":
            summary.update({u.key or ".".join(u.nested_key): json.loads(u.value_json) for u in rec.summary.update})
        elif kind == "history":
            history.append({i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "artifact":
            files = [c.path for c in rec.artifact.manifest.contents]
            artifacts.append({"name": rec.artifact.name, "type": rec.artifact.type, "files": files})
    return OfflineRun(run_id, project, tags, config, summary, history, artifacts)
