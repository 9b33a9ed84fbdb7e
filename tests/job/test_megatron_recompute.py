"""Full recompute with hash-routed layers + mHC crashes Megatron dev, on CPU, in dev's own code; the fix of PR
#6704 runs it; preflight reads the fix from a checkout's code; the rule that forbids it cites those lines.

The trees are Megatron-LM's own (tests/megatron_env.megatron_tree: exported from a local mirror, cached); the
probe (tests/job/recompute_probe.py) builds a real hash TopKRouter in a real MoE TransformerLayer wrapped in the
tree's HyperConnectionHybridLayer and calls the tree's checkpointed_forward, as HybridStack does under
--recompute-granularity full. PR #6704's head as fetched does not import (its last commit annotates with an
undefined CheckpointManager, megatron/core/models/hybrid/hybrid_block.py:389 there), so the patched tree is dev
with the PR's fix commit applied."""

from __future__ import annotations

import re

import pytest

from orchestrator.job import checkout
from orchestrator.plan import rules as R
from tests.megatron_env import DEV, PR_6704, PR_6704_FIX, megatron_tree, run_in_tree

ROUTER_ASSERT = range(811, 816)  # megatron/core/transformer/moe/router.py:811-815 at dev d48bd6be0a85


@pytest.fixture(scope="module")
def dev():
    return megatron_tree(DEV)


@pytest.fixture(scope="module")
def fixed():
    return megatron_tree(DEV, apply=(PR_6704_FIX,))


@pytest.mark.long
def test_dev_full_recompute_drops_input_ids_and_the_hash_router_asserts(dev):
    out = run_in_tree(dev, "tests.job.recompute_probe")
    assert out["wrapper"] == "HyperConnectionHybridLayer" and out["hash_layer"]
    assert out["control_ok"], out  # without recompute the same layer routes: the recompute path loses input_ids
    assert out["crashed"] and "input_ids is required for hash-based routing" in out["message"], out
    path, line = out["where"].split(":")
    assert path == "megatron/core/transformer/moe/router.py" and int(line) in ROUTER_ASSERT, out


@pytest.mark.long
def test_the_fix_of_pr_6704_runs_full_recompute_forward_and_backward(fixed):
    out = run_in_tree(fixed, "tests.job.recompute_probe")
    assert out["control_ok"] and not out["crashed"] and out["backward"], out


@pytest.mark.long
def test_preflight_reads_the_fix_from_the_checkouts_code(dev, fixed, tmp_path):
    assert checkout.recompute_keeps_input_ids(dev) is False
    assert checkout.recompute_keeps_input_ids(fixed) is True
    assert checkout.recompute_keeps_input_ids(megatron_tree(PR_6704, paths=("megatron/core/recompute.py",))) is True
    assert checkout.fixes(dev) == {R.FULL_RECOMPUTE_HASH_MHC: False}
    assert checkout.recompute_keeps_input_ids(tmp_path) is None  # no such file: cannot tell, the rule holds
    # another way to fix it (no layer loses input_ids) is the fixed behaviour too; the version string is not read
    (tmp_path / "megatron/core").mkdir(parents=True)
    text = (dev / checkout.RECOMPUTE).read_text()
    (tmp_path / checkout.RECOMPUTE).write_text(re.sub(r'\n\s*"input_ids",\n', "\n", text, count=1))
    assert checkout.recompute_keeps_input_ids(tmp_path) is True


def test_every_liftable_rule_has_a_detector_and_the_rule_cites_the_crash():
    assert set(checkout.FIXES) == R.LIFTABLE == {R.FULL_RECOMPUTE_HASH_MHC}
    rule = R.BY_ID[R.FULL_RECOMPUTE_HASH_MHC]
    for cite in ("megatron/core/recompute.py:95-108", "megatron/core/transformer/moe/router.py:811-815", "#6704"):
        assert cite in rule.source, cite
    assert rule.lifted_by and rule.needs == ("recompute",)
