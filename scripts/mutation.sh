#!/bin/bash
# Mutation testing of the core with mutmut (not in CI: hours for the whole core on 2 cores).
#   bash scripts/mutation.sh                                # every mutant of [tool.mutmut]
#   bash scripts/mutation.sh 'liere_jax.rotations.x_rotate*'   # the mutants of some functions
#   bash scripts/mutation.sh --sample [--only central|sampled] [--per_module 5] [--seed 0]
#       # the scoped run of docs/mutation.md (scripts/mutation_sample.py): the central functions'
#       # mutants and a seeded sample of the rest, those without a result yet (resumable), of
#       # the modules outside the numerics scope
#   bash scripts/mutation.sh --numerics --sample [...]   # the same draw for expm, positions,
#       # rotations and encodings/rope against their fast value tests only
#       # (mutation_sample.NUMERICS_*), in a snapshot of HEAD: build/mutation-numerics-<commit>
# One worker, at nice 15 (the cores are shared; JAX is not fork-safe: forkserver isolation).
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
sample=(.venv-mutation/bin/python "$PWD/scripts/mutation_sample.py")
scope=core
if [ "${1:-}" = --numerics ]; then
  shift
  scope=numerics
  commit=$(git rev-parse --short HEAD)
  dir=build/mutation-numerics-$commit
  if [ ! -d "$dir" ]; then  # The commit, not the working tree: edits under way stay out.
    mkdir -p "$dir.tmp" && git archive HEAD | tar -x -C "$dir.tmp"
    ln -s "$PWD/.venv-test" "$dir.tmp/.venv-test"
    ln -s "$PWD/.venv-mutation" "$dir.tmp/.venv-mutation"
    "${sample[@]}" --numerics_config "$dir.tmp/pyproject.toml"
    mv "$dir.tmp" "$dir"
  fi
  cd "$dir"
fi
run() {  # Survivors exit non-zero; the results say which.
  nice -n 15 .venv-mutation/bin/mutmut run --max-children 1 "$@" || true
}
if [ "${1:-}" = --sample ]; then
  shift
  if ! compgen -G 'mutants/liere_jax/*.py.meta' > /dev/null; then
    run 'liere_jax.positions.x_with_prefix*'  # Generates the mutants and the coverage first.
  fi
  mapfile -t names < <("${sample[@]}" --scope "$scope" "$@")
  if ((${#names[@]})); then run "${names[@]}"; fi
else
  run "$@"
fi
.venv-mutation/bin/mutmut results
