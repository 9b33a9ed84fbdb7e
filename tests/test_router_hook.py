"""jobs.instrument + jobs.megatron_run on CPU with megatron-core's real TopKRouter.

The router alone runs on CPU once torch.cuda.current_device() answers "cpu" (its gating moves the
weight to the current CUDA device, and expert-bias buffers are created there) and a one-process gloo
group stands in for its TP/CP/DP groups (the seq aux loss all-reduces over them).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

from jobs import instrument, megatron_run
from tests.megatron_env import import_megatron

TOKENS, BATCH, HIDDEN, EXPERTS, TOPK = 32, 2, 16, 8, 2
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cpu_megatron():
    import_megatron()
    import torch
    import torch.distributed as dist

    saved = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"
    fd, store = tempfile.mkstemp()
    os.close(fd)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield torch
    dist.destroy_process_group()
    torch.cuda.current_device = saved
    os.unlink(store)


def make_router(capacity_factor=None, pad=False, policy="probs", seed=0):
    import torch
    import torch.distributed as dist
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.manual_seed(seed)  # the gate weight's init draws from torch's RNG
    world = dist.group.WORLD
    cfg = TransformerConfig(
        num_layers=1,
        hidden_size=HIDDEN,
        num_attention_heads=2,
        num_moe_experts=EXPERTS,
        moe_router_topk=TOPK,
        moe_ffn_hidden_size=HIDDEN,
        moe_expert_capacity_factor=capacity_factor,
        moe_token_drop_policy=policy,
        moe_pad_expert_input_to_capacity=pad,
        moe_router_load_balancing_type="seq_aux_loss",
        moe_aux_loss_coeff=1e-4,
        moe_router_score_function="sqrtsoftplus",
        moe_router_enable_expert_bias=True,
        moe_router_dtype="fp32",
        add_bias_linear=False,
        use_cpu_initialization=True,
    )
    router = TopKRouter(cfg, pg_collection=ProcessGroupCollection(tp=world, cp=world, tp_cp=world, tp_dp_cp=world))
    router.set_layer_number(1)
    return router


def pre_drop_map(router, x):
    """The routing map before capacity dropping, from Megatron's own routing function."""
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function

    logits = router.gating(x).view(-1, EXPERTS)
    _, routing_map = topk_routing_with_score_function(
        logits,
        TOPK,
        use_pre_softmax=False,
        score_function="sqrtsoftplus",
        expert_bias=router.expert_bias,
    )
    return routing_map


