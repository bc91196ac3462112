"""The compiled program of a tiny model's gradient, as hashes, to show that a change leaves a
platform's program as it was: run it in a worktree of each commit and compare.

  python scripts/cpu_program.py liere64 [--platform cpu|tpu] [--out FILE]

Prints PE PLATFORM EXACT NAMES CHARS: EXACT hashes the program with source paths and metadata
stripped; NAMES hashes its instructions up to their names and order (identifiers dropped,
lines sorted, Mosaic bodies blanked: they carry source paths), which a refactor that renumbers
instructions keeps. --platform tpu compiles for one v5e chip, deviceless (libtpu,
requirements-tpu.txt), the model built with the TPU's numerics plan. FILE: the program's text,
for a diff.
"""
import argparse
import hashlib
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # This checkout's liere_jax.

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from liere_jax import numerics, tpu_slices
from liere_jax.config import model_config
from liere_jax.config.model import resolve
from liere_jax.model import ViT


def program(pe: str, platform: str = 'cpu') -> str:
  # The tests' tiny model (tests/helpers.py tiny_model), 256 wide: 4 heads of 64.
  cfg = model_config(pe=pe, variant='', patch=(4, 4), input_size=(16, 16), channels=3,
                     num_classes=5, width=256, depth=2, heads=4, pool='cls')
  model = ViT(resolve(cfg), rngs=nnx.Rngs(0), numerics=numerics.plan(platform))
  model.eval()
  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  grad = jax.jit(jax.grad(lambda p, x: jnp.sum(nnx.merge(graphdef, p, rest)(x) ** 2)))
  if platform == 'cpu':
    text = grad.lower(params, x).compile().as_text()
  else:
    mesh = jax.sharding.Mesh(tpu_slices.slice_devices(tpu_slices.parse_slice('v5litepod-1')),
                             ('data',))
    whole = NamedSharding(mesh, P())
    args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=whole),
                        (params, x))
    with jax.set_mesh(mesh):
      text = grad.trace(*args).lower().compile().as_text()
  text = re.sub(r'metadata=\{[^}]*\}|, stack_frame_id=\d+', '', text)
  # The stack frames' tables: file and function names, lines and columns.
  text = re.sub(r'^\d+ ("[^"]*"|\{[^}]*\})$', '', text, flags=re.M)
  return re.sub(r'\n\n+', '\n', text)


def names_free(text: str) -> str:
  """The instructions up to their names and order."""
  text = re.sub(r'%[A-Za-z0-9_.\-]+', '%', text)
  text = re.sub(r'\b[a-z_]+\.\d+(?=: )', 'p', text)  # Parameters of a computation.
  text = re.sub(r'"body":"[^"]*"', '"body":""', text)
  return '\n'.join(sorted(text.splitlines()))


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('pe')
  parser.add_argument('--platform', choices=('cpu', 'tpu'), default='cpu')
  parser.add_argument('--out')
  args = parser.parse_args()
  text = program(args.pe, args.platform)
  if args.out:
    Path(args.out).write_text(text)
  digest = lambda t: hashlib.sha256(t.encode()).hexdigest()[:16]
  print(args.pe, args.platform, digest(text), digest(names_free(text)), len(text))
