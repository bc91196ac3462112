"""Every option a config accepts changes what it says (issue 31).

OPTION_TESTS maps each field of the model, data, optimizer and loop sections (the config
builders in liere_jax/config/) to the tests that show its behaviour; a field without an
entry fails `test_every_config_field_has_a_behaviour_test`. The tests here are the sharp ones
that no other module had: init_scale sets the generators' range, each expm method is the one
called and agrees with the others, and timm RandAugment clips its drawn magnitude at both ends
(`fast`'s squarings: test_expm.py; `rotate` applies R, not R^T: test_rotations.py).
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from liere_jax import convert, encodings, expm as expm_lib, rotations
from liere_jax.encodings import liere
from liere_jax.numerics import plan
from liere_jax.config import model as model_spec
from liere_jax.data import randaugment
from tests.helpers import tiny_model_config, tiny_spec


def _liere(seed=0, **pe):
  spec = tiny_spec('liere8', **pe)
  return encodings.build(spec, rngs=nnx.Rngs(seed)), spec


@pytest.mark.parametrize('init_scale', [0.25, 2 * math.pi, 20.0])
def test_init_scale_sets_the_range_of_the_liere_generators(init_scale):
  """Generators ~ U[0, 1) * init_scale: they fill [0, init_scale) and nothing past it."""
  enc, _ = _liere(init_scale=init_scale)
  g = np.asarray(enc.generators[...])
  assert g.size >= 200  # 2 layers x 2 heads x 2 axes x 2 blocks x 28 entries.
  assert g.min() >= 0 and g.max() < init_scale
  assert g.max() > 0.9 * init_scale and g.min() < 0.1 * init_scale
  assert abs(g.mean() / init_scale - 0.5) < 0.05


# model.pe.expm -> what expm.expm runs for LieRE8 on this CPU (the names of earlier versions
# are the platform's or SciPy's); 'pallas' (interpret mode here): test_kernels_expm.py.
EXPM_FORMS = {'fast': 'cond', 'scipy': 'scipy', 'fast_loop': 'cond', 'fast_cond': 'cond',
              'fast_select': 'cond', 'scipy_remat': 'scipy'}


def test_each_expm_method_is_the_one_called_and_agrees_with_the_others(monkeypatch):
  """model.pe.expm reaches the exponential: a spy on the one rotations.py calls records the form
  its plan names for each config; rotations and their gradients agree across the methods."""
  called = []
  real = rotations.expm

  def spy(a, numerics):
    called.append(expm_lib.form(numerics, a.shape[-1]))
    return real(a, numerics)
  monkeypatch.setattr(rotations, 'expm', spy)
  pos = np.random.default_rng(0).uniform(-2, 2, (6, 2)).astype(np.float32)  # Off any lattice.
  results = {}
  assert set(EXPM_FORMS) == set(liere.METHODS[:2] + tuple(liere.LEGACY_METHODS))
  for method, form in EXPM_FORMS.items():
    enc, spec = _liere(expm=method)
    assert spec.pe.expm == method
    graphdef, state = nnx.split(enc)

    @jax.jit
    def rot_and_grad(state):
      def loss(state):
        rot = nnx.merge(graphdef, state).context(pos, plan('cpu')).rot
        return jnp.sum(jnp.sin(rot)), rot
      return jax.grad(loss, has_aux=True)(state)
    called.clear()
    grad, rot = rot_and_grad(state)
    assert called and set(called) == {form}, (method, called)
    results[method] = np.asarray(rot), np.asarray(grad['generators'][...])
  ref_rot, ref_grad = results['scipy']
  for method, (rot, grad) in results.items():
    np.testing.assert_allclose(rot, ref_rot, atol=2e-5, err_msg=method)
    np.testing.assert_allclose(grad, ref_grad, atol=2e-4, rtol=1e-4, err_msg=method)


@pytest.mark.parametrize('magnitude,end', [(10, 10.0), (0, 0.0)])
def test_timm_magnitudes_past_either_end_are_clipped_to_it(magnitude, end):
  """mstd 3 around m = 10 (or 0) draws past the end about half the time: each lands on the end
  itself, as timm's clip to [0, 10]; the op's argument follows (rotate: 3 degrees per level)."""
  plans = [randaugment.sample_timm_ops(np.random.default_rng(s),
                                       f'rand-m{magnitude}-n4-mstd3-p1') for s in range(300)]
  drawn = [(name, m, arg) for plan in plans for name, m, arg in plan]
  magnitudes = np.array([m for _, m, _ in drawn])
  assert magnitudes.min() >= 0 and magnitudes.max() <= 10
  assert 0.35 < np.mean(magnitudes == end) < 0.65
  assert np.any(magnitudes != end)
  for name, m, arg in drawn:
    if name == 'rotate':
      assert abs(arg) == pytest.approx(3 * m) and abs(arg) <= 30


def _tree(cfg):
  spec = model_spec.resolve(cfg)
  return {'/'.join(k): v.shape for k, v in convert.flatten(convert.abstract_params(spec)).items()}


def test_the_model_dims_shape_the_parameter_tree():
  """width, depth, heads (head_dim), mlp_dim, patch, input_size (tokens), channels,
  num_classes, pool (the CLS token) and qkv_bias each show in the parameter shapes."""
  cfg = tiny_model_config('abs', width=32, depth=3, heads=2, patch=4, size=16)
  cfg.update(mlp_dim=48, channels=2, num_classes=7, qkv_bias=False)
  tree = _tree(cfg)
  assert tree['patch_embed/kernel'] == (4, 4, 2, 32)  # patch, channels, width
  assert {k.split('/')[1] for k in tree if k.startswith('blocks/')} == {'0', '1', '2'}
  assert tree['blocks/0/mlp/fc1/kernel'] == (32, 48) and tree['head/kernel'] == (32, 7)
  assert tree['pe/embedding'] == (1, 1 + 16, 32) and tree['cls_token'] == (1, 1, 32)
  assert 'blocks/0/attn/qkv/bias' not in tree
  cfg.update(pool='mean', qkv_bias=True, input_size=(24, 24), patch=(8, 8))
  tree = _tree(cfg)
  assert 'cls_token' not in tree and tree['pe/embedding'] == (1, 9, 32)
  assert tree['blocks/0/attn/qkv/bias'] == (96,) and tree['patch_embed/kernel'] == (8, 8, 2, 32)
  liere = tiny_model_config('liere8', width=32, depth=1, heads=2)
  assert _tree(liere)['pe/generators'] == (1, 2, 2, 16 // 8, 28)  # [L, H, n, head_dim/b, 28]
  liere.heads = 1
  assert _tree(liere)['pe/generators'] == (1, 1, 2, 32 // 8, 28)


def test_the_optimizer_is_adamw_with_the_configs_betas_eps_decay_and_clipping():
  """Two steps of the configured optimizer against Adam(W) written out in numpy, at values far
  from the defaults (a field left at its default changes the numbers)."""
  from liere_jax import steps
  from liere_jax.config import run as run_spec
  from tests.helpers import tiny_config_and_batch
  cfg, _ = tiny_config_and_batch(8)
  cfg.update(lr=0.1, warmup_steps=0, total_steps=100, b1=0.5, b2=0.75, eps=0.1,
             weight_decay=0.3, grad_clip=1.0)
  tx, schedule = steps.make_optimizer(run_spec.resolve(cfg, 1))
  rng = np.random.default_rng(0)
  p = {'a': rng.normal(size=3).astype(np.float32), 'b': rng.normal(size=2).astype(np.float32)}
  grads = [{k: 3 * rng.normal(size=v.shape).astype(np.float32) for k, v in p.items()}
           for _ in range(2)]
  state, params = tx.init(p), p
  want, m, v = dict(p), {k: 0 for k in p}, {k: 0 for k in p}
  for t, g in enumerate(grads, 1):
    updates, state = tx.update(g, state, params)
    params = jax.tree.map(lambda x, u: x + u, params, updates)
    norm = math.sqrt(sum(float(np.sum(x.astype(np.float64) ** 2)) for x in g.values()))
    lr = 0.1 * 0.5 * (1 + math.cos(math.pi * (t - 1) / 100))  # The cosine, no warmup.
    assert float(schedule(t - 1)) == pytest.approx(lr, rel=1e-6)
    for k in p:
      gk = g[k] * min(1.0, 1.0 / norm)
      m[k] = 0.5 * m[k] + 0.5 * gk
      v[k] = 0.75 * v[k] + 0.25 * gk**2
      adam = (m[k] / (1 - 0.5**t)) / (np.sqrt(v[k] / (1 - 0.75**t)) + 0.1)
      want[k] = want[k] - lr * (adam + 0.3 * want[k])
    for k in p:
      np.testing.assert_allclose(params[k], want[k], rtol=1e-5, atol=1e-6, err_msg=f'{k} {t}')


def _arrows_images(seed, split, n, grid=4):
  from liere_jax.data import arrows
  return sorted(((arrows.make_example(arrows.split_seed(seed, split), i, grid)['image'] / 255
                  - .5) / .5).astype(np.float32).tobytes() for i in range(n))


def test_arrows_examples_come_from_the_stream_of_the_data_seed_and_the_split():
  """data.seed and data.train_split / eval_split pick the arrows streams: eval reads the first
  num_eval of (seed, eval_split), training the num_train of (seed, train_split)."""
  from liere_jax.config import data_config
  from liere_jax.data import pipeline
  from liere_jax.config.data import resolve_data
  cfg = resolve_data(data_config(name='arrows', grid=4, seed=3, num_eval=4,
                                 num_train=8, eval_split='train', train_split='test'))
  batch = next(iter(pipeline.eval_batches(cfg, global_batch_size=4)))
  assert sorted(x.tobytes() for x in batch['image']) == _arrows_images(3, 'train', 4)
  batch = pipeline.train_dataset(cfg, global_batch_size=8, seed=0)[0]
  assert sorted(x.tobytes() for x in batch['image']) == _arrows_images(3, 'test', 8)


@pytest.mark.parametrize('policy,n,m', [('rand-m3-n2-p1', 2, 3), ('rand-m9-n3-p1', 3, 9)])
def test_videomae_augment_applies_the_configs_timm_policy(monkeypatch, policy, n, m):
  from liere_jax.config import data_config
  from liere_jax.config import data as data_spec
  from liere_jax.data import transform
  drawn = []
  real = randaugment.sample_timm_ops
  monkeypatch.setattr(randaugment, 'sample_timm_ops',
                      lambda rng, pol: drawn.append(real(rng, pol)) or drawn[-1])
  spec = data_spec.resolve_data(data_config(
      name='ucf101', image_size=16, augment='videomae', randaug_policy=policy))
  clip = np.random.default_rng(0).integers(0, 256, (2, 20, 20, 3), dtype=np.uint8)
  for seed in range(3):
    transform.train_augment(spec, clip, np.random.default_rng(seed))
  assert len(drawn) == 3 and all(len(ops) == n and {o[1] for o in ops} == {m} for ops in drawn)


# Every field of the config builders (liere_jax/config/) -> the tests that show what it
# does: 'tests/FILE.py::TEST' (or a whole module). A field a builder gains fails
# test_every_config_field_has_a_behaviour_test until it has a row here.
M, D, O, T = ('tests/test_model.py::', 'tests/test_data.py::', 'tests/test_options.py::',
              'tests/test_training.py::')
S, E, P, C = ('tests/test_config.py::', 'tests/test_encodings.py::', 'tests/test_convert.py::',
              'tests/test_commuting.py::')
W, I, SC = ('tests/test_pipeline_workers.py::', 'tests/test_model_init.py::',
            'tests/test_scale.py::')
DIMS, OPTIMIZER = O + 'test_the_model_dims_shape_the_parameter_tree', (
    O + 'test_the_optimizer_is_adamw_with_the_configs_betas_eps_decay_and_clipping')
CADENCES = T + 'test_resume_takes_a_new_execution_and_new_cadences_and_refuses_a_different_model'
WORKERS = W + 'test_workers_and_resume_give_the_batches_of_ds_k'
DROPOUT_RNG = T + 'test_dropout_changes_the_step_and_its_masks_are_a_function_of_seed_and_step'
ARROWS_STREAMS = O + 'test_arrows_examples_come_from_the_stream_of_the_data_seed_and_the_split'
SHARDING = (T + 'test_parameter_shardings_follow_their_metadata',
            T + 'test_eight_devices_equal_one_device_step')
OPTION_TESTS = {
    'model.variant': (S + 'test_variant_dims_and_derived_values',
                      M + 'test_paper_tiny_is_the_official_tiny'),
    'model.width': (DIMS,), 'model.depth': (DIMS,), 'model.mlp_dim': (DIMS,),
    'model.heads': (DIMS, S + 'test_variant_dims_and_derived_values'),
    'model.patch': (DIMS, P + 'test_parity_every_encoding'),
    'model.input_size': (DIMS, E + 'test_abs_resize_keeps_the_training_grid_exact'),
    'model.channels': (DIMS, P + 'test_channels_first_and_shape_errors'),
    'model.num_classes': (DIMS, I + 'test_official_lightning_checkpoint'),
    'model.pool': (DIMS, P + 'test_parity_variants'),
    'model.dropout': (M + 'test_dropout_at_one_site_zeroes_exactly_that_branch',
                      DROPOUT_RNG),
    'model.dropout_sites': (M + 'test_dropout_at_one_site_zeroes_exactly_that_branch',
                            M + 'test_embed_dropout_zeroes_the_tokens',
                            M + 'test_mlp_hidden_dropout_acts_after_gelu'),
    'model.qkv_bias': (DIMS, P + 'test_official_export_refuses_what_it_cannot_represent'),
    'model.norm_pre': (
        'tests/test_pape.py::test_the_official_classifier_is_our_vit_with_model_norm_pre',
        'tests/test_pape.py::'
        'test_the_official_classifier_without_its_norm_pre_is_our_vit_without_it'),
    'model.init': (M + 'test_official_init_is_torch_default', M + 'test_jax_init_is_unchanged'),
    'model.dtype': (M + 'test_bfloat16_computes_in_bf16_with_float32_parameters_and_rotations',),
    'model.remat': (SC + 'test_remat_per_block_gives_the_same_train_step_with_dropout',),
    'model.scan_layers': (
        SC + 'test_scanned_blocks_give_the_loop_s_train_step_with_the_same_parameter_tree',
        S + 'test_scan_layers_defaults_by_depth_and_an_explicit_value_wins'),
    'model.pe.name': (P + 'test_parity_every_encoding',
                      E + 'test_shuffling_tokens_changes_relative_encodings_only'),
    'model.pe.positions': (
        E + 'test_positions_modes',
        S + 'test_position_defaults_follow_the_encoding_and_an_explicit_mode_wins'),
    'model.pe.share': (E + 'test_sharing_modes',
                       S + 'test_share_gives_the_generator_stacks'),
    'model.pe.init_scale': (O + 'test_init_scale_sets_the_range_of_the_liere_generators',),
    'model.pe.expm': (O + 'test_each_expm_method_is_the_one_called_and_agrees_with_the_others',),
    'model.pe.expm_precision': (
        'tests/test_expm.py::'
        'test_expm_precision_highest_keeps_float32_products_on_accelerators',
        'tests/test_expm.py::'
        'test_lowered_train_step_has_no_conditionals_on_accelerators'),
    'model.pe.parabolas': ('tests/test_pape.py::test_the_parameter_tree_and_the_parabolas_option',
                           P + 'test_parity_every_encoding'),
    'model.pe.jitter': (C + 'test_jitter_perturbs_training_only',
                        C + 'test_jitter_in_a_train_step_is_a_function_of_seed_and_step'),
    'data.name': (D + 'test_cifar100_on_mock_data', D + 'test_imagenet_on_mock_data',
                  D + 'test_ucf101_clips'),
    'data.data_dir': (D + 'test_pipeline_reads_prepared_arrows_like_on_the_fly',),
    'data.train_split': (ARROWS_STREAMS,),
    'data.eval_split': (ARROWS_STREAMS,
                        D + 'test_eval_center_crop_is_torchvisions'),
    'data.fraction': (D + 'test_fraction_trains_on_the_first_examples_and_repeats',),
    'data.augment': (D + 'test_official_orders',),
    'data.crop': (D + 'test_official_orders',
                  D + 'test_rrc_crops_native_images_anew_each_time_and_every_frame_alike'),
    'data.randaug_policy': (O + 'test_videomae_augment_applies_the_configs_timm_policy',),
    'data.random_erasing': (D + 'test_official_orders',
                            'tests/test_augment.py::test_random_erasing'),
    'data.eval_crop': (D + 'test_eval_center_crop_is_torchvisions',),
    'data.eval_views': (D + 'test_eval_views_are_the_official_ones',
                        D + 'test_evaluate_with_views_scores_every_view_and_every_video'),
    'data.mixup': (D + 'test_ucf101_clips',),
    'data.image_size': (D + 'test_imagenet_on_mock_data',),
    'data.num_frames': (D + 'test_ucf101_clips', D + 'test_eval_views_are_the_official_ones'),
    'data.frame_stride': (D + 'test_ucf101_clips', D + 'test_eval_views_are_the_official_ones'),
    'data.grid': (D + 'test_eval_at_another_resolution_renders_more_cells',
                  D + 'test_pipeline_reads_prepared_arrows_like_on_the_fly'),
    'data.num_eval': (D + 'test_eval_never_drops_examples',),
    'data.num_train': (D + 'test_fraction_trains_on_the_first_examples_and_repeats',),
    'data.seed': (ARROWS_STREAMS,),
    # The batches are the same whatever these are (the iterator takes them as arguments).
    'data.workers': (WORKERS,),
    'data.threads': (WORKERS,),
    'data.prefetch': (WORKERS,),
    'data.normalise': (D + 'test_device_normalisation_sends_the_pixels_of_the_host_batch',
                       T + 'test_uint8_batches_normalised_on_the_device_give_the_host_step'),
    'seed': (DROPOUT_RNG,
             D + 'test_train_batches_are_a_function_of_seed_and_step'),
    'batch_size': (D + 'test_process_shards_are_disjoint_and_make_the_global_batch',
                   T + 'test_eight_devices_equal_one_device_step'),
    'total_steps': (CADENCES, T + 'test_the_schedule_is_linear_warmup_then_cosine_to_zero'),
    'lr': (OPTIMIZER, T + 'test_the_schedule_is_linear_warmup_then_cosine_to_zero'),
    'warmup_steps': (T + 'test_the_schedule_is_linear_warmup_then_cosine_to_zero',),
    'b1': (OPTIMIZER,), 'b2': (OPTIMIZER,), 'eps': (OPTIMIZER,), 'weight_decay': (OPTIMIZER,),
    'grad_clip': (OPTIMIZER,),
    'sharding': SHARDING, 'model_parallel': SHARDING,
    'log_every': (CADENCES,), 'eval_every': (CADENCES,), 'checkpoint_every': (CADENCES,),
    'keep': (CADENCES,),
    'eval_batch_size': (T + 'test_evaluation_reads_batches_of_eval_batch_size',),
    'resolutions': (T + 'test_eval_writes_results_json',
                    T + 'test_other_sizes_are_evaluated_in_the_modes_the_encoding_reads'),
    'model_init': (
        I + 'test_workdir_latest_best_and_step_fresh_optimizer', I + 'test_safetensors_export',
        'tests/test_official_fixtures.py::'
        'test_model_init_from_an_official_lightning_checkpoint_gives_the_official_logits'),
    'model_init_head': (I + 'test_official_lightning_checkpoint',
                        I + 'test_mismatch_is_one_line_naming_the_fix'),
}


def _config_fields():
  """Every field the config builders write, as 'model.pe.name', 'data.grid', 'lr', ..."""
  from liere_jax.config import base_config, data_config, model_config
  model = model_config(pe='liere8', variant='', patch=(4, 4), input_size=(16, 16),
                       channels=3, num_classes=5)
  config = base_config(model=model, data=data_config(name='arrows'),
                       batch_size=8, total_steps=1, lr=1e-3)

  def walk(section, prefix):
    for key, value in section.items():
      if hasattr(value, 'items'):
        yield from walk(value, f'{prefix}{key}.')
      else:
        yield prefix + key
  return set(walk(config, ''))


def _tests_of(path):
  import ast
  import os
  with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), path)) as f:
    return {n.name for n in ast.parse(f.read()).body if isinstance(n, ast.FunctionDef)}


def test_every_config_field_has_a_behaviour_test():
  fields = _config_fields()
  missing = sorted(fields - set(OPTION_TESTS))
  assert not missing, f'config fields without a behaviour test in OPTION_TESTS: {missing}'
  gone = sorted(set(OPTION_TESTS) - fields)
  assert not gone, f'OPTION_TESTS rows for fields the config builders no longer write: {gone}'
  for field, tests in OPTION_TESTS.items():
    if field not in fields:
      continue
    assert tests, field
    for test in tests:
      path, _, name = test.partition('::')
      names = _tests_of(path)  # The module must exist; the test too, when one is named.
      assert not name or name in names, f'{field}: {test} does not exist'
