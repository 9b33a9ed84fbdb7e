#!/usr/bin/env bash
# The one-shot device check: run from the repository root of a copy of this project on the lent GPU machine
# (one H200, Python 3.12 with CUDA torch, no Transformer Engine, no network), with carry [".devcarry"]:
#     bash tests/gpu/device.sh
# Every step has its own `timeout` and appends to $OUT/device.log; a failing step never stops the next one.
# Results in $OUT (7 files): device.log, imports.json, argv.json, gemm.json, run_one.json, job_tail.log,
# summary.json. Whole run: 3-4 minutes expected; run-one gets what the steps before it left of 380 s, so at
# most about 7 minutes even when every step runs to its limit (430 s + timeout grace).
#
# DEVICE_DRY=1 (a machine without a GPU, any Python >= 3.11): the same steps, but the wheels are only
# checked to install for cp312 x86-64 (pip --python-version 3.12 --platform ...) into a scratch folder and
# this Python's own packages are used; the GEMM step runs its CPU smoke (shapes, no figures).
#
# .devcarry/ (git-ignored, ~8 MiB) was staged on the development machine with:
#   P="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
#      --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $P \
#       -d .devcarry/whl hydra-core==1.3.8 omegaconf==2.3.1 submitit==1.5.4 sqlalchemy==2.1.9 greenlet \
#       alembic==1.20.1 mako==1.4.3
#   python3 -m pip download --no-deps --only-binary=:all: -d .devcarry/whl typing_extensions==4.16.0
#   python3 -m pip wheel --no-deps -w .devcarry/whl antlr4-python3-runtime==4.9.3   # sdist only on PyPI
#   git -C <Megatron-LM mirror> archive --format=tar --prefix=megatron-lm/ dev megatron pretrain_hybrid.py \
#       hybrid_builders.py model_provider.py gpt_builders.py mamba_builders.py | gzip -9 > .devcarry/megatron-dev.tar.gz
#   git -C <Megatron-LM mirror> rev-parse dev > .devcarry/megatron-dev.commit     # d48bd6be0a85...
# The image already has torch, triton, numpy, pyyaml, rich, matplotlib, cloudpickle, markupsafe, packaging,
# einops, pytest (/work/.library/device/KINDS.md). Transformer Engine cannot travel: its cu13 core wheel
# alone is 276 MB (the carry limit is 64 MiB) and transformer_engine_torch is source-only.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
DRY=${DEVICE_DRY:-0}
PY=$(command -v "${PYTHON:-python3}")
CARRY=${DEVCARRY:-$ROOT/.devcarry}
WORK=${DEVICE_WORK:-/tmp/devwork}
SITE=$WORK/site
MEG=$WORK/megatron
OUT=${OUT:-$WORK/out}
LOG=$OUT/device.log
STEPS=$WORK/steps.tsv
mkdir -p "$OUT" "$WORK"
: >"$STEPS"
START=$(date +%s)

