"""In-process evidence for real Megatron jobs: router token counts inside the measurement window.

Why a hook: Megatron's console shows only the aux losses (the router records nothing else to the log), yet
the guide asks for token drop and padding, the per-expert receive distribution (hot experts) and the hot
EP rank per dispatch of the measured steps.

How it counts (Megatron file:line at dev d48bd6be0a85):
- Window: megatron.training.training.train_step is wrapped (train() looks the name up at call time),
  so the counter knows the iteration number; it counts only during iterations
  [warmup, warmup + measure) of this process. If that wrapper cannot be installed (another trainer),
  every iteration is counted and the sidecar says window.counting = "all".
- Router: each TopKRouter gets a forward hook at construction (TopKRouter.__init__ is wrapped before the
  model is built). It sees the router's inputs (hidden states, padding mask: MoELayer calls
  router(hidden_states, padding_mask, ...), megatron/core/transformer/moe/moe_layer.py:463-465) and its
  output (probs, routing_map) after capacity dropping and padding. Per call:
  routed = real (unpadded) rows x topk (top-k routing picks k experts per token);
  kept = routing_map entries on real rows (with --moe-pad-expert-input-to-capacity: those with non-zero
  prob); dropped = routed - kept; padded = expert-input slots that are padding: capacity padding, plus
  the padding rows the dispatcher still sends (dropless hybridep zeroes them in the routing map,
  megatron/core/transformer/moe/router.py:832-844; other dispatchers route them); padding_rows = rows the
  mask marks as padding. Padding is never counted as a drop.
- Drops the router cannot see: --moe-expert-rank-capacity-factor with the hybridep or ncclep dispatcher
  drops tokens inside the dispatcher, after the router. For those the drop fraction is None ("not
  measured") with the reason in `token_drop_unmeasured`, never 0.
- Per-dispatch EP load: orchestrator.job.expert_load (sampled per layer, reduced over the EP group once the window
  has ended, outside the timed steps).
- Activation recompute re-runs the router inside backward; those calls are skipped
  (torch._C._current_graph_task_id() != -1), so each microbatch counts once.
- Counts stay on the device and are summed there: no host sync per layer, so the hook does not
  perturb the step time being measured. CUDA-graph-captured routers do not run Python hooks.

This module imports torch and megatron only inside functions: jobs/ must import on a bare Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.stats import percentile
from orchestrator.job.expert_load import DispatchSamples, layer_summary

DISPATCHER_DROPS = ("hybridep", "ncclep")  # flex backends that apply --moe-expert-rank-capacity-factor


def router_summary(tokens_per_expert: Sequence[int], routed: int, dropped: int | None, padded: int) -> dict[str, Any]:
    """JobResult's MoE evidence from raw counts. Padding fraction = padded slots / expert input slots;
    dropped None = not measured (the drop fraction is None too)."""
    kept = sum(tokens_per_expert)
    mean = kept / len(tokens_per_expert) if tokens_per_expert else 0.0
    return {
        "token_drop_fraction": dropped / routed if routed and dropped is not None else None,
        "padding_fraction": padded / (kept + padded) if kept + padded else None,
        "expert_load_p50": percentile(tokens_per_expert, 50),
        "expert_load_p95": percentile(tokens_per_expert, 95),
        "expert_load_p99": percentile(tokens_per_expert, 99),
        "hot_expert_ratio": max(tokens_per_expert) / mean if mean else None,
    }


def unmeasured_drops(config: Any) -> str | None:
    """Why this router's token drop cannot be measured here, or None."""
    factor = getattr(config, "moe_expert_rank_capacity_factor", None)
    backend = getattr(config, "moe_flex_dispatcher_backend", None)
    if factor is None or getattr(config, "moe_token_dispatcher_type", None) != "flex":
        return None
    if backend not in DISPATCHER_DROPS:
        return None
    return (
        f"not measured: --moe-expert-rank-capacity-factor {factor} with the {backend} dispatcher drops tokens "
        "inside the dispatcher, after the router"
    )


@dataclass
class Window:
    """Iterations [warmup, warmup + measure) of this process are measured. Until begin() is first
    called (nobody drives the window) or with warmup/measure None, every call is measured."""

    warmup: int | None = None
    measure: int | None = None
    iteration: int = -1  # index of the train_step running now (-1: none started)
    in_step: bool = False

    def begin(self) -> None:
        self.iteration += 1
        self.in_step = True

    def end(self) -> None:
        self.in_step = False

    @property
    def driven(self) -> bool:
        return self.iteration >= 0

    @property
    def active(self) -> bool:
        if self.warmup is None or self.measure is None or not self.driven:
            return True
        return self.in_step and self.warmup <= self.iteration < self.warmup + self.measure

    @property
    def just_ended(self) -> bool:
        """The last measured train_step has just returned."""
        if self.warmup is None or self.measure is None:
            return False
        return not self.in_step and self.iteration == self.warmup + self.measure - 1

    @property
    def measured(self) -> int | None:
        """Measured iterations so far; None when nothing drives the window (count unknown)."""
        if not self.driven:
            return None
        if self.warmup is None or self.measure is None:
            return self.iteration + 1
        return max(0, min(self.iteration + 1, self.warmup + self.measure) - self.warmup)


