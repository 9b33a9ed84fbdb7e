"""The container recipe and preflight read one manifest (orchestrator/core/stack.py): every component preflight
checks is installed by the committed docker/Dockerfile at the manifest's pin, the recipe parses and lints clean,
and Megatron-LM goes in as a git checkout of the tested commit that preflight's commit row reads back.

The committed Dockerfile is read with a real parser (dockerfile-parse) and linted with hadolint (both from
PyPI, pyproject.toml's dev extra); nothing here builds the image (no GPU, no network)."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from orchestrator.core import stack
from orchestrator.core.megatron import TESTED_COMMIT
from orchestrator.job import checkout
from orchestrator.job import preflight as job
from orchestrator.job.preflight import CheckStatus, PreflightRequest

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / stack.RECIPE
# A space that needs every kernel: CSA layers, both flex backends, the cuDNN DSA kernels, Muon, router fusion.
EVERYTHING = PreflightRequest(
    entry_script="/opt/megatron-lm/pretrain_hybrid.py",
    gpus_per_node=8,
    flex_backends=["deepep", "hybridep"],
    cudnn_dsa=True,
    muon=True,
    packed_cp=True,
    router_fusion_sqrtsoftplus=True,
    csa=True,
)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, value) of a Dockerfile, as dockerfile-parse reads it (continuations joined, no comments)."""
    parser = DockerfileParser(fileobj=io.BytesIO(text.encode()))  # in memory: a path would be written
    return [(i["instruction"], i["value"]) for i in parser.structure if i["instruction"] != "COMMENT"]


def not_installed(text: str, components: list[stack.Component]) -> list[str]:
    """The components a recipe does not install at their pin, each with what is missing: a GIT one is a RUN in
    its folder that fetches exactly its commit (and pip-installs it unless it is run from its checkout), a PIP
    one a RUN that pins name==version, a BASE one the FROM of the manifest's base image."""
    steps = instructions(text)
    runs_in: dict[str, list[str]] = {}
    workdir = "/"
    for kind, value in steps:
        if kind == "WORKDIR":
            workdir = value
        elif kind == "RUN":
            runs_in.setdefault(workdir, []).append(value)
    froms = [v for k, v in steps if k == "FROM"]
    missing = []
    for c in components:
        if c.install == stack.BASE:
            if froms != [stack.BASE_IMAGE]:
                missing.append(f"{c.key}: FROM {froms} is not {stack.BASE_IMAGE}")
        elif c.install == stack.GIT:
            runs = runs_in.get(stack.src_dir(c), [])
            fetch = f"git fetch -q --depth 1 {c.git} {c.rev}"
            if not any(fetch in r and "git checkout -q FETCH_HEAD" in r for r in runs):
                missing.append(f"{c.key}: no RUN in {stack.src_dir(c)} fetching {c.git} {c.rev}")
            elif c.pip_install and not any("pip install" in r and f"'.{c.extras}'" in r for r in runs):
                missing.append(f"{c.key}: fetched but not pip-installed")
        elif not any(f"'{c.dists[0]}=={c.version}'" in v for k, v in steps if k == "RUN"):
            missing.append(f"{c.key}: no RUN pinning {c.dists[0]}=={c.version}")
    return missing


