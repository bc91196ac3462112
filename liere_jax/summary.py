r"""Model summary: parameters, position-encoding parameters, tokens and inference GFLOPs.

  python -m liere_jax.summary --config configs/cifar100.py:pe=liere8,variant=B [--json]

`params_pe` counts the free LieRE entries (strict upper triangles), as the paper's Table 10
does. FLOPs come from XLA's cost analysis of the jitted forward pass for one image (2 FLOPs per
multiply-add; the paper's Table 8 counts multiply-adds, `gmacs_per_image`), once with the
rotations computed inside the pass and once with them cached (`*_cached_pe`).
"""
import dataclasses
import json
import math

import jax
import jax.numpy as jnp
from absl import flags
from flax import nnx
from ml_collections import config_flags

from liere_jax import command
from liere_jax.config import parse_flags
from liere_jax.config.model import ModelSpec, resolve
from liere_jax.model import ViT


def _flops(fn, *args) -> float:
  cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost['flops'])


def _count(tree) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def param_counts(spec: ModelSpec) -> dict:
  """{'params_total', 'params_pe'} without allocating the parameters."""
  params = nnx.state(nnx.eval_shape(lambda: ViT(spec, rngs=nnx.Rngs(0))), nnx.Param)
  return dict(params_total=_count(params), params_pe=_count(params['pe']) if 'pe' in params else 0)


def summarize(spec: ModelSpec) -> dict:
  # The blocks in a loop: XLA's cost analysis counts a scan's body once, not once per layer.
  spec = dataclasses.replace(spec, scan_layers=False)
  model = nnx.eval_shape(lambda: ViT(spec, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(model)
  x = jax.ShapeDtypeStruct((1, *spec.input_size, spec.channels), jnp.float32)

  def forward(state, x, ctx=None):
    m = nnx.merge(graphdef, state)
    m.eval()
    return m(x, ctx=ctx)

  ctx = jax.eval_shape(lambda s: nnx.merge(graphdef, s).pe_context(model.train_grid), state)
  flops = _flops(forward, state, x)
  flops_cached = _flops(forward, state, x, ctx) if jax.tree.leaves(ctx) else flops
  return dict(
      pe=spec.pe.name,
      **param_counts(spec),
      tokens=math.prod(model.train_grid) + model.num_prefix,
      gflops_per_image=flops / 1e9,
      gflops_per_image_cached_pe=flops_cached / 1e9,
      gmacs_per_image=flops / 2e9,
      rotations_included=True,
  )


def main(argv):
  del argv
  with command.refusing():  # The config file and its model's values are checked first.
    s = summarize(resolve(flags.FLAGS.config.model))
  print(f"position encoding      {s['pe']}")
  print(f"parameters             {s['params_total']:,}")
  print(f"  position encoding    {s['params_pe']:,} "
        f"({100 * s['params_pe'] / s['params_total']:.2f}%)")
  print(f"tokens                 {s['tokens']}")
  print(f"GFLOPs / image         {s['gflops_per_image']:.3f} (rotations computed in the pass)")
  print(f"GFLOPs / image cached  {s['gflops_per_image_cached_pe']:.3f} (rotations cached)")
  print(f"GMACs / image          {s['gmacs_per_image']:.3f} (paper Table 8 unit)")
  if flags.FLAGS.json:
    print(json.dumps(s))


if __name__ == '__main__':  # Flags only here: the module is imported by tests and tools.
  config_flags.DEFINE_config_file('config', None, 'Config file[:args].', lock_config=True)
  flags.DEFINE_bool('json', False, 'Print one JSON object as the last line.')
  flags.mark_flag_as_required('config')
  command.run(main, 'summary', flags_parser=parse_flags)
