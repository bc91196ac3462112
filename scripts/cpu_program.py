"""The compiled CPU program of a tiny model's gradient, as a hash (source paths and metadata
stripped), to show that a change for another platform leaves this CPU's program as it was: run
it in a worktree of each commit and compare.

  python scripts/cpu_program.py liere64 [--out FILE]   # FILE: the program's text, for a diff
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

from liere_jax.config import model_config
from liere_jax.config.model import resolve
from liere_jax.model import ViT


def program(pe: str) -> str:
  # The tests' tiny model (tests/helpers.py tiny_model), 256 wide.
  cfg = model_config(pe=pe, variant='', patch=(4, 4), input_size=(16, 16), channels=3,
                     num_classes=5, width=256, depth=2, heads=4, pool='cls')
  model = ViT(resolve(cfg), rngs=nnx.Rngs(0))
  model.eval()
  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  loss = lambda p: jnp.sum(nnx.merge(graphdef, p, rest)(x) ** 2)
  text = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
  text = re.sub(r'metadata=\{[^}]*\}|, stack_frame_id=\d+', '', text)
  # The stack frames' tables: file and function names, lines and columns.
  text = re.sub(r'^\d+ ("[^"]*"|\{[^}]*\})$', '', text, flags=re.M)
  return re.sub(r'\n\n+', '\n', text)


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('pe')
  parser.add_argument('--out')
  args = parser.parse_args()
  text = program(args.pe)
  if args.out:
    Path(args.out).write_text(text)
  print(args.pe, hashlib.sha256(text.encode()).hexdigest()[:16], len(text))