def test_the_committed_recipe_is_the_manifests_rendering():
    """docker/Dockerfile is scripts/image.py's output: edit the manifest, re-render, commit both."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "image.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert RECIPE.read_text() == stack.dockerfile()


def test_the_recipe_parses_and_hadolint_finds_no_warning():
    steps = instructions(RECIPE.read_text())
    assert steps[0] == ("FROM", stack.BASE_IMAGE) and stack.BASE_IMAGE.startswith("nvcr.io/nvidia/pytorch:")
    assert [k for k, _ in steps].count("FROM") == 1 and steps[-1] == ("WORKDIR", stack.MEGATRON_DIR)
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    done = subprocess.run([hadolint, "--failure-threshold", "warning", str(RECIPE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_component_preflight_checks_is_installed_by_the_recipe_at_its_pin():
    need = job.needed(EVERYTHING)
    assert {c.key for c in need} >= set(job.KERNEL_CHECKS)  # every kernel row's component is asked for
    assert not_installed(RECIPE.read_text(), need) == []
    # every pin is a full commit (a branch moves) or a PyPI version, and git components name their version
    for c in stack.COMPONENTS:
        if c.install == stack.GIT:
            assert len(c.rev) == 40 and int(c.rev, 16) >= 0, c.key
            assert c.version or not c.pip_install, f"{c.key}: no version for preflight to compare"


def test_the_check_fails_for_a_component_the_recipe_does_not_install_or_pins_elsewhere():
    """The guard above can fail: a component preflight would check that the recipe lacks, and a recipe whose
    Transformer Engine commit drifted from the manifest, are both named."""
    te = stack.component("transformer_engine")
    extra = dataclasses.replace(te, key="nccl_tests", git="https://github.com/NVIDIA/nccl-tests.git")
    drifted = RECIPE.read_text().replace(te.rev, "0" * 40)
    assert not_installed(RECIPE.read_text(), [extra]) == [
        f"nccl_tests: no RUN in /opt/src/nccl_tests fetching {extra.git} {extra.rev}"
    ]
    assert [m.split(":")[0] for m in not_installed(drifted, [te])] == ["transformer_engine"]


def test_every_preflight_row_is_a_manifest_component_it_asked_for():
    """Each environment row names a component of the manifest (the node's GPU count aside), one the request
    needed: preflight has no list of its own."""
    need = {c.what: c for c in job.needed(EVERYTHING)}
    deep_ep = stack.component("deep_ep")
    rows = job.environment_checks(EVERYTHING)  # on this CPU host: most of them fail, each names its part
    names = {r.name for r in rows} - {"GPUs per node"}
    backends = {f"{deep_ep.what}: {b}" for b in EVERYTHING.flex_backends}
    assert names - backends <= set(need), names - backends - set(need)
    assert backends <= names and deep_ep.what in need
    failed = [r for r in rows if r.status is CheckStatus.FAIL and r.name in need and need[r.name].attr]
    assert failed and all(stack.RECIPE in r.fix for r in failed)  # each kernel's fix names the image


def test_the_pinned_transformer_engine_meets_every_floor_preflight_sets():
    te = stack.component("transformer_engine")
    assert te.release >= job.MIN_TE_ROUTER_FUSION_SQRTSOFTPLUS >= job.MIN_TE
    row = job.te_check(EVERYTHING, te.version + "+f031cf8")
    assert row.status is CheckStatus.PASS and f"pins {te.version}" in row.detail and row.name == te.what


def test_a_kernel_at_another_release_is_a_warning_naming_the_pin(tmp_path, monkeypatch):
    pkg = tmp_path / "fast_hadamard_transform"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def hadamard_transform(x, scale=1.0):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fast_hadamard_transform", raising=False)
    for found, status in (("1.0.4.post1", CheckStatus.PASS), ("1.0.3", CheckStatus.WARN)):
        monkeypatch.setattr(job, "_version", lambda *dists, v=found: v)
        row = job.hadamard_check()
        assert row.status is status, row
    assert "1.0.4.post1" in row.detail and stack.RECIPE in row.detail


def test_the_recipes_version_check_accepts_the_pins_and_refuses_a_drift(monkeypatch):
    """The last RUN reads every pinned distribution's metadata: a local build (2.14.0+f031cf8) passes, an
    older release fails the build."""
    body = next(v for k, v in instructions(RECIPE.read_text()) if k == "RUN" and "importlib.metadata" in v)
    code = body.split('python -c "', 1)[1].rsplit('"', 1)[0]
    reported = {c.dists[0]: c.version + "+abc1234" for c in stack.COMPONENTS if c.version and c.dists}
    monkeypatch.setattr(importlib.metadata, "version", lambda d: reported[d])
    with pytest.raises(SystemExit) as ok:
        exec(code, {})
    assert not ok.value.code
    reported["transformer_engine"] = "2.12.0"
    with pytest.raises(SystemExit) as bad:
        exec(code, {})
    assert bad.value.code == "transformer_engine: 2.12.0 != 2.14.0"


def test_megatron_goes_in_as_a_git_checkout_of_the_tested_commit(tmp_path):
    """The recipe's Megatron RUN, replayed against a local repository: the checkout keeps its .git, so
    preflight's commit row reads the commit back; the same tree without .git (an archive) fails preflight."""
    from orchestrator.config import compose

    mega = stack.component("megatron")
    assert mega.rev == TESTED_COMMIT and not mega.pip_install and mega.dest == stack.MEGATRON_DIR
    command = compose(["workload=megatron"]).cfg.workload.command  # preflight reads its .py's folder
    assert str(Path(command[-1]).parent) == stack.MEGATRON_DIR
    runs = [v for k, v in instructions(RECIPE.read_text()) if k == "RUN"]
    run = next(v for v in runs if mega.git in v)
    assert f"rm -rf {stack.MEGATRON_DIR}" not in run
    deep_ep = next(i for i, v in enumerate(runs) if stack.component("deep_ep").git in v)
    assert runs.index(run) < deep_ep and f"{stack.MEGATRON_DIR}/docker/patches/deepep.patch" in runs[deep_ep]

    upstream = tmp_path / "upstream"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=dev"]
    subprocess.run([*git, "init", "-q", str(upstream)], check=True)
    (upstream / "pretrain_hybrid.py").write_text("# entry\n")
    subprocess.run([*git, "-C", str(upstream), "add", "."], check=True)
    subprocess.run([*git, "-C", str(upstream), "commit", "-qm", "x"], check=True)
    sha = subprocess.run(
        ["git", "-C", str(upstream), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run(["git", "-C", str(upstream), "config", "uploadpack.allowAnySHA1InWant", "true"], check=True)
    dest = tmp_path / "megatron-lm"
    dest.mkdir()
    script = run.replace(mega.git, f"file://{upstream}").replace(mega.rev, sha)
    subprocess.run(["bash", "-c", script], cwd=dest, check=True, capture_output=True)
    assert checkout.git_commit(dest) == sha
    row, commit = job.commit_check(dest)
    assert commit == sha and row.status is CheckStatus.WARN  # a commit is read: not the tested one here
    shutil.rmtree(dest / ".git")  # what an archive of the same tree looks like
    assert job.commit_check(dest)[0].status is CheckStatus.FAIL
