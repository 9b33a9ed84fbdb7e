"""Legality rules for a layout, as data.

Why data: every rejection must name the rule, its one-line reason and where it comes from (Megatron's own
file:line, or the public paper a model follows: A = megatron/training/arguments.py, TC =
megatron/core/transformer/transformer_config.py, MPC = megatron/core/model_parallel_config.py, PS =
megatron/core/parallel_state.py, SCH = megatron/core/pipeline_parallel/schedules.py; "dev X:L" = Megatron-LM
dev at orchestrator.core.megatron.TESTED_COMMIT, "main X:L" = main at d98e8a64dd), and the planner must check
cheap rules before costly ones. Each Rule says which Layout fields it reads (`needs`), so the planner checks it once per
combination of those fields, and which `phase` it belongs to:

- "layout":  reads only the knobs, the groups (D_a, D_e, m) and the stage/model/hardware.
- "pattern": also reads the pipeline split (blocks per segment) and the HybridModel layer pattern.
- "argv":    reads the generated Megatron flags (we never emit the forbidden ones; this proves it). `needs`
             names the knobs that decide argv.py's flags in question (tests/plan/test_rules.py checks it).
- "memory":  reads the predicted heaviest-rank memory; checked last, only for survivors.

A rule that a known Megatron fix removes names it (`lifted_by`): it holds until preflight finds the fix in the
cluster's checkout (orchestrator.job.preflight reads the checkout's code for the fixed behaviour), and the sweep
then passes its id in `stage.lifted_rules` (evidence: the preflight event in the ledger). `active(stage)` is the
rule set a stage is planned and checked with.

A predicate returns True when the rule is VIOLATED; predicates of later phases return False while their
input is missing (None), so `violations()` is defined on any Ctx.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from orchestrator.core.knobs import OPTIM_DTYPES
from orchestrator.core.megatron import TESTED
from orchestrator.core.schema import HardwareConfig, ModelConfig, StageConfig
from orchestrator.plan import recompute
from orchestrator.plan.flags import flag_value
from orchestrator.plan.flops import has_precision
from orchestrator.plan.layout import Groups, Layout, groups
from orchestrator.plan.params import d_window, is_v4
from orchestrator.plan.pipeline import moe_layers_through

PHASES: tuple[str, ...] = ("layout", "pattern", "argv", "memory")

# Recompute modules (dev TC:2197, + "full" = --recompute-granularity full) and offload modules: recompute.py's.
RECOMPUTE_MODULES = recompute.RECOMPUTE_MODULES
OFFLOAD_MODULES = recompute.OFFLOAD_MODULES
DISPATCHERS = frozenset({"alltoall", "allgather", "flex"})
ATTENTION_BACKENDS = frozenset({"cudnn", "fused", "flash", "unfused", "auto"})  # what argv.py can emit
FLEX_BACKENDS = frozenset({"deepep", "hybridep", "ncclep"})
# Flags the hybrid '|' pattern path forbids (dev A:838-876) and flags we must never emit.
PATTERN_FORBIDDEN_FLAGS = (
    "--pipeline-model-parallel-layout",
    "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank",
    "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
)
DYNAMIC_CP_FLAGS = ("--dynamic-context-parallel", "--hybrid-context-parallel")

_GROUPS_DA = ("tp", "pp", "cp")
_GROUPS_DE = ("pp", "ep", "etp")
_GROUPS_M = ("tp", "pp", "cp", "mbs")


@dataclass
class Ctx:
    """Everything a rule may read about one (possibly partially bound) candidate."""

    model: ModelConfig
    stage: StageConfig
    hw: HardwareConfig
    layout: Layout
    blocks: int  # Transformer blocks to split over PP x VPP segments (params.effective_layers)
    split: tuple[int, ...] | None = None  # blocks per pipeline segment (pattern phase)
    pattern: str | None = None  # HybridModel layer pattern with '|' (pattern phase)
    argv: tuple[str, ...] | None = None  # generated Megatron flags (argv phase)
    memory_gb: float | None = None  # heaviest rank's predicted peak, GB (memory phase)
    moe_grouped_gemm: bool = True  # argv.py always passes --moe-grouped-gemm

    @cached_property
    def groups(self) -> Groups:
        return groups(self.layout, self.stage.gpus, self.stage.global_batch)

    @cached_property
    def flags(self) -> frozenset[str]:
        """Names of the flags in argv ('--x=1' counts as '--x'); empty without argv."""
        return frozenset(a.split("=", 1)[0] for a in (self.argv or ()) if a.startswith("--"))

    @property
    def d_a(self) -> int | None:
        return self.groups.d_a

    @property
    def d_e(self) -> int | None:
        return self.groups.d_e

    @property
    def m(self) -> int | None:
        return self.groups.m


@dataclass(frozen=True)
class Rule:
    """One legality rule. predicate(ctx) is True when the candidate VIOLATES the rule."""

    id: str
    reason: str
    source: str
    predicate: Callable[[Ctx], bool] = field(compare=False, repr=False)
    needs: tuple[str, ...] = ()  # Layout fields the predicate reads (beyond stage/model/hardware)
    phase: str = "layout"
    lifted_by: str = ""  # the Megatron fix that removes this rule (preflight detects it in the checkout)

    def violated(self, ctx: Ctx) -> bool:
        return bool(self.predicate(ctx))


def _flex(lay: Layout, *backends: str) -> bool:
    return lay.dispatcher == "flex" and lay.flex_backend in backends


def _has_flag(ctx: Ctx, flags: Sequence[str]) -> bool:
    return ctx.argv is not None and not ctx.flags.isdisjoint(flags)


def _hash_layers_wrong(c: Ctx) -> bool:
    """--moe-n-hash-layers (a hybrid layer number) does not reach exactly the model's n-th MoE layer."""
    pattern, value = flag_value(c.argv or (), "--hybrid-layer-pattern"), flag_value(c.argv or (), HASH_FLAG)
    return bool(pattern) and moe_layers_through(pattern or "", int(value or 0)) != c.model.moe_n_hash_layers


