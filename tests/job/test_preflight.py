"""preflight: one table, each row pass/fail with its fix; the dev-branch V4 modules found on disk; Slurm's
limits asked from the real local cluster; a failing preflight stops the sweep; rejected candidates never run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import cli
from orchestrator import preflight as pf
from orchestrator.core.schema import ClusterConfig, SlurmConfig, StageConfig
from orchestrator.job import preflight as job
from orchestrator.job.preflight import CheckStatus, PreflightRequest
from orchestrator.launch.slurm.partition import slurm_minutes


def fake_dev_tree(root: Path) -> Path:
    """Only the dev-branch V4 module files, each with the line that defines what preflight looks for."""
    for mod in job.V4_MODULES:
        path = root / mod.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{mod.defines}(*args):\n    pass\n")
    entry = root / "pretrain_hybrid.py"
    entry.write_text("")
    return entry


def by_name(rows) -> dict:
    return {r["name"] if isinstance(r, dict) else r.name: r for r in rows}


@pytest.mark.long
def test_installed_wheel_fails_naming_the_missing_v4_modules(capsys):
    """Against megatron-core 0.19.2 (this machine): non-zero, and every missing dev module is named."""
    rc = cli.main(["preflight", "+stage=1k", "workload=megatron", "cluster=local", "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    rows = by_name(out["checks"])
    assert rc == 1 and not out["ok"]
    for mod in job.V4_MODULES:
        row = rows[f"V4: {mod.what}"]
        assert row["status"] == "fail" and mod.path in row["fix"]
    assert rows["Megatron checkout"]["status"] == "fail" and "workload.command" in rows["Megatron checkout"]["fix"]
    assert rows["Slurm limits"]["status"] == "warn"  # cluster=local: a warning, not a crash
    assert (Path(out["folder"]) / "preflight.json").is_file()


def test_fake_dev_tree_passes_the_v4_rows(tmp_path):
    entry = fake_dev_tree(tmp_path / "megatron-lm")
    roots, checkout = job.megatron_roots(str(entry))
    rows = job.v4_module_checks(roots, checkout)
    assert checkout and roots == [entry.parent]
    assert all(r.status is CheckStatus.PASS for r in rows), [r for r in rows if r.status is not CheckStatus.PASS]
    (tmp_path / "megatron-lm" / job.V4_MODULES[2].path).write_text("def _top_k_routing(): pass\n")  # 0.19-like
    rows = job.v4_module_checks(roots, checkout)
    assert [r.name for r in rows if r.status is CheckStatus.FAIL] == ["V4: hash routing"]


@pytest.mark.long
def test_fake_dev_tree_through_the_command(tmp_path, capsys):
    """The same rows through the launcher (a local job) with workload.command pointing at the fake tree."""
    entry = fake_dev_tree(tmp_path / "megatron-lm")
    rc = cli.main(
        [
            "preflight",
            "+stage=smoke",
            "workload=megatron",
            "cluster=local",
            f"cluster.folder={tmp_path / 'runs'}",
            f"workload.command=[python,{entry}]",
            "--format",
            "json",
        ]
    )
    rows = by_name(json.loads(capsys.readouterr().out)["checks"])
    assert rc == 1  # no GPU here
    assert rows["Megatron checkout"]["status"] == "pass"
    assert all(rows[f"V4: {m.what}"]["status"] == "pass" for m in job.V4_MODULES)


@pytest.mark.long
def test_request_lists_every_kept_candidate_and_what_the_space_needs():
    from orchestrator.config import compose

    cfg = compose(["+stage=1k", "workload=megatron"]).cfg
    req, limits = pf.candidates(cfg)
    assert req.candidates and set(limits) == {c.key for c in req.candidates}
    assert {"deepep", "hybridep"} <= set(req.flex_backends)  # conf/stage/1k.yaml searches flex:*
    assert req.cudnn_dsa and not req.muon  # attention_backend cudnn; model.optimizer adam (dev's recipe)
    assert req.entry_script == "/opt/megatron-lm/pretrain_hybrid.py"
    assert all(c.world == 1024 for c in req.candidates)
    # Muon has no precision-aware optimizer (dev optimizer_config.py:519-525): it declares FP32 state
    muon_cfg = compose(["+stage=1k", "workload=megatron", "model.optimizer=muon", "workload.recipe.optim=[fp32]"]).cfg
    muon, _ = pf.candidates(muon_cfg)
    assert muon.muon  # --optimizer muon asks preflight for the emerging-optimizers package


@pytest.mark.long  # imports Megatron's own code
def test_validate_candidate_reports_megatrons_own_message(monkeypatch):
    """The verdict is Megatron's: argparse's error for an unknown flag, validate_args' assertion for a bad layout."""
    from tests.megatron_env import as_hopper, import_megatron

    import_megatron()
    ok = [
        "--num-layers",
        "4",
        "--hidden-size",
        "64",
        "--num-attention-heads",
        "4",
        "--seq-length",
        "128",
        "--max-position-embeddings",
        "128",
        "--micro-batch-size",
        "1",
        "--global-batch-size",
        "8",
        "--lr",
        "1e-4",
        "--train-iters",
        "10",
        "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size",
        "128",
        "--mock-data",
    ]
    with as_hopper():
        assert job.validate_candidate_argv(ok, 8) is None
        assert "unrecognized arguments: --no-such-flag" in job.validate_candidate_argv([*ok, "--no-such-flag"], 8)
        bad = job.validate_candidate_argv([*ok, "--tensor-model-parallel-size", "3"], 8)
    assert bad and ("divisible" in bad or "AssertionError" in bad)


