"""An independent count of what a Pallas kernel does, for the tests of the kernels' declared
costs (liere_jax.kernels.common.Cost): the pallas_call's kernel jaxpr walked once for every step
of its grid, in the grid's order, with the program ids known (so `pl.when` takes the branch that
step takes and loops run their trip counts), and its HBM traffic from the block specs: a block
is copied in when its index differs from the previous step's, and out when the next step's
differs (or at the last step), as the TPU pipeline does, each copy the block's part of the array
as laid out in HBM (`_block_bytes`). The kernels' `cost` functions count the same by hand.

The units are the ones Cost declares: MXU flops 2 m n k a product; a vector op one per element
of its result (reductions one per element reduced), scalar ops (ids, loop counters) none;
transcendentals one per element and not vector ops; data movement (reshapes, broadcasts,
slices, concatenations, loads and stores of refs) nothing. A primitive it does not know is an
error, so that no work slips past it.
"""
import itertools
import math

import jax
from jax.extend import core as jcore
import numpy as np

ELEMENTWISE = {
    'add', 'add_any', 'sub', 'mul', 'div', 'rem', 'max', 'min', 'neg', 'abs', 'sign', 'floor',
    'ceil', 'round', 'select_n', 'eq', 'ne', 'lt', 'le', 'gt', 'ge', 'and', 'or', 'not', 'xor',
    'convert_element_type', 'is_finite', 'square', 'clamp', 'nextafter', 'shift_left',
    'shift_right_logical', 'shift_right_arithmetic', 'reduce_precision', 'roll'}
TRANSCENDENTAL = {'exp', 'exp2', 'log', 'log1p', 'expm1', 'sin', 'cos', 'tan', 'tanh',
                  'logistic', 'sqrt', 'rsqrt', 'cbrt', 'pow', 'erf', 'atan2'}
REDUCTIONS = {'reduce_sum', 'reduce_max', 'reduce_min', 'reduce_and', 'reduce_or', 'argmax',
              'argmin'}
MOVES = {'broadcast_in_dim', 'reshape', 'squeeze', 'expand_dims', 'concatenate', 'slice',
         'dynamic_slice', 'transpose', 'iota', 'get', 'swap', 'copy', 'copy_p', 'pad',
         'rev', 'multiple_of', 'pvary', 'stack', 'split'}


def pallas_calls(fn, *args):
  """The pallas_call equations of fn's jaxpr, in order (nested jaxprs searched)."""
  found = []

  def walk(jaxpr):
    for e in jaxpr.eqns:
      if e.primitive.name == 'pallas_call':
        found.append(e)
        continue
      for p in e.params.values():
        for sub in (p if isinstance(p, (tuple, list)) else (p,)):
          inner = getattr(sub, 'jaxpr', sub)
          if hasattr(inner, 'eqns'):
            walk(inner)
  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return found


