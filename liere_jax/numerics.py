"""What runs where: one frozen `Numerics` value per platform, the only thing that decides which
program the exponential, the rotations and attention emit.

The value is resolved once, where the devices are known (`for_mesh`: the mesh's device platform;
deviceless TPU devices report 'tpu'), and handed to the model at construction (`ViT(spec,
numerics=...)`), which passes it down; a function's program depends on its arguments alone.
An A/B replaces a field (`dataclasses.replace`, `bench step --vs attention=xla`): a different
value is a different static argument, so jit traces it anew. `python -m liere_jax.bench plan
--config C --platform P` prints a config's plan on a platform (`describe`); why each platform
runs what it runs, with the figures: docs/decisions/.
"""
import dataclasses
from typing import Dict, Optional

import jax

from liere_jax import dots

EXPM_FORMS = ('cond', 'loop', 'select', 'scipy')  # liere_jax.expm
ATTENTION = ('xla', 'cudnn', 'kernel')  # liere_jax.attention
PAIRS = ('swap_matmul', 'swap_roll', 'blocks')  # liere_jax.rotations.rotate, blocks of 2
PRECISIONS = ('auto', 'highest')  # model.pe.expm_precision


MiB = 2**20
# A TensorCore's VMEM by jax's device_kind (Cloud TPU's system architecture pages; v4's is what
# its compiler reports). VMEM_LEAST, v4's, is also the compiler's default scope for a kernel on
# the others: a plan without a chip (`plan('tpu')`) assumes it.
TPU_VMEM = {'TPU v4': 16 * MiB, 'TPU v5 lite': 128 * MiB, 'TPU v5': 95 * MiB,
            'TPU v6 lite': 128 * MiB}
VMEM_LEAST = 16 * MiB


@dataclasses.dataclass(frozen=True)
class Numerics:
  """How a platform computes LieRE and attention (the platform's row, plus any override)."""
  platform: str  # 'cpu', 'tpu' or 'cuda' (every GPU): whose kernels and lowering.
  expm: str  # XLA's exponential (EXPM_FORMS): 'cond' one scale a chunk and lax.cond squarings,
  # 'loop' one scale a stack and a while loop, 'select' a scale a matrix and capped selects.
  expm_kernel: bool  # The Pallas exponential (liere_jax.kernels.expm) where it takes the blocks.
  every_token: bool  # Every token's exponential by the Pallas kernel, split over 'data' by
  # tokens, not the lattice's table, for the blocks rotations.every_token_kernel names.
  chunk_bytes: int  # 'cond' (and 'loop' on CPU) exponentiate stacks in chunks of this size.
  products: dots.Dots  # The exponential's and the lattice table's matrix products.
  elementwise_blocks: int  # Products of blocks up to this size as float32 multiply-adds.
  attention: str  # ATTENTION: XLA's, cuDNN's where it takes the shapes, or the Pallas kernels.
  pairs: str  # PAIRS: how blocks of 2 (RoPE) rotate outside a kernel.
  split_qkv: bool  # q, k, v from three products where XLA rotates q and k first (attention).
  vmem: int = VMEM_LEAST  # Bytes of VMEM a Pallas kernel may hold: the chip's (for_mesh,
  # TPU_VMEM); where the kernel's rows need more than its default scope, it asks for more.

  @property
  def interpret(self) -> bool:
    """Pallas kernels in interpret mode (on CPU: tests), with a TPU's tiling."""
    return self.platform == 'cpu'

  def at_precision(self, precision: str) -> 'Numerics':
    """This plan with the products of model.pe.expm_precision: 'auto' the platform's, 'highest'
    float32 everywhere (a TPU's HIGHEST is six bf16 passes: float32's error)."""
    if precision not in PRECISIONS:
      raise ValueError(f'model.pe.expm_precision={precision!r} is unknown; use one of '
                       f'{PRECISIONS} (e.g. --config.model.pe.expm_precision=auto).')
    if precision == 'auto':
      return self
    return dataclasses.replace(self, products=dots.CPU if self.platform == 'cpu' else
                               dots.HIGHEST)

  def replace(self, **fields) -> 'Numerics':
    """A copy with `fields` replaced, each checked (an A/B's side)."""
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(self)})
    if unknown:
      raise ValueError(f'{unknown} are not numerics fields; use some of '
                       f'{[f.name for f in dataclasses.fields(self)]}.')
    return _checked(dataclasses.replace(self, **fields))


PLATFORMS: Dict[str, Numerics] = {
    'cpu': Numerics('cpu', expm='cond', expm_kernel=False, every_token=False, chunk_bytes=2**16,
                    products=dots.CPU, elementwise_blocks=0, attention='xla',
                    pairs='swap_matmul', split_qkv=False),
    'tpu': Numerics('tpu', expm='loop', expm_kernel=True, every_token=True, chunk_bytes=16 * 2**20,
                    products=dots.TPU, elementwise_blocks=8, attention='kernel',
                    pairs='swap_roll', split_qkv=True),
    'cuda': Numerics('cuda', expm='select', expm_kernel=False, every_token=False,
                     chunk_bytes=16 * 2**20,
                     products=dots.GPU, elementwise_blocks=0, attention='cudnn',
                     pairs='blocks', split_qkv=False),
}


def _checked(n: Numerics) -> Numerics:
  for name, value, allowed in (('platform', n.platform, tuple(PLATFORMS)),
                               ('expm', n.expm, EXPM_FORMS), ('attention', n.attention, ATTENTION),
                               ('pairs', n.pairs, PAIRS)):
    if value not in allowed:
      raise ValueError(f'numerics {name}={value!r} is unknown; use one of {allowed}.')
  if n.attention == 'cudnn' and n.platform != 'cuda':
    raise ValueError(f"numerics attention='cudnn' needs platform='cuda', not {n.platform!r}.")
  return n


def platform_of(device_platform: str) -> str:
  """A JAX device's (or backend's) platform -> its row: 'gpu' and 'cuda' (and 'rocm') -> 'cuda'."""
  name = 'cuda' if device_platform in ('gpu', 'cuda', 'rocm') else device_platform
  if name not in PLATFORMS:
    raise ValueError(f'No numerics for platform {device_platform!r}; use one of '
                     f'{tuple(PLATFORMS)}.')
  return name


def plan(platform: Optional[str] = None, **overrides) -> Numerics:
  """The row of `platform` (default: this process's backend) with `overrides` replaced."""
  row = PLATFORMS[platform_of(platform or jax.default_backend())]
  return row.replace(**overrides) if overrides else row


def for_mesh(mesh, **overrides) -> Numerics:
  """The plan of the platform a mesh's devices are on (MaxText reads it the same way), with its
  chip's VMEM (TPU_VMEM; VMEM_LEAST for a chip not listed)."""
  device = mesh.devices.flat[0]
  chip = {'vmem': TPU_VMEM.get(device.device_kind, VMEM_LEAST)} if (
      platform_of(device.platform) == 'tpu') else {}
  return plan(device.platform, **{**chip, **overrides})
