"""The measured winner as a Megatron-Bridge recipe override: its layout and recipe knobs as Bridge spells them.

Why: NVIDIA publishes its DeepSeek-V4 recipes in Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge
src/megatron/bridge/recipes/deepseek/h100/deepseek_v4.py:61 `deepseek_v4_flash_pretrain_32gpu_h100_bf16_config`,
which sets `cfg.model.tensor_model_parallel_size` ... `cfg.train.micro_batch_size`, lines 72-129). A team that
trains there wants the winner as an override of that recipe, not as Megatron-LM flags. Bridge's ConfigContainer
(src/megatron/bridge/training/config.py:962) holds the sections: `model` (the model provider, a Megatron Core
TransformerConfig), `train`, `dataset`, `ddp`, `dist`; `scripts/training/run_recipe.py` takes `section.field=VALUE`
overrides (examples/models/deepseek_v4/slurm_pretrain.sh:176-196 passes the layout so) and the examples'
`--config-file` YAML is merged into the recipe with OmegaConf (pretrain_nemotron_3_nano.py:73-79).

The source is the winner's Megatron flags as its job ran them (`best --flags`, one owner of layout -> flags:
orchestrator/plan/argv.py); FIELDS maps each flag to its Bridge field, named as the Megatron Core dataclass field
the flag sets (Megatron-LM's arguments.py writes `--foo-bar` into `foo_bar`). A layout knob the flags leave out is
written as its off value (no recompute: `recompute_granularity: null`), so the recipe's own choice (the V4 recipe
recomputes `moe_act` and `mhc`) does not replace what was measured. tests/report/test_bridge.py checks every path
against Bridge's config classes (their dataclass fields, read with ast from the Bridge source and the Megatron-LM
commit it pins: neither imports on a CPU without triton).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from orchestrator.core.knobs import Layout

_ABSENT = object()  # a flag whose absence leaves the recipe's value alone


@dataclass(frozen=True)
class Field:
    """One Megatron flag and the Bridge ConfigContainer field it becomes."""

    flag: str
    path: str  # "<section>.<field>" in Bridge's ConfigContainer
    kind: type  # int, float, str, bool (a switch), list (the flag's values)
    absent: Any = _ABSENT  # the value when the flag is not given; _ABSENT: not written


FIELDS: tuple[Field, ...] = (
    # the layout (orchestrator.core.knobs), every one written: the measurement ran with exactly these
    Field("--tensor-model-parallel-size", "model.tensor_model_parallel_size", int, 1),
    Field("--sequence-parallel", "model.sequence_parallel", bool, False),
    Field("--pipeline-model-parallel-size", "model.pipeline_model_parallel_size", int, 1),
    Field("--context-parallel-size", "model.context_parallel_size", int, 1),
    Field("--cp-comm-type", "model.cp_comm_type", str),
    Field("--max-seqlen-per-dp-cp-rank", "model.max_seqlen_per_dp_cp_rank", int),
    Field("--expert-model-parallel-size", "model.expert_model_parallel_size", int, 1),
    Field("--expert-tensor-parallel-size", "model.expert_tensor_parallel_size", int, 1),
    Field("--recompute-granularity", "model.recompute_granularity", str, None),
    Field("--recompute-method", "model.recompute_method", str, None),
    Field("--recompute-num-layers", "model.recompute_num_layers", int, None),
    Field("--recompute-modules", "model.recompute_modules", list, None),
    Field("--fine-grained-activation-offloading", "model.fine_grained_activation_offloading", bool, False),
    Field("--offload-modules", "model.offload_modules", list, None),
    Field("--moe-token-dispatcher-type", "model.moe_token_dispatcher_type", str, "alltoall"),
    # training/flex_dispatcher_backend.py:83-84 sets the pair; its validation (line 88) reads them back
    Field("--moe-flex-dispatcher-backend", "model.moe_flex_dispatcher_backend", str, None),
    Field("--moe-expert-capacity-factor", "model.moe_expert_capacity_factor", float, None),
    Field("--moe-expert-rank-capacity-factor", "model.moe_expert_rank_capacity_factor", float, None),
    Field("--use-tp-pp-dp-mapping", "dist.use_tp_pp_dp_mapping", bool, False),
    Field("--micro-batch-size", "train.micro_batch_size", int),
    # the recipe's batch and length (run_recipe.py: "the selected dataset owns the sequence length")
    Field("--global-batch-size", "train.global_batch_size", int),
    Field("--seq-length", "model.seq_length", int),
    Field("--seq-length", "dataset.seq_length", int),
    # the recipe's performance switches the measurement ran with (off when it ran without)
    Field("--moe-grouped-gemm", "model.moe_grouped_gemm", bool, False),
    Field("--moe-permute-fusion", "model.moe_permute_fusion", bool, False),
    Field("--moe-router-fusion", "model.moe_router_fusion", bool, False),
    Field("--use-fused-mhc", "model.use_fused_mhc", bool, False),
    Field("--cross-entropy-loss-fusion", "model.cross_entropy_loss_fusion", bool, False),
    Field("--cross-entropy-fusion-impl", "model.cross_entropy_fusion_impl", str),
    Field("--moe-router-dtype", "model.moe_router_dtype", str),
    Field("--use-distributed-optimizer", "ddp.use_distributed_optimizer", bool, False),
    Field("--overlap-grad-reduce", "ddp.overlap_grad_reduce", bool, False),
    Field("--overlap-param-gather", "ddp.overlap_param_gather", bool, False),
    Field("--manual-gc", "train.manual_gc", bool, False),
    Field("--manual-gc-interval", "train.manual_gc_interval", int),
)
VPP_PATH = "model.virtual_pipeline_model_parallel_size"  # from the layout: the flags carry VPP in the pattern
PATHS: tuple[str, ...] = (*dict.fromkeys(f.path for f in FIELDS), VPP_PATH)
RECIPE = "deepseek_v4_flash_pretrain_config"  # recipes/deepseek/deepseek_v4.py: the H100 BF16 pre-training recipe


def parse_flags(argv: Sequence[str]) -> dict[str, list[str]]:
    """`--flag v1 v2` -> {"--flag": ["v1", "v2"]}; a switch maps to []; a repeated flag keeps its last values."""
    out: dict[str, list[str]] = {}
    flag = None
    for tok in argv:
        if tok.startswith("--"):
            flag = tok
            out[flag] = []
        elif flag is not None:
            out[flag].append(tok)
    return out


def _value(f: Field, given: list[str]) -> Any:
    if f.kind is bool:
        return True
    if f.kind is list:
        return list(given)
    if not given:
        raise ValueError(f"{f.flag} has no value in the winner's flags")
    return f.kind(given[0])


def override(argv: Sequence[str], layout: Layout) -> dict[str, dict[str, Any]]:
    """{section: {field: value}} for Bridge: the winner's flags through FIELDS, VPP from its layout."""
    flags = parse_flags(argv)
    out: dict[str, dict[str, Any]] = {}
    for f in FIELDS:
        if f.flag in flags:
            value = _value(f, flags[f.flag])
        elif f.absent is not _ABSENT:
            value = f.absent
        else:
            continue
        section, name = f.path.split(".", 1)
        out.setdefault(section, {})[name] = value
    section, name = VPP_PATH.split(".", 1)
    out.setdefault(section, {})[name] = layout.vpp if layout.vpp > 1 else None
    return out


def dotted(values: dict[str, dict[str, Any]]) -> list[str]:
    """The same override as run_recipe.py's trailing `section.field=VALUE` arguments."""

    def text(v: Any) -> str:
        if isinstance(v, list):
            return "[" + ",".join(str(x) for x in v) + "]"
        if v is None:
            return "null"
        return str(v).lower() if isinstance(v, bool) else str(v)

    return [f"{sec}.{k}={text(v)}" for sec, fields in values.items() for k, v in fields.items()]


def render(values: dict[str, dict[str, Any]], *, header: Sequence[str]) -> str:
    """The override file: comment lines (where it came from, how to use it), then the YAML sections."""
    lines = [f"# {h}" for h in header]
    lines.append(f"# run_recipe.py --recipe {RECIPE} " + " ".join(dotted(values)))
    return "\n".join(lines) + "\n" + yaml.safe_dump(values, sort_keys=False, default_flow_style=False)
