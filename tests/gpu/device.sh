#!/usr/bin/env bash
# The two-tier device check for a lent GPU machine (one H200, Python 3.12 with CUDA torch, no Transformer
# Engine, no network, 64 MiB per call, files kept between calls only while warm: 30 s). docs/gpu.md says how.
#
#   bash tests/gpu/device.sh tier-a          one call, carry [".devcarry"] (about 5 device minutes)
#   bash tests/gpu/device.sh tier-b K        call K of tier B, carry [".devcarry/tier-b/call-K"]; each call within
#                                            30 s of the last (about 10 device minutes in all)
#   bash tests/gpu/device.sh expect tier-a|tier-b    on any machine: what the carry lacks (exit 2), before a call
#
# Tier A (no Transformer Engine): install the carried wheels and Megatron-LM dev, then dev's real MoELayer at
# V4-Pro expert shapes emulating one EP rank per case, beside the planner's terms (moe.json), and a 4-layer
# GPT-MoE training step with --transformer-impl local through orchestrator.job.entry -> megatron_run, the router
# hook, the measurement window, the sidecar and orchestrator.evidence.collect (gpt.json).
# Tier B (a real V4 step): Transformer Engine's pieces arrive over calls 1..K (devcarry.py checks each sha256);
# call 1 installs the small wheels and starts compiling TE's torch extension in the background (setsid); the
# last call reassembles and installs TE, then runs the gpu1 stage's run-one with the reference attention path
# (--dsa-kernel-backend none) and the fast_hadamard_transform stand-in (tests/gpu/standins).
# Every step has its own `timeout`, times itself (steps.tsv) and writes one JSON under $OUT; a failing step
# never stops the next one; summary.json sets each measured figure beside the planner's prediction.
#
# DEVICE_DRY=1 (no GPU, any Python >= 3.11, `make test` runs it): the same steps on CPU: wheels are only checked
# to install for cp312 x86-64 into a scratch folder, Megatron is whatever DEVICE_MEGATRON names (else the
# installed megatron-core), the MoE step runs tiny shapes, the GPT step a CPU stand-in entry script
# (tests/gpu/cpu_pretrain.py), tier B's Transformer Engine build and install are announced, not run, and
# run-one goes to the twin. The figures of a dry run mean nothing; its files prove the sequence.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
DRY=${DEVICE_DRY:-0}
PY=$(command -v "${PYTHON:-python3}")
CARRY=${DEVCARRY:-$ROOT/.devcarry}
WORK=${DEVICE_WORK:-/tmp/devwork}
SITE=$WORK/site
MEG=${DEVICE_MEGATRON:-$WORK/megatron}
STORE=$WORK/tier-b
OUT=${OUT:-$WORK/out}
LOG=$OUT/device.log
STEPS=$OUT/steps.tsv
STANDINS=$ROOT/tests/gpu/standins
# Tier B's V4 run takes the reference attention path: the cuDNN DSA / FlashMLA kernels cannot travel, so
# --dsa-kernel-backend none (dev's default, said explicitly), and unpacked (SBHD) sequences, since the packed
# THD path needs the cuDNN backend (rule v4.packed_needs_cudnn). Space-separated Hydra overrides (read -ra).
TIER_B_SET="++stage.attention_backend=fused ++stage.packed_sequences=false ++workload.extra_args=[--dsa-kernel-backend,none]"
START=$(date +%s)