class _Counter:

  def __init__(self, while_trips):
    self.while_trips = while_trips
    self.mxu = self.vpu = self.transcendentals = 0
    self.by = {}  # vector ops by primitive (for a reader finding where two counts differ)

  def run(self, jaxpr, consts, args, ids, grid):
    env = {}
    read = lambda v: v.val if isinstance(v, jcore.Literal) else env.get(v)
    for var, val in zip(jaxpr.constvars, consts):
      env[var] = val
    for var, val in zip(jaxpr.invars, args):
      env[var] = val
    for e in jaxpr.eqns:
      outs = self.eqn(e, [read(v) for v in e.invars], ids, grid)
      for var, val in zip(e.outvars, outs):
        env[var] = val
    return [read(v) for v in jaxpr.outvars]

  def closed(self, closed, args, ids, grid):
    return self.run(closed.jaxpr, closed.consts, args, ids, grid)

  def eqn(self, e, vals, ids, grid):
    name = e.primitive.name
    out = e.outvars[0].aval if e.outvars else None
    size = math.prod(getattr(out, 'shape', ()))
    vector = bool(getattr(out, 'shape', ()))
    if name == 'program_id':
      return [np.int32(ids[e.params['axis']])]
    if name == 'num_programs':
      return [np.int32(grid[e.params['axis']])]
    if name in ('jit', 'pjit', 'closed_call', 'core_call', 'remat', 'checkpoint',
                'custom_jvp_call', 'custom_vjp_call'):
      sub = e.params.get('jaxpr', e.params.get('call_jaxpr'))
      if hasattr(sub, 'consts'):
        return self.closed(sub, vals, ids, grid)
      return self.run(sub, (), vals, ids, grid)
    if name == 'cond':
      index, *rest = vals
      if index is None:
        raise ValueError('a branch that no program id decides')
      branches = e.params['branches']
      return self.closed(branches[int(np.clip(index, 0, len(branches) - 1))], rest, ids, grid)
    if name == 'scan':
      p = e.params
      consts, carry, xs = (vals[:p['num_consts']],
                           vals[p['num_consts']:p['num_consts'] + p['num_carry']],
                           vals[p['num_consts'] + p['num_carry']:])
      for _ in range(p['length']):
        res = self.closed(p['jaxpr'], consts + carry + [None] * len(xs), ids, grid)
        carry = res[:p['num_carry']]
      return carry + [None] * (len(e.outvars) - p['num_carry'])
    if name == 'while':
      p = e.params
      cconsts, bconsts = vals[:p['cond_nconsts']], vals[
          p['cond_nconsts']:p['cond_nconsts'] + p['body_nconsts']]
      carry = vals[p['cond_nconsts'] + p['body_nconsts']:]
      trips = 0
      while True:
        pred, = self.closed(p['cond_jaxpr'], cconsts + carry, ids, grid)
        if pred is None:  # data-dependent: the trip count the estimate assumes
          if self.while_trips is None:
            raise ValueError('a loop of unknown trip count')
          pred = trips < self.while_trips
        if not pred:
          return carry
        carry = self.closed(p['body_jaxpr'], bconsts + carry, ids, grid)
        trips += 1
    before = self.vpu
    self._count(e, name, size, vector)
    if self.vpu != before:
      self.by[name] = self.by.get(name, 0) + self.vpu - before
    if not vector and all(v is not None for v in vals) and len(e.outvars) == 1:
      try:  # a scalar known here (an id, a loop counter): its value
        return [np.asarray(e.primitive.bind(*vals, **e.params))]
      except Exception:  # pylint: disable=broad-except
        pass
    return [None] * len(e.outvars)

  def _count(self, e, name, size, vector):
    if name == 'dot_general':
      (contract, _), _ = e.params['dimension_numbers']
      lhs = e.invars[0].aval.shape
      self.mxu += 2 * size * math.prod(lhs[i] for i in contract)
    elif name in REDUCTIONS:
      self.vpu += math.prod(e.invars[0].aval.shape) if e.invars[0].aval.shape else 0
    elif name in TRANSCENDENTAL:
      self.transcendentals += size if vector else 0
    elif name == 'integer_pow':
      y = abs(e.params['y'])
      self.vpu += size * (y.bit_length() - 1 + bin(y).count('1') - 1) if vector else 0
    elif name in ELEMENTWISE:
      self.vpu += size if vector else 0
    elif name in MOVES or name == 'addupdate':
      if name == 'addupdate':
        self.vpu += math.prod(e.invars[1].aval.shape)
    else:
      raise ValueError(f'a primitive the count does not know: {name}')


def _block_bytes(mapping, index):
  """The bytes of a block at these block indices in the array as a TPU lays it out in HBM: its
  minor dimension in whole 128 lanes, the second-minor in whole tiles of 8 32-bit rows (8
  float32, 16 bf16). A block that spans a dimension copies it padded; one that splits it, its
  own part (the last one's up to the padded end)."""
  shape, dtype = mapping.array_aval.shape, mapping.array_aval.dtype
  tiles = [1] * len(shape)
  tiles[-1] = 128
  if len(shape) > 1:
    tiles[-2] = 8 * max(1, 4 // dtype.itemsize)
  n = 1
  for dim, i, full, tile in zip(mapping.block_shape, index, shape, tiles):
    size = getattr(dim, 'block_size', 1)
    laid = -(-full // tile) * tile
    n *= max(0, min(laid if size >= full else size, laid - int(i) * size))
  return n * dtype.itemsize


def count(eqn, while_trips=None) -> dict:
  """What one pallas_call does over its grid: {'mxu_flops', 'vpu_ops', 'transcendentals',
  'bytes'} (while_trips: the trip count of a data-dependent loop)."""
  gm = eqn.params['grid_mapping']
  grid = tuple(int(g) for g in gm.grid)
  kernel = eqn.params['jaxpr']
  c = _Counter(while_trips)
  steps = list(itertools.product(*(range(g) for g in grid)))
  for ids in steps:
    c.run(kernel, (), [None] * len(kernel.invars), ids, grid)
  traffic = 0
  for mapping in gm.block_mappings:
    last = None
    for ids in steps:
      index = tuple(int(x) for x in jcore.jaxpr_as_fun(mapping.index_map_jaxpr)(*ids))
      if index != last:  # a copy in (an input) or out (an output: the previous block's)
        traffic += _block_bytes(mapping, index)
      last = index
  return {'mxu_flops': c.mxu, 'vpu_ops': c.vpu, 'transcendentals': c.transcendentals,
          'bytes': traffic, 'vpu_by_primitive': c.by}
