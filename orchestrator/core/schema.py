"""Typed configuration schema: one dataclass per Hydra config group.

Why here and why stdlib-only: Hydra composes YAML, then `orchestrator.config` merges it into these
dataclasses so an unknown key or a wrong type fails at load with the key's path. The planner and the
twin workload (which runs on compute nodes with a bare Python) import these same classes, so this
module must never import omegaconf, hydra, sqlalchemy or anything outside the standard library.
SearchConfig is built from the knob registry (orchestrator/core/knobs.py), so the knob list is written once.

Names follow the tuning guide: N (gpus), B (global_batch), b (mbs), S (seq_length), E (num_experts),
k (moe_router_topk), h (hidden_size), f (moe_ffn_hidden_size).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, make_dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from orchestrator.core.bounds import ranged, ranged_list
from orchestrator.core.errors import UserError
from orchestrator.core.failures import DEFAULT_RETRY_CLASSES
from orchestrator.core.knobs import search_fields

ATTENTION_VARIANTS = ("dsv4_hybrid", "mla", "gqa")  # V4's hybrid stack; the GPT path's MLA (DeepSeek-V3) and GQA


@dataclass
class ModelConfig:
    """A MoE model, described with Megatron's own argument names. The defaults are DeepSeek-V4-Pro's; a model
    YAML (V4-Flash: conf/model/dsv4_flash.yaml; another family: dsv3.yaml, qwen3_*.yaml, gpt_oss_120b.yaml)
    carries what differs.

    attention_variant picks the Megatron path: dsv4_hybrid trains on pretrain_hybrid.py (CSA/HCA attention,
    mHC, the '|' layer pattern), mla and gqa on pretrain_gpt.py (plain multi-latent or grouped-query attention,
    --pipeline-model-parallel-layout). The csa_*/dsa_*/o_*/mHC/hash fields are read on the V4 path only."""

    name: str = "dsv4_pro"
    num_layers: int = ranged(61, 1)  # Transformer blocks (the guide's 61)
    hidden_size: int = ranged(7168, 1)  # h
    num_attention_heads: int = ranged(128, 1)
    kv_channels: int = ranged(512, 1)
    # MLA / V4 attention dimensions (Megatron dev recipe names)
    q_lora_rank: int = ranged(1536, 1)
    kv_lora_rank: int = ranged(512, 1)
    qk_pos_emb_head_dim: int = ranged(64, 1)
    v_head_dim: int = ranged(512, 1)
    o_groups: int = ranged(16, 1)
    o_lora_rank: int = ranged(1024, 1)
    attention_variant: str = "dsv4_hybrid"  # ATTENTION_VARIANTS: CSA/HCA hybrid attention (V4) | mla | gqa
    qk_head_dim: int = ranged(
        128, 1
    )  # MLA (mla): per-head q/k width without the rope part (--qk-head-dim); V4 derives its own
    num_query_groups: int | None = ranged(None, 1)  # GQA (gqa): key/value head groups (--num-query-groups)
    qk_layernorm: bool = True
    window_size: int | None = ranged(None, 1)  # sliding-window attention, tokens attended incl. itself (GPT-OSS: 128)
    window_attn_skip_freq: int | None = ranged(
        None, 1
    )  # every n-th layer attends fully (GPT-OSS: 2); None: all windowed
    add_bias_linear: bool = False  # biases in the linear layers (GPT-OSS)
    glu_activation: str = "swiglu"  # swiglu | quick_geglu (GPT-OSS): both gated, three matrices per MLP
    rotary_base: int | None = ranged(None, 1)  # None: workload.recipe.rotary_base (the V4 recipe's)
    csa_window_size: int = ranged(128, 1)  # D_window lower bound for CP boundary exchange
    csa_compress_ratios: list[int] = ranged_list(lambda: [128, 128, 4] + [128, 4] * 29 + [0], 0)
    dsa_indexer_heads: int = ranged(64, 1)
    dsa_indexer_head_dim: int = ranged(128, 1)
    dsa_indexer_topk: int = ranged(1024, 1)
    # Dense FFN (only used for layers that are not MoE)
    ffn_hidden_size: int = ranged(18432, 1)
    num_dense_layers: int = ranged(0, 0)  # leading dense blocks; V4-Pro: every block is MoE
    # MoE
    num_experts: int = ranged(384, 1)  # E
    moe_router_topk: int = ranged(6, 1)  # k
    moe_ffn_hidden_size: int = ranged(3072, 1)  # f
    moe_shared_expert_intermediate_size: int = ranged(3072, 0)  # one shared expert
    moe_n_hash_layers: int = ranged(3, 0)
    # Router: the GPT path reads these; the V4 path writes its recipe's (workload.recipe), but a scaling set here
    moe_router_score_function: str = "sqrtsoftplus"
    moe_router_enable_expert_bias: bool = True
    moe_router_topk_scaling_factor: float | None = ranged(None, gt=0)  # None: workload.recipe's (V4-Pro 2.5)
    moe_router_num_groups: int | None = ranged(None, 1)  # group-limited routing (DeepSeek-V3: 8 groups, top 4)
    moe_router_group_topk: int | None = ranged(None, 1)
    moe_router_load_balancing_type: str = "seq_aux_loss"
    # Other structure
    vocab_size: int = ranged(129280, 1)
    mtp_num_layers: int = ranged(1, 0)
    hyper_connection_streams: int = ranged(4, 1)  # mHC residual streams (1: a plain residual, every model but V4)
    # adam | muon. Adam, not Muon: Megatron dev's own DeepSeek-V4-Pro recipe (examples/moe_recipes/
    # deepseek_v4_pro/gb300/*.yaml) trains with Adam and the ZeRO-1 distributed optimizer, the gradient
    # reduce-scatter + parameter all-gather the step-time model and the overlap flags describe. With muon, dev
    # turns --use-distributed-optimizer into its layer-wise optimizer (megatron/training/arguments.py:1858-1860
    # at d48bd6be0a85), whose default layout all-reduces the Muon matrices' gradients (arguments.py:4320-4330),
    # and needs the emerging-optimizers package. muon stays available (8 B/param of state in the memory model,
    # Newton-Schulz steps in the step-time model) for runs that reproduce V4's own training.
    optimizer: str = "adam"
    # Reference totals from the guide, used as sanity checks of the parameter model
    total_params_b: float = ranged(1600.0, gt=0)
    active_params_b: float = ranged(49.0, gt=0)


@dataclass
class HardwareConfig:
    """One accelerator type plus its node and network. Bandwidths are GB/s per GPU, one direction. The defaults
    are an NVIDIA H100 SXM 80GB, 8 per NVLink domain, one 400 Gb/s NIC per GPU (conf/hardware/h100.yaml)."""

    name: str = "h100"
    peak_bf16_tflops: float = ranged(989.0, gt=0)  # dense, no sparsity
    peak_fp8_tflops: float = ranged(1979.0, gt=0)
    peak_mxfp8_tflops: float | None = ranged(None, gt=0)  # MXFP8 needs Blackwell (sm_100+); None: the part has none
    hbm_gb: float = ranged(80.0, gt=0)  # decimal GB
    hbm_gb_s: float = ranged(3350.0, gt=0)  # HBM bandwidth, GB/s (the optimizer step and quantisation passes read it)
    nvlink_gb_s: float = ranged(450.0, gt=0)
    nic_gb_s: float = ranged(50.0, gt=0)  # 400 Gb/s NIC per GPU
    gpus_per_node: int = ranged(8, 1)  # GPUs of one host (GB200/GB300 compute trays: 4)
    gpus_per_nvlink_domain: int = ranged(8, 1)  # NVL72 systems: 72 (an EP/CP group inside one domain runs on NVLink)
    # GPU <-> host memory, GB/s per direction: what fine-grained activation offload copies over (steptime "offload").
    # HGX/DGX parts sit on PCIe Gen5 x16: 128 GB/s both directions on https://www.nvidia.com/en-us/data-center/h100/
    # and /h200/ ("PCIe Gen5: 128GB/s"), 64 per direction. GB200/GB300 reach their Grace over NVLink-C2C
    # (conf/hardware/gb200.yaml, gb300.yaml).
    host_link_gb_s: float = ranged(64.0, gt=0)
    # Step-time model constants (calibrated later from the ledger; see orchestrator/plan/steptime.py)
    gemm_efficiency: float = ranged(0.55, None, 1, gt=0)  # achieved / peak on large BF16 GEMMs
    attention_efficiency: float = ranged(0.40, None, 1, gt=0)
    a2a_efficiency: float = ranged(0.60, None, 1, gt=0)  # achieved / link bandwidth for MoE all-to-all
    p2p_efficiency: float = ranged(0.70, None, 1, gt=0)
    allreduce_efficiency: float = ranged(0.70, None, 1, gt=0)
    # achieved / host_link_gb_s for the offload's pinned-memory copies: PCIe Gen5's 128b/130b coding and TLP headers
    # (256 B payloads) leave ~88% of the nominal rate; a prior, not a fit
    host_link_efficiency: float = ranged(0.80, None, 1, gt=0)
    grad_sync_overlap: float = ranged(
        0.80, 0, 1
    )  # share of DP grad sync hidden when the recipe overlaps it (argv.overlaps)
    a2a_overlap: float = ranged(0.0, 0, 1)  # fraction of EP all-to-all hidden (EP overlap off by default)
    runtime_overhead_gb: float = ranged(3.0, 0)  # CUDA context, NCCL, allocator fragmentation
    workspace_gb: float = ranged(2.0, 0)  # fused kernels, cuBLAS workspace


if TYPE_CHECKING:

    class SearchConfig:
        """What the type checker sees of the class built below: one list of values per knob."""

        def __init__(self, **values: list[Any]) -> None: ...
        def __getattr__(self, knob: str) -> list[Any]: ...

else:
    SearchConfig = make_dataclass(
        "SearchConfig",
        search_fields(),
        namespace={
            "__module__": __name__,  # so pickle (submitit) finds it here
            "__doc__": "The knob ranges a stage searches: one list of values per knob of orchestrator.core.knobs, "
            "with the registry's defaults (recompute/offload entries are module lists, [] = none). Built from "
            "the registry so a new knob needs no edit here; a dataclass still, so OmegaConf types every list.",
        },
    )


@dataclass
class BudgetConfig:
    max_runs: int = ranged(24, 1)
    max_gpu_hours: float = ranged(2000.0, gt=0)  # every attempt (probe, screen, full) and the finalists count
    max_rounds: int = ranged(6, 1)
    # The sweep has converged after this many rounds in a row without a gain > policy.search.converge_gain over the
    # best nor a full-window near-tie within it (and no screened contender waiting). A stage's own: where the
    # optimum lies moves away from the first evidence (8k: joint EP+PP moves from the promoted 1k winners) it
    # takes more (docs/search-log.md "Stopping").
    converge_rounds: int = ranged(5, 1)
    # Charged to every launch on top of its iterations: process start, model build, first step (minutes at
    # scale). GPU-hours of one attempt = N x (startup_s + its window's iterations x mean step) / 3600.
    startup_s: float = ranged(0.0, 0)
    # The whole sweep's price (orchestrator/sweep/price.py): the policy's own sweep simulated on this many surfaces
    # drawn from the planner's predictions and error bands, printed by the dry run and a sweep's first lines and
    # kept for `status` and the report; 0: no whole-sweep price. Each sample is a whole simulated sweep (at 8k
    # with its 1k source's): ~20 CPU-seconds for a 1k dry run, ~65 for an 8k one (docs/search.md); on the bench
    # 4 samples' range held the actual spend on 19 of 19 rows (docs/search-log.md).
    price_samples: int = ranged(4, 0)
    # The planner's known step error, the level of the price's drawn steps: measured / predicted step of NVIDIA's
    # own layouts on `validate`'s fit rows (the 36 rows of 26.02 and 25.11, every system; the held-out rows never
    # read): their geometric mean and log-sd (`validate` prints both; tests/commands/test_validate.py checks these).
    # The planner runs fast. A cluster that measured its own sets them; 1.0 and 0.0 centre the price on the planner.
    price_step_bias: float = ranged(1.10, gt=0)
    price_step_sd: float = ranged(0.25, 0)


@dataclass
class ScreenConfig:
    """Multi-fidelity rounds (orchestrator/schedule/fidelity.py): a short window ranks, the full one decides.

    The screen's measured window is sized from the step-time noise the ledger has measured: the p50's 95%
    confidence interval must be narrower than `resolution` (relative), clamped to [min_measure_iters, the
    stage's measure_iters]. Before any noise is measured every run uses the full window."""

    enabled: bool = True
    # The guide's rule holds for screens too: warm-up must still cover compile, allocation and graph capture
    # (the first few iterations). A stage's own warm-up (300 at 1k-16k) is for dropless routing to settle,
    # which only the confirming full window waits for; a screen's is capped at the stage's.
    warmup_iters: int = ranged(50, 0)
    min_measure_iters: int = ranged(10, 1)
    resolution: float = ranged(0.01, None, 1, gt=0)  # the p50's 95% CI must be narrower than 1% of the step
    confirm_per_round: int = ranged(2, 0)  # contenders confirmed at the full window per round, at most
    probe_iters: int = ranged(5, 1)  # a fit probe: start-up plus this many iterations, read for max reserved memory
    # ... after this many warm-up iterations: its p50 is the rank's compute-only step (the composed step,
    # orchestrator/search/compose.py), so the first iterations (compile, allocator) stay out of it
    probe_warmup_iters: int = ranged(10, 0)
    # The early cut (orchestrator/schedule/fidelity.py CutLine: a median stopping rule, as Ray Tune's trial
    # schedulers stop trials the searcher proposed): once the sweep has a full-window best, a launch at scale
    # whose median step over iterations cut_warmup_iters+1..cut_after is above best p50 x (1 + cut_margin) is
    # stopped there and kept as a screen of those iterations (it ranks, never decides a best).
    cut: bool = True
    cut_margin: float = ranged(0.05, gt=0)  # 0.05 over 0.10: cheaper tune and held out, same gaps (docs/search-log.md)
    cut_after: int = ranged(15, 2)
    cut_warmup_iters: int = ranged(5, 0)  # compile, allocator, NCCL set-up: out of the median, as in a screen
    # A cut window whose fastest iteration is more than this under its median (a straggler's spikes over a fast
    # step, not a slow layout) reads as many iterations again before the cut (CutLine.split; 0: off)
    cut_split: float = ranged(0.2, 0)
    # Before any best: the launch that saves the warm start's seed (the one launch that waits out the stage's own
    # warm-up) is cut where its median is over its own expected step (composed or predicted) x (1 + this); the
    # next waiting launch saves the seed instead. 1.5 over 1.0 on fresh bench seeds: 1.0 also cut a good layout
    # 2x over its composed step (docs/search-log.md "The seed's own line").
    seed_cut_margin: float = ranged(1.5, gt=0)


@dataclass
class WarmStartConfig:
    """Warm start (orchestrator/schedule/fidelity.py): a stage's long warm-up (300 iterations at 1k-16k) is for
    dropless routing to settle, a property of the weights (the router's and its expert bias, a persistent
    buffer: Megatron dev megatron/core/transformer/moe/router.py:234-241), not of the layout. So the sweep's
    first full-window launch saves its weights at its end (the seed: --save, no optimizer, no RNG), and every
    later launch of the sweep, and of a sweep promoted from it, loads them (--load --finetune: iteration 0,
    no optimizer state) and warms up only for compile, allocation and graph capture. A torch_dist checkpoint
    loads under any other parallel layout (Megatron docs/api-guide/core/dist_checkpointing.md; EP included:
    megatron/core/transformer/moe/README.md, Upcycling)."""

    enabled: bool = True
    warmup_iters: int = ranged(50, 0)  # a warm-started launch's warm-up (capped at its fidelity's own)
    # Evidence beats configuration: once `learn_after` warm-started launches measured how many leading iterations
    # ran above their steady step (settled_iters), later ones warm up learn_factor x the most any needed
    # (at least learn_floor, at most warmup_iters): orchestrator/schedule/fidelity.py learned_warmup. On since the
    # probe-led rounds: held out the same 25/26 rows, 1k mean 26.7k -> 23.4k GPU-h (docs/search-log.md "The
    # learned warm-up"); `learn=false` warms every warm launch up `warmup_iters`.
    learn: bool = True
    learn_after: int = ranged(2, 1)
    learn_factor: float = ranged(2.0, 1.0)
    learn_floor: int = ranged(5, 0)
    # Charged on top of start-up: writing / reading the seed's bf16 weights (V4-Pro: 1.6T x 2 B = 3.2 TB, 25 GB
    # per node of 128, a few GB/s per node from a parallel file system)
    save_s: float = ranged(60.0, 0)
    load_s: float = ranged(60.0, 0)


@dataclass
class StageConfig:
    """One scale stage (1k, 8k, 16k, smoke, slice)."""

    name: str = "1k"
    gpus: int = ranged(1024, 1)  # N
    gpus_per_node: int = ranged(8, 1)
    global_batch: int = ranged(4096, 1)  # B, packed sequences
    seq_length: int = ranged(8192, 1)  # S
    warmup_iters: int = ranged(20, 0)
    measure_iters: int = ranged(30, 1)
    promotes_from: str | None = None
    search: SearchConfig = field(default_factory=SearchConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    screen: ScreenConfig = field(default_factory=ScreenConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    # Training semantics that the rules depend on
    use_distributed_optimizer: bool = True
    packed_sequences: bool = True  # THD packed input (required for CP>1 on the V4 path)
    attention_backend: str = "cudnn"  # the packed path needs cuDNN
    cp_partition_mode: str = "contiguous"
    deterministic_mode: bool = False
    transformer_engine: bool = True
    memory_margin_gb: float = ranged(4.0, 0)  # feasible = heaviest rank + margin <= HBM
    # What a one-GPU rank probe (--fake-process-group) cannot see: NCCL's and the dispatcher's buffers. A probed
    # layout is known to fit when its probe's peak + this <= HBM; once full-scale runs of probed layouts exist,
    # the margin is learned from them (their peak minus their probe's: orchestrator.search.select.probe_margin_gb)
    probe_margin_gb: float = ranged(6.0, 0)
    num_layers_override: int | None = ranged(None, 1)  # slice stage: fewer blocks, same h and E
    # Legality rules a Megatron fix removes (orchestrator.plan.rules.LIFTABLE), lifted for this stage. A real
    # sweep sets it from preflight's evidence (the fix found in the cluster's checkout), whatever it said here.
    lifted_rules: list[str] = field(default_factory=list)


@dataclass
class ContainerConfig:
    """A pyxis/enroot container every task of a Slurm job runs in (`srun --container-*`).

    Only the tasks run inside it: the batch script and the orchestrator itself run outside (pyxis runs a
    whole batch script in the container when `--container-image` is an sbatch option, and `srun` is then
    unusable from it). The project checkout and `cluster.folder` are always mounted at their own paths."""

    image: str | None = None  # e.g. nvcr.io#nvidia/pytorch:25.09-py3 or a squashfs path
    mounts: list[str] = field(default_factory=list)  # SRC:DST[:FLAGS] each, e.g. /lustre/data:/data:ro
    workdir: str | None = None  # the tasks' working directory inside the container


@dataclass
class JobResources:
    """What one job asks Slurm for beyond its GPUs. A None leaves Slurm's default (or the workload's)."""

    exclusive: bool | None = None  # whole nodes: no other job's dataloaders or NCCL traffic on them
    cpus_per_task: int | None = ranged(None, 1)  # per GPU: dataloader workers + NCCL proxy threads + the main thread
    mem: str | None = None  # per node: "0" = all of the node's memory, or e.g. "1800G"


@dataclass
class SlurmConfig:
    """What only the Slurm launcher (orchestrator/launch/slurm) reads, apart as submitit prefixes its Slurm
    executor's parameters (slurm_partition, ...): `cluster.slurm.partition=gpu`.

    The orchestrator runs where it is started (a login node); with `container.image` set only the job's tasks
    run inside the container, with `python` the interpreter submitit starts there."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    container: ContainerConfig = field(default_factory=ContainerConfig)
    python: str | None = None  # the Python that runs each task (submitit's `python=`); None = this process's
    max_array_size: int = ranged(1000, 1)  # tasks per sbatch array: a round is split into arrays of at most this many
    array_parallelism: int = ranged(64, 1)  # an array's tasks running at once (%N)
    # A sweep bound to Slurm whose client or controller does not answer (sbatch --version / sinfo) waits this
    # long, retrying with a growing pause, before `resume` / `cancel` give up with one error line.
    wait_s: float = ranged(300.0, 0)
    sbatch_extra: dict[str, Any] = field(default_factory=dict)  # extra #SBATCH options, e.g. {reservation: r}
    srun_args: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)  # shell lines the batch script runs before srun


@dataclass
class LocalConfig:
    """What only the local launcher (orchestrator/launch/local, submitit's LocalExecutor) reads."""

    max_workers: int = ranged(2, 1)  # jobs running at once on this machine


# Keys that moved, old dotted path -> new: a sweep's stored snapshot from before loads with each value where its
# key went (`legacy_moved`: resume, promotion and the report read the sweep as it was created, so a resumed sweep
# stops as the killed one would have), and an override naming an old key is told the new one
# (orchestrator.config.nearest_key). The cluster's backend settings were flat under `cluster` before they moved
# to cluster.slurm / cluster.local; the convergence rounds moved from the policy to the stage's budget.
MOVED_KEYS: dict[str, str] = {
    **{
        f"cluster.{k}": f"cluster.slurm.{k}"
        for k in (
            *("partition", "account", "qos", "constraint", "container", "python"),
            *("max_array_size", "array_parallelism", "sbatch_extra", "srun_args", "setup"),
        )
    },
    "cluster.slurm_wait_s": "cluster.slurm.wait_s",
    "cluster.local_max_workers": "cluster.local.max_workers",
    "policy.converge_rounds": "stage.budget.converge_rounds",
    # the compute precision became a numerics knob the recipe declares: a one-value list of the stage's precision
    "stage.precision": "workload.recipe.precision",
    # issue 48 item 5: the searcher's settings, the schedule's steps and the driver's settings live apart
    **{
        f"policy.{k}": f"policy.search.{k}"
        for k in (
            *("top_k_neighbours", "promote_top_k", "converge_gain", "model_trust_mape", "model_picks", "explore"),
            *("joint_moves", "anchor_distance", "max_predicted_loss"),
        )
    },
    **{f"policy.{k}": f"policy.schedule.{k}" for k in ("round0_size", "round_size", "screen_round_size")},
    **{f"policy.{k}": f"policy.schedule.{k}" for k in ("probe_pass", "probe_led")},
    "policy.probes_per_round": "policy.schedule.fit_probes.per_round",
    "policy.direct_per_round": "policy.schedule.probe_first.direct_per_round",
    "policy.round0_full": "policy.schedule.probe_first.round0_full",
    "policy.round0_probes": "policy.schedule.round0_spread.probes",
    "policy.coverage_probes": "policy.schedule.coverage_probes.per_round",
    "policy.probe_first": "policy.schedule.steps",  # a switch that became a step (STEP_SWITCHES)
    **{f"policy.{k}": f"policy.driver.{k}" for k in ("max_attempts", "retry_classes")},
}
# Moved keys whose new home is a list (a declared numerics knob): an old scalar value loads as a one-value list.
MOVED_TO_LIST: frozenset[str] = frozenset({"workload.recipe.precision"})


# Old on/off switches that became schedule steps (old key -> the step): a snapshot's `false` leaves the step out of
# its policy.schedule.steps, `true` keeps the default list.
STEP_SWITCHES: dict[str, str] = {"policy.probe_first": "probe_first"}


def moved_to(key: str) -> str | None:
    """Where an old key (or a key below one) went, else None."""
    for old, new in MOVED_KEYS.items():
        if key == old or key.startswith(old + "."):
            return new + key[len(old) :]
    return None


def legacy_moved(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A copy of a config snapshot (plain dict) with each key of MOVED_KEYS moved where it went, unless the
    snapshot already holds the new key there. The groups on the way are made under the new key's top group;
    a snapshot without that group (a stage-less one, for a stage's key) drops the old key."""

    def group(tree: Any, path: list[str], *, make: bool = False) -> Any:
        for part in path:
            if make and isinstance(tree, dict) and not isinstance(tree.get(part), dict):
                tree[part] = {}
            tree = tree.get(part) if isinstance(tree, dict) else None
        return tree

    out = copy.deepcopy(snapshot)
    for old, step in STEP_SWITCHES.items():
        *old_path, old_key = old.split(".")
        source = group(out, old_path)
        if isinstance(source, dict) and old_key in source and not source.pop(old_key):
            schedule = group(out, [*old_path, "schedule"], make=True)
            listed = schedule.get("steps") or list(SCHEDULE_STEPS)
            schedule["steps"] = [s for s in listed if s != step]
    for old, new in MOVED_KEYS.items():
        *old_path, old_key = old.split(".")
        top, *new_path = new.split(".")
        *new_path, new_key = new_path
        source = group(out, old_path)
        if isinstance(source, dict) and old_key in source:
            value = source.pop(old_key)
            target = group(out.get(top), new_path, make=True) if isinstance(out.get(top), dict) else None
            if isinstance(target, dict):
                target.setdefault(new_key, [value] if new in MOVED_TO_LIST and not isinstance(value, list) else value)
    return out


@dataclass
class ClusterConfig:
    """Where jobs run. kind: auto (sbatch if it answers, else local), slurm or local. What every launcher reads
    is here; what one backend alone reads is in its own sub-config (`slurm`, `local`)."""

    kind: str = "auto"
    folder: str = "./runs"
    # Resources: None = the workload's default (workload.resources; real Megatron asks for whole nodes).
    exclusive: bool | None = None
    cpus_per_task: int | None = ranged(None, 1)
    mem: str | None = None
    # A job's time limit: its predicted run time plus this margin, and never under min_time_min
    # (orchestrator.runspec.time_limit_min; Slurm's --time, the local executor's timeout alike).
    time_margin_min: int = ranged(10, 0)
    min_time_min: int = ranged(5, 1)
    poll_interval_s: float = ranged(5.0, gt=0)
    # The side pool a sweep's small probes (a job on at most this many GPUs, e.g. one-GPU rank probes) run on in
    # parallel, beside the full-scale jobs: what `status`'s cluster_hours (time to a decision) assumes.
    probe_gpus: int = ranged(8, 1)
    # the warning signal this long before the time limit (Slurm's --signal, local's)
    signal_delay_s: int = ranged(30, 0)
    env: dict[str, str] = field(
        default_factory=lambda: {
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            "NCCL_IB_TIMEOUT": "19",
            "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
        }
    )
    # MASTER_PORT = master_port + job id % master_port_span: two jobs sharing a node do not collide, and
    # the default range (29500-31499) stays below Linux's ephemeral ports (32768+).
    master_port: int = ranged(29500, 1, 65535)
    master_port_span: int = ranged(2000, 1, 65535)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    local: LocalConfig = field(default_factory=LocalConfig)


@dataclass
class LedgerConfig:
    """url: SQLAlchemy URL. ${oc.env:VAR} works for secrets; passwords are never printed or stored, and a
    PostgreSQL URL without one lets libpq find it (PGPASSWORD, ~/.pgpass). create_dir: `sweep` and `db
    upgrade` may create a missing SQLite file's folder (by default only an existing folder gets a ledger)."""

    url: str = "sqlite:///./ledger.sqlite"
    create_dir: bool = False
    echo: bool = False
    lease_ttl_s: float = ranged(60.0, gt=0)
    busy_timeout_ms: int = ranged(30000, 0)


@dataclass
class SearcherConfig:
    """The searcher's settings (orchestrator/search/policies.py): which layouts, ranked how; `policy.search.*`."""

    top_k_neighbours: int = ranged(2, 0)
    promote_top_k: int = ranged(3, 0)
    # "no gain > 1% over the best, nor a full-window near-tie within 1% of it, for stage.budget.converge_rounds rounds"
    converge_gain: float = ranged(0.01, 0)
    # The calibrated model's own top pick joins a round only when it predicts measurements this well
    # (leave-one-out MAPE); a worse model is used to rank neighbours, not to pick far-away layouts.
    model_trust_mape: float = ranged(0.10, 0)
    # Part of each round for the residual model's picks (orchestrator/search/moves.py): the unmeasured layouts
    # with the best optimistic bound, calibrated x exp(residual mean - explore x residual sd).
    model_picks: int = ranged(1, 0)
    explore: float = ranged(1.0, 0)
    joint_moves: bool = True  # two-knob moves over coupled knobs (CP+PP, EP+dispatcher, recompute+mbs/PP)
    anchor_distance: int = ranged(1, 0)  # anchors differ from each other in at least this many of EP, PP, CP
    # skip moves (and fit probes, schedule/steps/fit_probes.py) whose optimistic estimate is this much slower than
    # the best. Tuned on tests/bench/bench_search.py's tune set (docs/search-log.md "Moves that cannot win"):
    # 0.15 -> 0.08 spends less on screens of layouts that cannot beat the best; 0.05 missed a tune row at 8k
    max_predicted_loss: float = ranged(0.08, 0)
    # once the neighbourhood is exhausted, at most this many of the model's picks and ranking fill the round (they
    # pass max_predicted_loss on their optimistic bound alone); 0 missed a held-out row, 2 kept every row and cut
    # the means (docs/search-log.md "Moves that cannot win")
    fill_per_round: int = ranged(2, 0)


# The schedule's steps (orchestrator/schedule/steps/, one module each), in the order a round runs them: a
# policy's schedule is this list (policy.schedule.steps); a step left out does nothing.
SCHEDULE_STEPS = (
    "confirm",
    "propose",
    "screen",
    "probe_first",
    "fit_probes",
    "round0_spread",
    "coverage_probes",
    "warm_start",
    "early_cut",
    "budget",
    "neighbour_hold",
)


@dataclass
class ProbeFirstConfig:
    """Step `probe_first` (orchestrator/schedule/steps/probe_first.py): proposals as rank probes before scale."""

    # After round 0 the searcher's first direct_per_round proposals go at scale as ever and the rest get a one-GPU
    # rank probe (its compute-only step, a few GPU-hours) before any launch at scale; one is measured at scale once
    # its composed step (the probe's compute + the calibrated communication, orchestrator/search/compose.py), as the
    # searcher rates it (Policy.estimate), is within policy.schedule.probe_pass of the best measured step. Bench
    # (tests/bench/bench_search.py, docs/search-log.md): every proposal probed (direct 0) missed tune 8k rows (a
    # round more per layout, within max_rounds): probe_pass 0.05 6 of the first 12 rows, 0.15 4/16, 0.30 3/16;
    # 0.15 with 3 direct missed twin:gemm 8k; 0.15 with 2 met 16/16 (1k mean 59.4k GPU-h, 8k 108.8k) but held out
    # twin:overpredicted 1k then stopped 9.5% short (max_rounds), and 0.15 with 4 too; 5 direct (of
    # screen_round_size 6) with 0.05 keeps every held-out row and gap and lowers both stages' mean GPU-hours.
    direct_per_round: int = ranged(5, 0)
    # ... and round 0 runs only its first this many proposals at scale, probing the rest (0: all at scale).
    # Tried with 3 (and 2 direct): 1k mean 41.7k GPU-h tune, 59.8k held out, but twin:balanced 8k missed by
    # 3.0% and held-out twin:overpredicted 1k by 17.2%: off.
    round0_full: int = ranged(0, 0)


@dataclass
class FitProbesConfig:
    """Step `fit_probes` (orchestrator/schedule/steps/fit_probes.py): layouts the memory model cannot place."""

    # layouts the calibrated memory model cannot place on either side of HBM (its error band) that would be
    # pruned: this many per round get a fit probe (start-up + stage.screen.probe_iters) instead, the searcher's
    # most promising first (Policy.estimate). A probe is one GPU per probed rank for minutes. 1 -> 3 with that
    # ranking (docs/search-log.md "Fit probes where the searcher sees promise"): fresh twin seeds 104-111 at 1k
    # 10/16 -> 14/16 rows met; 3 probes ranked by the calibrated step alone: 8/16.
    per_round: int = ranged(3, 0)


@dataclass
class SiblingProbesConfig:
    """Step `sibling_probes` (orchestrator/schedule/steps/sibling_probes.py): layouts whose nearest measurement
    (orchestrator/search/nearest.py) and the absolute model disagree, probed then measured; convergence waits.
    Not in the default steps (docs/search-log.md "Predicting from the nearest measurement"): list it after
    fit_probes in policy.schedule.steps to turn it on."""

    per_round: int = ranged(2, 0)  # rank probes a round of disputed layouts whose estimate beats the best
    knobs: list[str] = field(default_factory=lambda: ["recompute"])  # the knob groups a neighbour may differ in


@dataclass
class Round0SpreadConfig:
    """Step `round0_spread` (orchestrator/schedule/steps/round0_spread.py): probe-led round 0's probes of the
    region the uncalibrated memory model prunes, spread over EP, PP, CP and recompute."""

    probes: int = ranged(6, 0)  # policy.schedule.probe_led says why


@dataclass
class CoverageProbesConfig:
    """Step `coverage_probes` (orchestrator/schedule/steps/coverage_probes.py)."""

    # Per round, this many rank probes of the best rated layout of a knob value no layout that ran on this stage
    # carries. 0 -> 1 (docs/search-log.md "A knob value no layout ran with gets a coverage probe"): held out 30/30
    # both, mean gap 1k 0.1% -> 0.0%, 8k 0.4% -> 0.2%, 8k GPU-h +2.7%; 2 lost a held-out row.
    per_round: int = ranged(1, 0)


@dataclass
class ScheduleConfig:
    """The schedule (orchestrator/schedule): its steps in order, the settings more than one step reads (the
    round's size, probe-led rounds, the probe's pass), and each step's own settings; `policy.schedule.*`."""

    steps: list[str] = field(default_factory=lambda: list(SCHEDULE_STEPS))
    round0_size: int = ranged(6, 1)
    round_size: int = ranged(4, 1)
    # A round that screens (stage.screen: short windows, ~1/4 of a full run), or whose launches all load the
    # sweep's seed (stage.warm_start: as short), proposes this many new candidates; 0 = round_size. Tuned: 4 ->
    # 35/40 bench rows met, 6 -> 37/40; with the warm start's rounds too, held out 9/10 -> 10/10
    # (docs/search-log.md "Warm start").
    screen_round_size: int = ranged(6, 0)
    # A probed layout is measured at scale once its composed step, as the searcher rates it, is within this of the
    # best measured step (probe_first's comment has the bench figures behind 0.05).
    probe_pass: float = ranged(0.05, 0)
    # Probe-led rounds (docs/search-log.md "Round 0 on evidence"). Round 0 rank-probes every layout before any launch
    # at scale, a promoted stage's mappings of its source's winners too, so round 1 measures the probed fits best
    # composed step first and the launch that saves the seed (the stage's whole warm-up) is the fastest the
    # evidence knows, not the uncalibrated model's favourite; round 0 also probes round0_spread.probes layouts the
    # uncalibrated memory model prunes inside its default band (spread over EP, PP, CP and recompute); every
    # round probes one layout per memory footprint; a probe too close to HBM to call is measured at scale when
    # promising. Against off (tests/bench/bench_search.py): held out 25/26 rows either way, 1k / 8k mean GPU-h
    # 33.9k / 72.4k -> 26.7k / 71.9k; fresh seeds 104-111 30/32 -> 31/32, 34.0k / 70.6k -> 23.4k / 65.8k;
    # tune seed 0 16/16 -> 14/16 (twin:imbalance and ext:surface at 8k). Probed only at 1k: the 8k rows fell
    # to 26/32 fresh; the promoted winner's first mapping at scale: held out 23/26.
    probe_led: bool = True
    probe_first: ProbeFirstConfig = field(default_factory=ProbeFirstConfig)
    fit_probes: FitProbesConfig = field(default_factory=FitProbesConfig)
    sibling_probes: SiblingProbesConfig = field(default_factory=SiblingProbesConfig)
    round0_spread: Round0SpreadConfig = field(default_factory=Round0SpreadConfig)
    coverage_probes: CoverageProbesConfig = field(default_factory=CoverageProbesConfig)


@dataclass
class DriverConfig:
    """The driver's settings (orchestrator/sweep): what it does with a failed attempt; `policy.driver.*`."""

    max_attempts: int = ranged(3, 1)
    # Failure classes resubmitted (how often: orchestrator.core.failures); the default is the table's retried classes.
    retry_classes: list[str] = field(default_factory=lambda: list(DEFAULT_RETRY_CLASSES))


@dataclass
class PolicyConfig:
    """The search (orchestrator/search): calibrate the analytic models on measurements, then explore one-factor
    neighbours of the best. `name` picks the searcher; its settings, the schedule's steps and the driver's live
    apart. The tuned values were tuned on tests/bench/bench_search.py (every surface, seeds 0-2)."""

    name: str = "calibrated_neighbours"
    search: SearcherConfig = field(default_factory=SearcherConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    driver: DriverConfig = field(default_factory=DriverConfig)


class TwinSurface(StrEnum):
    """The twin's named performance surfaces (orchestrator/job/twin/truth/surfaces.py says what each one does)."""

    balanced = "balanced"
    gemm = "gemm"
    span = "span"
    memory = "memory"
    imbalance = "imbalance"
    tails = "tails"
    mixed = "mixed"  # the held-out generator: every effect drawn wide (the bench tunes on none of its seeds)
    overpredicted = "overpredicted"  # memory ~2x smaller than predicted and EP128 wins (issue 19)
    overcharged = "overcharged"  # light recompute saves 5-10x less memory than its tensors say (issue 48)
    sibling = "sibling"  # overcharged, and light recompute slows a step 2-5%: the optimum is a sibling away
    wideband = "wideband"  # mixed, each tensor off on its own draw: no per-term memory fit holds


@dataclass
class TwinConfig:
    """The simulated workload's hidden performance surface and fault injection (simulated only)."""

    seed: int = ranged(0, 0)  # moves the surface's hidden constants (and so its optimum), and the run-to-run noise
    # The machine the twin simulates (its own formulas, not the planner's); each surface stresses one effect.
    surface: TwinSurface = TwinSurface.balanced
    time_scale: float = ranged(0.001, 0)  # sleep = simulated step time x time_scale
    max_sleep_s: float = ranged(0.004, 0)  # per iteration: a 1k job (350 iterations) sleeps ~1.4 s in all
    noise_sigma: float = ranged(0.03, 0)  # lognormal step-time noise
    tail_prob: float = ranged(
        0.03, 0, 1
    )  # probability of a slow (straggler) step (the surface raises it with EP node span)
    tail_factor: float = ranged(1.6, 0)
    routing_skew: float = ranged(0.25, 0)  # lognormal sigma of per-expert load
    nccl_timeout_rate: float = ranged(0.0, 0, 1)
    crash_rate: float = ranged(0.0, 0, 1)
    force_oom: bool = False
    # The GPU the twin emulates holds this many decimal GB (what torch reports as its total memory: the OOM
    # message's capacity, get_device_properties().total_memory); None: hardware.hbm_gb. Smaller than the
    # hardware group says emulates a cluster whose GPUs are not what the config assumes.
    gpu_capacity_gb: float | None = ranged(None, gt=0)
    # Checkpoint storage: a save writes the rank's weights + optimizer state at this rate (GB/s per GPU).
    ckpt_gb_s: float = ranged(5.0, gt=0)
    # Injected numerical divergence (correctness gate): layouts whose knobs match every entry (e.g.
    # {"cp": 4}) drift away from the shared loss / grad-norm curve, by up to diverge_scale relative.
    diverge_when: dict[str, int] = field(default_factory=dict)
    diverge_scale: float = ranged(0.05, 0)


@dataclass
class RecipeConfig:
    """The training recipe every candidate runs with, so a measured step is a step of real training.

    Defaults are Megatron dev's DeepSeek-V4-Pro recipe, examples/moe_recipes/deepseek_v4_pro/gb300/
    mxfp8_SL4K_256GPU_TP1PP4EP64.yaml at d48bd6be0a85 (":N" below is its line), where the guide is silent;
    every other Megatron file:line here is the dev branch at the same commit. The performance flags are part of
    the recipe because the step-time model must assume exactly the overlap they turn on
    (orchestrator.plan.argv.overlaps). Another recipe is a file conf/workload/recipe/NAME.yaml holding what it
    changes (workload/recipe=NAME), or one value overridden: workload.recipe.lr=2e-4. Its learning-rate schedule
    is the measurement's; a training run (`best --flags --train`) takes TrainConfig's instead.
    """

    # Learning rate. --lr has no default (megatron/training/arguments.py:3892-3894) and OptimizerParamScheduler
    # does float(max_lr) (megatron/core/optimizer_param_scheduler.py:158): without it a real job dies in setup.
    lr: float = ranged(3.9e-6, 0)  # :222
    min_lr: float = ranged(3.9e-7, 0)  # :223
    lr_warmup_init: float = ranged(3.9e-7, 0)  # :224
    lr_warmup_iters: int = ranged(0, 0)  # :227
    lr_decay_style: str = "cosine"  # :225
    # :226 decays over the recipe's own train_iters; None: the job's --train-iters (all its iterations)
    lr_decay_iters: int | None = ranged(None, 1)
    # Initialisation and regularisation
    init_method_std: float = ranged(0.02, 0)  # :243
    clip_grad: float = ranged(1.0, 0)  # :229
    weight_decay: float = ranged(0.1, 0)  # :228
    attention_dropout: float = ranged(0.0, 0, 1)  # :166
    hidden_dropout: float = ranged(0.0, 0, 1)  # :167
    # Adam (model.optimizer=adam, and Muon's scalar optimizer for embeddings, norms and biases). The recipe sets
    # no --optimizer: Megatron's default adam (megatron/training/arguments.py:3738-3740).
    adam_beta1: float = ranged(0.9, 0, 1)  # :230
    adam_beta2: float = ranged(0.95, 0, 1)  # :231
    adam_eps: float = ranged(1e-8, gt=0)  # Megatron's default (megatron/training/arguments.py:3267-3269)
    # Optimizer-state and main-grad precision (the `optim` knob, orchestrator/core/knobs.py OPTIM_DTYPES): numerics,
    # so declared here, not searched freely: the planner explores only these names. Default: Megatron's FP32 state
    # (12 B/param + 4 B grads), what every earlier sweep ran. The V4 recipe's own is ["bf16"]: BF16 main grads and
    # moments with FP32 master weights through the precision-aware optimizer (:237-241); ["fp32", "bf16"] lets the
    # search choose. (Not yet the default. The bench test's "overrun" with it was the test's own count: it counted an
    # OOM at scale as a run, which max_runs does not (history/spend.py Spend.runs); counted as the driver counts,
    # tests/search/test_search_bench.py passes with ["fp32", "bf16"]. The default's effect on the bench's rows and
    # on the FP32 goldens is not measured yet.)
    optim: list[str] = field(default_factory=lambda: ["fp32"])
    # Compute precision of the GEMMs (the `precision` knob, orchestrator/core/knobs.py PRECISIONS: bf16 | fp8
    # blockwise | fp8_cs tensorwise | mxfp8): numerics, declared here like `optim`; a precision the hardware group's
    # part lacks (MXFP8 before Blackwell) is rejected per layout (mcore.precision_on_hardware). Default: BF16, what
    # every earlier sweep ran (it was stage.precision). The V4 recipe's own is mxfp8 (:233, a GB300 recipe);
    # [bf16, fp8, mxfp8] lets the search choose among what the part has.
    precision: list[str] = field(default_factory=lambda: ["bf16"])
    # Muon, used only with model.optimizer=muon (Megatron's defaults, megatron/training/arguments.py:3274-3317)
    muon_momentum: float = ranged(0.9, 0, 1)
    muon_num_ns_steps: int = ranged(5, 1)
    muon_scale_mode: str = "spectral"
    # DeepSeek-V4-Pro numerics
    moe_router_topk_scaling_factor: float = ranged(2.5, gt=0)  # :155
    moe_router_bias_update_rate: float = ranged(1e-3, 0)  # :158
    moe_aux_loss_coeff: float = ranged(1e-4, 0)  # :154
    # --moe-expert-rank-capacity-factor, emitted for flex:ncclep layouts only: dev's ncclep sizes its per-rank
    # receive buffer with it and refuses to start without it (megatron/core/transformer/moe/token_dispatcher.py:
    # 1717-1722); the recipe's value (:199, there for hybridep). Drops it causes happen in the dispatcher:
    # "not measured".
    ncclep_rank_capacity_factor: float = ranged(1.5, gt=0)
    activation_func_clamp_value: float = ranged(10.0, gt=0)  # :159
    norm_epsilon: float = ranged(1e-6, gt=0)  # :121
    rotary_base: int = ranged(10000, gt=0)  # :126
    rotary_scaling_factor: float = ranged(4.0, gt=0)  # :132 YaRN on the compressed (CSA/HCA) layers
    original_max_position_embeddings: int = ranged(65536, 1)  # :138
    mscale: float = ranged(1.0, 0)  # :133
    mscale_all_dim: float = ranged(1.0, 0)  # :134
    csa_compress_rotary_base: float = ranged(40000.0, gt=0)  # :142
    dsa_indexer_loss_coeff: float = ranged(1e-2, 0)  # :146
    # :147; the dense indexer loss with --dsa-kernel-backend cudnn raises on SM90
    # (megatron/core/transformer/transformer_config.py:1781-1791)
    dsa_indexer_use_sparse_loss: bool = True
    mhc_sinkhorn_iterations: int = ranged(20, 1)  # :162
    mtp_loss_scaling_factor: float = ranged(0.1, 0)  # :165
    # Performance flags: the measured step is the recipe's step, and the step-time model hides exactly the
    # gradient reduce-scatter / parameter all-gather these turn on (orchestrator.plan.argv.overlaps).
    overlap_grad_reduce: bool = True  # :180
    # :181; needs the distributed optimizer and overlap_grad_reduce (megatron/training/arguments.py:1071-1079)
    overlap_param_gather: bool = True
    # --grad-reduce-in-bf16: the DDP grad buffer (the main grads every microbatch's wgrad adds into, and what grad
    # sync reduce-scatters) in BF16 with FP32 main grads. Megatron's default for --bf16 is an FP32 buffer
    # (megatron/training/arguments.py:1213-1217 sets --accumulate-allreduce-grads-in-fp32 unless this is given; the
    # buffer's dtype: megatron/core/distributed/param_and_grad_buffer.py:924). Numerics, off here as in dev's
    # recipes; Megatron-Bridge's performance recipes set it (ddp.grad_reduce_in_fp32 = False). memory counts it; the
    # step model does not (docs/validate.md "Eighth pass": tried, not kept).
    grad_reduce_in_bf16: bool = False
    # EP all-to-all overlap (--overlap-moe-expert-parallel-comm --delay-wgrad-compute): one microbatch's dispatch
    # and combine run under another's compute. Off in the V4 recipe; Megatron-Bridge's H100 recipes turn it on.
    overlap_moe_expert_parallel_comm: bool = False
    moe_permute_fusion: bool = True  # :186
    moe_router_fusion: bool = True  # :187
    cross_entropy_loss_fusion: bool = True  # :215-216 (native implementation)
    manual_gc_interval: int = ranged(10, 0)  # :220-221; --manual-gc every this many iterations, 0 = Python's own GC
    # --distributed-timeout-minutes = 60 (:171, at the recipe's 256 GPUs) + 5 per 1,024 GPUs more: NCCL
    # communicator setup and the first collectives take longer as N grows.
    distributed_timeout_min: int = ranged(60, 1)
    distributed_timeout_min_per_1k_gpus: int = ranged(5, 0)


@dataclass
class WorkloadConfig:
    """The command a job runs; the candidate's Megatron flags are appended to it (the contract)."""

    name: str = "twin"
    command: list[str] = field(default_factory=lambda: ["python", "-m", "orchestrator.job.twin"])
    simulated: bool = True
    extra_args: list[str] = field(default_factory=list)  # appended after the candidate's flags
    env: dict[str, str] = field(default_factory=dict)
    mock_data: bool = True
    in_process: bool = False  # runpy the entry script inside the job to instrument it (real Megatron)
    # A rank probe's run-time mode (orchestrator/plan/probe.py): "static-balanced/1" gives a --fake-process-group
    # job dev's static pipeline shapes, finite receive buffers and balanced expert counts; "none" runs dev as it
    # is, which crashes on every PP>1 V4 probe (the mode exists for a Megatron whose own fake path is faithful).
    probe_mode: str = "static-balanced/1"
    probe_skew: float = ranged(1.0, 1.0, 64.0)  # each probed rank's local experts receive this x balanced
    resources: JobResources = field(default_factory=JobResources)  # what the cluster's None fields fall back to
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    twin: TwinConfig = field(default_factory=TwinConfig)


@dataclass
class EffectiveConfig:
    """Effective-throughput inputs (guide: Q = tokens that advanced and were not rolled back / wall time).

    Default interruption rate from Llama 3 405B: 419 unexpected interruptions in 54 days on 16,384 GPUs
    = 419 / (54 x 24 x 16384) per GPU-hour.
    """

    checkpoint_interval_s: float = ranged(3600.0, gt=0)  # training time between checkpoint saves
    interruption_rate_per_gpu_hour: float = ranged(419.0 / (54 * 24 * 16384), 0)
    restart_overhead_s: float = ranged(600.0, 0)  # detect + reschedule + re-initialise, before the restore itself
    default_save_s: float = ranged(60.0, 0)  # used when no long-run window measured the save
    default_restore_s: float = ranged(120.0, 0)
    long_run: bool = False  # run a save/restart/restore window per finalist
    long_run_save_at: int = ranged(10, 1)  # iteration at which the long-run window saves and ends the first job
    long_run_after_iters: int = ranged(10, 1)  # iterations measured after the restart


@dataclass
class ParityConfig:
    """Correctness gate: a candidate must match a reference layout's loss / grad norm per step.

    On at every stage (issue 49 item 4): the winner at scale is the layout a team trains with, so it is compared
    with a reference of its own stage (sweep/finalists.reference: `reference` overridden, else the closest
    layout with those knobs that the model allows); the dry run prices its jobs (sweep/preview.py)."""

    enabled: bool = True
    steps: int = ranged(20, 1)
    loss_rtol: float = ranged(2e-3, 0)  # the packed path has no deterministic mode: tolerance is explicit
    grad_norm_rtol: float = ranged(2e-2, 0)
    reference: dict[str, int] = field(default_factory=lambda: {"cp": 1})  # knobs overridden for the reference
    # Values a reference may take beyond the stage's search lists when the plain override does not fit: knobs
    # that save memory without changing the step's math (recompute runs the same ops again, offload moves
    # activations to host memory, ETP splits each expert's matmuls as TP splits the dense ones). At 8k no CP1
    # layout of the stage's own lists fits 141 GB; with these, 15 do (sweep/finalists.stage_layouts).
    search: dict[str, Any] = field(
        default_factory=lambda: {
            "recompute": [["moe_act", "mla_up_proj", "mhc"]],
            "offload": [["expert_fc1"]],
            "etp": [2],
        }
    )


@dataclass
class TrainConfig:
    """The training run `best --flags --train` puts a sweep's winner on: what a site fills in once
    (conf/train/default.yaml, or its own train/NAME.yaml on Hydra's search path, selected with train=NAME).

    The measurement's data, run length, checkpoints, evaluation, logging and learning-rate schedule are replaced
    (the measurement runs the performance recipe's near-zero LR without warm-up: a step's time does not depend
    on it); the layout, the model, the rest of the recipe (workload.recipe: clipping, weight decay, Adam, the
    router numerics) and the performance flags are the measured ones (orchestrator.plan.argv).
    None fields are the site's to fill: the flags then carry a `<train.FIELD>` placeholder Megatron cannot
    mistake for a real path, and `best` names what is missing. Flag names are Megatron's
    (megatron/training/arguments.py: _add_data_args, _add_checkpointing_args, _add_validation_args)."""

    data_path: list[str] | None = None  # --data-path: the indexed dataset prefixes (optionally weight, prefix...)
    split: str = "99,1,0"  # --split train,valid,test: a validation share for --eval-interval to read
    tokenizer_type: str = "HuggingFaceTokenizer"  # a real tokenizer: the measurement's NullTokenizer is no text
    tokenizer_model: str | None = None  # --tokenizer-model: a local path or a Hugging Face id
    train_iters: int = ranged(500_000, 1)  # --train-iters of the run (the measurement runs warm-up + window)
    save: str | None = None  # --save: the checkpoint folder (on a filesystem every node shares)
    load: str | None = None  # --load: None resumes from `save` (a restarted job continues where it saved)
    save_interval: int = ranged(1000, 1)  # --save-interval in iterations
    eval_interval: int = ranged(1000, 1)  # --eval-interval in iterations
    eval_iters: int = ranged(10, 0)  # --eval-iters per evaluation (the measurement runs none)
    log_interval: int = ranged(10, 1)  # --log-interval (the measurement logs every step to time it)
    # The learning-rate schedule: DeepSeek-V3's pretraining schedule (DeepSeek-V3 Technical Report,
    # arXiv:2412.19437, section 4.2 "Hyper-Parameters": linear warm-up from 0 to 2.2e-4 over the first 2K steps,
    # then a cosine decay to 2.2e-5; TRAIN_SOURCES). No DeepSeek-V4 pretraining schedule could be confirmed from a
    # public source here. V3 holds the peak until 10T of its 14.8T tokens and decays over the next 4.3T; with
    # lr_decay_iters None the cosine spans the whole run (--lr-decay-iters = train_iters): set it to decay sooner.
    lr: float = ranged(2.2e-4, gt=0)  # --lr, the peak
    min_lr: float = ranged(2.2e-5, 0)  # --min-lr, where the decay ends
    lr_warmup_init: float = ranged(0.0, 0)  # --lr-warmup-init: the warm-up starts from 0
    lr_warmup_iters: int = ranged(2000, 0)  # --lr-warmup-iters
    lr_decay_style: str = "cosine"  # --lr-decay-style
    lr_decay_iters: int | None = ranged(None, 1)  # --lr-decay-iters; None: train_iters
    # Megatron's own default seed (megatron/training/config/common_config.py:11), written out so the run says it
    seed: int = ranged(1234, 0)
    tensorboard_dir: str | None = None  # --tensorboard-dir; None: <save>/tensorboard
    # --wandb-project; None: no W&B (Megatron's default). With a project, --wandb-exp-name is wandb_exp_name, else
    # <model>-<stage> (Megatron refuses an empty name: megatron/training/global_vars.py:247-248) and W&B writes
    # under <save>/wandb (global_vars.py:253-258)
    wandb_project: str | None = None
    wandb_exp_name: str | None = None
    extra_args: list[str] = field(default_factory=list)  # appended last (argparse: a later flag wins)


# Where each TrainConfig schedule default comes from (`best --flags --train` prints it beside the value).
V3_REPORT = "DeepSeek-V3 Technical Report (arXiv:2412.19437) sec. 4.2"
TRAIN_SOURCES = {
    "lr": V3_REPORT,
    "min_lr": V3_REPORT,
    "lr_warmup_init": V3_REPORT,
    "lr_warmup_iters": V3_REPORT,
    "lr_decay_style": V3_REPORT,
    "lr_decay_iters": "the run's train_iters",
    "seed": "Megatron's default",
    "tensorboard_dir": "<save>/tensorboard",
    "wandb_project": "off",
}


@dataclass
class SweepConfig:
    name: str | None = None


@dataclass
class RootConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    ledger: LedgerConfig = field(default_factory=LedgerConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    effective: EffectiveConfig = field(default_factory=EffectiveConfig)
    parity: ParityConfig = field(default_factory=ParityConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    stage: StageConfig | None = None

    def required_stage(self) -> StageConfig:
        """The stage of a command that plans or runs jobs (composed with +stage=NAME, or a sweep's stored config)."""
        if self.stage is None:
            raise UserError("no stage given: add +stage=NAME (e.g. +stage=1k)")
        return self.stage

    def job_cluster(self) -> ClusterConfig:
        """The cluster settings jobs are launched with: the workload's resources where the cluster sets none."""
        c, r = self.cluster, self.workload.resources
        return replace(
            c,
            exclusive=r.exclusive if c.exclusive is None else c.exclusive,
            cpus_per_task=r.cpus_per_task if c.cpus_per_task is None else c.cpus_per_task,
            mem=r.mem if c.mem is None else c.mem,
        )
