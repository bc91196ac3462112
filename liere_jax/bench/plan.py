r"""bench plan: what a platform computes for a config, read from the numerics plan the model is
built with (liere_jax.numerics) through the functions that dispatch on it.

  python -m liere_jax.bench plan --config configs/imagenet.py:pe=liere8 [--platform cpu|cuda|tpu]
      [--topology v5litepod-8: a TPU chip's VMEM; default the least, v4's]

Prints the exponential (its form, products, squarings, kernel or XLA), the rotations' path
(lattice or every token), how q and k are rotated, the attention path and the qkv projection,
and their dtypes. tests/test_bench_plan.py holds each line against the lowered program.
"""
import jax
from flax import nnx

from liere_jax import attention, encodings, expm, lattice, numerics as numerics_lib, rotations
from liere_jax.config.model import resolve
from liere_jax.kernels import attention as attention_kernel, expm as expm_kernel
from liere_jax.model import ViT

_SQUARINGS = {
    'cond': 'one scale a chunk of {chunk}, its squarings lax.cond branches (up to 2^{cap})',
    'loop': 'one scale a stack, its squarings a while loop (no cap){chunks}',
    'select': 'a scale a matrix, {cap} squarings kept by select (no control flow)',
    'kernel': 'each matrix its own squarings, a loop to its tile\'s largest, in the kernel',
    'scipy': 'jax.scipy.linalg.expm under vmap (its Pade order and squarings as selects)',
    'closed form': 'none: [[cos, sin], [-sin, cos]]',
}
_KERNEL = {'tpu': 'Pallas (Mosaic)', 'cuda': 'Pallas (Triton)', 'cpu': 'Pallas (interpret mode)'}


def plan_of(config, platform=None, device_kind=None) -> dict:
  """What `platform` (default: this backend) computes for the config's model: a dict of lines;
  device_kind: a TPU chip's (its VMEM, numerics.TPU_VMEM; default: the least)."""
  spec = resolve(config.model)
  numerics = numerics_lib.plan(platform)
  if device_kind is not None:
    numerics = numerics.replace(vmem=numerics_lib.TPU_VMEM[device_kind])
  model = nnx.eval_shape(lambda: ViT(spec, rngs=nnx.Rngs(0), numerics=numerics))
  graphdef, state = nnx.split(model)
  grid = spec.train_grid
  # Layer 0's context, as attention sees it (every layer's has its shapes).
  ctx = jax.eval_shape(lambda s: (lambda m: m.pe.layer(m.pe_context(grid), 0))(
      nnx.merge(graphdef, s)), state)
  positions = model.pe_positions(grid)
  heads, d = spec.heads, spec.head_dim
  shape = (config.batch_size, len(positions), heads, d)
  out = {'config': spec.pe.name, 'platform': numerics.platform + (
             f' ({device_kind}: {numerics.vmem // numerics_lib.MiB} MiB of VMEM)'
             if device_kind else ''),
         'dtypes': f'model {spec.dtype}; parameters, rotations and exponentials float32'}
  # A composition ('liere8+pape'): its rotary part rotates as alone, its lift follows.
  pe = model.pe.rotary if isinstance(model.pe, encodings.Composition) else model.pe
  if spec.pe.family.split('+')[0] == 'liere':
    out.update(_liere(pe.numerics(numerics), spec.pe.block, positions))
  path = attention.path(numerics, ctx, shape)
  out['rotation'] = _application(numerics, ctx, path, spec.dtype)
  out['attention'] = path + (_lifted(path, attention.lifted(ctx, shape), d) if ctx.lifts else {
      'xla': ': jax.nn.dot_product_attention (XLA)',
      'cudnn': ": jax.nn.dot_product_attention, cuDNN's where it takes the shapes (chosen while "
               "tracing on a GPU; XLA's elsewhere)",
      'kernel': ': the Pallas attention kernel, q, k and v read in place',
      'kernel, band': ': the Pallas attention kernel, rotating q and k inside, q, k and v read in '
                      'place',
      'rotation kernel': ': the Pallas rotation kernel, then the attention kernel',
      'kernel after xla': ': XLA rotates q and k, then the Pallas attention kernel'}[path])
  out['qkv'] = ('three products' if attention.split_qkv(numerics, ctx, shape)
                else 'one product')
  return out


