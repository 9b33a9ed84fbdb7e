"""What each --recompute-modules and --offload-modules value covers, in one table.

Why one table: the memory model needs the activation tensors a module frees, the FLOP model the forward
work it repeats in backward, the step-time model whether the MoE dispatch runs again, and the rules the
set of values Megatron accepts. Written once here, they cannot drift apart.

Tensor names are memory.block_activation_elems keys; FLOP pieces are flops.BlockFlops fields. The module
meanings follow Megatron dev's TransformerConfig.recompute_modules docstring
(megatron/core/transformer/transformer_config.py:598-620): "mlp" is the dense MLP only (MoE layers never
set recompute_mlp, transformer_layer.py:536-538), "moe" checkpoints the whole MoE layer (router, dispatch,
experts with their activation, shared expert: moe/moe_layer.py:250-254).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

FULL = "full"  # --recompute-granularity full: every layer rebuilt from its checkpointed input
# Full recompute as argv.py emits it: --recompute-method uniform --recompute-num-layers 1, so Megatron keeps
# the input of every layer (megatron/core/recompute.py:147-156 at dev d48bd6be0a85). On the hybrid stack every
# pattern symbol is a layer (megatron/core/models/hybrid/hybrid_block.py:617-618, and :952-953 runs full
# recompute through that checkpointed_forward), so a V4 block (attention symbol + MoE symbol) keeps
# LAYERS_PER_BLOCK / FULL_RECOMPUTE_NUM_LAYERS inputs, each the n-stream mHC tensor.
FULL_RECOMPUTE_NUM_LAYERS = 1
LAYERS_PER_BLOCK = 2
FULL_INPUTS_PER_BLOCK = LAYERS_PER_BLOCK // FULL_RECOMPUTE_NUM_LAYERS


@dataclass(frozen=True)
class Coverage:
    """One module's reach: what it stops keeping and what it runs again."""

    drops: frozenset[str]  # activation tensors not kept for backward
    repeats: frozenset[str] = frozenset()  # forward FLOP pieces run again in backward (offload: none)
    redispatch: bool = False  # the MoE all-to-all runs again with the recomputed forward


def _c(drops: Iterable[str], repeats: Iterable[str] = (), redispatch: bool = False) -> Coverage:
    return Coverage(frozenset(drops), frozenset(repeats), redispatch)


# Selective recompute (dev TC:2197 choices; "full" is the granularity, FULL above).
RECOMPUTE: dict[str, Coverage] = {
    "core_attn": _c({"core_attn"}, {"attn"}),
    "moe_act": _c({"moe_act"}, {"act"}),
    "layernorm": _c({"attn_norm", "mlp_norm"}, {"norm"}),
    "mla_up_proj": _c({"q_up"}, {"q_up"}),
    "mlp": _c({"mlp"}, {"mlp"}),
    "moe": _c(
        {"router", "moe_input", "expert_fc1", "moe_act", "expert_fc2", "shared"},
        {"router", "expert", "shared", "act"},
        redispatch=True,
    ),
    "shared_experts": _c({"shared"}, {"shared"}),
    "mhc": _c({"mhc"}, {"mhc"}),
    "gdn": _c(()),  # GatedDeltaNet modules: a V4 block has none, so they free and repeat nothing here
    "gdn_norm_out": _c(()),
}
# Fine-grained activation offload: the tensors go to host memory; nothing is recomputed.
OFFLOAD: dict[str, Coverage] = {
    "attn_norm": _c({"attn_norm"}),
    "qkv_linear": _c({"q_up", "kv"}),
    "core_attn": _c({"core_attn"}),
    "attn_proj": _c({"attn_proj"}),
    "mlp_norm": _c({"mlp_norm"}),
    "expert_fc1": _c({"expert_fc1"}),
    "moe_act": _c({"moe_act"}),
    "fused_group_mlp": _c({"expert_fc1", "moe_act", "expert_fc2"}),
}
RECOMPUTE_MODULES = frozenset(RECOMPUTE) | {FULL}  # every value --recompute-modules / the knob accepts
OFFLOAD_MODULES = frozenset(OFFLOAD)
# FLOP pieces in a fixed order, so a sum over a set of them is the same float on every run.
PIECES = ("attn", "q_up", "mhc", "router", "expert", "shared", "act", "mlp", "norm")


_NOTHING = _c(())  # an unknown module (the rules reject it) covers nothing


def dropped(recompute: Iterable[str], offload: Iterable[str]) -> frozenset[str]:
    """Activation tensors a selective recompute set and an offload set leave out (FULL is handled apart)."""
    return frozenset().union(
        *(RECOMPUTE.get(mod, _NOTHING).drops for mod in recompute),
        *(OFFLOAD.get(mod, _NOTHING).drops for mod in offload),
    )


def repeated(recompute: Iterable[str]) -> tuple[str, ...]:
    """FLOP pieces a selective recompute set runs again, in PIECES order (each once however many modules
    cover it: "moe" with "moe_act" repeats the activation once)."""
    pieces = frozenset().union(*(RECOMPUTE.get(mod, _NOTHING).repeats for mod in recompute))
    return tuple(p for p in PIECES if p in pieces)


def redispatches(recompute: Iterable[str]) -> bool:
    """Whether the recomputed forward sends the MoE tokens again (full recompute or the moe module)."""
    return any(mod == FULL or RECOMPUTE.get(mod, _NOTHING).redispatch for mod in recompute)
