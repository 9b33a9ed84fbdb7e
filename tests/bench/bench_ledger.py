"""Ledger speed on both engines: `compare` over 100k synthetic runs (goal < 300 ms, median of 5) and
the bulk insert rate of step samples through `Ledger.record_result` (one transaction per result).

The 100k rows (candidate + attempt + result each) are bulk-loaded with Core executemany, then
ANALYZEd; the timed part is exactly what `python -m orchestrator compare` runs (orchestrator.ledger.queries.compare).
PostgreSQL: a throwaway database orch_bench_<pid> on 127.0.0.1, dropped at the end.
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import insert, text

N_RUNS = 100_000
GOAL_S = 0.300
QUERIES = {
    "where ep=64, sort tokens_per_gpu, limit 20": dict(where=["ep=64"], sort="tokens_per_gpu", limit=20),
    "sort step_p50_s, limit 50": dict(sort="step_p50_s", limit=50),
    "stage=1k, tokens_per_gpu>=1000 recompute=moe_act, sort mfu": dict(
        stage="1k", where=["tokens_per_gpu>=1000", "recompute=moe_act"], sort="mfu", limit=20
    ),
}
RESULTS, SAMPLES = 20, 2000  # step-sample insert: 20 results x 2000 iterations


def load_synthetic(led, n: int = N_RUNS, seed: int = 0) -> None:
    """n candidates, each with one attempt and one result, in one sweep (explicit ids, pointers set)."""
    from orchestrator.ledger import models as m

    rng = random.Random(seed)
    now = datetime.now(UTC)
    with led.engine.begin() as conn:
        conn.execute(
            insert(m.Sweep),
            [
                dict(
                    id=1,
                    name="bench",
                    stage="1k",
                    model="dsv4_pro",
                    hardware="h100",
                    workload="twin",
                    config_yaml="",
                    status="done",
                    provenance={},
                    created_at=now,
                    updated_at=now,
                )
            ],
        )
        cands, atts, ress = [], [], []
        for i in range(1, n + 1):
            ep, pp = rng.choice((8, 16, 32, 64, 128)), rng.choice((4, 8, 16))
            step = rng.uniform(5, 40)
            cands.append(
                dict(
                    id=i,
                    sweep_id=1,
                    key=f"{i:032x}",
                    tp=1,
                    pp=pp,
                    vpp=rng.choice((1, 2)),
                    cp=rng.choice((1, 2)),
                    ep=ep,
                    etp=1,
                    mbs=rng.choice((1, 2)),
                    recompute=rng.choice(("none", "moe_act", "mla_up_proj+mhc")),
                    offload="none",
                    dispatcher="alltoall",
                    use_tp_pp_dp_mapping=False,
                    layer_pattern="",
                    layout={},
                    predicted={},
                    pred_step_time_s=step * 0.8,
                    verdict="legal",
                    round=i % 6,
                    status="done",
                    latest_attempt_id=i,
                    latest_result_id=i,
                    created_at=now,
                    updated_at=now,
                )
            )
            atts.append(
                dict(
                    id=i,
                    candidate_id=i,
                    attempt_no=1,
                    job_id=str(1000 + i),
                    job_dir="/runs",
                    state="COMPLETED",
                    log_paths=[],
                    sidecar_paths=[],
                    simulated=True,
                    created_at=now,
                    updated_at=now,
                )
            )
            ress.append(
                dict(
                    id=i,
                    attempt_id=i,
                    candidate_id=i,
                    simulated=True,
                    step_p50_s=step,
                    step_p99_s=step * 1.1,
                    tokens_per_s_per_gpu=4096 * 8192 / step / 1024,
                    mfu=rng.uniform(0.1, 0.5),
                    peak_allocated_gb=rng.uniform(40, 80),
                    peak_reserved_gb=rng.uniform(45, 85),
                    token_drop_fraction=0.0,
                    timers_ms={},
                    versions={},
                    created_at=now,
                )
            )
        for model, rows in ((m.Candidate, cands), (m.Attempt, atts), (m.Result, ress)):
            for i in range(0, len(rows), 10_000):
                conn.execute(insert(model.__table__), rows[i : i + 10_000])
        if led.dialect == "postgresql":  # explicit ids: move the sequences past them
            for table in ("sweep", "candidate", "attempt", "result"):
                conn.execute(
                    text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
                )
    with led.engine.connect() as conn:
        conn.execute(text("ANALYZE"))
        conn.commit()


def time_compare(led) -> dict:
    from orchestrator.ledger import queries

    out = {}
    for name, kw in QUERIES.items():
        queries.compare(led, **kw)  # warm caches
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            rows = queries.compare(led, **kw)
            times.append(time.perf_counter() - t0)
        assert rows, name
        out[name] = statistics.median(times)
    return out


def sample_rate(led) -> float:
    """Step samples per second stored by record_result (with their result row and rank memory)."""
    from orchestrator.core.result import JobResult

    cand = led.add_candidates("bench", [_candidate_in(i) for i in range(RESULTS)])
    atts = [led.new_attempt(c.id, job_dir="/runs", simulated=True) for c in cand]
    res = JobResult(
        ok=True,
        simulated=True,
        step_times_s=[1.0] * SAMPLES,
        lm_loss=[2.0] * SAMPLES,
        grad_norm=[1.0] * SAMPLES,
        step_p50_s=1.0,
    ).to_dict()
    t0 = time.perf_counter()
    for a in atts:
        led.evidence.record_result(a.id, res)
    return RESULTS * SAMPLES / (time.perf_counter() - t0)


def _candidate_in(i: int):
    from orchestrator.ledger.ledger import CandidateIn

    return CandidateIn(key=f"sample-{i}", layout={"ep": 64})


def bench_engine(url: str) -> tuple[dict, float]:
    from orchestrator.ledger.ledger import Ledger

    with Ledger.open(url) as led:
        t0 = time.perf_counter()
        load_synthetic(led)
        print(f"   loaded {N_RUNS:,} runs in {time.perf_counter() - t0:.1f} s", flush=True)
        return time_compare(led), sample_rate(led)


def _postgres():
    """(url, cleanup) of a throwaway database, or (None, reason)."""
    try:
        import psycopg

        admin = psycopg.connect(
            "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=5", autocommit=True
        )
    except Exception as exc:  # noqa: BLE001
        return None, f"PostgreSQL unreachable: {exc}"
    name = f"orch_bench_{os.getpid()}"
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.execute(f'CREATE DATABASE "{name}"')

    def cleanup():
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()

    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", cleanup


def main() -> bool:
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        engines = [("sqlite", f"sqlite:///{Path(tmp) / 'bench.sqlite'}", None)]
        pg_url, pg_cleanup = _postgres()
        if pg_url is None:
            print(f"   postgresql: skipped ({pg_cleanup})")
            ok = not os.environ.get("CI")
        else:
            engines.append(("postgresql", pg_url, pg_cleanup))
        for name, url, cleanup in engines:
            print(f"   {name}:", flush=True)
            try:
                times, rate = bench_engine(url)
            finally:
                if cleanup:
                    cleanup()
            for q, t in times.items():
                met = t < GOAL_S
                ok &= met
                print(
                    f"     compare [{q}]: {t * 1000:.0f} ms "
                    f"(goal < {GOAL_S * 1000:.0f} ms: {'met' if met else 'MISSED'})"
                )
            print(f"     step samples via record_result: {rate:,.0f} samples/s ({RESULTS} x {SAMPLES})")
    return ok


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)
