"""The TPU compiler's figures for an exponential stack, forward and forward + backward, per expm
method, compiled deviceless for one chip (libtpu, requirements-tpu.txt; no TPU needed):

  .venv-test/bin/python scripts/expm_kernel_cost.py [--m 16848] [--b 64] [--topology v5litepod-1]
      [--method pallas --method fast ...]

Prints, per method and pass: XLA's FLOPs and bytes accessed (cost_analysis), the temporaries
and the generated code (memory_analysis), and the compile time. A Pallas (Mosaic) kernel is a
custom call: its FLOPs are not counted and its bytes are its operands and results.
"""
import argparse
import sys
import time

import jax
import jax.numpy as jnp
from jax.sharding import SingleDeviceSharding

sys.path.insert(0, __file__.rsplit('/scripts/', 1)[0])
from liere_jax import expm, tpu_slices  # pylint: disable=g-import-not-at-top
from liere_jax.bench.expm import impl_numerics  # pylint: disable=g-import-not-at-top


def main():
  p = argparse.ArgumentParser()
  p.add_argument('--m', type=int, default=16848)  # ImageNet LieRE64's lattice exponentials.
  p.add_argument('--b', type=int, default=64)
  p.add_argument('--topology', default='v5litepod-1')
  p.add_argument('--method', action='append')
  args = p.parse_args()
  dev = tpu_slices.parse_slice(args.topology).devices()[0]
  x = jax.ShapeDtypeStruct((args.m, args.b, args.b), jnp.float32,
                           sharding=SingleDeviceSharding(dev))
  print(f'{args.m} matrices of {args.b}x{args.b} float32 on {dev.device_kind}, '
        f'jax {jax.__version__}')
  print(f"{'method':<12} {'pass':<8} {'GFLOP':>8} {'GB accessed':>12} {'temp MiB':>9} "
        f"{'code KiB':>9} {'compile s':>9}")
  for method in args.method or ['pallas', 'loop', 'select']:
    numerics = impl_numerics(method, platform='tpu')
    fwd = lambda a, n=numerics: expm.expm(a, n)
    both = jax.grad(lambda a, g, n=numerics: jnp.sum(expm.expm(a, n) * g))
    for name, fn, ins in (('fwd', fwd, (x,)), ('fwd+bwd', both, (x, x))):
      t0 = time.perf_counter()
      c = jax.jit(fn).trace(*ins).lower().compile()
      dt = time.perf_counter() - t0
      cost, mem = c.cost_analysis(), c.memory_analysis()
      print(f"{method:<12} {name:<8} {cost.get('flops', 0) / 1e9:8.1f} "
            f"{cost.get('bytes accessed', 0) / 1e9:12.3f} {mem.temp_size_in_bytes / 2**20:9.1f} "
            f"{mem.generated_code_size_in_bytes / 2**10:9.0f} {dt:9.1f}", flush=True)


if __name__ == '__main__':
  main()
