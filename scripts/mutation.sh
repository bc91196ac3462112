#!/bin/bash
# Mutation testing of the core with mutmut (not in CI: hours for the whole core on 2 cores).
#   bash scripts/mutation.sh                                # every mutant of [tool.mutmut]
#   bash scripts/mutation.sh 'liere_jax.rotations.x_rotate*'   # the mutants of some functions
# Needs .venv-test (bash scripts/test.sh builds it); mutmut (requirements-mutation.txt) goes in
# .venv-mutation, which sees .venv-test's packages. Mutants and results live in mutants/
# (ignored); a rerun tests only what changed. Report: docs/mutation.md.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv-test/bin/python ]; then
  echo "build .venv-test first: bash scripts/test.sh" >&2
  exit 1
fi
if [ ! -x .venv-mutation/bin/mutmut ]; then
  "${PYTHON:-python3.11}" -m venv .venv-mutation
  .venv-test/bin/python -c 'import site; print(site.getsitepackages()[0])' > \
      "$(.venv-mutation/bin/python -c 'import site; print(site.getsitepackages()[0])')/venv_test.pth"
  .venv-mutation/bin/pip install -q -r requirements-mutation.txt
fi
.venv-mutation/bin/mutmut run "$@" || true  # Survivors exit non-zero; the results say which.
.venv-mutation/bin/mutmut results
