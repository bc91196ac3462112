"""The example in docs/encodings.md, run as it stands: a registered encoding in a user's own
Flax NNX attention. Checked for what an encoding must do there: commuting ones make the output
depend on relative positions only, and every one changes the output with the positions."""
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from liere_jax import encodings

DOC = os.path.join(os.path.dirname(__file__), '..', 'docs', 'encodings.md')


def _doc():
  with open(DOC) as f:
    return f.read()


@pytest.fixture(scope='module')
def example():
  """The names the doc's ```python block defines, after running it."""
  blocks = re.findall(r'```python\n(.*?)```', _doc(), re.S)
  assert len(blocks) == 1, 'docs/encodings.md should hold one python example'
  namespace = {}
  exec(compile(blocks[0], DOC, 'exec'), namespace)  # pylint: disable=exec-used
  return namespace


def _positions(n, seed=0):
  return np.random.default_rng(seed).uniform(0, 3, (16, n)).astype(np.float32)


def test_the_example_runs(example):
  assert example['y'].shape == (2, 16, 64)
  assert isinstance(example['attention'].pe, encodings.LieRE)


@pytest.mark.parametrize('pe,grid', [('rope_mixed', (4, 4)), ('comrope_ld4', (4, 4)),
                                     ('string_cayley', (4, 4)), ('liere8', (16,)),
                                     ('alibi', (4, 4))])
def test_commuting_encodings_see_relative_positions_only(example, pe, grid):
  """The output at positions p + s equals that at p (generators that commute; LieRE in 1D) and
  differs at 2 p: the encoding acts on q and k, and only through position differences."""
  attention = example['RotaryAttention'](64, 4, grid, pe=pe, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (2, 16, 64))
  pos = _positions(len(grid))
  y = attention(x, pos)
  np.testing.assert_allclose(attention(x, pos + np.float32(1.25)), y, atol=1e-4)
  assert np.abs(np.asarray(attention(x, 2 * pos) - y)).max() > 1e-3


def test_liere_in_2d_changes_the_attention(example):
  """2D LieRE: the output moves with the positions and is not the output without an encoding
  (all positions 0: every rotation the identity); its generators do not commute, so a common
  shift moves it too."""
  attention = example['RotaryAttention'](64, 4, (4, 4), rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (2, 16, 64))
  y = attention(x)
  # Traced positions (under jit): all-zero positions known at trace time take the lattice path.
  plain = nnx.jit(lambda m, x, pos: m(x, pos))(attention, x, jnp.zeros((16, 2)))
  nope = example['RotaryAttention'](64, 4, (4, 4), pe='none', rngs=nnx.Rngs(0))
  nnx.update(nope, nnx.state(attention, nnx.Not(nnx.PathContains('pe'))))
  np.testing.assert_allclose(plain, nope(x), atol=1e-5)
  assert np.abs(np.asarray(y - plain)).max() > 1e-3
  pos = _positions(2)
  assert np.abs(np.asarray(attention(x, pos + np.float32(1.25)) - attention(x, pos))).max() > 1e-4


@pytest.mark.parametrize('pe', ('abs', 'sincos', 'paper_visionllama', 'string_circulant4'))
def test_other_encodings_fit_the_example(example, pe):
  attention = example['RotaryAttention'](64, 4, (4, 4), pe=pe, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (2, 16, 64))
  y = attention(x)
  assert y.shape == x.shape and bool(jnp.all(jnp.isfinite(y)))
  nope = example['RotaryAttention'](64, 4, (4, 4), pe='none', rngs=nnx.Rngs(0))
  nnx.update(nope, nnx.state(attention, nnx.Not(nnx.PathContains('pe'))))
  assert np.abs(np.asarray(y - nope(x))).max() > 1e-4


def test_the_doc_lists_every_encoding():
  doc = _doc()
  for name in encodings.NAMES:
    assert f'| `{name}` |' in doc, name
