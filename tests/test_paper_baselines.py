"""The paper's baseline columns as encodings of their own (liere_jax/encodings/rope.py, liere.py).

paper_visionllama is the official LieRE code's "tiled" VisionLlama (fixed frequencies
exp(-4 linspace(0, 1, k)), [0, 1] positions); paper_rope_mixed is the official code's RoPE-Mixed,
LieRE with 2x2 blocks. Checked here against numpy written from the definitions; logit parity
with the PyTorch port and the official model is in tests/test_convert.py.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from liere_jax import encodings, positions, reproduce
from liere_jax.config import model as model_spec
from liere_jax.model import ViT
from liere_jax.numerics import plan
from tests.helpers import tiny_model_config, tiny_spec


def _encoding(pe, **kw):
  """(the encoding module, its resolved model) without building the ViT."""
  spec = model_spec.resolve(tiny_model_config(pe=pe, **kw))
  return encodings.build(spec, rngs=nnx.Rngs(0)), spec


def _rotation(angle):
  return np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])


@pytest.mark.parametrize('n_dims,head_dim', [(2, 16), (3, 16), (1, 6)])
def test_paper_visionllama_rotations_are_the_official_tiled_ones(n_dims, head_dim):
  """Pair a k + j turns by p_a exp(-4 j / (k - 1)), p_a = i / (n - 1); CLS is the identity."""
  size = 12 if n_dims < 3 else 8
  pe, spec = _encoding('paper_visionllama', n_dims=n_dims, size=size, width=2 * head_dim,
                       heads=2)
  assert spec.pe.positions == 'normalized'
  grid = spec.train_grid
  ctx = pe.context(jnp.asarray(positions.with_prefix(
      positions.grid_positions(grid, grid, spec.pe.positions), 1)))
  rot = np.asarray(pe.layer(ctx, 0).rot)  # [1, 1 + T, n k, 2, 2]: every head alike
  k = head_dim // (2 * n_dims)
  omega = np.exp(-4. * np.arange(k) / max(k - 1, 1))
  np.testing.assert_allclose(pe.freqs, omega, rtol=1e-15)
  axes = [np.arange(g) / (g - 1) for g in grid]
  pos = np.stack(np.meshgrid(*axes, indexing='ij'), -1).reshape(-1, n_dims)
  want = np.stack([np.stack([_rotation(p[a] * omega[j]) for a in range(n_dims)
                             for j in range(k)]) for p in np.concatenate([pos[:1] * 0, pos])])
  assert rot.shape == (1,) + want.shape
  np.testing.assert_allclose(rot[0], want, atol=1e-6)

  # Applied to consecutive head dims (2m, 2m + 1) of every head; dims past 2 n k unchanged.
  q = np.random.default_rng(0).normal(size=(1, len(want), 2, head_dim)).astype(np.float32)
  out, _, bias = pe.layer(ctx, 1).attend(jnp.asarray(q), jnp.asarray(q), plan())  # Every layer alike.
  pairs = q[..., :2 * n_dims * k].reshape(1, len(want), 2, n_dims * k, 2)
  rotated = np.einsum('tmij,bthmj->bthmi', want, pairs).reshape(1, len(want), 2, -1)
  np.testing.assert_allclose(np.asarray(out)[..., :2 * n_dims * k], rotated, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(out)[..., 2 * n_dims * k:], q[..., 2 * n_dims * k:])
  assert bias is None


def test_paper_visionllama_is_exactly_relative():
  """q R(x)^T R(y) k depends on y - x only (shared shift s)."""
  pe, _ = _encoding('paper_visionllama', width=32, heads=2)
  rng = np.random.default_rng(1)
  pos = rng.uniform(-2, 2, size=(6, 2)).astype(np.float32)
  shift = np.float32([0.75, -1.25])
  q, k = (jnp.asarray(rng.normal(size=(1, 6, 2, 16)), jnp.float32) for _ in range(2))

  def scores(p):
    rq, rk, _ = pe.layer(pe.context(jnp.asarray(p)), 0).attend(q, k, plan())
    return np.einsum('bthd,bshd->bhts', rq, rk)

  np.testing.assert_allclose(scores(pos + shift), scores(pos), atol=1e-5)
  assert np.abs(scores(pos) - np.einsum('bthd,bshd->bhts', q, k)).max() > 0.1  # It does turn.


def test_paper_visionllama_has_no_parameters():
  def count(pe):
    model = nnx.eval_shape(lambda: ViT(tiny_spec(pe=pe), rngs=nnx.Rngs(0)))
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))

  assert not jax.tree.leaves(nnx.state(_encoding('paper_visionllama')[0], nnx.Param))
  assert count('paper_visionllama') == count('none')


def test_paper_rope_mixed_is_liere2():
  s = model_spec.resolve(tiny_model_config(pe='paper_rope_mixed'))
  assert (s.pe.name, s.pe.family, s.pe.block, s.pe.positions) == (
      'paper_rope_mixed', 'liere', 2, 'normalized')
  assert model_spec.resolve(tiny_model_config(pe='paper_rope_mixed', share='layers')).pe.layers == 1
  (paper, _), (liere2, _) = _encoding('paper_rope_mixed'), _encoding('liere2')
  g = np.asarray(paper.generators[...])
  assert type(paper) is type(liere2) is encodings.LieRE
  assert g.shape == liere2.generators.shape == (2, 2, 2, 8, 1)
  assert 0 <= g.min() and g.max() < 2 * np.pi and g.max() > np.pi  # U[0, 2 pi).
  np.testing.assert_array_equal(g, liere2.generators[...])  # The same init.


@pytest.mark.parametrize('pe,n_dims,width,match', [
    ('paper_visionllama', 2, 6, r'paper_visionllama needs head_dim >= 4 for 2D positions, got 3'),
    ('paper_visionllama', 3, 10, r'needs head_dim >= 6 for 3D positions, got 5'),
    ('paper_rope_mixed', 2, 2, r'model.pe.name=paper_rope_mixed: block size 2 must be in \[2, '
     r'head_dim=1\]'),
])
def test_impossible_head_dims_are_refused(pe, n_dims, width, match):
  with pytest.raises(ValueError, match=match):
    model_spec.resolve(tiny_model_config(pe=pe, n_dims=n_dims, width=width, heads=2))


def test_the_registry_names_them_and_the_port_builds_them():
  assert {'paper_rope_mixed', 'paper_visionllama'} <= set(encodings.NAMES)
  torch_vit = pytest.importorskip('liere_jax.torch_vit')
  assert 'paper_visionllama' in torch_vit.BUILDERS
  assert encodings.label('paper_rope_mixed') == 'RoPE-Mixed (paper: LieRE2)'


def test_table4_rows_map_to_the_share_modes():
  """Paper Table 4: the first row (Table 1's numbers, LieRE64's 5.684 GFLOP of Table 8) learns
  per layer and head, the last shares everything; the RoPE-Mixed column is paper_rope_mixed."""
  table1 = {'paper_rope_mixed': 68.8, 'liere32': 70.0, 'liere8': 70.3}  # LieRE64 -> ours 32.
  runs = reproduce.SUITES['table4'].runs
  assert {r.pe for r in runs} == set(table1)
  report = reproduce.SUITES['table4'].report
  rows = [dict(pe=r.pe, label=r.label, seed=0, top1=.5, top1_ci95=[.4, .6], run=r.name)
          for r in runs]
  paper = {(r['pe'], r['label']): line.split(' | ')[-1].rstrip(' |')
           for r, line in zip(rows, report(rows)[0].splitlines()[4:])}
  for pe, value in table1.items():
    assert paper[(pe, 'share none')] == str(value)
  assert [paper[(pe, 'share all')] for pe in table1] == ['68.3', '69.4', '69.5']
  assert [paper[(pe, 'share layers')] for pe in table1] == ['68.7', '69.5', '69.8']
  assert [paper[(pe, 'share heads')] for pe in table1] == ['69.5', '69.7', '69.7']


def test_the_suites_run_the_papers_definitions_in_the_papers_rows():
  table3 = {r.pe for r in reproduce.SUITES['table3'].runs}
  assert {'paper_visionllama', 'paper_rope_mixed', 'rope_axial', 'rope_mixed'} <= table3
  assert {pe for pe, _ in reproduce.PAPER_TABLE3} == {
      'abs', 'paper_visionllama', 'paper_rope_mixed', 'liere8', 'liere_head'}
  assert {r.pe for r in reproduce.SUITES['table7'].runs} == {'liere8', 'paper_rope_mixed'}
  for pe in ('rope_axial', 'rope_mixed', 'paper_visionllama', 'paper_rope_mixed'):
    assert '(' in encodings.label(pe)  # Every baseline row says whose definition it is.
