r"""bench rotations: a whole model's LieRE rotations, general path against lattice path.

  python -m liere_jax.bench rotations [--case NAME ...] [--repeats N] [--json]

A whole model's LieRE rotations (rotations.liere_rotations, every layer and head, 2D normalized
grid with a CLS token): one exponential per token (general) against the lattice path
(exponentials at the primitive grid points, products for the rest), each in this backend's
plan (liere_jax.numerics); forward and forward+backward seconds (variants interleaved, medians),
counted forward GFLOP, and max |R - R(general)|. (The degree-18 variants left with TAYLOR18:
docs/decisions/013-removed-taylor18.md.)
"""
import functools
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from liere_jax import lattice, numerics as numerics_lib, rotations
from liere_jax.bench.flops import liere_flops
from liere_jax.bench.timing import interleaved, table
from liere_jax.positions import grid_positions, with_prefix


ROTATION_CASES = {  # layers, heads, grid, block; 2D normalized positions, CLS at 0.
    'cifar_vitti_liere64': (12, 3, (8, 8), 64),  # bench step's configs/cifar100.py:variant=Ti
    'cifar_vitb_liere64': (12, 12, (8, 8), 64),
    'imagenet_vitb16_liere64': (12, 12, (14, 14), 64),
    'cifar_vitb_liere8': (12, 12, (8, 8), 8),
    'imagenet_vitb16_liere8': (12, 12, (14, 14), 8),
    'tiny': (2, 2, (5, 5), 8),  # for tests
}
ROTATION_VARIANTS = ('general', 'lattice')


def bench_rotations(cases=tuple(c for c in ROTATION_CASES if c != 'tiny'),
                    variants=ROTATION_VARIANTS, repeats=3, log=print):
  """Rows per case and variant (path): fwd / fwd+bwd seconds (medians, variants interleaved),
  counted forward GFLOP (bench.flops.liere_flops) and max |R - R_first variant|."""
  unknown = [c for c in cases if c not in ROTATION_CASES]
  if unknown:
    raise ValueError(f'bench rotations: unknown case(s) {unknown}; use {list(ROTATION_CASES)}.')
  bad = [v for v in variants if v not in ROTATION_VARIANTS]
  if bad:
    raise ValueError(f'bench rotations: unknown variant(s) {bad}; use some of '
                     f'{ROTATION_VARIANTS}.')
  numerics = numerics_lib.plan()
  rows = []
  for name in cases:
    layers, heads, grid, block = ROTATION_CASES[name]
    rng = np.random.default_rng(0)
    gens = rng.uniform(0, 2 * np.pi, (layers, heads, 2, 64 // block,
                                      rotations.num_free(block))).astype(np.float32)
    pos = np.asarray(with_prefix(grid_positions(grid, grid, 'normalized'), 1))
    g = rng.standard_normal((layers, heads, len(pos), 64 // block, block, block), np.float32)
    gens_d, g_d = jnp.asarray(gens), jnp.asarray(g)
    fns, base = [], None
    for path in variants:
      lat = path == 'lattice'
      rot = lambda p, lat=lat: rotations.liere_rotations(p, pos, block, numerics, lat)
      fwd_c = jax.jit(rot).lower(gens_d).compile()
      bwd_c = jax.jit(jax.grad(lambda p, gg, rot=rot: jnp.sum(rot(p) * gg))).lower(
          gens_d, g_d).compile()
      gflop = liere_flops(gens, pos, block, lattice_ok=lat)[1] / 1e9
      r = np.asarray(fwd_c(gens_d))
      jax.block_until_ready(bwd_c(gens_d, g_d))
      base = r if base is None else base
      plan = lattice.lattice_plan(pos) if lat else None
      row = dict(case=name, path=path, gflop=gflop,
                 n_exp=layers * heads * (64 // block) * (
                     len(plan.primitives) if plan else len(pos)),
                 diff=float(np.abs(r - base).max()), fwd=None, fwd_bwd=None)
      fns.append((fwd_c, bwd_c, row))
      rows.append(row)
    calls = [f for fwd_c, bwd_c, _ in fns for f in (functools.partial(fwd_c, gens_d),
                                                     functools.partial(bwd_c, gens_d, g_d))]
    times = interleaved(calls, repeats)
    for i, (_, _, row) in enumerate(fns):
      row['fwd'], row['fwd_bwd'] = (statistics.median(times[2 * i]),
                                    statistics.median(times[2 * i + 1]))
      log(f"[{name}] {row['path']}: fwd {row['fwd']:.3f} s, "
          f"fwd+bwd {row['fwd_bwd']:.3f} s")
  return rows


def rotations_table(rows) -> str:
  head = (f"{'case':24s} {'path':8s} {'exps':>7s} {'GFLOP':>7s} {'fwd s':>7s} "
          f"{'fwd+bwd s':>9s} {'x fwd':>6s} {'x f+b':>6s} {'max |R-R0|':>10s}")
  lines, base = [], {}
  for r in rows:
    b = base.setdefault(r['case'], r)
    lines.append(f"{r['case']:24s} {r['path']:8s} {r['n_exp']:7d} "
                 f"{r['gflop']:7.2f} {r['fwd']:7.3f} {r['fwd_bwd']:9.3f} "
                 f"{b['fwd'] / r['fwd']:6.2f} {b['fwd_bwd'] / r['fwd_bwd']:6.2f} "
                 f"{r['diff']:10.1e}")
  return table(head, lines)