def tokens(torch, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(TOKENS, BATCH, HIDDEN, generator=g, requires_grad=True)


def test_capacity_factor_drops_are_counted(cpu_megatron):
    torch = cpu_megatron
    router, counter = make_router(capacity_factor=0.5), instrument.RouterCounter()
    counter.attach(router)
    x = tokens(torch)
    before = pre_drop_map(router, x)
    _probs, routing_map = router(x)
    t = counter.totals()
    n = TOKENS * BATCH
    assert int(before.sum()) == n * TOPK == t["routed_tokens"]  # top-k always picks k experts
    assert t["tokens_per_expert"] == routing_map.sum(0).tolist()
    assert t["dropped_tokens"] == int(before.sum() - routing_map.sum()) > 0
    assert bool((routing_map <= before).all())  # dropping only removes assignments
    capacity = math.ceil(n * TOPK / EXPERTS * 0.5)
    assert max(t["tokens_per_expert"]) <= capacity and t["padded_tokens"] == 0
    r = counter.report()
    assert r["token_drop_fraction"] == pytest.approx(t["dropped_tokens"] / (n * TOPK))
    assert r["token_drop_fraction"] >= 0.5 - 1e-9  # capacity 0.5: at least half the assignments go
    assert r["moe_layers"] == 1 and r["microbatches"] == 1 and r["window"]["counting"] == "all"


def test_dropless_counts_every_assignment(cpu_megatron):
    torch = cpu_megatron
    router, counter = make_router(capacity_factor=None), instrument.RouterCounter()
    counter.attach(router)
    for seed in range(3):
        x = tokens(torch, seed)
        expected = pre_drop_map(router, x).sum(0)
        _, routing_map = router(x)
        assert torch.equal(routing_map.sum(0), expected)
    t = counter.totals()
    assert t["dropped_tokens"] == 0 and t["padded_tokens"] == 0
    assert sum(t["tokens_per_expert"]) == t["routed_tokens"] == 3 * TOKENS * BATCH * TOPK
    assert counter.report()["token_drop_fraction"] == 0.0


def test_pad_to_capacity_separates_padding_from_tokens(cpu_megatron):
    torch = cpu_megatron
    from megatron.core.transformer.moe.moe_utils import apply_router_token_dropping

    router, counter = make_router(capacity_factor=1.0, pad=True), instrument.RouterCounter()
    counter.attach(router)
    x = tokens(torch, 7)
    before = pre_drop_map(router, x)
    _, final_map = router(x)
    t = counter.totals()
    capacity = math.ceil(TOKENS * BATCH * TOPK / EXPERTS)
    assert int(final_map.sum()) == EXPERTS * capacity  # every expert is fed exactly `capacity` rows
    real = before & final_map
    assert t["tokens_per_expert"] == real.sum(0).tolist()
    assert t["padded_tokens"] == int((final_map & ~before).sum()) > 0
    assert t["dropped_tokens"] == int(before.sum() - real.sum())
    probs = torch.rand(TOKENS * BATCH, EXPERTS) * before  # the utility agrees on the same map
    _, cross = apply_router_token_dropping(probs, before, TOPK, 1.0, pad_to_capacity=True)
    assert int(cross.sum()) == EXPERTS * capacity


def test_window_counts_only_measured_iterations(cpu_megatron):
    torch = cpu_megatron
    router, counter = make_router(), instrument.RouterCounter.for_window(warmup=2, measure=3)
    counter.attach(router)
    x = tokens(torch)
    for _ in range(7):
        counter.window.begin()
        for _ in range(2):  # two microbatches per iteration
            router(x)
        counter.window.end()
    router(x)  # outside any train_step: not counted
    r = counter.report()
    assert r["routed_tokens"] == 3 * 2 * TOKENS * BATCH * TOPK
    assert r["microbatches"] == 6
    assert r["window"] == {
        "warmup_iters": 2,
        "measure_iters": 3,
        "measure_iters_requested": 3,
        "iterations_seen": 7,
        "counting": "window",
    }


def test_recompute_in_backward_is_not_counted_twice(cpu_megatron):
    torch = cpu_megatron
    from torch.utils.checkpoint import checkpoint

    router, counter = make_router(), instrument.RouterCounter()
    counter.attach(router)
    calls = []
    router.register_forward_hook(lambda *_: calls.append(1))
    x = tokens(torch)
    probs, _ = checkpoint(router, x, use_reentrant=True)
    probs.sum().backward()  # re-runs router.forward inside backward
    assert x.grad is not None and len(calls) == 2  # the forward really ran twice
    assert counter.totals()["routed_tokens"] == TOKENS * BATCH * TOPK


def test_install_hooks_new_routers_and_train_step(cpu_megatron):
    torch = cpu_megatron
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.training import training

    original_init, original_step = TopKRouter.__init__, training.train_step
    counter = instrument.RouterCounter.for_window(0, 1).install()
    try:
        assert training.train_step is not original_step
        router = make_router()  # built after install: hooked without attach()
        router(tokens(torch))
        assert counter.totals()["routed_tokens"] == TOKENS * BATCH * TOPK
    finally:
        counter.uninstall()
    assert TopKRouter.__init__ is original_init and training.train_step is original_step
    router(tokens(torch))  # hook removed
    assert counter.totals()["routed_tokens"] == TOKENS * BATCH * TOPK


def test_megatron_run_writes_sidecar(cpu_megatron, tmp_path):
    """runpy an entry script with patched argv; the sidecar carries the router counts of its run."""
    entry = tmp_path / "entry_script.py"
    entry.write_text(
        textwrap.dedent(f"""
        import json, sys
        import torch
        from tests.test_router_hook import make_router
        json.dump(sys.argv, open({str(tmp_path / "argv.json")!r}, "w"))
        router = make_router(capacity_factor=0.5)
        for i in range(4):
            router(torch.randn({TOKENS}, {BATCH}, {HIDDEN}))
        sys.exit(3)
    """)
    )
    code = megatron_run.main(str(entry), ["--micro-batch-size", "1"], (1, 2), tmp_path, 5)
    assert code == 3
    assert json.loads((tmp_path / "argv.json").read_text())[1:] == ["--micro-batch-size", "1"]
    side = json.loads((tmp_path / "sidecar-rank-5.json").read_text())
    assert side["simulated"] is False and side["rank"] == 5
    assert side["routed_tokens"] == 4 * TOKENS * BATCH * TOPK and side["dropped_tokens"] > 0
    assert side["window"]["counting"] == "all"  # no train_step ran: the window was not driven
    assert side["peak_allocated_mb"] is None  # CPU: no CUDA allocator
    assert 0 < side["token_drop_fraction"] < 1 and side["hot_expert_ratio"] >= 1.0
    assert str(tmp_path) not in sys.path


def test_summary_percentiles_match_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 384):
        loads = rng.integers(0, 10_000, size=n).tolist()
        s = instrument.router_summary(loads, routed=sum(loads) + 10, dropped=10, padded=5)
        for q in (50, 95, 99):
            assert s[f"expert_load_p{q}"] == pytest.approx(np.percentile(loads, q))
        assert s["hot_expert_ratio"] == pytest.approx(max(loads) / np.mean(loads)) if sum(loads) else True
        assert s["padding_fraction"] == pytest.approx(5 / (sum(loads) + 5))