CAPACITY_LB_TYPES = frozenset({"aux_loss", "seq_aux_loss", "global_aux_loss", "none"})
PAD_FLAG, HASH_FLAG = "--moe-pad-expert-input-to-capacity", "--moe-n-hash-layers"
EP_OVERLAP_FLAG = "--overlap-moe-expert-parallel-comm"


def _mnnvl(ctx: Ctx) -> bool:
    return ctx.hw.gpus_per_nvlink_domain > ctx.stage.gpus_per_node


def _vpp_group(ctx: Ctx) -> int:
    return ctx.layout.pp  # --microbatch-group-size-per-virtual-pipeline-stage defaults to PP (dev MPC:426)


V4 = f"{TESTED} DSv4 path (dsv4_hybrid)"
# The v4.* rules are rules of the V4 attention and its hybrid stack: each reads model.attention_variant (is_v4), so
# a GPT-path model (DeepSeek-V3's MLA, Qwen3's and GPT-OSS's GQA on pretrain_gpt.py) may take TP > 1, core_attn
# recompute, a --pipeline-model-parallel-layout and CP without packed input where Megatron allows them.
FULL_RECOMPUTE_HASH_MHC = "v4.full_recompute_hash_mhc"
PR_6704 = "Megatron-LM PR #6704 (Fix full recompute for hybrid mHC and MTP layers)"


def _full_recompute_drops_input_ids(c: Ctx) -> bool:
    """Full recompute on a model whose hash-routed MoE layers sit inside mHC wrappers."""
    m = c.model
    return "full" in c.layout.recompute and m.moe_n_hash_layers > 0 and (m.hyper_connection_streams or 0) > 1


# Not a legality rule (no Megatron check behind it): the planner's own cut of a fine-grained offload that is not
# needed. Offload changes one step term only, steptime's "offload" (the host copies beyond the compute they run
# under, >= 0, and the bubble that stage time stretches; factors are >= 0), so a layout with offload is never
# predicted faster than the same layout without it: a dominated layout, kept only where that sibling is over HBM or
# illegal. A stage may then search offload without doubling the layouts that fit anyway (planner.plan applies it).
OFFLOAD_NOT_NEEDED = Rule(
    "plan.offload_not_needed",
    "activation offload is kept only where the same layout without it does not fit (or is illegal): offload buys "
    "memory, never step time",
    "orchestrator/plan/planner.py (_offload_where_needed); offload modules: dev megatron/core/transformer/"
    "transformer_config.py:2403-2426",
    lambda c: False,
    ("offload",),
    "plan",
)

