"""The paths users walk, end to end, for every config in configs/.

Each row: training (2 steps, a tiny model set by command-line overrides only, the config's
own options: the official recipe's augmentation, evaluation protocol, dropout sites, inits, bf16)
on datasets prepared by `liere_jax.data.prepare` from tiny files in the original download formats
(tests/datasets.py writes them: the CIFAR-100 binary archive, the ILSVRC2012 tars, UCF101 .avi
videos and split lists; the command for cifar100, its function in-process for the others), then
evaluation of the workdir (the run's own config.json), then `python -m liere_jax.convert
to_torch`, then the export loaded
into the PyTorch port and its logits compared with the JAX model's on a batch of the eval
pipeline: within 1e-4 in float32 (with the trained head, and with a random head so the
comparison sees the whole body); finite and loosely close in bfloat16. The first row runs the
commands a user types (`train.py`, `eval.py --workdir DIR`, `python -m liere_jax.convert`); the
others their library functions in this process (helpers.train, helpers.evaluate, convert's
`call`), on as many of the session's devices as the row names.
"""
import dataclasses
import functools
import io
import json
import os
import subprocess
import sys
from typing import Tuple

import numpy as np
from PIL import Image
import pytest

torch = pytest.importorskip('torch')

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from liere_jax import checkpoint, paths, torch_vit  # noqa: E402
from liere_jax.config import data_config
from liere_jax.convert import __main__ as convert_cli  # noqa: E402
from liere_jax.data import pipeline, prepare  # noqa: E402
from liere_jax.config.datasets import DATASETS  # noqa: E402
from liere_jax.config.data import resolve_data  # noqa: E402
from liere_jax.config.model import resolve  # noqa: E402
from liere_jax.model import ViT  # noqa: E402
from tests import datasets, helpers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOGIT_TOL = 1e-4
BF16_TOL = 0.15  # bfloat16 JAX vs float32 PyTorch, logits of O(1): 0.03 measured.
SIZES = {  # Stand-in examples per split; eval sizes are not multiples of the batch (padding).
    datasets.Cifar100: dict(train=16, test=10),
    datasets.Imagenet2012: dict(train=16, validation=6),
    datasets.Ucf101: dict(train=6, test=3),
}
OPTIONS = {datasets.Ucf101: dict(texture=64)}  # Frames with content, not flat.
CIFAR_SIZES = dict(train=16, test=10)  # The prepared originals (eval sizes pad the batch).
IMAGENET_VAL, UCF_TEST = 6, 2
TINY = ['--config.model.variant=', '--config.model.width=32', '--config.model.depth=1',
        '--config.model.heads=2', '--config.model.mlp_dim=64', '--config.batch_size=8',
        '--config.eval_batch_size=8', '--config.total_steps=2', '--config.checkpoint_every=2',
        '--config.log_every=1']
IMAGE_32 = ['--config.data.image_size=32', '--config.model.input_size=(32,32)']


@dataclasses.dataclass(frozen=True)
class Row:
  config: str  # configs/<file>[:args]
  args: Tuple[str, ...] = ()  # train.py overrides besides TINY
  devices: int = 1
  eval_resolutions: Tuple[int, ...] = ()  # eval's --resolutions, if any.
  n_examples: int = 0  # Expected eval examples.
  resolutions: Tuple[str, ...] = ()  # Expected keys of results.json's 'resolutions'.
  float32: bool = True
  data: bool = True  # Reads the stand-in data_dir (arrows renders on the fly).
  expect: Tuple[Tuple[str, object], ...] = ()  # (dotted key, value) in the run's config.json.


OFFICIAL = (('model.dropout', 0.1), ('model.init', 'official'), ('model.qkv_bias', False),
            ('warmup_steps', 0))  # The paper configs as shipped.
CIFAR = OFFICIAL + (('data.augment', 'official_randaug'), ('data.crop', 'pad'))
IMAGENET = OFFICIAL + (('data.augment', 'official_randaug'), ('data.crop', 'rrc'),
                       ('data.eval_crop', 'center'))
