#!/usr/bin/env bash
# The GPU figures of docs/performance.md in one call (10 min), each section under its own time
# limit, most important first:
#   scripts/gpu_figures.sh OUT [OFFICIAL]
# 1. the A/B of each GPU change against the path before it (issue 38's LieRE8 products as
# multiply-adds (elementwise_blocks=8, untimed on a GPU), its fused exponential
# (expm 'pallas': bench expm beside torch.matrix_exp, then the step), its squarings as a loop,
# RoPE's pair swap and pairs on x's layout, q, k and v as three products (a TPU's); then the
# exponential's form, its precision, rotate's form, cuDNN attention); 2. the train step of every
# encoding in PES against abs (ViT-B/16, BATCH); 3. a profile of the LieRE64 step (device-busy fraction, kernels and
# device-to-host copies per step, top kernels); 4. bench expm against torch.matrix_exp; 5. the
# official step beside ours (with OFFICIAL, a checkout of github.com/StanfordMIMI/LieRE).
# OUT gets log.txt (everything printed), results.jsonl (each bench's JSON line, tagged) and
# each reproduce run in RUNS as a .tgz. Environment: PY (python3), DEADLINE (seconds for the
# whole script, 570), BATCH (128), AB (the A/B sections, in order), PES, PROFILE, EXPM_ARGS,
# RUNS (table3 runs to train and evaluate first; none by default), OFFICIAL_BATCH (64); an
# empty AB=, PES=, PROFILE= or EXPM_ARGS= skips those. Compiled programs are cached across
# sections (JAX's persistent cache in OUT/.jax_cache): abs compiles once.
set -u
OUT=${1:?usage: scripts/gpu_figures.sh OUT [OFFICIAL]}
OFFICIAL=${2:-}
PY=${PY:-python3}
DEADLINE=${DEADLINE:-570}
BATCH=${BATCH:-128}
PES=${PES-liere64 liere8 paper_rope_mixed rope_mixed}
AB=${AB-blocks pallas squarings swap pairs qkv all expm precision attention}
PROFILE=${PROFILE-1}
RUNS=${RUNS:-}
EXPM_ARGS=${EXPM_ARGS---repeats 3 --case imagenet_vitb16_liere64 --case imagenet_vitb16_liere8 --case cifar_vitb_liere64 --impl fast --impl select --impl cond --impl torch}
OFFICIAL_BATCH=${OFFICIAL_BATCH:-64}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")  # Both paths may be relative to where the script was called from.
[[ -n $OFFICIAL ]] && OFFICIAL=$(realpath "$OFFICIAL")
cd "$(dirname "$0")/.."
# bench expm times torch.matrix_exp in the same process: JAX must not take 75% of the GPU.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR="$OUT/.jax_cache" JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
exec > >(tee -a "$OUT/log.txt") 2>&1
START=$SECONDS