RULES: tuple[Rule, ...] = (
    # ---- V4 path (Megatron-LM dev's DeepSeek-V4 implementation) ----
    Rule(
        "v4.tp1_with_te",
        "V4 hybrid attention (dsv4_hybrid) needs TP=1 and Transformer Engine",
        f"{V4}; dev TC:1743-1790",
        lambda c: c.model.attention_variant == "dsv4_hybrid" and (c.layout.tp != 1 or not c.stage.transformer_engine),
        ("tp",),
    ),
    Rule(
        "v4.cp_needs_packed_thd",
        "CP>1 on the V4 path needs packed THD input (stage.packed_sequences)",
        f"{V4}; dev TC:1566",
        lambda c: is_v4(c.model) and c.layout.cp > 1 and not c.stage.packed_sequences,
        ("cp",),
    ),
    Rule(
        "v4.packed_needs_cudnn",
        "the packed THD path needs the cuDNN attention backend",
        f"{V4}; dev TC:3796-3808",
        lambda c: is_v4(c.model) and c.stage.packed_sequences and c.stage.attention_backend != "cudnn",
    ),
    Rule(
        "mcore.attention_backend_known",
        "stage.attention_backend must be cudnn (the packed V4 path), fused, flash, unfused or auto",
        "dev megatron/core/transformer/enums.py:51-58 (AttnBackend); "
        "megatron/core/models/common/language_module/language_module.py:108-142",
        lambda c: c.stage.attention_backend not in ATTENTION_BACKENDS,
    ),
    Rule(
        "v4.cp_contiguous",
        "dsv4_hybrid with CP>1 needs --cp-partition-mode contiguous",
        f"{V4}; dev TC:1612",
        lambda c: is_v4(c.model) and c.layout.cp > 1 and c.stage.cp_partition_mode != "contiguous",
        ("cp",),
    ),
    Rule(
        "v4.no_deterministic_packed",
        "the packed path has no deterministic mode",
        V4,
        lambda c: is_v4(c.model) and c.stage.packed_sequences and c.stage.deterministic_mode,
    ),
    Rule(
        "v4.static_cp_only",
        "the V4 path supports only static CP (no dynamic/hybrid CP flags)",
        V4,
        lambda c: _has_flag(c, DYNAMIC_CP_FLAGS),
        ("cp",),
        "argv",
    ),
    Rule(
        "v4.no_core_attn_recompute",
        "core_attn recompute is not supported on the V4 path",
        V4,
        lambda c: is_v4(c.model) and "core_attn" in c.layout.recompute,
        ("recompute",),
    ),
    Rule(
        "v4.no_qkv_linear_offload",
        "qkv_linear offload is not supported on the V4 path",
        V4,
        lambda c: is_v4(c.model) and "qkv_linear" in c.layout.offload,
        ("offload",),
    ),
    Rule(
        "v4.cp_d_window",
        "each CP rank needs local rows S/CP >= D_window for the CSA boundary exchange",
        "dev csa_utils/cp_utils.py:136,191-202 (CSA boundary exchange across CP ranks)",
        lambda c: (
            c.model.attention_variant == "dsv4_hybrid"
            and c.layout.cp > 1
            and c.stage.seq_length // c.layout.cp < d_window(c.model)
        ),
        ("cp",),
    ),
    Rule(
        "v4.pattern_segments",
        "the '|' layer pattern must hold every block in exactly PP x VPP segments",
        "dev A:884-897 (segments % PP == 0, VPP = segments / PP)",
        lambda c: (
            c.split is not None
            and (
                len(c.split) != c.layout.pp * c.layout.vpp
                or sum(c.split) != c.blocks
                or (c.pattern is not None and c.pattern.count("|") + 1 != c.layout.pp * c.layout.vpp)
            )
        ),
        ("pp", "vpp"),
        "pattern",
    ),
    Rule(
        "v4.pattern_excludes_layout_flags",
        "the hybrid '|' pattern forbids --pipeline-model-parallel-layout, VPP layer flags and account-for flags",
        "dev A:838-876 (mutually exclusive pipeline-split flags)",
        lambda c: is_v4(c.model) and _has_flag(c, PATTERN_FORBIDDEN_FLAGS),
        ("pp", "vpp"),
        "argv",
    ),
    Rule(
        "v4.no_moe_enable_deepep",
        "--moe-enable-deepep is deprecated: use flex + --moe-flex-dispatcher-backend",
        "dev TC:2018-2027",
        lambda c: _has_flag(c, ("--moe-enable-deepep",)),
        ("dispatcher", "flex_backend"),
        "argv",
    ),
    Rule(
        "v4.mnnvl_needs_hybridep",
        "on a multi-node NVLink (MNNVL) system the flex dispatcher must use hybridep, the only MNNVL backend",
        "dev TC:941-945 (only hybridep supports MNNVL)",
        lambda c: _mnnvl(c) and _flex(c.layout, "deepep", "ncclep"),
        ("dispatcher", "flex_backend"),
    ),
    Rule(
        FULL_RECOMPUTE_HASH_MHC,
        "full recompute crashes with hash-routed layers + mHC: checkpointed_forward sends each "
        "HyperConnectionHybridLayer down its non-TransformerLayer branch, which drops input_ids, and the first "
        "hash-routed MoE layer asserts",
        "dev megatron/core/recompute.py:95-108 (input_ids popped for a non-TransformerLayer); "
        "megatron/core/transformer/moe/router.py:811-815 (hash routing asserts input_ids); "
        "megatron/core/models/hybrid/hybrid_block.py:70,947-959 (the mHC wrapper, HybridStack's full recompute); "
        f"fixed by the unmerged {PR_6704}",
        _full_recompute_drops_input_ids,
        ("recompute",),
        lifted_by=PR_6704,
    ),
    # ---- Megatron grids and batch ----
    Rule(
        "mcore.dense_grid",
        "world size N must be divisible by TP x PP x CP (dense grid)",
        "dev A:457-467; dev PS:732-735",
        lambda c: c.stage.gpus % (c.layout.tp * c.layout.pp * c.layout.cp) != 0,
        _GROUPS_DA,
    ),
    Rule(
        "mcore.expert_grid",
        "world size N must be divisible by ETP x EP x PP (expert grid)",
        "dev PS:782-789",
        lambda c: c.stage.gpus % (c.layout.etp * c.layout.ep * c.layout.pp) != 0,
        _GROUPS_DE,
    ),
    Rule(
        "mcore.experts_div_ep",
        "num_experts E must be divisible by EP",
        "dev A:1711-1717; megatron/core/transformer/moe/moe_layer.py:189",
        lambda c: c.model.num_experts % c.layout.ep != 0,
        ("ep",),
    ),
    Rule(
        "mcore.heads_div_tp",
        "num_attention_heads must be divisible by TP",
        "dev TC:1490",
        lambda c: c.model.num_attention_heads % c.layout.tp != 0,
        ("tp",),
    ),
    Rule(
        "mcore.query_groups_div_tp",
        "GQA: num_query_groups must be a multiple or a divisor of TP",
        "dev TC:1505-1512",
        lambda c: (
            c.model.attention_variant == "gqa"
            and bool(c.model.num_query_groups)
            and (c.model.num_query_groups or 1) % c.layout.tp != 0
            and c.layout.tp % (c.model.num_query_groups or 1) != 0
        ),
        ("tp",),
    ),
    Rule(
        "mcore.precision_on_hardware",
        "the compute precision must be bf16, fp8, fp8_cs or mxfp8, and the part must have it: MXFP8 needs Blackwell "
        "(hardware.peak_mxfp8_tflops); Hopper (H100/H200) runs bf16 and FP8 (blockwise, tensorwise)",
        "dev megatron/core/enums.py:12 (Fp8Recipe); dev megatron/core/fp8_utils.py:772-773 (mxfp8 -> TE's "
        "MXFP8BlockScaling), which TE runs on compute capability 10.0+ only (Transformer Engine docs, 'MXFP8: "
        "Blackwell'); NVIDIA H100/H200 datasheets list FP8, not MXFP8",
        lambda c: not has_precision(c.hw, c.layout.precision),
        ("precision",),
    ),
    Rule(
        "mcore.gbs_div_mbs_dp",
        "B must be divisible by b x D_a and give m >= 1 microbatch",
        "dev megatron/core/num_microbatches_calculator.py:381-391",
        lambda c: c.d_a is not None and c.m is None,
        _GROUPS_M,
    ),
    Rule(
        "mcore.seq_div_2cp",
        "seq_length S must be divisible by 2 x CP",
        "dev A:1424-1428",
        lambda c: c.stage.seq_length % (2 * c.layout.cp) != 0,
        ("cp",),
    ),
    Rule(
        "mcore.tp_pp_dp_mapping",
        "--use-tp-pp-dp-mapping with PP>1 needs expert DP D_e == DP D_a",
        "dev PS:802-806",
        lambda c: (
            c.layout.use_tp_pp_dp_mapping
            and c.layout.pp > 1
            and c.d_a is not None
            and c.d_e is not None
            and c.d_a != c.d_e
        ),
        ("use_tp_pp_dp_mapping", *_GROUPS_DA, *_GROUPS_DE),
    ),
    # ---- Optimizer precision (the `optim` knob: numerics the recipe declares) ----
    Rule(
        "mcore.optim_known",
        "the optimizer precision must be one of knobs.OPTIM_DTYPES (fp32, bf16, bf16_moments): dtypes dev's parser "
        "takes (main grads fp32|bf16, main params fp32|fp16, moments fp32|fp16|bf16|fp8)",
        "dev A:5103-5139 (--main-grads-dtype, --main-params-dtype, --exp-avg-dtype, --exp-avg-sq-dtype choices)",
        lambda c: c.layout.optim not in OPTIM_DTYPES,
        ("optim",),
    ),
    Rule(
        "mcore.precision_aware_needs_adam_distopt",
        "BF16 optimizer state or main grads (--use-precision-aware-optimizer) needs Adam and the distributed optimizer",
        "dev megatron/core/optimizer/optimizer_config.py:519-525",
        lambda c: (
            c.layout.optim != "fp32"
            and (str(c.model.optimizer).lower() != "adam" or not c.stage.use_distributed_optimizer)
        ),
        ("optim",),
    ),
    Rule(
        "mcore.bf16_grads_vs_fp32_accumulation",
        "BF16 main grads cannot be combined with --accumulate-allreduce-grads-in-fp32",
        "dev A:1317-1321",
        lambda c: (
            _has_flag(c, ("--accumulate-allreduce-grads-in-fp32",))
            and OPTIM_DTYPES.get(c.layout.optim, ("fp32",))[0] != "fp32"
        ),
        ("optim",),
        "argv",
    ),
    # ---- Pipeline and VPP ----
    Rule(
        "mcore.vpp_needs_pp",
        "VPP > 1 needs PP > 1",
        "dev PS:739-740",
        lambda c: c.layout.vpp > 1 and c.layout.pp == 1,
        ("pp", "vpp"),
    ),
    Rule(
        "mcore.vpp_group_bounds",
        "interleaved VPP needs PP <= microbatch_group_size (= PP) <= m (config B: m=4 < PP=8)",
        "dev SCH:1254-1262 (interleaved schedule check)",
        lambda c: c.layout.vpp > 1 and c.m is not None and not (c.layout.pp <= _vpp_group(c) <= c.m),
        ("vpp", *_GROUPS_M),
    ),
    Rule(
        "mcore.vpp_group_remainder",
        "interleaved VPP needs m % microbatch_group_size == 0 or >= PP (dependency bubbles)",
        "dev SCH:1264-1274",
        lambda c: (
            c.layout.vpp > 1
            and c.m is not None
            and c.m >= _vpp_group(c)
            and c.m % _vpp_group(c) != 0
            and c.m % _vpp_group(c) < c.layout.pp
        ),
        ("vpp", *_GROUPS_M),
    ),
    Rule(
        "mcore.min_blocks_per_segment",
        "every pipeline segment needs >= 1 block: blocks >= PP x VPP",
        "dev A:884-897; pipeline.split_blocks places >= 1 block per segment",
        lambda c: c.blocks < c.layout.pp * c.layout.vpp,
        ("pp", "vpp"),
    ),
    Rule(
        "mcore.hash_layers_first_segment",
        "hash-routed layers (moe_n_hash_layers) must all sit in the first pipeline segment",
        "dev TC:2878-2899 (stated for the GPT layout; assumed for the hybrid split)",
        lambda c: (
            c.split is not None
            and c.layout.pp > 1
            and c.model.moe_n_hash_layers > 0
            and c.split[0] < c.model.moe_n_hash_layers
        ),
        ("pp", "vpp"),
        "pattern",
    ),
    Rule(
        "mcore.hash_layers_are_layer_numbers",
        "--moe-n-hash-layers must reach the model's n-th MoE symbol: every hybrid symbol is a layer",
        "dev megatron/core/transformer/moe/router.py:202-206; megatron/core/models/hybrid/hybrid_block.py:617-618",
        _hash_layers_wrong,
        ("pp", "vpp"),
        "argv",
    ),
    # ---- MoE dispatcher ----
    Rule(
        "mcore.dispatcher_known",
        "dispatcher must be alltoall|allgather|flex; flex needs backend deepep|hybridep|ncclep, others none",
        "dev TC:934-945 (dispatcher and flex backend choices), dev TC:2038-2043 (ncclep needs flex)",
        lambda c: (
            c.layout.dispatcher not in DISPATCHERS
            or (c.layout.dispatcher == "flex") != (c.layout.flex_backend is not None)
            or (c.layout.flex_backend is not None and c.layout.flex_backend not in FLEX_BACKENDS)
        ),
        ("dispatcher", "flex_backend"),
    ),
    Rule(
        "mcore.flex_needs_tp_ep",
        "deepep and ncclep need TP x EP > 1",
        "dev megatron/core/transformer/moe/token_dispatcher.py:1886,1914",
        lambda c: _flex(c.layout, "deepep", "ncclep") and c.layout.tp * c.layout.ep <= 1,
        ("tp", "ep", "dispatcher", "flex_backend"),
    ),
    Rule(
        "mcore.ncclep_no_capacity",
        "ncclep supports no capacity factor (token dropping) or padding",
        "main megatron/core/transformer/moe/token_dispatcher.py:1556",
        lambda c: _flex(c.layout, "ncclep") and c.layout.capacity_factor is not None,
        ("dispatcher", "flex_backend", "capacity_factor"),
    ),
    Rule(
        "mcore.capacity_needs_aux_loss",
        "a capacity factor works only with aux_loss, seq_aux_loss, global_aux_loss or none load balancing",
        "dev TC:2089-2112",
        lambda c: (
            c.argv is not None
            and c.layout.capacity_factor is not None
            and (flag_value(c.argv or (), "--moe-router-load-balancing-type") or "aux_loss") not in CAPACITY_LB_TYPES
        ),
        ("capacity_factor",),
        "argv",
    ),
    Rule(
        "mcore.padding_needs_capacity",
        "--moe-pad-expert-input-to-capacity needs a capacity factor",
        "dev TC:2115-2119",
        lambda c: _has_flag(c, (PAD_FLAG,)) and not _has_flag(c, ("--moe-expert-capacity-factor",)),
        ("capacity_factor",),
        "argv",
    ),
    Rule(
        "mcore.deepep_no_padding",
        "flex + deepep cannot pad expert input to capacity",
        "dev TC:2029-2036",
        lambda c: _flex(c.layout, "deepep") and _has_flag(c, (PAD_FLAG,)),
        ("dispatcher", "flex_backend"),
        "argv",
    ),
    Rule(
        "mcore.ep_a2a_overlap",
        "EP all-to-all overlap (--overlap-moe-expert-parallel-comm) needs EP > 1, VPP when PP > 1, an alltoall or "
        "flex dispatcher and no moe recompute",
        "dev TC:3379-3396, 3454",
        lambda c: (
            _has_flag(c, (EP_OVERLAP_FLAG,))
            and (
                c.layout.ep <= 1
                or (c.layout.pp > 1 and c.layout.vpp <= 1)
                or c.layout.dispatcher == "allgather"
                or "moe" in c.layout.recompute
            )
        ),
        ("ep", "pp", "vpp", "dispatcher", "recompute"),
        "argv",
    ),
    # ---- Recompute and offload ----
    Rule(
        "mcore.recompute_known",
        "unknown --recompute-modules entry",
        "dev TC:2197",
        lambda c: not set(c.layout.recompute) <= RECOMPUTE_MODULES,
        ("recompute",),
    ),
    Rule(
        "mcore.full_vs_selective",
        "full recompute cannot be combined with selective modules",
        "dev TC:2153-2182",
        lambda c: "full" in c.layout.recompute and len(c.layout.recompute) > 1,
        ("recompute",),
    ),
    Rule(
        "mcore.moe_act_needs_grouped_gemm",
        "moe_act recompute needs --moe-grouped-gemm",
        "dev TC:2215-2217",
        lambda c: "moe_act" in c.layout.recompute and not c.moe_grouped_gemm,
        ("recompute",),
    ),
    Rule(
        "mcore.offload_known",
        "unknown --offload-modules entry",
        "dev TC:2403-2420",
        lambda c: not set(c.layout.offload) <= OFFLOAD_MODULES,
        ("offload",),
    ),
    Rule(
        "mcore.offload_vs_moe_recompute",
        "no moe_act/expert_fc1/fused_group_mlp offload while moe is recomputed",
        "dev TC:2428-2436",
        lambda c: (
            "moe" in c.layout.recompute and bool({"moe_act", "expert_fc1", "fused_group_mlp"} & set(c.layout.offload))
        ),
        ("recompute", "offload"),
    ),
    Rule(
        "mcore.attn_proj_offload_needs_core_attn",
        "attn_proj offload needs core_attn offload",
        "dev TC:2423-2427",
        lambda c: "attn_proj" in c.layout.offload and "core_attn" not in c.layout.offload,
        ("offload",),
    ),
    Rule(
        "mcore.mhc_recompute_needs_mhc",
        "mhc recompute needs hyper-connections (a V4 model: hyper_connection_streams > 1)",
        "dev TC:2197 (mhc is a recompute module of the hyper-connection layers only)",
        lambda c: "mhc" in c.layout.recompute and c.model.hyper_connection_streams <= 1,
        ("recompute",),
    ),
    Rule(
        "mcore.mhc_recompute_vs_norm_offload",
        "mhc recompute conflicts with attn_norm/mlp_norm offload",
        "dev TC:2294-2401",
        lambda c: "mhc" in c.layout.recompute and bool({"attn_norm", "mlp_norm"} & set(c.layout.offload)),
        ("recompute", "offload"),
    ),
    Rule(
        "mcore.offload_without_cpu_offloading",
        "fine-grained offload cannot be combined with cpu_offloading",
        "dev TC:2403-2406",
        lambda c: bool(c.layout.offload) and _has_flag(c, ("--cpu-offloading-num-layers",)),
        ("offload", "recompute"),
        "argv",
    ),
    # ---- Memory (last) ----
    Rule(
        "mem.exceeds_hbm",
        "heaviest rank's predicted memory + margin exceeds HBM",
        "orchestrator/plan/memory.py: weights + grads + optimizer + activations (Korthikanti et al. 2022, "
        "arXiv:2205.05198) + comm buffers + workspace + runtime",
        lambda c: c.memory_gb is not None and c.memory_gb + c.stage.memory_margin_gb > c.hw.hbm_gb,
        (),
        "memory",
    ),
)