FLOAT32 = ('--config.model.dtype=float32',)  # For the 1e-4 port check (bf16 is the default).


ROWS = {
    # The config as shipped (liere8, bf16, the official recipe); eval at another size by flag.
    'cifar100-liere8-bf16': Row('cifar100.py', eval_resolutions=(48,), n_examples=10,
                                resolutions=('48',), float32=False,
                                expect=CIFAR + (('model.dtype', 'bfloat16'),)),
    'cifar100-paper_rope_mixed-mean-fsdp-2dev': Row(
        'cifar100.py:pe=paper_rope_mixed', ('--config.model.pool=mean', '--config.sharding=fsdp',
                                            *FLOAT32),
        devices=2, n_examples=10, expect=CIFAR + (('model.pool', 'mean'),)),
    'cifar100-rope_mixed-ours': Row(  # Our recipe as options.
        'cifar100.py:pe=rope_mixed', ('--config.data.augment=randaug', '--config.model.init=jax',
                                      *FLOAT32), n_examples=10,
        expect=(('data.augment', 'randaug'), ('model.init', 'jax'))),
    'imagenet2012-abs-2dev': Row(
        'imagenet.py:pe=abs', (*IMAGE_32, '--config.resolutions=(48,)', *FLOAT32), devices=2,
        n_examples=IMAGENET_VAL, resolutions=('48',), expect=IMAGENET),
    'imagenet2012-paper_visionllama-bf16-fsdp-4dev': Row(
        'imagenet.py:pe=paper_visionllama', (*IMAGE_32, '--config.sharding=fsdp'), devices=4,
        n_examples=IMAGENET_VAL, float32=False,
        expect=IMAGENET + (('model.dtype', 'bfloat16'), ('sharding', 'fsdp'))),
    # ucf101 as shipped: native frames, VideoMAE augmentation, 5 x 3 views; 4 frames at stride 2.
    'ucf101-liere8-views-2dev': Row(
        'ucf101.py', ('--config.data.image_size=32', '--config.data.num_frames=4',
                      '--config.data.frame_stride=2', '--config.model.input_size=(4,32,32)',
                      *FLOAT32),
        devices=2, eval_resolutions=(48,), n_examples=UCF_TEST, resolutions=('48',),
        expect=OFFICIAL + (('data.augment', 'videomae'), ('data.crop', 'rrc'),
                           ('data.random_erasing', 0.25), ('data.eval_views', [5, 3]),
                           ('data.mixup', 0.0), ('data.name', 'ucf101/ucf101_1'))),
    'arrows-alibi-num_train': Row(
        'arrows.py:grid=4,pe=alibi', ('--config.data.num_train=32', '--config.data.num_eval=12',
                                      '--config.resolutions=(60,)'),
        n_examples=12, resolutions=('60',), data=False,
        expect=(('model.pe.name', 'alibi'), ('data.num_train', 32))),
}


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  """The datasets as a user makes them: the preparation command on the original downloads."""
  downloads, root = tmp_path_factory.mktemp('downloads'), str(tmp_path_factory.mktemp('tfds'))
  datasets.cifar100_archive(str(downloads), CIFAR_SIZES)
  os.makedirs(downloads / 'manual')
  datasets.imagenet_tars(str(downloads / 'manual'), num_classes=3, per_class=3,
                         num_val=IMAGENET_VAL)
  datasets.ucf101_downloads(str(downloads), extracted=True, num_frames=8)
  rc, out = _run(['-m', 'liere_jax.data.prepare', 'cifar100', f'--download_dir={downloads}',
                  f'--data_dir={root}'], devices=1)
  assert rc == 0, f'prepare cifar100 failed:\n{out}'
  for name in ('imagenet2012', 'ucf101/ucf101_1'):  # The command's function, in this process.
    prepare.prepare(name, str(downloads), root)
  return root


@pytest.fixture(scope='module')
def stand_in_dir(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('stand_ins'))
  for builder, sizes in SIZES.items():
    datasets.prepare(builder, root, sizes, **OPTIONS.get(builder, {}))
  return root


