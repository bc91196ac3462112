"""The parameter layout of the PyTorch port (liere_jax/torch_vit.py), both ways, and the fold
of a string_cayley run into the plain rope_mixed model the port runs."""
import dataclasses

import numpy as np

from liere_jax import param_tree
from liere_jax.convert import tree


def _torch_leaf(path, n_spatial):
  """(torch name, jax->torch, torch->jax, shape map) of one JAX parameter path."""
  *parents, leaf = path
  ident = lambda x: x
  if leaf == 'kernel' and parents == ['patch_embed']:  # [*patch, C, D] <-> [D, C, *patch]
    n = n_spatial
    fwd_axes = (n + 1, n) + tuple(range(n))
    inv_axes = tuple(range(2, n + 2)) + (1, 0)
    return ('.'.join(parents + ['weight']), lambda k: np.transpose(k, fwd_axes),
            lambda w: np.transpose(w, inv_axes), lambda s: tuple(s[a] for a in fwd_axes))
  if leaf == 'kernel':  # Linear [in, out] <-> [out, in]
    return ('.'.join(parents + ['weight']), lambda k: k.T, lambda w: w.T,
            lambda s: tuple(reversed(s)))
  if leaf == 'scale':
    return '.'.join(parents + ['weight']), ident, ident, ident
  return '.'.join(path), ident, ident, ident


def torch_layout(params, spec) -> dict:
  """JAX params -> {torch name: np.ndarray} for torch_vit.ViT (checked against ModelSpec
  `spec`)."""
  flat = tree.check_params(params, spec)
  n = spec.n_dims
  out = {}
  for path, value in flat.items():
    name, fwd, _, _ = _torch_leaf(path, n)
    out[name] = np.ascontiguousarray(fwd(value))
  return out


def from_torch_layout(state, spec) -> dict:
  """{torch name: array} -> JAX params (nnx.to_pure_dict layout) of ModelSpec `spec`; the key
  set and every shape are checked (ValueError naming the first mismatched key)."""
  reference = tree.abstract_params(spec)
  n = spec.n_dims
  expected, inverse = {}, {}
  for path, leaf in param_tree.flatten(reference).items():
    name, _, inv, shape = _torch_leaf(path, n)
    expected[name] = shape(tuple(leaf.shape))
    inverse[path] = (name, inv, leaf.dtype)
  tree.check_keys(expected, state, 'The weights file')
  flat = {path: np.ascontiguousarray(inv(np.asarray(state[name]))).astype(dtype, copy=False)
          for path, (name, inv, dtype) in inverse.items()}
  return param_tree.unflatten_like(reference, flat)


def fold_string_cayley(params, spec):
  """A string_cayley model (params, ModelSpec) -> (params, ModelSpec) of the rope_mixed model
  with the same outputs.

  The encoding turns each head's q and k by P = (I - S)(I + S)^-1 before RoPE-Mixed:
  q_h P^T = x (W_q,h P^T) + b_q,h P^T, so P goes into the qkv kernel and bias (q and k
  columns of every layer and head) and `cayley` is dropped; `freqs` stay RoPE-Mixed's.
  """
  import jax
  from liere_jax import encodings
  if spec.pe.name != 'string_cayley':
    raise ValueError(f'--fold folds string_cayley runs; this run has pe={spec.pe.name!r}.')
  pe = {k: np.asarray(v) for k, v in params['pe'].items()}
  with jax.default_device(jax.devices('cpu')[0]):
    orth = np.asarray(encodings.cayley_orthogonal(pe['cayley'], spec.head_dim), np.float64)
  out = jax.tree.map(np.asarray, params)
  out['pe'] = {'freqs': pe['freqs']}
  h, d = spec.heads, spec.head_dim
  for i in range(spec.depth):
    qkv = out['blocks'][i]['attn']['qkv']
    kernel = qkv['kernel'].reshape(spec.width, 3, h, d).astype(np.float64)
    kernel[:, :2] = np.einsum('xjhe,hfe->xjhf', kernel[:, :2], orth[i])
    qkv['kernel'] = kernel.reshape(spec.width, 3 * spec.width).astype(np.float32)
    if 'bias' in qkv:
      bias = qkv['bias'].reshape(3, h, d).astype(np.float64)
      bias[:2] = np.einsum('jhe,hfe->jhf', bias[:2], orth[i])
      qkv['bias'] = bias.reshape(-1).astype(np.float32)
  # rope_mixed reads the options string_cayley reads (none) and the same positions.
  return out, dataclasses.replace(spec, pe=dataclasses.replace(spec.pe, name='rope_mixed',
                                                               family='rope_mixed'))
