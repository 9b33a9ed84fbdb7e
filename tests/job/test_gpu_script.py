"""The CPU-checkable parts of the GPU checks: tests/gpu/run.sh (its shell syntax, the marker's skip on a machine
without CUDA, the exact command it runs composing and planning here), and the two-tier device script
tests/gpu/device.sh run dry (DEVICE_DRY=1) end to end on CPU: its carry checks, tier A's steps, tier B's calls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.commands.plan import megatron_flags
from orchestrator.config import compose
from orchestrator.plan import planner
from tests.gpu.test_megatron_gpu import STAGE, TOPK, run_one_command

ROOT = Path(__file__).resolve().parents[2]


def test_run_sh_is_valid_bash_and_refuses_without_a_checkout(tmp_path):
    script = ROOT / "tests" / "gpu" / "run.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = {"PATH": "/usr/bin:/bin", "MEGATRON_LM": str(tmp_path)}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "error: no pretrain_hybrid.py" in proc.stderr


@pytest.mark.long
def test_gpu_tests_skip_without_cuda():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/gpu", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "1 skipped" in proc.stdout and "needs a CUDA GPU" in proc.stdout


def test_the_gpu_command_composes_and_plans_one_candidate(tmp_path):
    cmd = run_one_command(tmp_path / "megatron-lm", tmp_path / "runs")
    overrides = [a for a in cmd if "=" in a]
    cfg = compose(overrides, require_stage=True).cfg
    assert cfg.stage.name == STAGE and cfg.stage.gpus == 1 and cfg.workload.in_process
    assert cfg.workload.command[-1] == str(tmp_path / "megatron-lm" / "pretrain_hybrid.py")
    kept = planner.plan(cfg.model, cfg.hardware, cfg.stage, workload=cfg.workload.name).candidates
    assert kept, "the one-GPU stage must keep a candidate"
    argv = megatron_flags(cfg, cfg.stage, kept[0])
    value = {a: b for a, b in zip(argv, [*argv[1:], ""])}
    assert value["--tensor-model-parallel-size"] == value["--expert-model-parallel-size"] == "1"
    assert value["--moe-router-topk"] == str(TOPK) and "--mock-data" in argv


# ---- tests/gpu/device.sh + device_checks.py: the one-shot run on a lent GPU machine without TE or network ----

DEVICE_SH = ROOT / "tests" / "gpu" / "device.sh"
CHECKS = ROOT / "tests" / "gpu" / "device_checks.py"


def _checks(*args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECKS), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_device_sh_is_valid_bash_and_names_every_step_file():
    assert subprocess.run(["bash", "-n", str(DEVICE_SH)]).returncode == 0
    text = DEVICE_SH.read_text()
    # The files that come back: every JSON the summary reads is written under $OUT.
    for name in ("imports.json", "argv.json", "gemm.json", "moe.json", "gpt.json", "te.json", "run_one.json"):
        assert f'"$OUT/{name}"' in text, name
    for name in ("job_tail.log", "summary.json"):
        assert f'"$OUT/{name}"' in text, name


def test_summary_reads_every_step_and_reports_failures(tmp_path):
    steps = tmp_path / "steps.tsv"
    steps.write_text("install\t0\t2\nrun-one\t1\t10\n")
    (tmp_path / "imports.json").write_text(json.dumps({"missing_required": [], "v4_backend_te_available": False}))
    (tmp_path / "run_one.json").write_text(json.dumps({"ok": False, "failure_class": "CRASH", "failure_detail": "x"}))
    (tmp_path / "gemm.json").write_text(json.dumps({"device": "d", "rows": [{"tokens_per_expert": 16}]}))
    proc = _checks("summary", str(tmp_path), "--steps", str(steps))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["steps"] == [{"step": "install", "rc": 0, "s": "2"}, {"step": "run-one", "rc": 1, "s": "10"}]
    assert doc["run_one"]["failure_class"] == "CRASH" and doc["v4_backend_te_available"] is False
    assert doc["gemm"]["rows"] == [{"tokens_per_expert": 16}] and doc["argv_verdict"] is None


@pytest.mark.long
def test_gemm_smoke_prints_measured_beside_the_planner(tmp_path):
    """Without CUDA the step refuses to report a figure; --smoke runs the same grouped-GEMM code on tiny
    shapes, and every row carries the planner's efficiency for that batch (steptime.expert_efficiency)."""
    from orchestrator.plan.steptime import expert_efficiency

    proc = _checks("gemm", str(tmp_path / "g.json"))
    doc = json.loads((tmp_path / "g.json").read_text())
    assert proc.returncode == 1 and doc["error"] == "no CUDA device: nothing measured" and not doc["rows"]
    proc = _checks("gemm", str(tmp_path / "s.json"), "--smoke")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["planner"]["hidden"] == 7168 and doc["planner"]["moe_ffn"] == 3072  # ModelConfig (dsv4_pro)
    assert [r["tokens_per_expert"] for r in doc["rows"]] == [16, 32]
    for r in doc["rows"]:
        assert r["planner_efficiency"] == round(
            doc["planner"]["gemm_efficiency"] * expert_efficiency(r["tokens_per_expert"]), 3
        )
    assert "planner assumes" in proc.stdout


