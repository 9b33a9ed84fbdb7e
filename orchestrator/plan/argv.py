"""A candidate's Megatron-LM command line (flags only, no program name), and reading it back.

Why one module: the real job and the twin workload must see the same flags, and the twin must read
its layout from them exactly as Megatron would. Every flag emitted is listed in FLAGS with the branch
that accepts it: "main" = megatron-core 0.19.2 / main's parser accepts flag and value (tests run the
real parser), "dev" = needs Megatron's dev branch (the only code that trains DeepSeek-V4: CSA/HCA
attention, mHC, hash routing, packed-THD CP). DEV_ONLY_FLAGS is the dev set.

Choices (see megatron-facts.md):
- The pipeline split is the hybrid layer pattern with '|' (pretrain_hybrid.py); VPP = segments / PP.
  Never --pipeline-model-parallel-layout, the VPP layer flags or account-for flags: Megatron rejects
  them together with a pattern. --num-layers is set to the pattern's layer-symbol count, the value
  Megatron derives, so it does not warn.
- --timing-log-level 1: level 2 adds per-microbatch forward/backward timers, and every timer start and
  stop calls torch.cuda.synchronize(), which would perturb the pipeline we are timing.
- --log-interval 1 and --log-memory-interval 1 (a multiple of it): every step's time and memory line.
- --logging-level 20: timers are logged at INFO; the DSv3 examples' 40 hides them.
- Stage attention backend "cudnn" (the packed V4 path): --attention-backend fused (TE's cuDNN fused
  attention) plus --dsa-kernel-backend cudnn for the sparse CSA/HCA kernels.
- fp8 stage precision: --fp8-format e4m3 --fp8-recipe blockwise (DeepSeek-style 128x128, Hopper-capable).
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from orchestrator.knobs import KNOB, KNOBS
from orchestrator.plan.layout import Layout
from orchestrator.schema import ModelConfig, StageConfig

MAIN, DEV = "main", "dev"

# flag -> (branch, value type); bool = store_true, list = one or more values.
FLAGS: dict[str, tuple[str, type]] = {
    # parallel
    "--tensor-model-parallel-size": (MAIN, int),
    "--pipeline-model-parallel-size": (MAIN, int),
    "--context-parallel-size": (MAIN, int),
    "--expert-model-parallel-size": (MAIN, int),
    "--expert-tensor-parallel-size": (MAIN, int),
    "--sequence-parallel": (MAIN, bool),
    "--use-tp-pp-dp-mapping": (MAIN, bool),
    # batch
    "--micro-batch-size": (MAIN, int),
    "--global-batch-size": (MAIN, int),
    "--seq-length": (MAIN, int),
    "--max-position-embeddings": (MAIN, int),
    # model structure
    "--num-layers": (MAIN, int),
    "--hidden-size": (MAIN, int),
    "--ffn-hidden-size": (MAIN, int),
    "--num-attention-heads": (MAIN, int),
    "--kv-channels": (MAIN, int),
    "--normalization": (MAIN, str),
    "--swiglu": (MAIN, bool),
    "--disable-bias-linear": (MAIN, bool),
    "--untie-embeddings-and-output-weights": (MAIN, bool),
    "--position-embedding-type": (MAIN, str),
    "--hybrid-layer-pattern": (MAIN, str),  # the flag is main; V4's C/H/W symbols need dev
    "--mtp-num-layers": (MAIN, int),
    "--spec": (DEV, list),  # flag exists on main; hybrid_dsv4_stack_spec only on dev
    # MLA / V4 attention
    "--multi-latent-attention": (MAIN, bool),
    "--q-lora-rank": (MAIN, int),
    "--kv-lora-rank": (MAIN, int),
    "--qk-pos-emb-head-dim": (MAIN, int),
    "--v-head-dim": (MAIN, int),
    "--qk-layernorm": (MAIN, bool),
    "--o-groups": (DEV, int),
    "--o-lora-rank": (DEV, int),
    "--experimental-attention-variant": (DEV, str),  # main accepts only gated_delta_net|dsa, not dsv4_hybrid
    "--csa-window-size": (DEV, int),
    "--csa-compress-ratios": (DEV, str),
    "--dsa-indexer-n-heads": (MAIN, int),
    "--dsa-indexer-head-dim": (MAIN, int),
    "--dsa-indexer-topk": (MAIN, int),
    "--enable-hyper-connections": (DEV, bool),
    "--num-residual-streams": (DEV, int),
    "--use-fused-mhc": (DEV, bool),
    # MoE
    "--num-experts": (MAIN, int),
    "--moe-router-topk": (MAIN, int),
    "--moe-ffn-hidden-size": (MAIN, int),
    "--moe-shared-expert-intermediate-size": (MAIN, int),
    "--moe-grouped-gemm": (MAIN, bool),
    "--moe-token-dispatcher-type": (MAIN, str),
    "--moe-flex-dispatcher-backend": (MAIN, str),
    "--moe-expert-capacity-factor": (MAIN, float),
    "--moe-router-load-balancing-type": (MAIN, str),
    "--moe-aux-loss-coeff": (MAIN, float),
    "--moe-router-score-function": (MAIN, str),
    "--moe-router-enable-expert-bias": (MAIN, bool),
    "--moe-router-dtype": (MAIN, str),
    "--moe-n-hash-layers": (DEV, int),
    # recompute / offload
    "--recompute-granularity": (MAIN, str),
    "--recompute-method": (MAIN, str),
    "--recompute-num-layers": (MAIN, int),
    "--recompute-modules": (MAIN, list),  # "mhc" is a dev value (0.19.2's TransformerConfig rejects it)
    "--fine-grained-activation-offloading": (MAIN, bool),
    "--offload-modules": (MAIN, list),
    # optimizer / precision / kernels
    "--optimizer": (MAIN, str),
    "--use-distributed-optimizer": (MAIN, bool),
    "--bf16": (MAIN, bool),
    "--fp8-format": (MAIN, str),
    "--fp8-recipe": (MAIN, str),
    "--attention-backend": (MAIN, str),
    "--dsa-kernel-backend": (MAIN, str),
    "--transformer-impl": (MAIN, str),
    "--deterministic-mode": (MAIN, bool),
    # data
    "--mock-data": (MAIN, bool),
    "--tokenizer-type": (MAIN, str),
    "--vocab-size": (MAIN, int),
    # context parallel and packed (THD) input
    "--cp-comm-type": (MAIN, list),
    "--cp-partition-mode": (DEV, str),
    "--sequence-packing-scheduler": (DEV, str),
    "--max-seqlen-per-dp-cp-rank": (MAIN, int),
    "--calculate-per-token-loss": (MAIN, bool),
    "--use-varlen-dataset": (DEV, bool),
    "--varlen-mock-dataset-config-json": (DEV, str),
    # run length and logging
    "--train-iters": (MAIN, int),
    "--eval-iters": (MAIN, int),
    "--log-interval": (MAIN, int),
    "--log-throughput": (MAIN, bool),
    "--timing-log-level": (MAIN, int),
    "--timing-log-option": (MAIN, str),
    "--log-memory-interval": (MAIN, int),
    "--logging-level": (MAIN, int),
}
DEV_ONLY_FLAGS = frozenset(f for f, (branch, _) in FLAGS.items() if branch == DEV)
# Dev-only because of the value emitted, though main's parser knows the flag.
DEV_VALUE_FLAGS = frozenset({"--spec", "--experimental-attention-variant"})
# Main flags whose values can hold dev-only parts: V4 pattern symbols, the mhc recompute module.
DEV_VALUES = {"--hybrid-layer-pattern": "C/H/W symbols", "--recompute-modules": "mhc"}
DEV_PATTERN_SYMBOLS = frozenset("CHW")  # CSA (ratio 4), HCA (128), window-only (0): dev hybrid symbols
DSV4_SPEC = ("megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_dsv4_stack_spec")
ATTENTION_BACKENDS = {  # stage.attention_backend -> flags
    "cudnn": ("--attention-backend", "fused", "--dsa-kernel-backend", "cudnn"),
    "fused": ("--attention-backend", "fused"),
    "flash": ("--attention-backend", "flash"),
    "unfused": ("--attention-backend", "unfused"),
    "auto": ("--attention-backend", "auto"),
}
TIMING_LOG_LEVEL = 1
PIPE, MTP_SEPARATOR = "|", "/"


def pattern_segments(pattern: str) -> int:
    """Pipeline segments in a hybrid pattern: '|'-separated pieces of the part before the first '/'."""
    return pattern.split(MTP_SEPARATOR)[0].count(PIPE) + 1


def pattern_layers(pattern: str) -> int:
    """Layer symbols in the main pattern: what Megatron derives num_layers from."""
    return sum(ch not in f"{PIPE} " for ch in pattern.split(MTP_SEPARATOR)[0])


class _Argv:
    """Collects flags; refuses any flag not in FLAGS so every emitted flag has a known branch."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, flag: str, *values: object) -> None:
        if flag not in FLAGS:
            raise KeyError(f"{flag} is not in argv.FLAGS: add it with its branch (main/dev)")
        self.items.append(flag)
        self.items.extend(str(v) for v in values)