def test_slurm_minutes():
    assert slurm_minutes("infinite") is None
    assert [slurm_minutes(t) for t in ("30", "4:00:00", "1-00:00:00", "2-12", "10:30")] == [30, 240, 1440, 3600, 11]


@pytest.mark.slurm(shared=True)  # reads the partition, submits nothing
def test_slurm_rows_from_the_local_cluster(slurm_cluster):
    stage = StageConfig(name="smoke", gpus=32, gpus_per_node=8)
    rows, rejected = pf.cluster_checks(ClusterConfig(kind="slurm"), stage, {"a": 30, "b": 60})
    got = {r.name: r for r in rows}
    assert got["partition debug MaxTime"].status is CheckStatus.PASS and not rejected  # MaxTime infinite
    assert got["GPUs per node (Slurm)"].status is CheckStatus.PASS
    assert got["nodes"].status is CheckStatus.PASS and "has 4" in got["nodes"].detail
    assert got["account"].status is CheckStatus.PASS
    big, _ = pf.cluster_checks(
        ClusterConfig(kind="slurm", cpus_per_task=8), StageConfig(gpus=1024, gpus_per_node=16), {}
    )
    got = {r.name: r for r in big}
    assert got["nodes"].status is CheckStatus.FAIL and got["GPUs per node (Slurm)"].status is CheckStatus.FAIL
    assert got["CPUs per node"].status is CheckStatus.FAIL and "cluster.cpus_per_task=" in got["CPUs per node"].fix
    unknown, _ = pf.cluster_checks(ClusterConfig(kind="slurm", slurm=SlurmConfig(qos="no-such-qos")), stage, {})
    assert {r.name: r for r in unknown}["QoS no-such-qos"].status is CheckStatus.FAIL


