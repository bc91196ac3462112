"""Pytest setup, before JAX starts: eight fake CPU devices, quick XLA compiles, one BLAS thread,
the repo on sys.path, and JAX's persistent compilation cache for the session.

The cache is a directory of this session (removed at its end) that the tests' subprocesses
(train, eval, the converters, the benchmarks) and pytest-xdist workers (scripts/test.sh runs two)
inherit through the environment: a program compiled
once, e.g. the tiny model's train step that many train.py runs share, is read back instead of
compiled again. Entries are keyed by the program, its compile options, the XLA flags and the JAX
version, so a hit runs the same executable a compile would give. To keep the cache across
sessions, set JAX_COMPILATION_CACHE_DIR to a directory of your own; to test with XLA's full
optimisations, set XLA_FLAGS=--xla_force_host_platform_device_count=8.
"""
import os
import shutil
import tempfile

# Eight fake devices; XLA's CPU backend without its LLVM optimisations and with its classic
# (non-MLIR) fusion emitters: the tests' programs are tiny, so compiling them is most of the
# suite's time, and these compile them ~3x and then another ~1.3x faster (the same HLO passes;
# only the machine code differs). helpers.python passes them on.
os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8 '
                      '--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true '
                      '--xla_cpu_use_fusion_emitters=false')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# One BLAS thread: numpy's eigh / solve on 2 shared cores otherwise stall for seconds.
os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')

_OWN_CACHE = None
if not os.environ.get('JAX_COMPILATION_CACHE_DIR'):
  _OWN_CACHE = tempfile.mkdtemp(prefix='liere_jax_tests_jax_cache_')
  os.environ['JAX_COMPILATION_CACHE_DIR'] = _OWN_CACHE
# Every program, however small or quick to compile (the defaults skip those under 1 s).
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')
_PID = os.getpid()


def pytest_unconfigure(config):
  del config
  if _OWN_CACHE and os.getpid() == _PID:  # Not from a forked worker process.
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)