usage() { echo "usage: bash tests/gpu/device.sh tier-a | tier-b CALL | expect tier-a|tier-b" >&2; exit 2; }
[ $# -ge 1 ] || usage
MODE=$1
mkdir -p "$OUT" "$WORK"
touch "$STEPS"

say() { echo "$*" | tee -a "$LOG"; }
# step NAME LIMIT_S CMD...: run CMD under `timeout`, output appended to the log, rc and seconds recorded.
step() {
    local name=$1 limit=$2 t0 rc
    shift 2
    # a dry run on a shared CPU (the test suite) is bounded by its test's own timeout, not the device's clock:
    # the limits are sized for the lent machine's minutes, and a loaded 2-core host can take ten times as long
    [ "$DRY" = 1 ] && limit=$((limit * 10))
    say "=== $name (limit ${limit} s) at $(date -u +%T), $(($(date +%s) - START)) s in"
    t0=$(date +%s)
    if [ "$(type -t "$1")" = function ]; then  # a function of this script: in a child bash, under timeout
        timeout -k 10 "$limit" bash -c "$*" >>"$LOG" 2>&1
    else
        timeout -k 10 "$limit" "$@" >>"$LOG" 2>&1
    fi
    rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - t0))" >>"$STEPS"
    say "=== $name: rc=$rc in $(($(date +%s) - t0)) s"
    return 0
}
# fail fast, before any device time is spent: the carry must hold what this mode expects
expect() {
    "$PY" tests/gpu/devcarry.py expect "$@" || exit 2
}

