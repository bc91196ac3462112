"""The official PaPE classifiers (DTU-PAS/parabolic-position-encoding: pape/nn/image_classifier.py
`ImageClassifier`, pape/nn/video_classifier.py `VideoClassifier`), one way: their description as
our model section (`pape_model`) and their state_dict as our parameter tree
(`from_pape_layout`).

Our ViT with `model.norm_pre` is the official classifier in evaluation (tests/test_pape.py
holds its logits to the official's): the official TransformerEncoder normalises every token once
before its first layer (`norm_pre`, pape/nn/encoder.py:18, applied at :36), ours there with
model.norm_pre (`pape_model` sets it). The rest maps one to one in evaluation: the Conv2d / Conv3d patch embedding with bias, the CLS token first
(position 0), pre-norm layers (norm1, one qkv Linear with bias laid out (q|k|v, head, head
dim), PaPE's lift from norm1's output, softmax at head_size**-0.5, out_proj; norm2, fc1, exact
GELU, fc2), `norm_post`, the classifier on the CLS token; LayerNorm eps 1e-5. Training differs
too (not parameters): the official stochastic depth (`drop_path`, 0.1 by default) and its
dropout on the attention probabilities; our ViT has neither.

Positions as liere_jax/encodings/pape.py documents: the official `normalize=False` (the ImageNet
recipe's default), patches at 1..n with CLS at 0; the 2D (col, row) order is ours (row, col) by
swapping the two rows of `position`'s n axis. Full-length video clips only: the official
VideoClassifier masks the padding of shorter clips, our ViT has no padding mask.
"""
from typing import Optional

import ml_collections
import numpy as np

from liere_jax import param_tree
from liere_jax.config import model_config
from liere_jax.convert import tree
from liere_jax.convert.torch_layout import _torch_leaf

# The official model sizes (pape/configs.py MODEL_SIZES): hidden_size, num_layers, num_heads,
# head_size, intermediate_size.
PAPE_SIZES = {'nano': (128, 4, 4, 32, 256), 'tiny': (256, 7, 4, 64, 512),
              'small': (512, 10, 8, 64, 2048), 'base': (768, 12, 12, 64, 3072)}
# Our top-level parameters -> the official module names (torch_layout names the leaves).
_TOP = {'patch_embed': 'embedding', 'cls_token': 'cls', 'norm_pre': 'encoder.norm_pre',
        'norm': 'encoder.norm_post', 'head': 'classifier'}
_BLOCK = {'norm1': 'norm1', 'attn/qkv': 'attention.qkv_proj', 'attn/proj': 'attention.out_proj',
          'norm2': 'norm2', 'mlp/fc1': 'ffn.fc1', 'mlp/fc2': 'ffn.fc2'}
# Our pe parameter [L, ...] -> the official per-layer position encoder's entry.
_PE = {'position': 'position.weight', 'ab': 'ab.weight', 'position_scales': 'position_scales',
       'a': 'a.weight'}


