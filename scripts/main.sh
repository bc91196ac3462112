#!/usr/bin/env bash
# Sets up a virtual environment from requirements.txt with the package installed (editable:
# `python -m liere_jax.<tool>` runs from any directory), trains the synthetic spatial task
# (configs/arrows.py, LieRE8) and evaluates it. Extra arguments go to train.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q -r requirements.txt
.venv/bin/pip install -q --no-deps -e .
WORKDIR=${WORKDIR:-runs/arrows_liere8}
.venv/bin/python train.py --config configs/arrows.py --workdir "$WORKDIR" "$@"
.venv/bin/python eval.py --workdir "$WORKDIR"