@pytest.mark.slurm
def test_preflight_job_on_the_local_slurm_cluster(slurm_cluster, tmp_path, capsys):
    """The whole command on cluster=slurm: the job runs on a node, the Slurm rows come from sinfo/sacctmgr."""
    rc = cli.main(
        [
            "preflight",
            "+stage=smoke",
            "workload=megatron",
            "cluster=slurm",
            f"cluster.folder={tmp_path}",
            "cluster.cpus_per_task=1",
            "--format",
            "json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    rows = by_name(out["checks"])
    assert rc == 1 and out["job_id"]  # no real GPU on the test nodes
    assert rows["Python"]["status"] == "pass" and rows["torch + CUDA"]["status"] == "fail"
    assert rows["partition debug MaxTime"]["status"] == "pass" and rows["nodes"]["status"] == "pass"


def test_request_round_trips_through_the_report(tmp_path):
    report = job.PreflightReport([job.Check("x", CheckStatus.WARN, "d", "f")], {"k": "why"})
    report.save(tmp_path)
    back = job.PreflightReport.load(tmp_path)
    assert back.checks[0].status is CheckStatus.WARN and back.rejected == {"k": "why"}
    assert PreflightRequest(entry_script="e", gpus_per_node=8).candidates == []


# --- the checkout: commit, fixes; Transformer Engine and kernels the space needs --------------------------------
from orchestrator.core.megatron import TESTED_COMMIT  # noqa: E402
from orchestrator.job import checkout  # noqa: E402
from orchestrator.plan import rules as R  # noqa: E402

OTHER = "0123456789abcdef0123456789abcdef01234567"


def git_checkout(root: Path, commit: str | None, *, packed: bool = False) -> Path:
    """A checkout's git metadata as `git clone` leaves it: HEAD -> refs/heads/dev -> commit (loose or packed)."""
    git = root / ".git"
    (git / "refs/heads").mkdir(parents=True, exist_ok=True)
    (git / "HEAD").write_text("ref: refs/heads/dev\n")
    if commit and packed:
        (git / "packed-refs").write_text(f"# pack-refs with: peeled fully-peeled sorted\n{commit} refs/heads/dev\n")
    elif commit:
        (git / "refs/heads/dev").write_text(commit + "\n")
    return root


def test_the_commit_is_read_from_git_metadata_and_compared_with_the_tested_one(tmp_path):
    tested = git_checkout(tmp_path / "a", TESTED_COMMIT)
    row, commit = job.commit_check(tested)
    assert commit == TESTED_COMMIT and row.status is CheckStatus.PASS and "tested" in row.detail
    other = git_checkout(tmp_path / "b", OTHER, packed=True)
    row, commit = job.commit_check(other)
    assert commit == OTHER and row.status is CheckStatus.WARN
    assert OTHER in row.detail and TESTED_COMMIT in row.detail  # names both commits
    (tmp_path / "c").mkdir()
    row, commit = job.commit_check(tmp_path / "c")  # an archive: no git metadata, the commit is unrecorded
    assert commit is None and row.status is CheckStatus.FAIL
    assert "git clone" in row.fix and TESTED_COMMIT in row.fix
    detached = tmp_path / "d" / ".git"
    detached.mkdir(parents=True)
    (detached / "HEAD").write_text(OTHER + "\n")
    assert checkout.git_commit(tmp_path / "d") == OTHER


def test_the_router_fusion_with_sqrtsoftplus_needs_te_2_13():
    """--moe-router-fusion with sqrtsoftplus raises below TE 2.13 (moe_utils.py:742-745): the floor moves."""
    fused = PreflightRequest(entry_script="e", gpus_per_node=8, packed_cp=True, router_fusion_sqrtsoftplus=True)
    low = job.te_check(fused, "2.12.0")
    assert low.status is CheckStatus.FAIL and ">= 2.13" in low.detail and "moe_router_fusion=false" in low.fix
    assert job.te_check(fused, "2.13.0+cu13").status is CheckStatus.PASS
    plain = PreflightRequest(entry_script="e", gpus_per_node=8, packed_cp=True)
    assert job.te_check(plain, "2.9.0").status is CheckStatus.PASS
    assert job.te_check(plain, "2.8.1").status is CheckStatus.FAIL
    assert job.te_check(plain, None).status is CheckStatus.FAIL


def test_fast_hadamard_transform_is_checked_and_its_fix_says_the_sdist_is_a_stub(tmp_path, monkeypatch):
    missing = job.hadamard_check()  # not installed on this machine
    assert missing.status is CheckStatus.FAIL and "dsa.py:264-269" in missing.detail
    assert "stub" in missing.fix and "offline" in missing.fix
    pkg = tmp_path / "fast_hadamard_transform"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def hadamard_transform(x, scale=1.0):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert job.hadamard_check().status is CheckStatus.PASS
    import sys

    sys.modules.pop("fast_hadamard_transform", None)
    (pkg / "__init__.py").write_text("")  # the stub: a package without the kernel
    assert job.hadamard_check().status is CheckStatus.FAIL
    sys.modules.pop("fast_hadamard_transform", None)


@pytest.mark.long
def test_request_asks_for_te_2_13_hadamard_and_validates_what_a_fixed_megatron_would_run():
    from orchestrator.config import compose

    req, _ = pf.candidates(compose(["+stage=1k", "workload=megatron"]).cfg)
    assert req.router_fusion_sqrtsoftplus and req.csa  # the recipe fuses the router; V4-Pro has CSA layers
    argvs = [c.argv for c in req.candidates]
    assert any(a[a.index("--recompute-granularity") + 1] == "full" for a in argvs if "--recompute-granularity" in a)
    cfg = compose(["+stage=16k", "workload=megatron"]).cfg
    big, _ = pf.candidates(cfg)
    off = [c for c in big.candidates if "--fine-grained-activation-offloading" in c.argv]
    assert off and all(c.env.get("NVTE_CPU_OFFLOAD_V1") == "1" for c in off)


@pytest.mark.long
def test_preflight_lifts_a_rule_only_where_the_checkout_carries_the_fix(tmp_path):
    """The node's rows and report: dev d48bd6be0a85 (the rule holds: a warning) and dev with PR #6704's fix
    (lifted), each with its commit recorded; the report keeps both through save/load."""
    from tests.megatron_env import DEV, PR_6704_FIX, megatron_tree

    for tree, lifted in (
        (megatron_tree(DEV), []),
        (megatron_tree(DEV, apply=(PR_6704_FIX,)), [R.FULL_RECOMPUTE_HASH_MHC]),
    ):
        rows, got = job.fix_checks(tree)
        assert got == lifted
        (row,) = rows
        assert (
            row.status is (CheckStatus.PASS if lifted else CheckStatus.WARN) and R.FULL_RECOMPUTE_HASH_MHC in row.detail
        )
    (unknown,), none = job.fix_checks(None)  # no checkout: cannot tell, the rule holds
    assert none == [] and unknown.status is CheckStatus.WARN
    fixed = megatron_tree(DEV, apply=(PR_6704_FIX,))
    entry = tmp_path / "megatron-lm"
    entry.mkdir()
    (entry / "megatron").symlink_to(fixed / "megatron", target_is_directory=True)
    (entry / "pretrain_hybrid.py").write_text("")
    git_checkout(entry, TESTED_COMMIT)
    report = job.check(PreflightRequest(entry_script=str(entry / "pretrain_hybrid.py"), gpus_per_node=8))
    assert report.lifted == [R.FULL_RECOMPUTE_HASH_MHC]
    assert report.megatron["commit"] == TESTED_COMMIT == report.megatron["tested_commit"]
    rows = by_name(report.checks)
    assert rows["Megatron commit"].status is CheckStatus.PASS
    report.save(tmp_path)
    back = job.PreflightReport.load(tmp_path)
    assert back.lifted == report.lifted and back.megatron == report.megatron


@pytest.mark.long
def test_pr_6756_makes_dsv4_hybrid_an_invalid_choice_and_preflight_says_so(tmp_path):
    """PR #6756 ("merge main into dev", open) as it stands: its parser refuses the V4 argv (invalid choice
    'dsv4_hybrid'), so preflight's Megatron row fails with that message and rejects every candidate, and its V4
    rows miss hash routing and the DSv4 layer spec. Its modules import triton unconditionally: the probe serves
    import-time stand-ins for it (no kernel runs)."""
    from tests.megatron_env import PR_6756, megatron_tree, run_in_tree
    from tests.plan.test_argv import CONFIGS, build

    tree = megatron_tree(PR_6756)
    roots, is_checkout = job.megatron_roots(str(tree / "pretrain_hybrid.py"))
    failed = {r.name for r in job.v4_module_checks(roots, is_checkout) if r.status is CheckStatus.FAIL}
    assert {"V4: hash routing", "V4: hybrid DSv4 layer spec"} <= failed
    cases = [
        {"key": n, "argv": build(lay, st), "world": st.gpus, "env": {}, "te": "2.13.0"}
        for n, (lay, st) in CONFIGS.items()
    ]
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    out = run_in_tree(tree, "tests.job.megatron_probe", str(path), "--stand-in-triton")
    assert out["preflight"]["status"] == "fail" and set(out["rejected"]) == set(CONFIGS)
    assert all("invalid choice: 'dsv4_hybrid'" in why for why in out["rejected"].values()), out["rejected"]
