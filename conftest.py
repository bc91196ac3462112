"""Pytest setup: eight fake CPU devices (before JAX starts) and the repo on sys.path."""
import os

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# One BLAS thread: numpy's eigh / solve on 2 shared cores otherwise stall for seconds.
os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')