def _knob(a: _Argv, layout: Layout, name: str) -> None:
    """A knob carried by one flag (its first in the registry): a number or a word is written as the flag's
    value, a switch only when True, an optional value only when set (absent = Megatron's default)."""
    k, value = KNOB[name], getattr(layout, name)
    if value is True:
        a.add(k.flags[0])
    elif value is not None and value is not False:
        a.add(k.flags[0], k.base(value))


def _parallel(a: _Argv, layout: Layout) -> None:
    _knob(a, layout, "tp")
    _knob(a, layout, "pp")
    _knob(a, layout, "cp")
    _knob(a, layout, "ep")
    _knob(a, layout, "etp")
    if layout.tp > 1:
        a.add("--sequence-parallel")  # MoE with attention-TP > 1 and no SP fails in training
    _knob(a, layout, "use_tp_pp_dp_mapping")


def _model(a: _Argv, model: ModelConfig, layer_pattern: str) -> None:
    dsv4 = model.attention_variant == "dsv4_hybrid"
    a.add("--num-layers", pattern_layers(layer_pattern))
    a.add("--hidden-size", model.hidden_size)
    a.add("--ffn-hidden-size", model.ffn_hidden_size)
    a.add("--num-attention-heads", model.num_attention_heads)
    a.add("--kv-channels", model.kv_channels)
    for flag in ("--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights"):
        a.add(flag)
    a.add("--normalization", "RMSNorm")
    a.add("--position-embedding-type", "rope")
    a.add("--hybrid-layer-pattern", layer_pattern)
    if model.mtp_num_layers:
        a.add("--mtp-num-layers", model.mtp_num_layers)
    a.add("--multi-latent-attention")
    a.add("--q-lora-rank", model.q_lora_rank)
    if not dsv4:  # dev derives kv_lora_rank (and qk_head_dim) from v_head_dim - qk_pos_emb_head_dim
        a.add("--kv-lora-rank", model.kv_lora_rank)
    a.add("--qk-pos-emb-head-dim", model.qk_pos_emb_head_dim)
    a.add("--v-head-dim", model.v_head_dim)
    a.add("--qk-layernorm")
    if dsv4:
        a.add("--spec", *DSV4_SPEC)
        a.add("--experimental-attention-variant", "dsv4_hybrid")
        a.add("--o-groups", model.o_groups)
        a.add("--o-lora-rank", model.o_lora_rank)
        a.add("--csa-window-size", model.csa_window_size)
        a.add("--csa-compress-ratios", "[" + ",".join(str(r) for r in model.csa_compress_ratios) + "]")
    a.add("--dsa-indexer-n-heads", model.dsa_indexer_heads)
    a.add("--dsa-indexer-head-dim", model.dsa_indexer_head_dim)
    a.add("--dsa-indexer-topk", model.dsa_indexer_topk)
    if model.hyper_connection_streams and model.hyper_connection_streams > 1:
        a.add("--enable-hyper-connections")
        a.add("--num-residual-streams", model.hyper_connection_streams)
        a.add("--use-fused-mhc")


