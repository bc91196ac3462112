#!/usr/bin/env bash
# Builds a fresh virtual environment from the repo's requirement files, installs the package in
# it (editable: `python -m liere_jax.<tool>` runs from any directory), checks the import layers
# (lint-imports, pyproject.toml's [tool.importlinter]) and runs the test suite, listing its
# slowest tests. Extra arguments go to pytest. PYTEST_WORKERS (2) pytest-xdist
# processes share the tests: one alone leaves a core idle while XLA compiles (0: no workers).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
rm -rf .venv-test
"$PY" -m venv .venv-test
.venv-test/bin/pip install -q -r requirements-test.txt
.venv-test/bin/pip install -q --no-deps -e .
.venv-test/bin/lint-imports --no-cache
.venv-test/bin/python -m pytest -q -n "${PYTEST_WORKERS:-2}" --durations=15 "$@"