# section NAME LIMIT CMD...: runs CMD under min(LIMIT, time left); its --json line goes to
# results.jsonl tagged with NAME. Skipped when under 30 s would be left.
section() {
  local name=$1 limit=$2; shift 2
  local left=$((DEADLINE - (SECONDS - START)))
  if ((left < 30)); then echo "== $name: skipped, ${left}s left"; return 1; fi
  ((limit > left)) && limit=$left
  echo "== $name (limit ${limit}s, at $((SECONDS - START))s): $*"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/.section" | grep -v -E '^(\{"|\[\{)'
  local rc=${PIPESTATUS[0]} json
  json=$(grep -E '^(\{"|\[\{)' "$OUT/.section" | tail -n 1)
  [[ -n $json ]] && echo "{\"section\": \"$name\", \"result\": $json}" >> "$OUT/results.jsonl"
  echo "== $name: rc=$rc in $((SECONDS - START))s"
  return $rc
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
$PY -c 'import jax, flax, optax, orbax.checkpoint as o, numpy; print("jax", jax.__version__,
"flax", flax.__version__, "optax", optax.__version__, "numpy", numpy.__version__, jax.devices())'

section smoke 90 $PY -m liere_jax.bench step --config configs/arrows.py --vs pe=abs \
    --steps 2 --warmup 1 --json || { echo "smoke failed: stopping"; exit 1; }
git log -1 --format='commit %h %s' 2>/dev/null || true

for run in $RUNS; do
  section "$run" 300 $PY -m liere_jax.reproduce --suite table3 --only "$run" \
      --out /tmp/gpu_figures_report && tar czf "$OUT/$run.tgz" -C runs/reproduce "$run"
done

step() {  # step NAME CONFIG_ARGS VS [LIMIT]: bench step of ViT-B/16 at BATCH
  section "$1" "${4:-150}" $PY -m liere_jax.bench step --config "configs/imagenet.py:$2" \
      --vs "$3" --config.batch_size="$BATCH" --steps 8 --json
}
# Each change against the path before it, in one process: B replaces fields of the numerics
# plan (liere_jax.numerics; --vs FIELD=VALUE) or config values. blocks: B the candidate, LieRE8's
# 8x8 products as float32 multiply-adds; squarings: the loop form against select (the GPU's);
# RoPE's blocks of 2 (the GPU's form) against the form on x's layout by a product (the CPU's) or
# by lane shifts (the TPU's); the exponential's form (cond: per-chunk branches and remat), its
# products (highest: float32), XLA's attention instead of cuDNN's (attention=xla).
# pallas: the exponential as one Triton kernel (expm 'pallas'): its own bench expm section
# first, so a failure there leaves the other sections' figures.
OLD_EXPM=expm=cond
OLD_PREC=config.model.pe.expm_precision=highest
for ab in $AB; do
  case $ab in
    blocks) step ab_blocks pe=liere8 elementwise_blocks=8 ;;  # B: 8x8 products as multiply-adds
    squarings) step ab_squarings pe=liere64 expm=loop ;;  # A: select (GPU default)
    pallas)  # The fused exponential (issue 38 item 2, Triton): the stack alone, then the step.
      section ab_expm_pallas 150 $PY -m liere_jax.bench expm --repeats 3 \
          --case imagenet_vitb16_liere64 --case cifar_vitb_liere64 --impl fast --impl loop \
          --impl pallas --impl torch --json
      step ab_pallas pe=liere64 config.model.pe.expm=pallas ;;  # A: select (GPU default)
    pairs) step ab_pairs pe=rope_mixed pairs=swap_matmul ;;  # B: on x's layout (CPU, TPU); A: blocks (GPU)
    qkv) step ab_qkv pe=liere64 split_qkv=True ;;  # B: q, k, v as three products (a TPU's, rotated)
    swap) step ab_swap pe=rope_mixed pairs=swap_roll ;;  # B: x's layout by roll (the TPU's)
    all) step ab_all pe=liere64 "$OLD_EXPM,$OLD_PREC,attention=xla" ;;
    expm) step ab_expm pe=liere64 "$OLD_EXPM" ;;
    precision) step ab_precision pe=liere64 "$OLD_PREC" ;;
    attention) step ab_attention pe=abs attention=xla ;;
  esac
done

for pe in $PES; do step "step_$pe" "pe=$pe" pe=abs; done

[[ -n $PROFILE ]] && section profile_liere64 120 $PY -m liere_jax.bench profile \
    --config configs/imagenet.py:pe=liere64 --config.batch_size="$BATCH" --steps 5 --json

[[ -n $EXPM_ARGS ]] && section expm 150 $PY -m liere_jax.bench expm $EXPM_ARGS --json

# The official step runs in a second process on the same GPU: at batch 128 ours held 36.7 GiB
# and theirs ran out at 42.5 GiB on an 80 GB H100, hence its own, smaller batch.
[[ -n $OFFICIAL ]] && section official_liere64 200 $PY -m liere_jax.bench step \
    --config configs/imagenet.py:pe=liere64 --vs pe=abs --config.batch_size="$OFFICIAL_BATCH" \
    --steps 10 --official "$OFFICIAL" --json
rm -rf "$OUT/.section" "$OUT/.jax_cache"
echo "== done in $((SECONDS - START))s"
