"""The Megatron flags a candidate's command line may carry, each with the branch whose parser accepts it.

Why a table: the real job, the twin and the checks against megatron-core 0.19.2 must agree on which flags
exist where. "main" = megatron-core 0.19.2 / main's parser accepts flag and value (tests run the real
parser), "dev" = only Megatron's dev branch (the only code that trains DeepSeek-V4: CSA/HCA attention,
mHC, hash routing, packed-THD CP, YaRN's original length). DEV_ONLY_FLAGS is the dev set; split_dev
drops it for a main/PyPI parser. orchestrator.plan.argv refuses any flag not listed here.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    "--pipeline-model-parallel-layout": (MAIN, str),  # the GPT path's split (E, t, m, L stages)
    "--quick-geglu": (MAIN, bool),  # GPT-OSS's clamped GELU-GLU
    "--window-size": (MAIN, str),  # "W-1,0": W keys incl. the query's own
    "--window-attn-skip-freq": (MAIN, int),
    "--spec": (DEV, list),  # flag exists on main; hybrid_dsv4_stack_spec only on dev
    # MLA / V4 attention
    "--multi-latent-attention": (MAIN, bool),
    "--qk-head-dim": (MAIN, int),
    "--group-query-attention": (MAIN, bool),
    "--num-query-groups": (MAIN, int),
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
    "--moe-expert-rank-capacity-factor": (MAIN, float),
    "--moe-router-load-balancing-type": (MAIN, str),
    "--moe-aux-loss-coeff": (MAIN, float),
    "--moe-router-score-function": (MAIN, str),
    "--moe-router-enable-expert-bias": (MAIN, bool),
    "--moe-router-dtype": (MAIN, str),
    "--moe-n-hash-layers": (DEV, int),
    "--moe-layer-freq": (MAIN, str),  # "([0]*3+[1]*58)": the leading dense blocks of DeepSeek-V3
    "--moe-router-num-groups": (MAIN, int),
    "--moe-router-group-topk": (MAIN, int),
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
    "--use-precision-aware-optimizer": (MAIN, bool),
    "--main-grads-dtype": (MAIN, str),
    "--main-params-dtype": (MAIN, str),
    "--exp-avg-dtype": (MAIN, str),
    "--exp-avg-sq-dtype": (MAIN, str),
    "--overlap-grad-reduce": (MAIN, bool),
    "--overlap-param-gather": (MAIN, bool),
    "--grad-reduce-in-bf16": (MAIN, bool),
    "--bf16": (MAIN, bool),
    "--fp8-format": (MAIN, str),
    "--fp8-recipe": (MAIN, str),
    "--attention-backend": (MAIN, str),
    "--dsa-kernel-backend": (MAIN, str),
    "--transformer-impl": (MAIN, str),
    "--deterministic-mode": (MAIN, bool),
    "--moe-permute-fusion": (MAIN, bool),
    "--overlap-moe-expert-parallel-comm": (MAIN, bool),
    "--delay-wgrad-compute": (MAIN, bool),
    "--moe-router-fusion": (MAIN, bool),
    "--cross-entropy-loss-fusion": (MAIN, bool),
    "--cross-entropy-fusion-impl": (MAIN, str),
    # training recipe (orchestrator.core.schema.RecipeConfig)
    "--lr": (MAIN, float),
    "--min-lr": (MAIN, float),
    "--lr-warmup-init": (MAIN, float),
    "--lr-warmup-iters": (MAIN, int),
    "--lr-decay-style": (MAIN, str),
    "--lr-decay-iters": (MAIN, int),
    "--init-method-std": (MAIN, float),
    "--clip-grad": (MAIN, float),
    "--weight-decay": (MAIN, float),
    "--attention-dropout": (MAIN, float),
    "--hidden-dropout": (MAIN, float),
    "--adam-beta1": (MAIN, float),
    "--adam-beta2": (MAIN, float),
    "--adam-eps": (MAIN, float),
    "--muon-momentum": (MAIN, float),
    "--muon-num-ns-steps": (MAIN, int),
    "--muon-scale-mode": (MAIN, str),
    "--moe-router-topk-scaling-factor": (MAIN, float),
    "--moe-router-bias-update-rate": (MAIN, float),
    "--activation-func-clamp-value": (MAIN, float),
    "--norm-epsilon": (MAIN, float),
    "--rotary-base": (MAIN, int),
    "--rotary-scaling-factor": (MAIN, float),
    "--original-max-position-embeddings": (DEV, int),
    "--mscale": (MAIN, float),
    "--mscale-all-dim": (MAIN, float),
    "--csa-compress-rotary-base": (DEV, float),
    "--dsa-indexer-loss-coeff": (MAIN, float),
    "--dsa-indexer-use-sparse-loss": (MAIN, bool),
    "--mhc-sinkhorn-iterations": (DEV, int),
    "--mtp-loss-scaling-factor": (MAIN, float),
    "--manual-gc": (MAIN, bool),
    "--manual-gc-interval": (MAIN, int),
    "--distributed-timeout-minutes": (MAIN, int),
    # data
    "--mock-data": (MAIN, bool),
    # a one-GPU rank probe: one process trains rank RANK of a WORLD_SIZE job, every collective skipped
    # (dev megatron/training/arguments.py:4312; also in megatron-core 0.19.2)
    "--fake-process-group": (MAIN, bool),
    "--tokenizer-type": (MAIN, str),
    "--vocab-size": (MAIN, int),
    # a training run's data, checkpoints and evaluation (orchestrator.core.schema.TrainConfig)
    "--data-path": (MAIN, list),
    "--split": (MAIN, str),
    "--tokenizer-model": (MAIN, str),
    "--save": (MAIN, str),
    "--load": (MAIN, str),
    "--save-interval": (MAIN, int),
    # warm start (orchestrator.core.schema.WarmStartConfig): the seed saves weights only, later launches load them
    "--finetune": (MAIN, bool),
    "--no-load-optim": (MAIN, bool),
    "--no-load-rng": (MAIN, bool),
    "--no-save-optim": (MAIN, bool),
    "--no-save-rng": (MAIN, bool),
    "--eval-interval": (MAIN, int),
    "--seed": (MAIN, int),
    "--tensorboard-dir": (MAIN, str),
    "--wandb-project": (MAIN, str),
    "--wandb-exp-name": (MAIN, str),
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


def branch_of(flag: str) -> str:
    """'main' or 'dev' for a flag argv.py emits."""
    return FLAGS[flag][0]


def split_dev(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(main argv, dev-only flags): drop each dev-only flag with its values, for checking an argv against a
    main/PyPI parser."""
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


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The token after `flag` in argv (or after '=' in '--flag=value'); None if absent."""
    for i, tok in enumerate(argv):
        if tok == flag:
            return argv[i + 1] if i + 1 < len(argv) else ""
        if tok.startswith(flag + "="):
            return tok.split("=", 1)[1]
    return None