BY_ID = {r.id: r for r in (*RULES, OFFLOAD_NOT_NEEDED)}  # the planner's own cut is named like a rule
assert len(BY_ID) == len(RULES) + 1, "duplicate rule id"
LIFTABLE = frozenset(r.id for r in RULES if r.lifted_by)


def check_lifted(ids: Iterable[str]) -> list[str]:
    """The ids as given, or ValueError naming one that no Megatron fix lifts (only LIFTABLE rules can be)."""
    ids = list(ids)
    bad = [i for i in ids if i not in LIFTABLE]
    if bad:
        raise ValueError(
            f"stage.lifted_rules names {', '.join(bad)}: only rules a Megatron fix removes can be lifted "
            f"({', '.join(sorted(LIFTABLE)) or 'none'})"
        )
    return ids


def lift_notes(stage: StageConfig) -> list[str]:
    """One line per rule a Megatron fix removes: held until the fix is found, or lifted for this stage."""
    lifted = set(stage.lifted_rules)
    return [
        f"rule {r.id} lifted by stage.lifted_rules (a real sweep sets it only when preflight finds {r.lifted_by})"
        if r.id in lifted
        else f"rule {r.id} holds until preflight finds {r.lifted_by} in the cluster's Megatron checkout"
        for r in RULES
        if r.lifted_by
    ]


def active(stage: StageConfig | None = None) -> tuple[Rule, ...]:
    """The rules a stage is planned and checked with: every rule but those in stage.lifted_rules."""
    lifted = set(check_lifted(stage.lifted_rules)) if stage is not None else set()
    return RULES if not lifted else tuple(r for r in RULES if r.id not in lifted)


def violations(ctx: Ctx, rules: Sequence[Rule] = RULES) -> list[Rule]:
    """The rules `ctx` violates (of those given), in RULES order."""
    return [r for r in rules if r.predicate(ctx)]


def by_phase(phase: str, rules: Sequence[Rule] = RULES) -> tuple[Rule, ...]:
    return tuple(r for r in rules if r.phase == phase)