def _run(args, devices, cwd=ROOT):
  env = dict(os.environ, XLA_FLAGS=helpers.xla_flags(devices),
             JAX_PLATFORMS='cpu', PYTHONPATH=ROOT)
  proc = subprocess.run([sys.executable, *args], env=env, cwd=cwd, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, timeout=600)
  return proc.returncode, proc.stdout


def _train(row: Row, workdir: str, data_dir: str, command: bool):
  """train.py with the row's flags (`command`), or the same run in this process."""
  config = os.path.join(ROOT, 'configs', row.config)
  flags = [*TINY, *([f'--config.data.data_dir={data_dir}'] if row.data else []), *row.args]
  if command:
    rc, out = _run([os.path.join(ROOT, 'train.py'), '--config', config, '--workdir', workdir,
                    *flags, '--noprogress'], row.devices)
    assert rc == 0, f'train.py failed:\n{out}'
    return
  path, _, arg = config.partition(':')
  run = helpers.override(helpers.load_config(path, arg), helpers.flag_overrides(flags))
  assert helpers.train(run, workdir, row.devices) is None


def _evaluate(row: Row, workdir: str, command: bool):
  """eval.py --workdir DIR (`command`), or the same evaluation in this process."""
  if command:
    args = ('--resolutions', ','.join(map(str, row.eval_resolutions))) if (
        row.eval_resolutions) else ()
    rc, out = _run([os.path.join(ROOT, 'eval.py'), '--workdir', workdir, *args], row.devices)
    assert rc == 0, f'eval.py failed:\n{out}'
    return
  overrides = {'resolutions': row.eval_resolutions} if row.eval_resolutions else {}
  helpers.evaluate(workdir, devices=row.devices, **overrides)


# The JAX side runs jitted with XLA's backend optimisations off (compile time is most of it).
_FAST_COMPILE = {'xla_backend_optimization_level': 0, 'xla_llvm_disable_expensive_passes': True}


@functools.partial(jax.jit, static_argnums=0, compiler_options=_FAST_COMPILE)
def _forward(graphdef, state, x):
  return nnx.merge(graphdef, state)(x)


def _jax_model(config, params):
  model = ViT(resolve(config.model), rngs=nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, params)
  nnx.update(model, state)
  model.eval()
  return model


def _logits(jm, tm, x):
  y_jax = np.asarray(_forward(*nnx.split(jm), jnp.asarray(x)))
  with torch.no_grad():
    y_torch = tm(torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -1, 1)))).numpy()
  return y_jax, y_torch


def _check_port(workdir: str, out: str, float32: bool):
  """The export in the PyTorch port vs the JAX model of the run, on an eval batch."""
  config, params, _ = checkpoint.load_params(workdir)
  x = next(pipeline.eval_batches(resolve_data(config.data), global_batch_size=4))['image']
  jm = _jax_model(config, params)
  tm = torch_vit.load_liere_safetensors(out).eval()
  # A random head as well: after 2 steps from the zero-initialised head, logits are ~bias.
  head = np.random.default_rng(0).normal(size=jm.head.kernel.shape).astype(np.float32)
  head /= np.sqrt(head.shape[0])
  report = {}
  for name in ('trained head', 'random head'):
    if name == 'random head':
      jm.head.kernel.value = jnp.asarray(head)
      tm.head.weight.data = torch.from_numpy(np.ascontiguousarray(head.T))
    y_jax, y_torch = _logits(jm, tm, x)
    assert y_jax.shape == y_torch.shape == (4, config.model.num_classes)
    assert np.isfinite(y_jax).all() and np.isfinite(y_torch).all(), name
    report[name] = float(np.abs(y_jax - y_torch).max())
  tol = LOGIT_TOL if float32 else BF16_TOL
  print(f'{workdir}: JAX vs PyTorch max |logit difference| {report} (tolerance {tol})')
  assert max(report.values()) <= tol, f'JAX vs PyTorch max |logit difference| {report}'
  return report


