"""orchestrator.job.instrument + orchestrator.job.megatron_run on CPU with megatron-core's real TopKRouter.

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

from orchestrator.job import instrument, megatron_run
from tests.megatron_env import import_megatron

TOKENS, BATCH, HIDDEN, EXPERTS, TOPK = 32, 2, 16, 8, 2
ROOT = Path(__file__).resolve().parents[2]


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


def make_router(capacity_factor=None, pad=False, policy="probs", seed=0, expert_bias=True):
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
        moe_router_enable_expert_bias=expert_bias,
        moe_router_dtype="fp32",
        add_bias_linear=False,
        use_cpu_initialization=True,
    )
    router = TopKRouter(cfg, pg_collection=ProcessGroupCollection(tp=world, cp=world, tp_cp=world, tp_dp_cp=world))
    router.set_layer_number(1)
    return router


def pre_drop_map(router, x):
    """The routing map before capacity dropping, from Megatron's own routing function."""
    bias = getattr(router, "expert_bias", None)
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function

    logits = router.gating(x).view(-1, EXPERTS)
    _, routing_map = topk_routing_with_score_function(
        logits,
        TOPK,
        use_pre_softmax=False,
        score_function="sqrtsoftplus",
        expert_bias=bias,
    )
    return routing_map


def tokens(torch, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(TOKENS, BATCH, HIDDEN, generator=g, requires_grad=True)


@pytest.mark.long
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


@pytest.mark.long
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


@pytest.mark.long
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


# 0.19.2's expert-bias update cannot take a padding mask (router.py:738 there broadcasts [tokens] against
# [tokens, experts]; dev flattens and unsqueezes it), so the padding tests route without expert bias.
def padding_mask(torch, padded_positions=8):
    """[seq, batch], True = padding (MoELayer's orientation at the router): the last positions of each sequence."""
    mask = torch.zeros(TOKENS, BATCH, dtype=torch.bool)
    mask[-padded_positions:, :] = True
    return mask


def dropless_hybridep(router):
    """Dev's dropless-hybridep masking after top-k routing (megatron/core/transformer/moe/router.py:832-844 at
    d48bd6be0a85): padded rows get zero probs and leave the routing map. 0.19.2 has no such step, so the test
    puts it after 0.19.2's own routing."""
    original = router.routing

    def routing(logits, padding_mask=None):
        probs, routing_map = original(logits, padding_mask=padding_mask)
        if padding_mask is not None:
            valid = (~padding_mask.reshape(-1)).unsqueeze(-1)
            probs, routing_map = probs * valid, routing_map & valid
        return probs, routing_map

    router.routing = routing
    return router


@pytest.mark.long
def test_padding_rows_are_padding_not_drops(cpu_megatron):
    """megatron-core 0.19.2's real TopKRouter with a padding mask, dropless: 0.19.2 still routes the padded
    rows (they are padding slots of the expert input); dev's dropless hybridep zeroes them in the routing map,
    where tokens x k - kept would have called every one of them a drop."""
    torch = cpu_megatron
    mask = padding_mask(torch)
    n, n_pad = TOKENS * BATCH, int(mask.sum())
    valid = n - n_pad
    router, counter = make_router(expert_bias=False), instrument.RouterCounter()
    counter.attach(router)
    _, routing_map = router(tokens(torch), mask)
    t = counter.totals()
    assert int(routing_map.sum()) == n * TOPK  # 0.19.2 routes padding rows too
    assert t["routed_tokens"] == valid * TOPK and t["dropped_tokens"] == 0
    assert t["padding_rows"] == n_pad and t["padded_tokens"] == n_pad * TOPK
    assert sum(t["tokens_per_expert"]) == valid * TOPK
    r = counter.report()
    assert r["token_drop_fraction"] == 0.0 and r["padding_fraction"] == pytest.approx(n_pad / n)

    router, counter = dropless_hybridep(make_router(expert_bias=False)), instrument.RouterCounter()
    counter.attach(router)
    _, routing_map = router(tokens(torch), mask)
    assert n * TOPK - int(routing_map.sum()) == n_pad * TOPK  # the old formula: every padded slot a "drop"
    t = counter.totals()
    assert t["dropped_tokens"] == 0 and t["padded_tokens"] == 0 and t["padding_rows"] == n_pad
    assert t["routed_tokens"] == valid * TOPK == sum(t["tokens_per_expert"])
    assert counter.report()["token_drop_fraction"] == 0.0


@pytest.mark.long
def test_capacity_drops_count_only_real_rows(cpu_megatron):
    torch = cpu_megatron
    mask = padding_mask(torch)
    router, counter = make_router(capacity_factor=0.5, expert_bias=False), instrument.RouterCounter()
    counter.attach(router)
    x = tokens(torch, 3)
    _, routing_map = router(x, mask)
    real = ~mask.reshape(-1).unsqueeze(-1)
    before = pre_drop_map(router, x) & real
    t = counter.totals()
    assert t["tokens_per_expert"] == (routing_map & real).sum(0).tolist()
    assert t["dropped_tokens"] == int(before.sum() - (routing_map & real).sum()) > 0
    assert t["routed_tokens"] == int(real.sum()) * TOPK


@pytest.mark.long
def test_dispatcher_drops_are_not_measured_as_zero(cpu_megatron):
    """--moe-expert-rank-capacity-factor with hybridep / ncclep drops inside the dispatcher, after the router:
    the drop is None with the reason, never 0. With alltoall the factor is not applied and drops are counted."""
    torch = cpu_megatron
    for backend, measured in (("hybridep", False), ("ncclep", False), ("deepep", True)):
        router, counter = make_router(), instrument.RouterCounter()
        cfg = router.config
        cfg.moe_token_dispatcher_type, cfg.moe_flex_dispatcher_backend = "flex", backend
        cfg.moe_expert_rank_capacity_factor = 1.5
        counter.attach(router)
        router(tokens(torch))
        r = counter.report()
        assert (r["token_drop_fraction"] == 0.0) is measured, backend
        assert (r["dropped_tokens"] is None) is not measured
        assert measured or "after the router" in r["token_drop_unmeasured"]


@pytest.mark.long
def test_ep_receive_per_dispatch_is_summed_over_the_ep_group(cpu_megatron):
    """Two EP ranks (EP=2: experts 0-3 on rank 0, 4-7 on rank 1), each routing its own tokens through the same
    layer: the receive of EP rank j in dispatch d is the sum over both senders of their rows for j's experts.
    Five dispatches, two kept by the sampler (indices 0 and 4); EP rank 0 reports, rank 1 does not."""
    torch = cpu_megatron
    ranks = []
    for seed in (0, 1):
        router = make_router(seed=0)  # one layer: the same weights on both ranks
        router.config.expert_model_parallel_size = 2
        counter = instrument.RouterCounter(sample_capacity=2)
        counter.attach(router)
        maps = [router(tokens(torch, 10 * seed + d))[1] for d in range(5)]
        ranks.append((counter, maps))
    total = ranks[0][0].ep_buffer() + ranks[1][0].ep_buffer()  # what all_reduce(SUM) over the group gives
    ranks[0][0].take_reduced(total.clone(), writer=True)
    ranks[1][0].take_reduced(total.clone(), writer=False)
    half = EXPERTS // 2
    receive = [
        [sum(int(maps[d][:, j * half : (j + 1) * half].sum()) for _, maps in ranks) for j in range(2)] for d in (0, 4)
    ]
    per_expert = [sum(int(m[:, e].sum()) for _, maps in ranks for m in maps) for e in range(EXPERTS)]
    (layer,) = ranks[0][0].report()["ep_load"]
    assert layer["dispatches"] == 5 and layer["ep_size"] == 2 and layer["layer"] == "1"
    assert layer["hot_rank_tokens"] == [max(r) for r in receive]
    assert layer["hot_rank_share"] == pytest.approx([max(r) / sum(r) for r in receive])
    assert layer["hot_rank"] == [r.index(max(r)) for r in receive]
    assert layer["hot_expert"] == per_expert.index(max(per_expert))
    assert layer["hot_expert_ratio"] == pytest.approx(max(per_expert) / (sum(per_expert) / EXPERTS))
    assert "ep_load" not in ranks[1][0].report()


def test_sampler_keeps_a_bounded_deterministic_subset():
    from orchestrator.job.expert_load import DispatchSamples

    s = DispatchSamples(capacity=4)
    for d in range(100):
        s.add(d)
    assert [i for i, _ in s.kept] == [0, 32, 64, 96] and s.stride == 32 and s.seen == 100
    assert all(len(DispatchSamples(capacity=c).kept) <= c for c in (1, 2, 3))


@pytest.mark.long
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


@pytest.mark.long
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


@pytest.mark.long
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


@pytest.mark.long
def test_window_end_reduces_the_ep_samples_once(cpu_megatron, monkeypatch):
    """install() wraps train_step; after the last measured step (outside the timed steps) the samples are
    reduced: a single process is its own EP group, so its report carries ep_load from its own routing maps."""
    torch = cpu_megatron
    from megatron.training import training

    router = make_router()
    maps = []
    monkeypatch.setattr(training, "train_step", lambda: maps.append(router(tokens(torch, len(maps)))[1]))
    counter = instrument.RouterCounter.for_window(warmup=1, measure=2).install()
    try:
        counter.attach(router)
        for i in range(4):
            training.train_step()
            assert ("ep_load" in counter.report()) == (i >= 2)  # iteration 2 is the last measured one
    finally:
        counter.uninstall()
    (layer,) = counter.report()["ep_load"]
    assert layer["dispatches"] == 2  # iterations 1 and 2 of 0..3
    assert layer["hot_rank_tokens"] == [int(m.sum()) for m in maps[1:3]]  # EP = 1: the one rank gets all
    assert layer["hot_rank_share"] == [1.0, 1.0]


@pytest.mark.long
def test_megatron_run_writes_sidecar(cpu_megatron, tmp_path):
    """runpy an entry script with patched argv; the sidecar carries the router counts of its run."""
    entry = tmp_path / "entry_script.py"
    entry.write_text(
        textwrap.dedent(f"""
        import json, sys
        import torch
        from tests.job.test_router_hook import make_router
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
    assert "gpu_total_memory_bytes" not in side  # nor a device to state its memory
    assert 0 < side["token_drop_fraction"] < 1 and side["hot_expert_ratio"] >= 1.0
    assert str(tmp_path) not in sys.path


def test_the_sidecar_states_the_devices_total_memory(monkeypatch):
    """On a GPU the sidecar records torch.cuda.get_device_properties(<this rank's device>).total_memory: what
    the sweep plans with instead of hardware.hbm_gb. Asked only once CUDA is initialised (not at a bare exit)."""
    import types

    import torch

    asked: list[int] = []

    def props(device):
        asked.append(device)
        return types.SimpleNamespace(total_memory=150_110_011_392)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert instrument.device_memory() == {} and asked == []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    assert instrument.device_memory() == {"gpu_total_memory_bytes": 150_110_011_392} and asked == [3]


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
        "import sys, orchestrator.job.instrument, orchestrator.job.megatron_run; "
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


@pytest.mark.long
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
    code = f"import sys\nfrom orchestrator.job import megatron_run\nsys.exit({run})"
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
