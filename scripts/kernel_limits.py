"""The attention kernel's longest rows a TPU's VMEM holds (liere_jax.kernels.attention.MAX_TOKENS):
for each band of n diagonals (0: none), the most tokens at which the kernel's forward and backward
compile, deviceless, at 12 heads of 64 in bf16 and batch 8 (ViT-B's heads; UCF101's clips a
chip). `--scope default`: for a v4 chip (16 MiB of VMEM, the least of our TPUs; the compiler's
default scope elsewhere); `--scope wide`: past the default's rows, where the kernel asks for
WIDE_SCOPE, for a v5e chip. A bisection over multiples of 16; each compile takes 5-60 s on a
2-core CPU.

  python scripts/kernel_limits.py [--scope default|wide] [--bands 0,3,7,15]
"""
import argparse

import jax
import jax.numpy as jnp

from liere_jax.kernels import attention as attention_kernel
from liere_jax.tpu_slices import parse_slice, slice_devices


def fits(device, tokens: int, band: int) -> bool:
  """Whether the kernel's forward and backward at these shapes compile for the device."""
  where = jax.sharding.SingleDeviceSharding(device)
  qkv = jax.ShapeDtypeStruct((8, tokens, 3, 12, 64), jnp.bfloat16, sharding=where)
  # The kernel takes blocks of b as their entries (b rows) and builds the band of n = 2b - 1.
  diag = jax.ShapeDtypeStruct(((band + 1) // 2 or 1, tokens, 12 * 64), jnp.bfloat16,
                              sharding=where)
  loss = lambda qkv, diag: attention_kernel.attention_qkv(
      qkv, diag if band else None).astype(jnp.float32).sum()
  step = jax.grad(loss, argnums=(0, 1) if band else 0)
  try:
    jax.jit(step).trace(qkv, diag).lower(lowering_platforms=('tpu',)).compile()
  except jax.errors.JaxRuntimeError as e:
    if 'vmem' not in str(e).lower():
      raise
    return False
  return True


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--scope', choices=('default', 'wide'), default='default')
  p.add_argument('--bands', default='0,3,7,15')
  p.add_argument('--high', type=int, default=None,
                 help='tokens known not to fit (default: 1040, wide 2064)')
  args = p.parse_args()
  wide = args.scope == 'wide'
  device = slice_devices(parse_slice('v5litepod-8' if wide else 'v4-8'))[0]
  for band in (int(n) for n in args.bands.split(',')):
    # The wide scope starts where the default one stops (the kernel asks for it past there).
    low = attention_kernel.MAX_TOKENS[attention_kernel.SCOPE][band] if wide else 128
    high = args.high or (2064 if wide else 1040)
    while high - low > 16:
      mid = (low + high) // 32 * 16
      ok = fits(device, mid, band)
      print(f'{args.scope} scope, band {band}: {mid} tokens {"fit" if ok else "do not fit"}',
            flush=True)
      low, high = (mid, high) if ok else (low, mid)
    print(f'{args.scope} scope, band {band}: MAX_TOKENS {low} (fit), {high} does not',
          flush=True)


if __name__ == '__main__':
  main()