@pytest.mark.parametrize('name', list(ROWS))
def test_user_path(name, data_dir, tmp_path):
  row = ROWS[name]
  workdir = str(tmp_path / 'run')
  command = name == next(iter(ROWS))  # The commands themselves once.
  _train(row, workdir, data_dir, command)
  assert os.path.exists(os.path.join(workdir, 'checkpoints', '2'))
  config = json.loads(open(os.path.join(workdir, 'config.json')).read())
  for key, value in row.expect:  # The row exercises what it says it does.
    got = functools.reduce(lambda d, k: d[k], key.split('.'), config)
    assert got == value, f'{key} = {got!r} in the run, the row expects {value!r}'
  metrics = paths.read_metrics(workdir)
  assert [m['step'] for m in metrics if 'loss' in m] == [1, 2]
  assert all(np.isfinite(m['loss']) for m in metrics if 'loss' in m), metrics

  _evaluate(row, workdir, command)
  res = json.loads(open(os.path.join(workdir, 'eval', 'results.json')).read())
  assert res['step'] == 2 and res['n_examples'] == row.n_examples, res
  assert 0 <= res['top1'] <= 1 and 0 <= res['shuffled_top1'] <= 1, res
  assert sorted(res['resolutions']) == sorted(row.resolutions), res
  for by_mode in res['resolutions'].values():
    assert by_mode and all(0 <= acc <= 1 for acc in by_mode.values()), res
  assert os.path.getsize(os.path.join(workdir, 'eval', 'attention.png')) > 0

  export = str(tmp_path / 'model.safetensors')
  argv = ['to_torch', '--workdir', workdir, '--out', export]
  if command:
    rc, out = _run(['-m', 'liere_jax.convert', *argv], row.devices)
    assert rc == 0, f'export failed:\n{out}'
  else:
    assert convert_cli.call(argv) == 0
  assert os.path.getsize(export) > 0 and os.path.exists(str(tmp_path / 'model.json'))
  _check_port(workdir, export, row.float32)


def test_stand_ins_read_back_through_the_pipeline(stand_in_dir):
  """The stand-in data through the real pipeline (no TensorFlow): shapes, counts, pixels."""
  cifar = resolve_data(data_config(name='cifar100', data_dir=stand_in_dir,
                                   augment='none'))
  info = pipeline.dataset_info(cifar)
  assert info == dict(input_shape=(32, 32, 3), num_classes=100, num_train=16, num_eval=10)
  builder = datasets.Cifar100(data_dir=stand_in_dir, sizes=SIZES[datasets.Cifar100])
  examples = builder._generate_examples('test', 10)  # pylint: disable=protected-access
  written = sorted((np.asarray(Image.open(io.BytesIO(ex['image']))).tobytes(), ex['label'])
                   for _, ex in examples)
  mean, std = (np.array(DATASETS['cifar100'].mean),
               np.array(DATASETS['cifar100'].std))
  read = []
  for batch in pipeline.eval_batches(cifar, global_batch_size=4):
    pixels = np.round((batch['image'] * std + mean) * 255).astype(np.uint8)
    read += [(pixels[i].tobytes(), batch['label'][i]) for i in np.flatnonzero(batch['mask'])]
  assert sorted(read) == written  # PNG is lossless: exactly the pixels and labels written.
  imagenet = resolve_data(data_config(name='imagenet2012', data_dir=stand_in_dir,
                                      image_size=24, eval_split='validation'))
  assert pipeline.dataset_info(imagenet)['num_eval'] == 6
  train = pipeline.train_dataset(dataclasses.replace(imagenet, augment='randaug'),
                                 global_batch_size=4, seed=0)
  assert train[1]['image'].shape == (4, 24, 24, 3) and train[1]['label'].shape == (4, 1000)
  ucf = resolve_data(data_config(name='ucf101', data_dir=stand_in_dir, image_size=16,
                                 num_frames=4, frame_stride=2))
  assert pipeline.dataset_info(ucf) == dict(input_shape=(4, 16, 16, 3), num_classes=101,
                                            num_train=6, num_eval=3)