say() { echo "$*" | tee -a "$LOG"; }
# step NAME LIMIT_S CMD...: run CMD under `timeout`, output appended to the log, rc and seconds recorded.
step() {
    local name=$1 limit=$2 t0 rc
    shift 2
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

do_install() {
    local w=("$CARRY"/whl/*.whl)
    [ -f "${w[0]}" ] || { echo "error: no wheels in $CARRY/whl: run with carry [\".devcarry\"]"; return 2; }
    [ -f "$CARRY/megatron-dev.tar.gz" ] || { echo "error: no $CARRY/megatron-dev.tar.gz"; return 2; }
    local tag=()
    if [ "$DRY" = 1 ]; then  # prove the set installs for the device's cp312 x86-64, without using it here
        tag=(--python-version 3.12 --implementation cp --only-binary=:all: --platform manylinux2014_x86_64
            --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "${tag[@]}" "${w[@]}" || return 1
    ls "$SITE"
    rm -rf "$MEG" && mkdir -p "$MEG" && tar xzf "$CARRY/megatron-dev.tar.gz" -C "$MEG" --strip-components=1 || return 1
    echo "Megatron-LM dev $(cat "$CARRY/megatron-dev.commit" 2>/dev/null) in $MEG"
    # The dataset index helpers pretrain compiles on rank 0 (megatron/core/datasets/Makefile): built here
    # so a compiler problem shows in this step, not inside the run.
    # LIBEXT from this Python: the Makefile asks python3-config, which a venv may lack.
    make -C "$MEG/megatron/core/datasets" \
        "LIBEXT=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')" || echo "warning: dataset helpers did not build (mock data may not need them)"
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
    print("device", p.name, f"sm_{p.major}{p.minor}", f"{p.total_memory / 2**30:.1f} GiB", p.multi_processor_count, "SMs")
EOF
    "$PY" -m pip list 2>/dev/null | grep -iE "^(torch|triton|numpy|transformer|hydra|omegaconf|submitit|sqlalchemy|alembic|einops|nvidia-cudnn|cudnn|flash)" || true
}

do_run_one() {
    local runs=$WORK/runs
    rm -rf "$runs"
    "$PY" -m orchestrator run-one +stage=gpu1 workload=megatron cluster=local "cluster.folder=$runs" \
        "workload.command=[$PY,$MEG/pretrain_hybrid.py]" --format json >"$OUT/run_one.json"
}

do_preflight() {  # the orchestrator's own verdict on this machine, one row per check with its fix
    COLUMNS=160 "$PY" -m orchestrator preflight +stage=gpu1 workload=megatron cluster=local "cluster.folder=$WORK/preflight" \
        "workload.command=[$PY,$MEG/pretrain_hybrid.py]"
}

do_job_tail() {  # the job folder's evidence, one file: Megatron's log tails, the sidecar, preflight, result
    local dir
    dir=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("job_dir") or "")' "$OUT/run_one.json" 2>/dev/null)
    [ -n "$dir" ] || dir=$(find "$WORK/runs" -name job.json -printf '%h\n' 2>/dev/null | tail -1)
    [ -n "$dir" ] && [ -d "$dir" ] || { echo "no job folder found under $WORK/runs"; find "$WORK/runs" -maxdepth 4 | head -50; return 1; }
    echo "job folder: $dir"
    ls -la "$dir"
    for f in "$dir"/sidecar-rank-*.json "$dir"/preflight.json "$dir"/result.json; do
        [ -f "$f" ] && { echo "===== $(basename "$f")"; head -c 20000 "$f"; echo; }
    done
    for f in "$dir"/rank-*.err "$dir"/rank-*.out "$dir"/*_log.err "$dir"/*_log.out "$dir"/.submitit/*/*_log.*; do
        [ -f "$f" ] && { echo "===== tail of $f"; tail -c 60000 "$f"; echo; }
    done
    return 0
}

export ROOT DRY PY CARRY WORK SITE MEG OUT
export -f do_install do_environment do_preflight do_run_one do_job_tail
say "device check: DRY=$DRY python=$PY root=$ROOT out=$OUT $(date -u +%FT%TZ)"
step install 60 do_install
if [ "$DRY" = 1 ]; then
    export PYTHONPATH=$ROOT:$MEG${PYTHONPATH:+:$PYTHONPATH}
    GEMM=(--smoke)
else
    export PYTHONPATH=$SITE:$ROOT:$MEG${PYTHONPATH:+:$PYTHONPATH}
    GEMM=()
fi
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
step environment 20 do_environment
step imports 60 "$PY" tests/gpu/device_checks.py imports "$OUT/imports.json"
step argv 60 "$PY" tests/gpu/device_checks.py argv "$OUT/argv.json"
step preflight 45 do_preflight
step gemm 75 "$PY" tests/gpu/device_checks.py gemm "$OUT/gemm.json" --budget-s 45 "${GEMM[@]}"
# run-one gets what is left of 380 s (so the whole script stays under 7 minutes), at most 240 s.
left=$((380 - ($(date +%s) - START)))
[ "$left" -gt 240 ] && left=240
[ "$left" -lt 30 ] && left=30
step run-one "$left" do_run_one
step job-tail 15 do_job_tail
cat "$OUT/run_one.json" >>"$LOG" 2>/dev/null
cp "$LOG" "$WORK/device.log.full" 2>/dev/null
# job_tail's text goes to its own file too (device.log keeps everything, job_tail.log is the short read).
sed -n '/^=== job-tail (limit/,/^=== job-tail: rc=/p' "$LOG" >"$OUT/job_tail.log"
step summary 15 "$PY" tests/gpu/device_checks.py summary "$OUT" --steps "$STEPS"
say "done in $(($(date +%s) - START)) s; results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
cat "$OUT/summary.json"