def pape_model(*, positional: str, num_classes: int, patch_size: int, height: int, width: int,
               size: Optional[str] = None, hidden_size: int = 0, num_layers: int = 0,
               num_heads: int = 0, head_size: int = 0, intermediate_size: int = 0,
               parabolas: int = 50, normalize: bool = False, frame_length: Optional[int] = None,
               max_samples: Optional[int] = None) -> ml_collections.ConfigDict:
  """Our model section of the official classifier with these config values (the official
  Config's names: `positional` 'pape' or 'pape_ri', `size` a MODEL_SIZES name or the dims,
  `pape.parabolas`, `video.frame_length` and `video.max_samples` for the VideoClassifier, the
  dataset's height, width and classes; RGB input, as its patch embedding takes); ValueError
  naming what ours cannot hold."""
  if positional not in ('pape', 'pape_ri'):
    raise ValueError(f"positional={positional!r}: only the official 'pape' and 'pape_ri' "
                     'classifiers are read here.')
  dims = [hidden_size, num_layers, num_heads, head_size, intermediate_size]
  if size is not None:
    if size not in PAPE_SIZES:
      raise ValueError(f'size={size!r} is not an official model size ({list(PAPE_SIZES)}).')
    dims = [d or s for d, s in zip(dims, PAPE_SIZES[size])]
  hidden, depth, heads, head, mlp = dims
  if not all(dims):
    raise ValueError('Give the official model size (size=...) or all of hidden_size, '
                     'num_layers, num_heads, head_size and intermediate_size.')
  if heads * head != hidden:
    raise ValueError(f'num_heads * head_size = {heads} * {head} != hidden_size = {hidden}: the '
                     'official attention projects to its own width, ours keeps the token width.')
  if normalize:
    raise ValueError('normalize=True: the official positions divided by the grid (its 2D '
                     '(col, row) by (rows, cols)) have no position mode here; the official '
                     'default is normalize=False.')
  if height % patch_size or width % patch_size:
    raise ValueError(f'{height}x{width} is not divisible by patch_size={patch_size}: the '
                     'official positions count the partial patches its convolution drops.')
  if (frame_length is None) != (max_samples is None):
    raise ValueError('A VideoClassifier needs both frame_length and max_samples.')
  patch = (patch_size,) * 2 if frame_length is None else (frame_length, patch_size, patch_size)
  frames = () if frame_length is None else (frame_length * max_samples,)
  m = model_config(pe=positional, width=hidden, depth=depth, heads=heads, mlp_dim=mlp,
                   patch=patch, input_size=frames + (height, width), channels=3,
                   num_classes=num_classes, pool='cls', qkv_bias=True, norm_pre=True)
  if positional == 'pape':
    m.pe.parabolas = parabolas
  return m


def _official_name(path) -> str:
  """The official name of our non-pe parameter `path` (a tuple of str)."""
  if path == ('cls_token',):
    return _TOP['cls_token']
  leaf = _torch_leaf(path, 0)[0].rsplit('.', 1)[-1]  # kernel, scale -> weight; bias.
  if path[0] == 'blocks':
    return f'encoder.layers.{path[1]}.{_BLOCK["/".join(path[2:-1])]}.{leaf}'
  return f'{_TOP[path[0]]}.{leaf}'


def from_pape_layout(state, spec) -> dict:
  """An official PaPE / PaPE-RI classifier's state_dict -> our params of ModelSpec `spec`
  (pape_model's, resolved: with model.norm_pre). Every key and shape is checked (ValueError
  naming the first mismatch)."""
  if spec.pe.family not in ('pape', 'pape_ri'):
    raise ValueError(f'pe={spec.pe.name}: the official PaPE classifiers hold pape or pape_ri.')
  state = {k: np.asarray(v, np.float32) for k, v in state.items()}
  reference = tree.abstract_params(spec)
  ref_flat = param_tree.flatten(reference)
  n, depth = spec.n_dims, spec.depth
  expected, flat = {}, {}
  for path, leaf in ref_flat.items():
    if path[0] == 'pe':
      continue
    shape = _torch_leaf(path, n)[3]
    expected[_official_name(path)] = shape(tuple(leaf.shape))
  layer_shapes = {k: ref_flat[('pe', k)].shape[1:] for k in _PE if ('pe', k) in ref_flat}
  for i in range(depth):  # Linear weights [out, in]; PaPE-RI's buffer [1, H, 1, 1].
    for key, shape in layer_shapes.items():
      expected[_pe_name(i, key)] = (1, shape[0], 1, 1) if key == 'position_scales' else shape[::-1]
  tree.check_keys(expected, state, 'The official PaPE state_dict')
  for path in ref_flat:
    if path[0] != 'pe':
      inverse = _torch_leaf(path, n)[2]
      flat[path] = np.ascontiguousarray(inverse(state[_official_name(path)]))
  for key in layer_shapes:
    layers = [state[_pe_name(i, key)] for i in range(depth)]
    if key == 'position_scales':
      value = np.stack([s.reshape(-1) for s in layers])  # [1, H, 1, 1] -> [L, H]
    else:
      value = np.stack([w.T for w in layers])  # Linear [out, in] -> [L, in, out]
    if key == 'position' and n == 2:
      value = value[:, ::-1]  # Their (col, row) -> our (row, col).
    flat[('pe', key)] = np.ascontiguousarray(value)
  return param_tree.unflatten_like(reference, flat)


def _pe_name(layer: int, key: str) -> str:
  return f'encoder.layers.{layer}.attention.position_encoder.{_PE[key]}'