def _moe(a: _Argv, model: ModelConfig, layout: Layout) -> None:
    a.add("--num-experts", model.num_experts)
    a.add("--moe-router-topk", model.moe_router_topk)
    a.add("--moe-ffn-hidden-size", model.moe_ffn_hidden_size)
    if model.moe_shared_expert_intermediate_size:
        a.add("--moe-shared-expert-intermediate-size", model.moe_shared_expert_intermediate_size)
    a.add("--moe-grouped-gemm")
    _knob(a, layout, "dispatcher")
    if layout.dispatcher == "flex":
        if not layout.flex_backend:
            raise ValueError("dispatcher flex needs flex_backend (deepep | hybridep | ncclep)")
        _knob(a, layout, "flex_backend")  # never the deprecated --moe-enable-deepep
    _knob(a, layout, "capacity_factor")
    a.add("--moe-router-load-balancing-type", "seq_aux_loss")
    a.add("--moe-aux-loss-coeff", "0.0001")
    a.add("--moe-router-score-function", "sqrtsoftplus")
    a.add("--moe-router-enable-expert-bias")
    a.add("--moe-router-dtype", "fp32")
    if getattr(model, "moe_n_hash_layers", 0):
        a.add("--moe-n-hash-layers", model.moe_n_hash_layers)