# ---- the two-tier device script, dry (tests/gpu/device.sh DEVICE_DRY=1) --------------------------------------

DEVCARRY = ROOT / "tests" / "gpu" / "devcarry.py"
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
import devcarry  # noqa: E402
import device_checks  # noqa: E402


def fake_wheel(folder: Path, dist: str, version: str = "1.0") -> Path:
    """A minimal valid pure-Python wheel (pip installs it offline): the carry's shape without its contents."""
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    files = {
        f"dryrun_{dist.lower()}/__init__.py": "",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as z:
        for name, body in files.items():
            z.writestr(name, body)
        z.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"]))
    return path


def fake_tier_a(carry: Path) -> Path:
    import io
    import tarfile

    for prefix in devcarry.TIER_A_WHEELS:
        fake_wheel(carry / "whl", prefix)
    with tarfile.open(carry / devcarry.TIER_A_MEGATRON[0], "w:gz") as tar:
        body = b"a dry run's stand-in for the Megatron-LM dev tree\n"
        info = tarfile.TarInfo("megatron-lm/README")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    (carry / devcarry.TIER_A_MEGATRON[1]).write_text("d48bd6be0a85\n")
    return carry


def fake_te_downloads(src: Path, core_bytes: int) -> Path:
    """The files `stage tier-b` packs, as a staging machine's downloads name them (a core wheel of random bytes)."""
    import os as _os

    v = devcarry.TE_VERSION
    src.mkdir(parents=True, exist_ok=True)
    (src / f"{devcarry.TE_CORE}-{v}-py3-none-manylinux_2_28_x86_64.whl").write_bytes(_os.urandom(core_bytes))
    fake_wheel(src, "transformer_engine", v)
    (src / f"{devcarry.TE_TORCH_SDIST}-{v}.tar.gz").write_bytes(b"sdist")
    for dep in devcarry.TE_DEPS:
        fake_wheel(src, dep.rstrip("-"), "1.0")
    return src


def device_sh(*args: str, env: dict, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    import os as _os

    base = {k: v for k, v in _os.environ.items() if not k.startswith(("DEVICE_", "DEVCARRY", "OUT"))}
    return subprocess.run(
        ["bash", str(DEVICE_SH), *args], cwd=ROOT, env={**base, "PYTHON": sys.executable, **env},
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_no_carry_fails_fast_naming_what_is_missing(tmp_path):
    """Before any device second is spent: one error line naming each missing file and how to stage it."""
    env = {"DEVCARRY": str(tmp_path / "carry"), "DEVICE_WORK": str(tmp_path / "w"), "OUT": str(tmp_path / "out")}
    proc = device_sh("tier-a", env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert "whl/hydra_core-*.whl" in line and "megatron-dev.tar.gz" in line and "docs/gpu.md" in line
    assert not (tmp_path / "out" / "steps.tsv").read_text()  # nothing ran
    proc = device_sh("tier-b", "2", env=env)
    assert proc.returncode == 2 and "call-2/manifest.json" in proc.stderr and "stage tier-b" in proc.stderr


def test_tier_b_packs_into_calls_and_the_device_checks_every_piece(tmp_path):
    carry = fake_tier_a(tmp_path / "carry")
    src = fake_te_downloads(tmp_path / "dl", core_bytes=7 * devcarry.MIB + 12345)
    budget = 3 * devcarry.MIB
    m = devcarry.stage_tier_b(src, carry, budget)
    calls = m["calls"]
    assert len(calls) >= 3 and all(sum(f["bytes"] for f in c["files"]) <= budget for c in calls)
    assert [f["kind"] for f in calls[0]["files"]][:2] == ["wheel", "sdist"]  # the build can start on call 1
    pieces = [f for c in calls for f in c["files"] if f["kind"] == "piece"]
    assert [f["name"] for f in pieces] == m["wheel"]["parts"] and all(f["bytes"] <= devcarry.PIECE_MAX for f in pieces)
    assert devcarry.expect_tier_b(carry) == [] and devcarry.expect_tier_b(carry, 2) == []
    store = tmp_path / "store"
    with pytest.raises(devcarry.CarryError, match="went cold"):  # call 2 on a machine that lost call 1
        devcarry.receive(2, carry / "tier-b" / "call-2", store)
    for c in calls:
        got = devcarry.receive(c["call"], carry / "tier-b" / f"call-{c['call']}", store)
        assert got["last"] == (c["call"] == len(calls))
    wheel = devcarry.assemble(store)
    core = next(src.glob(f"{devcarry.TE_CORE}-*.whl"))
    assert wheel.read_bytes() == core.read_bytes()
    damaged = carry / "tier-b" / "call-2" / calls[1]["files"][0]["name"]
    damaged.write_bytes(b"x" * damaged.stat().st_size)
    with pytest.raises(devcarry.CarryError, match="damaged"):
        devcarry.receive(2, damaged.parent, store)


@pytest.mark.long
def test_every_emulated_rank_gets_its_exact_tokens_per_expert():
    """One GPU stands for one EP rank: its E/EP experts receive k T EP / E tokens each, T = b S / CP, which is
    the planner's T_expert (moe.t_expert); past EP = E/k the layer routes top-(E/EP) over more tokens."""
    from orchestrator.plan import moe

    model = compose(["+stage=1k"]).cfg.model
    cases = device_checks.moe_cases(8)
    assert cases and {c["stage"] for c in cases} == {"1k", "8k"}
    for c in [*cases, {"ep": 128, "cp": 8, "mbs": 1, "seq_length": 8192}]:
        emu = device_checks.emulation(model, c)
        t_group = moe.t_group(c["ep"], c["mbs"], c["seq_length"], c["cp"])
        assert emu["tokens_per_expert"] == moe.t_expert(model.moe_router_topk, t_group, model.num_experts)
        assert emu["experts"] == model.num_experts // c["ep"] and emu["topk"] <= emu["experts"]
        assert emu["layer_tokens"] * emu["topk"] == emu["rank_tokens"] * model.moe_router_topk


def test_hadamard_standin_is_the_hadamard_transform():
    """tests/gpu/standins/fast_hadamard_transform: x H_n (Sylvester order) x scale, zero-padded to a power of two."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location(
        "fht", ROOT / "tests" / "gpu" / "standins" / "fast_hadamard_transform" / "__init__.py"
    )
    fht = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fht)

    def hadamard(n: int) -> torch.Tensor:
        h = torch.ones(1, 1)
        while h.shape[0] < n:
            h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
        return h

    x = torch.randn(3, 5, 64)
    assert torch.allclose(fht.hadamard_transform(x, 0.125), x @ hadamard(64) * 0.125, atol=1e-5)
    y = torch.randn(2, 48, dtype=torch.bfloat16)
    got = fht.hadamard_transform(y, 48**-0.5)
    want = (torch.nn.functional.pad(y.float(), (0, 16)) @ hadamard(64))[:, :48] * 48**-0.5
    assert got.dtype == torch.bfloat16 and torch.allclose(got.float(), want, atol=0.05)
    g = torch.randn(4, 32, requires_grad=True)
    fht.hadamard_transform(g, 0.5).sum().backward()  # autograd: the transform is symmetric
    assert torch.allclose(g.grad, (torch.ones(4, 32) @ hadamard(32)) * 0.5)


@pytest.mark.long
def test_tier_a_dry_run_writes_every_step_and_sets_measured_beside_predicted(tmp_path):
    """Tier A end to end on CPU: the carried wheels install for cp312 x86-64, dev's MoELayer (the installed
    megatron-core here) runs each emulated rank, the GPT-MoE step goes through orchestrator.job.entry ->
    megatron_run (router hook, window, sidecar) -> collect, and the summary pairs each figure with the planner's."""
    out = tmp_path / "out"
    env = {"DEVICE_DRY": "1", "DEVCARRY": str(fake_tier_a(tmp_path / "carry")), "DEVICE_WORK": str(tmp_path / "w"),
           "OUT": str(out)}  # fmt: skip
    proc = device_sh("tier-a", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    steps = {ln.split("\t")[0]: int(ln.split("\t")[1]) for ln in (out / "steps.tsv").read_text().splitlines()}
    assert list(steps) == ["install", "environment", "imports", "gemm", "moe", "gpt", "summary"]
    assert steps["install"] == steps["moe"] == steps["gpt"] == steps["summary"] == 0, steps
    summary = json.loads((out / "summary.json").read_text())
    rows = summary["moe"]["rows"]
    assert [r["ep"] for r in rows] == [8, 32] and all(len(r["saved_activations_gb"]) == 2 for r in rows)
    assert all(r["saved_activations_gb"][0] > 0 and r["forward_backward_ms"][1] > 0 for r in rows)
    gpt = summary["gpt"]
    assert gpt["ok"] and gpt["checks"]["measured_window"] and gpt["checks"]["router_counts_window"]
    assert gpt["result"]["measure_iters"] == 5 and gpt["result"]["simulated"]  # the stand-in says what it is


@pytest.mark.long
def test_tier_b_dry_run_over_its_calls(tmp_path):
    """Tier B call by call on CPU: each call checks its pieces, call 1 starts the extension build in the
    background, the last reassembles the wheel and runs te, argv, preflight, run-one (the twin, dry) and the
    summary; a call issued out of order is refused before anything runs."""
    carry = fake_tier_a(tmp_path / "carry")
    src = fake_te_downloads(tmp_path / "dl", core_bytes=5 * devcarry.MIB)
    calls = devcarry.stage_tier_b(src, carry, 4 * devcarry.MIB)["calls"]
    out, work = tmp_path / "out", tmp_path / "w"
    env = {"DEVICE_DRY": "1", "DEVCARRY": str(carry), "DEVICE_WORK": str(work), "OUT": str(out)}
    proc = device_sh("tier-b", "2", env=env)
    assert proc.returncode == 2 and "went cold" in proc.stderr
    for c in calls:
        proc = device_sh("tier-b", str(c["call"]), env=env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        if c["call"] < len(calls):
            assert f"issue call {c['call'] + 1} within 30 s" in proc.stdout
    assert (work / "tier-b" / "te_build.rc").read_text().strip() == "0"
    assert "dry: would build" in (work / "tier-b" / "te_build.log").read_text()
    steps = [ln.split("\t") for ln in (out / "steps.tsv").read_text().splitlines()]
    names = [s[0] for s in steps]
    assert names[:2] == ["install", "te-build-start"] and names[-3:] == ["run-one", "job-tail", "summary"]
    assert dict((s[0], s[1]) for s in steps)["te-install"] == "0"
    run = json.loads((out / "run_one.json").read_text())
    assert run["ok"] and run["predicted_memory_gb"]
    argv = json.loads((out / "argv.json").read_text())["argv"]
    assert argv[len(argv) - 1 - argv[::-1].index("--dsa-kernel-backend") + 1] == "none"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["v4_step"]["memory_gb"][1] == run["predicted_memory_gb"] and summary["te"]["ok"] is False


@pytest.mark.long
def test_the_gpt_moe_argv_is_one_megatron_accepts():
    """Tier A's GPT-MoE flags at full size (hidden 7168, 6 local experts, top-6, --transformer-impl local)
    through Megatron's own parse_args + validate_args + optimizer setup (the installed megatron-core here;
    the carried dev checkout on the device, where the step checks again before it runs)."""
    from orchestrator.job import megatron_check

    model = compose(["+stage=1k"]).cfg.model
    argv = device_checks.gpt_argv(model, 8)
    value = {a: b for a, b in zip(argv, [*argv[1:], ""])}
    assert value["--transformer-impl"] == "local" and value["--hidden-size"] == "7168"
    assert value["--num-experts"] == str(model.num_experts // 64) and value["--moe-router-topk"] == "6"
    assert megatron_check.check_candidate(argv, 1, transformer_config=False) is None
