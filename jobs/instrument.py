"""In-process evidence for real Megatron jobs: router token counts inside the measurement window.

Why a hook: Megatron's console shows only aux losses, never tokens per expert or drops
(megatron-facts.md §3), yet the guide asks for the drop fraction, padding and the per-expert receive
distribution (hot experts) of the measured steps.

How it counts (choices):
- Window: megatron.training.training.train_step is wrapped (train() looks the name up at call time),
  so the counter knows the iteration number; it counts only during iterations
  [warmup, warmup + measure) of this process. If that wrapper cannot be installed (another trainer),
  every iteration is counted and the sidecar says window.counting = "all".
- Router: each TopKRouter gets a forward hook at construction (TopKRouter.__init__ is wrapped before
  the model is built). Its output (probs, routing_map) is after capacity dropping and padding, so:
  routed = tokens x topk (top-k routing always picks k experts per token), kept = real assignments in
  routing_map (with --moe-pad-expert-input-to-capacity: those with non-zero prob), padded = the other
  routing_map entries, dropped = routed - kept.
- Activation recompute re-runs the router inside backward; those calls are skipped
  (torch._C._current_graph_task_id() != -1), so each microbatch counts once.
- Counts stay on the device and are summed there: no host sync per layer, so the hook does not
  perturb the step time being measured. CUDA-graph-captured routers do not run Python hooks.

This module imports torch and megatron only inside functions: jobs/ must import on a bare Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def router_summary(tokens_per_expert: Sequence[int], routed: int, dropped: int, padded: int) -> dict[str, Any]:
    """JobResult's MoE evidence from raw counts. Padding fraction = padded slots / expert input slots."""
    kept = sum(tokens_per_expert)
    mean = kept / len(tokens_per_expert) if tokens_per_expert else 0.0
    return {
        "token_drop_fraction": dropped / routed if routed else None,
        "padding_fraction": padded / (kept + padded) if kept + padded else None,
        "expert_load_p50": percentile(tokens_per_expert, 50),
        "expert_load_p95": percentile(tokens_per_expert, 95),
        "expert_load_p99": percentile(tokens_per_expert, 99),
        "hot_expert_ratio": max(tokens_per_expert) / mean if mean else None,
    }


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
    def measured(self) -> int | None:
        """Measured iterations so far; None when nothing drives the window (count unknown)."""
        if not self.driven:
            return None
        if self.warmup is None or self.measure is None:
            return self.iteration + 1
        return max(0, min(self.iteration + 1, self.warmup + self.measure) - self.warmup)


@dataclass
class RouterCounter:
    """Counts router assignments inside the window. install() hooks megatron-core; attach(router)
    hooks one existing router (tests)."""

    window: Window = field(default_factory=Window)
    _kept: dict[int, Any] = field(default_factory=dict)  # router id -> device tensor [E]
    _padded: dict[int, Any] = field(default_factory=dict)
    _routed: int = 0
    _calls: dict[int, int] = field(default_factory=dict)
    _handles: list[Any] = field(default_factory=list)
    _undo: list[tuple[Any, str, Any]] = field(default_factory=list)

    @classmethod
    def for_window(cls, warmup: int, measure: int) -> RouterCounter:
        return cls(window=Window(warmup=warmup, measure=measure))

    # -- hooks ------------------------------------------------------------------------------
    def hook(self, module, inputs, output) -> None:
        """Forward hook body: add this call's per-expert kept counts (on device), padding, routed."""
        import torch

        if not self.window.active or torch._C._current_graph_task_id() != -1:
            return  # outside the window, or a recompute inside backward
        probs, routing_map = output[0], output[1]
        if routing_map.dim() != 2 or routing_map.dtype != torch.bool:
            return  # inference router returns indices; not a training step
        key = id(module)
        pad = bool(getattr(module.config, "moe_pad_expert_input_to_capacity", False))
        real = routing_map & (probs != 0) if pad else routing_map
        kept = real.sum(dim=0, dtype=torch.int64)
        self._kept[key] = kept if key not in self._kept else self._kept[key] + kept
        if pad:
            padded = (routing_map & ~real).sum(dtype=torch.int64)
            self._padded[key] = padded if key not in self._padded else self._padded[key] + padded
        self._routed += routing_map.shape[0] * int(module.topk)
        self._calls[key] = self._calls.get(key, 0) + 1

    def attach(self, router) -> None:
        self._handles.append(router.register_forward_hook(self.hook))

    def install(self) -> RouterCounter:
        """Hook every TopKRouter built from now on, and wrap train_step for the window."""
        from megatron.core.transformer.moe import router as router_mod

        cls = router_mod.TopKRouter
        original_init = cls.__init__
        counter = self

        def init_and_hook(router_self, *args, **kwargs):
            original_init(router_self, *args, **kwargs)
            counter.attach(router_self)

        self._patch(cls, "__init__", init_and_hook)
        try:
            from megatron.training import training as training_mod
        except Exception:  # noqa: BLE001 - another trainer: count every iteration
            return self
        original_step = training_mod.train_step

        def train_step(*args, **kwargs):
            counter.window.begin()
            try:
                return original_step(*args, **kwargs)
            finally:
                counter.window.end()

        self._patch(training_mod, "train_step", train_step)
        return self

    def _patch(self, owner, name: str, value) -> None:
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for owner, name, value in reversed(self._undo):
            setattr(owner, name, value)
        self._undo.clear()

    # -- results ------------------------------------------------------------------------------
    def totals(self) -> dict[str, Any]:
        """Counts summed over routers (MoE layers incl. MTP) and measured microbatches; one host sync."""
        per_router = [t.tolist() for t in self._kept.values()]
        experts = max((len(c) for c in per_router), default=0)
        tokens = [sum(c[i] for c in per_router) for i in range(experts)]
        padded = int(sum(int(t) for t in self._padded.values()))
        kept = sum(tokens)
        microbatches = max(self._calls.values(), default=0)
        return {
            "tokens_per_expert": tokens,
            "routed_tokens": self._routed,
            "dropped_tokens": self._routed - kept,
            "padded_tokens": padded,
            "moe_layers": len(self._calls),
            "microbatches": microbatches,
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
        return {"window": window, **t, **summary}


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
