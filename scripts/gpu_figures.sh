#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md in one go, each section under its own time limit:
#   scripts/gpu_figures.sh OUT [OFFICIAL]
# OUT gets log.txt (everything printed), results.jsonl (each bench's JSON line, tagged) and
# each reproduce run in RUNS as a .tgz. OFFICIAL: a checkout of github.com/StanfordMIMI/LieRE
# for the official train step beside ours. Environment: PY (python3), DEADLINE (seconds for the
# whole script, 560), BATCH (ViT-B/16 bench step batch, 128), PES (encodings timed against abs),
# RUNS (table3 runs to train and evaluate first; none by default), EXPM_ARGS (--repeats 3);
# OFFICIAL_BATCH (64: the official step beside ours); PES= or EXPM_ARGS= (empty) skips those.
set -u
OUT=${1:?usage: scripts/gpu_figures.sh OUT [OFFICIAL]}
OFFICIAL=${2:-}
PY=${PY:-python3}
DEADLINE=${DEADLINE:-560}
BATCH=${BATCH:-128}
PES=${PES-liere8 paper_rope_mixed rope_mixed liere64}
RUNS=${RUNS:-}
EXPM_ARGS=${EXPM_ARGS---repeats 3}
OFFICIAL_BATCH=${OFFICIAL_BATCH:-64}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")  # Both paths may be relative to where the script was called from.
[[ -n $OFFICIAL ]] && OFFICIAL=$(realpath "$OFFICIAL")
cd "$(dirname "$0")/.."
# bench expm times torch.matrix_exp in the same process: JAX must not take 75% of the GPU.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
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

section smoke 120 $PY -m liere_jax.bench step --config configs/arrows.py --vs pe=abs \
    --steps 2 --warmup 1 --json || { echo "smoke failed: stopping"; exit 1; }

for run in $RUNS; do
  section "$run" 300 $PY -m liere_jax.reproduce --suite table3 --only "$run" \
      --out /tmp/gpu_figures_report && tar czf "$OUT/$run.tgz" -C runs/reproduce "$run"
done

[[ -n $EXPM_ARGS ]] && section expm 150 $PY -m liere_jax.bench expm $EXPM_ARGS --json

for pe in $PES; do
  section "step_$pe" 150 $PY -m liere_jax.bench step --config "configs/imagenet.py:pe=$pe" \
      --vs pe=abs --config.batch_size="$BATCH" --steps 10 --json
done

# The official step runs in a second process on the same GPU: at batch 128 ours held 36.7 GiB
# and theirs ran out at 42.5 GiB on an 80 GB H100, hence its own, smaller batch.
[[ -n $OFFICIAL ]] && section official_liere64 200 $PY -m liere_jax.bench step \
    --config configs/imagenet.py:pe=liere64 --vs pe=abs --config.batch_size="$OFFICIAL_BATCH" \
    --steps 10 --official "$OFFICIAL" --json
rm -f "$OUT/.section"
echo "== done in $((SECONDS - START))s"
