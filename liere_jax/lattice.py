"""The lattice path of LieRE's rotations: positions on a lattice as powers of primitive points.

The generator is linear in p, so R(m q) = R(q)^m: only the primitive points q need an
exponential, and every other point is one product of two earlier powers along its ray
(`lattice_plan`, built at trace time in numpy); `table` multiplies them out, `take_static`
reads the table by token.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from liere_jax.expm import xla_algebra
from liere_jax.numerics import Numerics


@dataclasses.dataclass(frozen=True)
class LatticePlan:
  """Positions on a lattice as powers of primitive points (numpy, built at trace time).

  The table of rotations has slots 0 = I, 1..P = exp at the primitive points `primitives`
  [P, n], then one slot per product: level j multiplies slots lhs[j] @ rhs[j] (all from
  earlier levels). Token t reads slot token_slot[t], transposed where
  transpose[t] (p = -m q).
  """
  primitives: np.ndarray
  levels: tuple
  token_slot: np.ndarray
  transpose: np.ndarray

  @property
  def n_products(self):
    return sum(len(l) for l, _ in self.levels)


def concrete_positions(positions):
  """positions as float64 numpy if known at trace time (also a constant under jit), else None."""
  if isinstance(positions, jax.core.Tracer):
    # A jit constant (jnp.asarray of numpy) has its value; other tracers give None.
    positions = getattr(positions, 'get_const', lambda: None)()
    if positions is None:
      return None
  try:
    return np.asarray(positions, np.float64)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return None


def lattice_plan(positions, tol: float = 1e-5, max_multiple: int = 2**16):
  """The LatticePlan of positions [T, n], or None (traced, off a lattice, or nothing to gain).

  Step per axis: its smallest nonzero |p|; the positions must be integer multiples of it within
  tol (relative; float32 grids are within 2e-7). The primitive points are q * step, the float32
  positions they stand for within float32 rounding.
  """
  pos = concrete_positions(positions)
  if pos is None or pos.ndim != 2 or not np.all(np.isfinite(pos)):
    return None
  mags = np.abs(pos)
  steps = np.array([m[m > 0].min() if np.any(m > 0) else 1. for m in mags.T])
  k = pos / steps
  ki = np.rint(k)
  if np.any(np.abs(k - ki) > tol * np.maximum(1., np.abs(ki))) or np.abs(ki).max(
      initial=0) > max_multiple:
    return None
  ki = ki.astype(np.int64)
  mult = np.gcd.reduce(np.abs(ki), axis=1)  # 0 for p = 0.
  nonzero = mult > 0
  q = np.zeros_like(ki)
  q[nonzero] = ki[nonzero] // mult[nonzero, None]
  first = np.take_along_axis(q, np.argmax(q != 0, axis=1)[:, None], 1)[:, 0]
  transpose = first < 0  # R(-q) = R(q)^T.
  q[transpose] *= -1
  dirs, inv = np.unique(q[nonzero], axis=0, return_inverse=True)
  inv = inv.reshape(-1)
  n_dirs = len(dirs)
  # Every needed power m >= 2 of a direction is m = h + r, h the largest power of 2 below m:
  # its level ceil(log2 m) exceeds both operands'. Close the set under that split.
  need = set(zip(inv.tolist(), mult[nonzero].tolist()))
  todo = [x for x in need if x[1] > 1]
  while todo:
    d, m = todo.pop()
    h = 1 << int(m - 1).bit_length() - 1
    for sub in ((d, h), (d, m - h)):
      if sub[1] > 1 and sub not in need:
        need.add(sub)
        todo.append(sub)
  level_of = lambda m: int(m - 1).bit_length()  # ceil(log2 m): 0 for the primitives.
  high = lambda m: 1 << level_of(m) - 1  # the largest power of 2 below m
  # By level, then by the level of the right operand (one source array per batched product).
  powers = sorted((x for x in need if x[1] > 1),
                  key=lambda x: (level_of(x[1]), level_of(x[1] - high(x[1])), x))
  if not n_dirs or (n_dirs + 1 >= len(pos) and not powers and not np.any(transpose)
                    and np.all(nonzero)):
    return None  # Every token at the origin, or its own primitive point: nothing to gain.
  slot = {(d, 1): 1 + d for d in range(n_dirs)}
  levels, cur, nxt = [], None, 1 + n_dirs
  for d, m in powers:
    if level_of(m) != cur:
      levels.append(([], []))
      cur = level_of(m)
    levels[-1][0].append(slot[(d, high(m))])
    levels[-1][1].append(slot[(d, m - high(m))])
    slot[(d, m)] = nxt
    nxt += 1
  token_slot = np.zeros(len(pos), np.int64)
  token_slot[nonzero] = [slot[(d, m)] for d, m in zip(inv.tolist(), mult[nonzero].tolist())]
  return LatticePlan(primitives=(dirs * steps).astype(np.float32),
                     levels=tuple((np.array(l), np.array(r)) for l, r in levels),
                     token_slot=token_slot, transpose=transpose)


@jax.named_scope('liere_lattice')  # Reading the table: the lattice path's traffic.
def take_static(x: jax.Array, idx: np.ndarray) -> jax.Array:
  """x[:, idx] for static numpy indices, whose backward is gathers, not one scatter-add over
  every index (a serial loop on CPU): one of every slot's first reader, masked where none reads
  it (no padded copy of the cotangent); further readers (a slot read twice: the identity by CLS
  and the origin) by a gather of those alone, added at their few slots."""
  idx = np.asarray(idx, np.int64)
  n = x.shape[1]
  # inv[c, s]: the c-th index position reading slot s, or -1 if none.
  order = np.argsort(idx, kind='stable')
  rank = np.empty_like(order)
  counts = np.bincount(idx, minlength=n)
  starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
  rank[order] = np.arange(len(idx)) - starts[idx[order]]
  inv = np.full((max(int(counts.max(initial=0)), 1), n), -1, np.int64)
  inv[rank, idx] = np.arange(len(idx))

  @jax.custom_vjp
  def take(x):
    return jnp.take(x, idx, axis=1)

  def bwd(_, g):
    def gather(row):  # [G, n, ...]: g at row's positions, 0 where -1
      got = jnp.take(g, np.maximum(row, 0), axis=1)
      if np.any(row < 0):
        got = jnp.where((row >= 0).reshape((1, n) + (1,) * (g.ndim - 2)), got, 0)
      return got
    out = gather(inv[0])
    for row in inv[1:]:
      cols = np.flatnonzero(row >= 0)
      if 4 * len(cols) < n:
        out = out.at[:, cols].add(jnp.take(g, row[cols], axis=1))
      else:
        out = out + gather(row)
    return (out,)

  take.defvjp(lambda x: (take(x), None), bwd)
  return take(x)


def table(rot: jax.Array, plan: LatticePlan, numerics: Numerics) -> jax.Array:
  """The table of every slot [G, n_slots, b b] from the primitives' rotations rot [G, P, b, b]:
  I, the primitives, then each level's products (at `numerics`' products)."""
  matmul = xla_algebra(numerics.products, numerics.elementwise_blocks).matmul
  block = rot.shape[-1]
  bounds = np.cumsum([0, 1, rot.shape[1]] + [len(lhs) for lhs, _ in plan.levels])
  with jax.named_scope('liere_lattice'):
    parts = [jnp.broadcast_to(jnp.eye(block, dtype=rot.dtype), rot[:, :1].shape), rot]
    for lhs, rhs in plan.levels:
      # No growing table (its copies and their backward cost more than the products at small
      # b): each operand is read from one earlier part; lhs (d, 2^(j-1)) all from the last.
      src_l = np.searchsorted(bounds, lhs, 'right') - 1
      src_r = np.searchsorted(bounds, rhs, 'right') - 1
      assert np.all(src_l == src_l[0]), 'lhs operands come from one part'
      left = take_static(parts[src_l[0]], lhs - bounds[src_l[0]])
      out = []
      for src in np.unique(src_r):  # contiguous: the plan sorts by the rhs part
        sel = np.flatnonzero(src_r == src)
        out.append(matmul(left[:, sel[0]:sel[-1] + 1],
                          take_static(parts[src], rhs[sel] - bounds[src])))
      parts.append(jnp.concatenate(out, axis=1) if len(out) > 1 else out[0])
    out = jnp.concatenate(parts, axis=1)
    # Flat before it is gathered and read: a TPU lays [..., b, b] out in 8 x 128 tiles (16x an
    # 8 x 8 block), [..., b b] in 2x.
    return out.reshape(out.shape[:2] + (block * block,))