def _memory(a: _Argv, layout: Layout) -> None:
    if layout.recompute == ("full",):
        a.add("--recompute-granularity", "full")
        a.add("--recompute-method", "uniform")
        a.add("--recompute-num-layers", 1)
    elif "full" in layout.recompute:
        raise ValueError(f"full recompute cannot be combined with modules: {layout.recompute}")
    elif layout.recompute:
        a.add("--recompute-granularity", "selective")
        a.add("--recompute-modules", *layout.recompute)
    if layout.offload:
        a.add("--fine-grained-activation-offloading")
        a.add("--offload-modules", *layout.offload)


def _cp(a: _Argv, stage: StageConfig, layout: Layout, mock_data: bool) -> None:
    if layout.cp <= 1:
        return
    a.add("--cp-comm-type", "p2p")
    a.add("--cp-partition-mode", stage.cp_partition_mode)  # dsv4_hybrid with CP requires contiguous
    if stage.packed_sequences:  # contiguous CP needs THD input from the packing scheduler
        a.add("--sequence-packing-scheduler", "dp_balanced")
        a.add("--max-seqlen-per-dp-cp-rank", stage.seq_length // layout.cp)
        a.add("--calculate-per-token-loss")
        a.add("--use-varlen-dataset")
        if mock_data:
            s = stage.seq_length
            cfg = {
                "mode": "distribution",
                "type": "lognormal",
                "format": "thd",
                "min_seq_len": s,
                "max_seq_len": s,
                "mean_seq_len": s,
                "lognormal_sigma": 1.1,
            }
            a.add("--varlen-mock-dataset-config-json", json.dumps(cfg, separators=(",", ":")))


def megatron_argv(
    model: ModelConfig,
    stage: StageConfig,
    layout: Layout,
    *,
    layer_pattern: str,
    train_iters: int,
    mock_data: bool = True,
    extra: Iterable[str] = (),
) -> list[str]:
    """Megatron flags for one candidate. model: ModelConfig, stage: StageConfig (orchestrator.schema).

    layer_pattern is the hybrid pattern with '|' between PP x VPP segments (orchestrator.plan.pipeline).
    `extra` is appended last (argparse: a later flag wins).
    """
    segments = pattern_segments(layer_pattern)
    if segments != layout.pp * layout.vpp:
        raise ValueError(f"pattern has {segments} segments, layout needs PP x VPP = {layout.pp * layout.vpp}")
    a = _Argv()
    _parallel(a, layout)
    _knob(a, layout, "mbs")
    a.add("--global-batch-size", stage.global_batch)
    a.add("--seq-length", stage.seq_length)
    a.add("--max-position-embeddings", stage.seq_length)
    _model(a, model, layer_pattern)
    _moe(a, model, layout)
    _memory(a, layout)
    a.add("--optimizer", model.optimizer)
    if stage.use_distributed_optimizer:
        a.add("--use-distributed-optimizer")
    a.add("--bf16")
    if stage.precision == "fp8":
        a.add("--fp8-format", "e4m3")
        a.add("--fp8-recipe", "blockwise")
    if stage.attention_backend not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {stage.attention_backend!r}: {sorted(ATTENTION_BACKENDS)}")
    backend = ATTENTION_BACKENDS[stage.attention_backend]
    for flag, value in zip(backend[::2], backend[1::2]):
        a.add(flag, value)
    a.add("--transformer-impl", "transformer_engine" if stage.transformer_engine else "local")
    if stage.deterministic_mode:
        a.add("--deterministic-mode")
    if mock_data:
        a.add("--mock-data")
        a.add("--tokenizer-type", "NullTokenizer")
        a.add("--vocab-size", model.vocab_size)
    _cp(a, stage, layout, mock_data)
    written = set(a.items)
    for k in KNOBS:  # a plain knob no section above places (a new one in the registry): its flag, here
        if k.name not in _READ and k.flags[0] not in written:
            _knob(a, layout, k.name)
    a.add("--train-iters", train_iters)
    a.add("--eval-iters", 0)
    a.add("--log-interval", 1)
    a.add("--log-throughput")
    a.add("--timing-log-level", TIMING_LOG_LEVEL)
    a.add("--timing-log-option", "minmax")
    a.add("--log-memory-interval", 1)
    a.add("--logging-level", 20)
    return a.items + [str(x) for x in extra]


def branch_of(flag: str) -> str:
    """'main' or 'dev' for a flag this module emits."""
    return FLAGS[flag][0]


def split_dev(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(main argv, dev-only flags) : drop each dev-only flag with its values. For checking an argv
    against a main/PyPI parser."""
    keep, dropped, skipping = [], [], False
    for tok in argv:
        if tok.startswith("--"):
            skipping = tok in DEV_ONLY_FLAGS
            if skipping:
                dropped.append(tok)
                continue
        if not skipping:
            keep.append(tok)
    return keep, dropped


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag, (_, kind) in FLAGS.items():
        if kind is bool:
            p.add_argument(flag, action="store_true")
        elif kind is list:
            p.add_argument(flag, nargs="+")
        else:
            p.add_argument(flag, type=kind)
    return p


def parse_flags(argv: Sequence[str]) -> dict[str, object]:
    """Flags keyed by argparse dest (tensor_model_parallel_size ...). Those in FLAGS are typed, and
    absent ones are None (False for switches). Others (e.g. extra_args such as
    --moe-router-force-load-balancing) are kept untyped: no value -> True, one -> str, more -> list."""
    ns, rest = _parser().parse_known_args(list(argv))
    out = vars(ns)
    name, values = None, []
    for tok in [*rest, "--"]:
        if tok.startswith("--"):
            if name:
                out[name] = True if not values else values[0] if len(values) == 1 else list(values)
            name, _, value = tok[2:].partition("=")
            name, values = name.replace("-", "_"), [value] if value else []
        elif name:
            values.append(tok)
    return out


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


Flags = dict[str, Any]  # parse_flags' answer


def _vpp(f: Flags, kw: dict[str, Any]) -> int:
    pattern = f["hybrid_layer_pattern"]
    return max(pattern_segments(pattern) // kw["pp"], 1) if pattern else 1


def _recompute(f: Flags, kw: dict[str, Any]) -> tuple[str, ...]:
    if f["recompute_granularity"] == "full":
        return ("full",)
    if f["recompute_granularity"] == "selective":
        return tuple(f["recompute_modules"] or ("core_attn",))  # Megatron's default module
    return ()


def _offload(f: Flags, kw: dict[str, Any]) -> tuple[str, ...]:
    return tuple(f["offload_modules"] or ()) if f["fine_grained_activation_offloading"] else ()


def _flex_backend(f: Flags, kw: dict[str, Any]) -> str | None:
    return (f["moe_flex_dispatcher_backend"] or "deepep") if kw["dispatcher"] == "flex" else None


# The knobs Megatron does not read as one flag's value (absent = the Layout default): f(flags, knobs read so far)
_READ: dict[str, Callable[[Flags, dict[str, Any]], Any]] = {
    "vpp": _vpp,
    "etp": lambda f, kw: f["expert_tensor_parallel_size"] or kw["tp"],  # None -> TP, as Megatron
    "recompute": _recompute,
    "offload": _offload,
    "dispatcher": lambda f, kw: f["moe_token_dispatcher_type"] or "allgather",  # Megatron's default
    "flex_backend": _flex_backend,
}


def layout_from_argv(argv: Sequence[str]) -> Layout:
    """Read a Layout back from Megatron flags (the inverse of megatron_argv's layout part): every knob of the
    registry, from its flag with Megatron's default when absent (_READ where Megatron reads it otherwise)."""
    f = parse_flags(argv)
    kw: dict[str, Any] = {}
    for k in KNOBS:  # registry order: pp before vpp, tp before etp, dispatcher before flex_backend
        if k.name in _READ:
            kw[k.name] = _READ[k.name](f, kw)
        else:
            value = f[_dest(k.flags[0])]
            kw[k.name] = bool(value) if k.base is bool else k.default if value is None else value
    return Layout(**kw)


def shell_join(argv: Sequence[str], multiline: bool = False) -> str:
    """Copy-pasteable shell text (quotes the pattern's '|' and the JSON); multiline puts each flag and
    its values on its own line, joined with backslash-newline."""
    if not multiline:
        return shlex.join(list(argv))
    lines: list[list[str]] = []
    for tok in argv:
        if tok.startswith("--") or not lines:
            lines.append([])
        lines[-1].append(tok)
    return " \\\n".join(shlex.join(line) for line in lines)