def _liere(numerics, block, positions) -> dict:
  form = expm.form(numerics, block)
  products = numerics.products.name
  if form == 'kernel':
    layout = ('entries layout [b, b, m/128, 128], float32 multiply-adds'
              if block <= expm_kernel.ENTRIES_UP_TO else f'tiles of {expm_kernel.tile_matrices(block)} '
              f'matrices, products at {products}')
    how = f'{_KERNEL[numerics.platform]}, {layout}'
  elif form in ('cond', 'loop', 'select'):
    how = 'XLA, products ' + ('float32 multiply-adds' if block <= numerics.elementwise_blocks
                              else f'at {products}')
  else:
    how = 'XLA' + (', products at HIGHEST' if form == 'scipy' else '')
  chunks = ', in chunks of {:,} bytes'.format(numerics.chunk_bytes) if (
      numerics.platform == 'cpu') else ''
  squarings = _SQUARINGS[form].format(chunk=f'{numerics.chunk_bytes:,} bytes',
                                      cap=expm.MAX_SQUARINGS if form == 'cond' else expm.SELECT_CAP,
                                      chunks=chunks)
  taylor = {'cond': 'degree 12 (Paterson-Stockmeyer)', 'select': 'degree 12 (Paterson-Stockmeyer)',
            'loop': 'degree 12 (Bader-Blanes-Casas)', 'kernel': 'degree 12 (Bader-Blanes-Casas)'}
  out = {'exponential': f'{form}: {how}; {squarings}' + (
      f'; {taylor[form]}, then one Newton-Schulz step' if form in taylor else '')}
  path = rotations.path(numerics, block, positions)
  if path == 'lattice':
    plan = lattice.lattice_plan(positions)
    products = ('float32 multiply-adds' if block <= numerics.elementwise_blocks
                else f'at {numerics.products.name}')
    out['rotations'] = (f'lattice: {len(plan.primitives)} primitive points exponentiated, '
                        f'{plan.n_products} products (XLA, {products}) a (layer, head, block)')
  else:
    split = rotations.every_token_kernel(numerics, block, len(positions))
    out['rotations'] = f'every token: {len(positions)} exponentials a stack' + (
        ', split over the data axis by tokens' if split else '') + (
        ", made and handed to the attention kernel as its entries [L, b, T, H d] (one "
        "permutation product to interleave the dims)"
        if rotations.entries_path(numerics, block, len(positions)) else '')
  return out


def _lifted(path, channels, d) -> str:
  """The attention line of a lifting context whose q and k have `channels` a head."""
  what = f'q, k lifted to {channels} channels at the scale {d}**-0.5, v of {d}'
  if path == 'kernel, lift':
    return (f': the Pallas attention kernel of {what}, each head\'s q and k padded with zeros '
            f'to {attention_kernel.lifted(channels)} lanes')
  if path == 'cudnn, lift':
    return (f": jax.nn.dot_product_attention of {what} padded with zeros to {channels}, "
            "cuDNN's where it takes the shapes (chosen while tracing on a GPU; an explicit "
            "softmax (XLA) elsewhere)")
  return f': an explicit softmax (XLA) of {what}'


def _application(numerics, ctx, path, dtype) -> str:
  """How q and k are rotated on this path."""
  if isinstance(ctx, encodings.Composed):
    return (f'XLA: {_application(numerics, ctx.first, "xla", dtype)[len("XLA: "):]}, then '
            'lifted by XLA (Lift)')
  if ctx.lifts:
    return 'none (q and k lifted by XLA: Lift)'
  if not ctx.rotates:
    return 'none' + (' (a logit bias)' if ctx.biased else '')
  if path == 'kernel, band':
    b = ctx.block
    return (f'inside the attention kernel: the blocks\' {b} entries a dim in {dtype}, made a '
            f'band of {2 * b - 1} diagonals on chip, by lane shifts, float32 sums')
  if path == 'rotation kernel':
    return (f'the rotation kernel: each token\'s 128 x 128 tile in {dtype}, float32 sums')
  if not isinstance(ctx, (encodings.Rotate, encodings.Angles)):
    return f'{type(ctx).__name__}.attend (XLA)'
  return f'XLA: {rotations.rotation_form(numerics, ctx.block)}, float32 sums'


def plan_table(res: dict) -> str:
  keys = ('exponential', 'rotations', 'rotation', 'attention', 'qkv', 'dtypes')
  return '\n'.join(f'  {k:12s} {res[k]}' for k in keys if k in res)

