"""Benchmarks: `python -m liere_jax.bench ACTION [flags]`, one action per module.

The actions and their one-line help are listed once, in __main__.py (ACTIONS; `python -m
liere_jax.bench --help` prints them); each action's module docstring says what it measures and
how. What they share is timing.py: a timed call (block_until_ready), rounds of interleaved calls
(medians after warm-up), the table text. Timings use nothing device-specific: the same command
runs on CPU, GPU and TPU. The last line of --json output is the machine-readable result.

Besides the actions' modules: flops.py (counted FLOPs of the exponentials, the model's from its
shapes), peer.py (the official PyTorch code's train step, for `step --official`), timing.py.
"""
from liere_jax.bench.expm import (ALL_IMPLS, CASES, DEFAULT_CASES, IMPLS, ROW_KEYS, Case,
                                  available_bytes, bench_expm, case_inputs, expm_table, is_oom,
                                  parse_case)
from liere_jax.bench.data import bench_data, data_table
from liere_jax.bench.flops import fast_flops, liere_flops
from liere_jax.bench.peer import Official, OfficialError, official_kwargs, time_official
from liere_jax.bench.rotations import (ROTATION_CASES, ROTATION_VARIANTS, TAYLOR18, TAYLORS,
                                       bench_rotations, rotations_table)
from liere_jax.bench.step import (bench_step, load_config, random_batches, step_table, vs_overrides,
                                  with_args)

__all__ = ['ALL_IMPLS', 'CASES', 'DEFAULT_CASES', 'IMPLS', 'ROW_KEYS', 'Case', 'available_bytes',
           'bench_expm', 'case_inputs', 'expm_table', 'is_oom', 'parse_case', 'fast_flops',
           'liere_flops',
           'ROTATION_CASES', 'ROTATION_VARIANTS', 'TAYLOR18', 'TAYLORS', 'bench_rotations',
           'rotations_table', 'Official', 'OfficialError', 'official_kwargs', 'time_official',
           'bench_step', 'load_config', 'random_batches', 'step_table', 'vs_overrides', 'with_args',
           'bench_data', 'data_table']