@dataclass
class _Router:
    """One router's (one MoE layer's) counts; tensors stay on its device until the report."""

    label: str  # Megatron's layer number ("mtp-<n>" for an MTP layer's router)
    ep: int  # expert-parallel size: EP rank j owns experts [j E/EP, (j + 1) E/EP)
    kept: Any = None  # [E] token assignments of real rows
    received: Any = None  # [E] every row dispatched to each expert
    routed: Any = 0  # real rows x topk
    padded: Any = 0  # expert-input slots that are padding
    padding_rows: Any = 0  # rows the padding mask marks
    calls: int = 0
    samples: DispatchSamples = field(default_factory=DispatchSamples)


def _padding_mask(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The router's padding mask (True = padding), positional (MoELayer) or by keyword."""
    return args[1] if len(args) > 1 else kwargs.get("padding_mask")


@dataclass
class RouterCounter:
    """Counts router assignments inside the window. install() hooks megatron-core; attach(router)
    hooks one existing router (tests)."""

    window: Window = field(default_factory=Window)
    sample_capacity: int = 64  # sampled dispatches per layer (orchestrator.job.expert_load)
    _routers: dict[int, _Router] = field(default_factory=dict)  # id(router) -> its counts, first call first
    _unmeasured: str | None = None
    _ep_load: list[dict[str, Any]] | None = None  # reduced per-layer summaries (finish_window)
    _ep_writer: bool = True
    _handles: list[Any] = field(default_factory=list)
    _undo: list[tuple[Any, str, Any]] = field(default_factory=list)

    @classmethod
    def for_window(cls, warmup: int, measure: int) -> RouterCounter:
        return cls(window=Window(warmup=warmup, measure=measure))

    # -- hooks ------------------------------------------------------------------------------
    def hook(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        """Forward hook body: add this call's counts (on device)."""
        import torch

        if not self.window.active or torch._C._current_graph_task_id() != -1:
            return  # outside the window, or a recompute inside backward
        probs, routing_map = output[0], output[1]
        if routing_map.dim() != 2 or routing_map.dtype != torch.bool:
            return  # inference router returns indices; not a training step
        r = self._router(module, routing_map.shape[1])
        pad = bool(getattr(module.config, "moe_pad_expert_input_to_capacity", False))
        real = routing_map & (probs != 0) if pad else routing_map
        padded = (routing_map & ~real).sum(dtype=torch.int64)
        mask = _padding_mask(args, kwargs)
        rows = routing_map.shape[0]
        if mask is not None:
            pad_rows = mask.reshape(-1).to(torch.bool).unsqueeze(-1)
            padded = padded + (real & pad_rows).sum(dtype=torch.int64)
            real = real & ~pad_rows
            n_pad = pad_rows.sum(dtype=torch.int64)
            r.padding_rows = r.padding_rows + n_pad
            r.routed = r.routed + (rows - n_pad) * int(module.topk)
        else:
            r.routed = r.routed + rows * int(module.topk)
        kept = real.sum(dim=0, dtype=torch.int64)
        received = routing_map.sum(dim=0, dtype=torch.int64)
        r.kept = kept if r.kept is None else r.kept + kept
        r.received = received if r.received is None else r.received + received
        r.padded = r.padded + padded
        r.calls += 1
        if received.numel() % r.ep == 0:
            r.samples.add(received.view(r.ep, -1).sum(dim=1))
        self._unmeasured = self._unmeasured or unmeasured_drops(module.config)

    def _router(self, module: Any, experts: int) -> _Router:
        key = id(module)
        if key not in self._routers:
            number = getattr(module, "layer_number", None)
            mtp = bool(getattr(module, "is_mtp_layer", False))
            ep = int(getattr(module.config, "expert_model_parallel_size", 1) or 1)
            self._routers[key] = _Router(
                label=f"mtp-{number}" if mtp else str(number),
                ep=ep if experts % ep == 0 else 1,
                samples=DispatchSamples(capacity=self.sample_capacity),
            )
        return self._routers[key]

    def attach(self, router: Any) -> None:
        self._handles.append(router.register_forward_hook(self.hook, with_kwargs=True))

    def install(self) -> RouterCounter:
        """Hook every TopKRouter built from now on, and wrap train_step for the window (and its end)."""
        from megatron.core.transformer.moe import router as router_mod

        cls = router_mod.TopKRouter
        original_init = cls.__init__
        counter = self

        def init_and_hook(router_self: Any, *args: Any, **kwargs: Any) -> None:
            original_init(router_self, *args, **kwargs)
            counter.attach(router_self)

        self._patch(cls, "__init__", init_and_hook)
        try:
            from megatron.training import training as training_mod
        except Exception:  # noqa: BLE001 - another trainer: count every iteration
            return self
        original_step = training_mod.train_step

        def train_step(*args: Any, **kwargs: Any) -> Any:
            counter.window.begin()
            try:
                return original_step(*args, **kwargs)
            finally:
                counter.window.end()
                if counter.window.just_ended:  # outside the timed steps: one collective per EP group
                    counter.finish_window()

        self._patch(training_mod, "train_step", train_step)
        return self

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for owner, name, value in reversed(self._undo):
            setattr(owner, name, value)
        self._undo.clear()

    # -- the EP reduction at the end of the window --------------------------------------------
    def ep_buffer(self) -> Any:
        """This rank's sampled per-EP-rank rows and per-expert rows of every router, as one int64 tensor
        (the same layout on every rank of the EP group), or None without routers."""
        import torch

        parts: list[Any] = []
        for r in self._routers.values():
            parts.extend(t for _, t in r.samples.kept)
            if r.received is not None:
                parts.append(r.received)
        return torch.cat([p.reshape(-1) for p in parts]) if parts else None

    def take_reduced(self, buffer: Any, *, writer: bool = True) -> None:
        """Read the EP-group sum of ep_buffer() back into per-layer summaries (one host copy)."""
        values, at = buffer.tolist(), 0
        load = []
        for r in self._routers.values():
            receive = []
            for _ in r.samples.kept:
                receive.append(values[at : at + r.ep])
                at += r.ep
            experts = values[at : at + r.received.numel()] if r.received is not None else []
            at += len(experts)
            load.append(layer_summary(r.label, receive, experts, r.samples.seen))
        self._ep_load, self._ep_writer = load, writer

    def finish_window(self, all_reduce: Callable[[Any], None] | None = None) -> None:
        """Sum the samples over the EP group (torch.distributed over Megatron's expert-model-parallel group;
        a single process is its own group) and keep the per-layer summaries; EP rank 0 reports them."""
        buffer = self.ep_buffer()
        if buffer is None:
            return
        writer = True
        if all_reduce is not None:
            all_reduce(buffer)
        else:
            import torch.distributed as dist
            from megatron.core import parallel_state

            if dist.is_available() and dist.is_initialized() and parallel_state.model_parallel_is_initialized():
                writer = parallel_state.get_expert_model_parallel_rank() == 0
                dist.all_reduce(buffer, group=parallel_state.get_expert_model_parallel_group())
        self.take_reduced(buffer, writer=writer)

    # -- results ------------------------------------------------------------------------------
    def totals(self) -> dict[str, Any]:
        """Counts summed over routers (MoE layers incl. MTP) and measured microbatches; one host sync."""
        routers = list(self._routers.values())
        per_router = [r.kept.tolist() for r in routers if r.kept is not None]
        experts = max((len(c) for c in per_router), default=0)
        tokens = [sum(c[i] for c in per_router) for i in range(experts)]
        routed = sum(int(r.routed) for r in routers)
        return {
            "tokens_per_expert": tokens,
            "routed_tokens": routed,
            "dropped_tokens": None if self._unmeasured else routed - sum(tokens),
            "padded_tokens": sum(int(r.padded) for r in routers),
            "padding_rows": sum(int(r.padding_rows) for r in routers),
            "moe_layers": len(routers),
            "microbatches": max((r.calls for r in routers), default=0),
        }

    def report(self) -> dict[str, Any]:
        t = self.totals()
        summary = (
            router_summary(t["tokens_per_expert"], t["routed_tokens"], t["dropped_tokens"], t["padded_tokens"])
            if t["tokens_per_expert"]
            else {}
        )
        window = {
            "warmup_iters": self.window.warmup,
            "measure_iters": self.window.measured,
            "measure_iters_requested": self.window.measure,
            "iterations_seen": self.window.iteration + 1,
            "counting": "window" if self.window.driven else "all",
        }
        doc: dict[str, Any] = {"window": window, **t, **summary}
        if self._unmeasured:
            doc["token_drop_unmeasured"] = self._unmeasured
        if self._ep_load is not None and self._ep_writer:
            doc["ep_load"] = self._ep_load
        return doc


def peak_memory_mb() -> dict[str, float | None]:
    """This process's CUDA allocator peaks (MB = 2**20 bytes, as Megatron's memory line); None on CPU."""
    try:
        import torch
    except ImportError:
        return {"peak_allocated_mb": None, "peak_reserved_mb": None}
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {"peak_allocated_mb": None, "peak_reserved_mb": None}
    mb = 1024.0 * 1024.0
    return {
        "peak_allocated_mb": round(torch.cuda.max_memory_allocated() / mb, 2),
        "peak_reserved_mb": round(torch.cuda.max_memory_reserved() / mb, 2),
    }


def device_memory() -> dict[str, int]:
    """What this rank's GPU holds, `torch.cuda.get_device_properties(device).total_memory` (bytes), for the
    sidecar: the sweep plans with it instead of hardware.hbm_gb (orchestrator.sweep.capacity). Empty on CPU or
    before CUDA was initialised (asking then would initialise it at exit)."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    return {"gpu_total_memory_bytes": int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)}