def test_jobs_modules_import_without_torch():
    code = (
        "import sys, jobs.instrument, jobs.megatron_run; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


FAKE_ROUTER = """
class TopKRouter:  # the checkout's router: install() must hook this one, not the wheel's
    def __init__(self, *args, **kwargs):
        self.hooks = 0

    def register_forward_hook(self, hook, **kwargs):
        self.hooks += 1
        return self  # the handle

    def remove(self):
        pass
"""
FAKE_SCRIPT = """
import json, sys
import megatron.core.context_parallel_layout as cpl  # dev-only: the wheel has no such module
from megatron.core.transformer.moe.router import TopKRouter
router = TopKRouter()
seen = {{"core": sys.modules["megatron.core"].__file__, "cpl": cpl.__file__, "hooks": router.hooks}}
json.dump(seen, open({out!r}, "w"))
"""


def test_checkout_comes_first_and_shadows_the_installed_wheel(tmp_path):
    """A Megatron checkout (namespace `megatron/`, like the dev tree) with a module the wheel lacks: main()
    puts it first on sys.path before the router hook imports megatron, so the script and the hook both get
    the checkout's modules, in a fresh interpreter where megatron-core 0.19.2 is installed."""
    tree = tmp_path / "megatron-lm"
    files = {
        "megatron/core/__init__.py": "",
        "megatron/core/context_parallel_layout.py": "",
        "megatron/core/transformer/__init__.py": "",
        "megatron/core/transformer/moe/__init__.py": "",
        "megatron/core/transformer/moe/router.py": FAKE_ROUTER,
        "pretrain_hybrid.py": FAKE_SCRIPT.format(out=str(tmp_path / "seen.json")),
    }
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(textwrap.dedent(text))
    wheel = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('megatron.core').origin)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout.strip()
    assert not wheel.startswith(str(tree))  # the wheel is there to shadow a checkout put in second place
    script = str(tree / "pretrain_hybrid.py")
    run = f"megatron_run.main({script!r}, [], (0, 1), {str(tmp_path)!r}, 3)"
    code = f"import sys\nfrom jobs import megatron_run\nsys.exit({run})"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=300)
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["core"].startswith(str(tree)) and seen["cpl"].startswith(str(tree))
    assert seen["hooks"] == 1  # the hook went onto the checkout's TopKRouter
    side = json.loads((tmp_path / "sidecar-rank-3.json").read_text())
    assert "instrument_error" not in side and side["rank"] == 3


def test_megatron_extra_leaves_the_containers_torch_alone():
    """`pip install .[megatron]` in a container must not pin or replace its CUDA torch (the Makefile pins the
    CPU torch of dev installs)."""
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extra = meta["project"]["optional-dependencies"]["megatron"]
    assert not [req for req in extra if req.split("=")[0].split(">")[0].split("<")[0].strip() == "torch"]
    assert any(req.startswith("megatron-core") for req in extra)
    assert "torch==" in (ROOT / "Makefile").read_text()