pip_install() {  # pip_install WHEEL...: into $SITE, offline; a dry run checks they install for the device
    local tag=()
    if [ "$DRY" = 1 ]; then
        tag=(--python-version 3.12 --implementation cp --only-binary=:all: --platform manylinux2014_x86_64
            --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "${tag[@]}" "$@"
}

do_install() {  # do_install WHEELS_DIR MEGATRON_DIR: the orchestrator's wheels and Megatron-LM dev (both tiers)
    local wheels=$1 from=$2
    pip_install "$wheels"/*.whl || return 1
    ls "$SITE"
    if [ -n "${DEVICE_MEGATRON:-}" ]; then
        echo "Megatron-LM: $MEG (DEVICE_MEGATRON)"
        return 0
    fi
    rm -rf "$MEG" && mkdir -p "$MEG" && tar xzf "$from/megatron-dev.tar.gz" -C "$MEG" --strip-components=1 || return 1
    echo "Megatron-LM dev $(cat "$from/megatron-dev.commit" 2>/dev/null) in $MEG"
    [ "$DRY" = 1 ] && return 0
    # the dataset index helpers pretrain compiles on rank 0 (megatron/core/datasets/Makefile), built here so a
    # compiler problem shows in this step; LIBEXT from this Python (the Makefile asks python3-config)
    make -C "$MEG/megatron/core/datasets" \
        "LIBEXT=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')" ||
        echo "warning: dataset helpers did not build (mock data may not need them)"
}

do_environment() {
    nvidia-smi || echo "(no nvidia-smi)"
    uname -m
    "$PY" - <<'EOF'
import sys
import torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, f"sm_{p.major}{p.minor}", f"{p.total_memory / 2**30:.2f} GiB", p.multi_processor_count, "SMs")
EOF
}

# ---- tier B: Transformer Engine's torch extension, compiled against this machine's torch in the background
te_build_start() {
    local sdist
    sdist=$(ls "$STORE"/transformer_engine_torch-*.tar.gz 2>/dev/null | head -1)
    [ -n "$sdist" ] || { echo "error: no transformer_engine_torch sdist in $STORE"; return 1; }
    rm -f "$STORE/te_build.rc"
    mkdir -p "$STORE/built"
    if [ "$DRY" = 1 ]; then  # announce, and exercise the same background bookkeeping
        setsid bash -c "echo 'dry: would build $sdist'; echo 0 > '$STORE/te_build.rc'" >"$STORE/te_build.log" 2>&1 < /dev/null &
    else
        # NVTE_PYTORCH_FORCE_BUILD: build here, never try a download (there is no network)
        setsid env NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_FRAMEWORK=pytorch MAX_JOBS="$(nproc)" PYTHONPATH="$SITE" \
            bash -c "'$PY' -m pip wheel -v --no-deps --no-build-isolation --no-index -w '$STORE/built' '$sdist'; echo \$? > '$STORE/te_build.rc'" \
            >"$STORE/te_build.log" 2>&1 < /dev/null &
    fi
    echo "torch extension build started in the background (pid $!), log $STORE/te_build.log"
}

te_build_wait() {  # te_build_wait LIMIT_S: until the background build wrote its exit code
    local limit=$1 waited=0
    while [ ! -f "$STORE/te_build.rc" ] && [ "$waited" -lt "$limit" ]; do sleep 5; waited=$((waited + 5)); done
    tail -5 "$STORE/te_build.log" 2>/dev/null
    [ -f "$STORE/te_build.rc" ] || { echo "the torch extension is still building after ${limit} s"; return 1; }
    return "$(cat "$STORE/te_build.rc")"
}

do_te_install() {  # the reassembled core wheel, TE's pure wheel and the built extension
    local core
    core=$("$PY" tests/gpu/devcarry.py assemble --store "$STORE") || return 2
    echo "reassembled $core (sha256 checked)"
    if [ "$DRY" = 1 ]; then
        echo "dry: would install $core, $(ls "$STORE"/transformer_engine-*.whl) and the built extension"
        return 0
    fi
    pip_install "$core" "$STORE"/transformer_engine-*.whl || return 1
    if ! te_build_wait 240; then  # the background build failed or is late: one try in the foreground
        echo "retrying the torch extension build in the foreground"
        NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_FRAMEWORK=pytorch MAX_JOBS=$(nproc) PYTHONPATH=$SITE \
            "$PY" -m pip wheel --no-deps --no-build-isolation --no-index -w "$STORE/built" \
            "$STORE"/transformer_engine_torch-*.tar.gz || return 1
    fi
    pip_install "$STORE"/built/transformer_engine_torch-*.whl
}

do_run_one() {  # the gpu1 stage's candidate through run-one: the reference attention path
    local runs=$WORK/runs workload tb
    read -ra tb <<<"$TIER_B_SET"
    rm -rf "$runs"
    workload=(workload=megatron "workload.command=[$PY,$MEG/pretrain_hybrid.py]")
    [ "$DRY" = 1 ] && workload=(workload=twin)  # the dry run: the command line and the summary, not Megatron
    "$PY" -m orchestrator run-one +stage=gpu1 "${workload[@]}" cluster=local "cluster.folder=$runs" \
        "${tb[@]}" --format json >"$OUT/run_one.json"
}

do_preflight() {  # the orchestrator's own verdict on this machine, one row per check with its fix
    [ "$DRY" = 1 ] && { echo "dry: preflight needs the device"; return 0; }
    local tb
    read -ra tb <<<"$TIER_B_SET"
    COLUMNS=160 "$PY" -m orchestrator preflight +stage=gpu1 workload=megatron cluster=local "cluster.folder=$WORK/preflight" \
        "workload.command=[$PY,$MEG/pretrain_hybrid.py]" "${tb[@]}"
}

do_job_tail() {  # the run-one job folder's evidence, one file
    local dir
    dir=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("job_dir") or "")' "$OUT/run_one.json" 2>/dev/null)
    [ -n "$dir" ] && [ -d "$dir" ] || { echo "no job folder found under $WORK/runs"; return 1; }
    echo "job folder: $dir"
    ls -la "$dir"
    for f in "$dir"/sidecar-rank-*.json "$dir"/preflight.json "$dir"/result.json; do
        [ -f "$f" ] && { echo "===== $(basename "$f")"; head -c 20000 "$f"; echo; }
    done
    for f in "$dir"/rank-*.err "$dir"/rank-*.out; do
        [ -f "$f" ] && { echo "===== tail of $f"; tail -c 60000 "$f"; echo; }
    done
    return 0
}

set_paths() {
    if [ "$DRY" = 1 ]; then  # this Python's own packages; a DEVICE_MEGATRON checkout first when given
        export PYTHONPATH=$ROOT${DEVICE_MEGATRON:+:$MEG}:$STANDINS${PYTHONPATH:+:$PYTHONPATH}
        SMOKE=(--smoke)
    else
        export PYTHONPATH=$SITE:$ROOT:$MEG:$STANDINS${PYTHONPATH:+:$PYTHONPATH}
        SMOKE=()
    fi
    export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
}

export ROOT DRY PY CARRY WORK SITE MEG STORE OUT TIER_B_SET
export -f pip_install do_install do_environment te_build_start te_build_wait do_te_install do_run_one \
    do_preflight do_job_tail

case "$MODE" in
expect)
    [ $# -ge 2 ] || usage
    expect "${@:2}"
    ;;
tier-a)
    expect tier-a
    say "device check tier A: DRY=$DRY python=$PY root=$ROOT out=$OUT $(date -u +%FT%TZ)"
    step install 60 do_install "$CARRY/whl" "$CARRY"
    set_paths
    step environment 20 do_environment
    step imports 60 "$PY" tests/gpu/device_checks.py imports "$OUT/imports.json"
    step gemm 45 "$PY" tests/gpu/device_checks.py gemm "$OUT/gemm.json" --budget-s 25 "${SMOKE[@]}"
    step moe 120 "$PY" tests/gpu/device_checks.py moe "$OUT/moe.json" --budget-s 90 "${SMOKE[@]}"
    GPT=(--megatron "$MEG")
    [ "$DRY" = 1 ] && GPT=(--entry tests/gpu/cpu_pretrain.py)
    step gpt 240 "$PY" tests/gpu/device_checks.py gpt "$OUT/gpt.json" --budget-s 220 "${GPT[@]}" "${SMOKE[@]}"
    step summary 15 "$PY" tests/gpu/device_checks.py summary "$OUT" --steps "$STEPS"
    ;;
tier-b)
    [ $# -ge 2 ] || usage
    CALL=$2
    expect tier-b --call "$CALL"
    say "device check tier B call $CALL: DRY=$DRY python=$PY root=$ROOT out=$OUT $(date -u +%FT%TZ)"
    RECEIVED=$("$PY" tests/gpu/devcarry.py receive "$CALL" --store "$STORE") || {
        echo "error: call $CALL refused (above): nothing was run" >&2
        exit 2
    }
    say "received: $RECEIVED"
    if [ "$CALL" = 1 ]; then
        step install 90 do_install "$STORE" "$STORE"  # call 1's wheels: the orchestrator's, TE's pure one, its deps
        step te-build-start 10 te_build_start
        set_paths
        if [ "${TIER_B_KERNELS:-0}" = 1 ]; then  # tier A's kernel check, while the extension compiles
            step moe 120 "$PY" tests/gpu/device_checks.py moe "$OUT/moe.json" --budget-s 90 "${SMOKE[@]}"
        fi
    fi
    case "$RECEIVED" in
    *'"last": true'*)
        set_paths
        read -ra TB <<<"$TIER_B_SET"
        TB_SET=("${TB[@]/#/--set=}")
        step environment 20 do_environment
        step te-install 300 do_te_install
        step te 60 "$PY" tests/gpu/device_checks.py te "$OUT/te.json"
        step argv 60 "$PY" tests/gpu/device_checks.py argv "$OUT/argv.json" \
            "${TB_SET[@]}"
        step preflight 45 do_preflight
        left=$((540 - ($(date +%s) - START)))  # run-one gets what is left of 9 minutes, at least 60 s
        [ "$left" -lt 60 ] && left=60
        step run-one "$left" do_run_one
        step job-tail 15 do_job_tail
        sed -n '/^=== job-tail (limit/,/^=== job-tail: rc=/p' "$LOG" >"$OUT/job_tail.log"
        step summary 15 "$PY" tests/gpu/device_checks.py summary "$OUT" --steps "$STEPS"
        ;;
    *)
        tail -2 "$STORE/te_build.log" 2>/dev/null
        say "call $CALL done in $(($(date +%s) - START)) s: issue call $((CALL + 1)) within 30 s"
        exit 0
        ;;
    esac
    ;;
*)
    usage
    ;;
esac
say "done in $(($(date +%s) - START)) s; results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
cat "$OUT/summary.json" 2>/dev/null
exit 0
