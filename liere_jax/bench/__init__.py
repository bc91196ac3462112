"""Benchmarks: `python -m liere_jax.bench ACTION [flags]`, one action per module.

The actions and their one-line help are listed once, in __main__.py (ACTIONS; `python -m
liere_jax.bench --help` prints them); each action's module docstring says what it measures and
how. What they share is timing.py: a timed call (block_until_ready), rounds of interleaved calls
(medians after warm-up), the table text. Timings use nothing device-specific: the same command
runs on CPU, GPU and TPU. The last line of --json output is the machine-readable result.

Besides the actions' modules: flops.py (counted FLOPs of the exponentials, the model's from its
shapes), peer.py (the official PyTorch code's train step, for `step --official`), hlo.py (a
compiled module's HBM traffic, for `compile`), timing.py. Whether a run fits its chips and the
Cloud TPU slices are the library's: liere_jax/fit.py, liere_jax/tpu_slices.py.
"""
from liere_jax.bench.expm import CASES, ROW_KEYS, Case, bench_expm, expm_table, parse_case
from liere_jax.bench.flops import fast_flops, liere_flops
from liere_jax.bench.peer import Official, OfficialError, official_kwargs, time_official
from liere_jax.bench.step import load_config, vs_overrides, with_args

__all__ = ['CASES', 'ROW_KEYS', 'Case', 'bench_expm', 'expm_table', 'parse_case', 'fast_flops',
           'liere_flops', 'Official', 'OfficialError', 'official_kwargs', 'time_official',
           'load_config', 'vs_overrides', 'with_args']
