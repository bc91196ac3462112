"""RoPE-Mixed's rotations against their definition (the mutation run's selection for them,
docs/mutation.md): angle_{l,h,j}(p) = sum_a freqs[a, l, h*d/2 + j] p_a, each pair turned by
[[cos, -sin], [sin, cos]]."""
import types

import jax
import jax.numpy as jnp
import numpy as np

from liere_jax.encodings.rope import RopeMixed


def test_each_layer_head_and_pair_turns_by_its_frequencies_dotted_with_the_position():
  n, depth, heads, pairs, tokens = 2, 2, 3, 4, 5  # every axis its own size
  rng = np.random.default_rng(0)
  freqs = rng.normal(size=(n, depth, heads * pairs)).astype(np.float32)
  pos = rng.uniform(0, 8, (tokens, n)).astype(np.float32)
  # The rotations read the learned frequencies and the head count only (whatever builds them).
  got = np.asarray(RopeMixed.rotations(
      types.SimpleNamespace(freqs=jnp.asarray(freqs), heads=heads), jnp.asarray(pos)))
  assert got.shape == (depth, heads, tokens, pairs, 2, 2)
  for l in range(depth):
    for h in range(heads):
      for t in range(tokens):
        angle = pos[t].astype(np.float64) @ freqs[:, l, h * pairs:(h + 1) * pairs]
        c, s = np.cos(angle), np.sin(angle)
        np.testing.assert_allclose(got[l, h, t], np.stack([np.stack([c, -s], -1),
                                                           np.stack([s, c], -1)], -2),
                                   atol=3e-6)


def test_the_angles_are_computed_at_highest_precision_on_every_platform():
  # A GPU's default float32 dot rounds through TF32 (10-bit mantissa): ~1e-3 relative on the
  # angles, 0.01 rad at position 14 and frequency 1. CPU computes float32 either way.
  stand_in = types.SimpleNamespace(freqs=jnp.ones((2, 1, 4)), heads=2)
  hlo = jax.jit(lambda p: RopeMixed.rotations(stand_in, p)).lower(jnp.ones((3, 2))).as_text()
  assert 'dot_general' in hlo and 'precision = [HIGHEST, HIGHEST]' in hlo, hlo
