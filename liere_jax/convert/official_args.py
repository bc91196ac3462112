"""The official StanfordMIMI/LieRE model description, both ways: our ModelSpec -> its
`RoPEViT` keyword arguments (`official_spec`), and its keyword arguments or its
LiereImageClassification init_args -> our model section."""
import ml_collections

from liere_jax.encodings import registry

OFFICIAL_HEAD_DIM = 64  # FlexibleAttention asserts dim_head == 64.
# The official LiereImageClassification's model sizes (models/model_args.py size_params):
# (dim, depth, heads, mlp_dim).
OFFICIAL_SIZES = {'tiny': (384, 12, 6, 768), 'base': (768, 12, 12, 3072),
                  'large': (1024, 24, 16, 4096), 'huge': (1280, 32, 16, 5120)}
# Official (rotary_embedding_per_layer, rotary_embedding_per_head) -> our model.pe.share.
OFFICIAL_SHARE = {(True, True): 'none', (False, True): 'layers', (True, False): 'heads',
                  (False, False): 'all'}
# Why an encoding the official code lacks is not its look-alike there.
_LOOK_ALIKES = {
    'rope_axial': ('the official VisionLlama ("tiled") uses phases exp(-4 j/15) on positions in '
                   '[0, 1], ours 1/100^(4j/d) on integer positions; different rotations '
                   '(pe=paper_visionllama is the official one)'),
}


def _not_official(ms) -> str:
  """Why model spec `ms` has no official RoPEViT, or ''."""
  n, name = ms.n_dims, ms.pe.name
  facts = registry.facts(name)
  if not facts.official:
    why = _LOOK_ALIKES.get(facts.family, f'the official LieRE code has no {name} encoding; '
                           'export it for liere_jax/torch_vit.py with `python -m '
                           'liere_jax.convert to_torch` instead')
    return f'pe={name}: {why}'
  if n not in (2, 3):
    return f'{n}D inputs (the official RoPEViT handles 2D images and 3D volumes only)'
  if n == 2 and (ms.patch[0] != ms.patch[1] or ms.input_size[0] != ms.input_size[1]):
    return (f'non-square 2D input_size={tuple(ms.input_size)} / patch={tuple(ms.patch)} (the '
            'official 2D ViT is square)')
  if ms.pool != 'cls':
    return ("pool='mean' (ours has no CLS token; the official mean pooling averages the CLS "
            'token too)')
  if ms.head_dim != OFFICIAL_HEAD_DIM:
    return f'head_dim={ms.head_dim} (the official FlexibleAttention asserts dim_head == 64)'
  if ms.heads == 1 and ms.width == OFFICIAL_HEAD_DIM:
    return 'heads=1 with width=64 (the official attention then has no output projection)'
  if name == 'paper_visionllama' and ms.pe.positions == 'integer':
    return ('pe=paper_visionllama with positions=integer: the official "tiled" encoding turns '
            'by its fixed frequencies times [0, 1] positions and has no parameter to rescale; '
            'use positions=normalized')
  return ''


def official_spec(ms) -> dict:
  """RoPEViT keyword arguments for ModelSpec `ms`, or ValueError naming why it is not
  representable."""
  why = _not_official(ms)
  if why:
    raise ValueError(f'Cannot export to the official LieRE layout: {why}.')
  n, name, block = ms.n_dims, ms.pe.name, ms.pe.block
  kw = dict(image_size=int(ms.input_size[0]) if n == 2 else [int(s) for s in ms.input_size],
            patch_size=int(ms.patch[0]) if n == 2 else [int(p) for p in ms.patch],
            num_classes=int(ms.num_classes), dim=ms.width, depth=ms.depth, heads=ms.heads,
            mlp_dim=ms.mlp_dim, input_dimensionality=n, pool='cls', channels=int(ms.channels),
            dim_head=OFFICIAL_HEAD_DIM)
  if name == 'paper_visionllama':  # As the official LiereImageClassification builds it.
    kw.update(positional_encoding_type='tiled', phase_type='inverse_exp')
  elif block is not None or name == 'rope_mixed':
    share = ms.pe.share
    kw.update(positional_encoding_type='liere', phase_type='naver',
              generator_dim=block or 2, enable_ape=False,
              rotary_embedding_per_layer=share in ('none', 'heads'),
              rotary_embedding_per_head=share in ('none', 'layers'))
  else:  # abs, or none as an all-zero absolute embedding.
    kw.update(positional_encoding_type='absolute', enable_ape=True)
  return kw


def rope_vit_kwargs(init_args: dict) -> dict:
  """The RoPEViT keyword arguments that the official LiereImageClassification builds from its
  init_args (the `model.init_args` of an official lightning_conf/*.yaml, as JSON)."""
  a = {'num_classes': 100, 'input_dimensionality': 1, 'generator_dim': 64, 'model_size': 'tiny',
       'rotary_embedding_per_layer': False, 'rotary_embedding_per_head': False,
       **init_args}  # models/model_args.py defaults.
  arch = a.get('model_architecture')
  if a['model_size'] not in OFFICIAL_SIZES:
    raise ValueError(f"model_size={a['model_size']!r} is unknown; the official sizes are "
                     f'{list(OFFICIAL_SIZES)}.')
  for key in ('imsize', 'patch_size'):
    if key not in a:
      raise ValueError(f'The official init_args lack {key!r}; add it (the input and patch '
                       'size of the official run).')
  dim, depth, heads, mlp_dim = OFFICIAL_SIZES[a['model_size']]
  kw = dict(image_size=a['imsize'], patch_size=a['patch_size'], num_classes=a['num_classes'],
            dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim,
            input_dimensionality=a['input_dimensionality'])
  if arch in ('rope_mixed', 'liere'):  # rope_mixed: the official LieRE with 2x2 blocks.
    kw.update(positional_encoding_type='liere', phase_type='naver',
              generator_dim=2 if arch == 'rope_mixed' else a['generator_dim'],
              rotary_embedding_per_layer=a['rotary_embedding_per_layer'],
              rotary_embedding_per_head=a['rotary_embedding_per_head'], enable_ape=False)
  elif arch == 'visionllama':
    kw.update(positional_encoding_type='tiled', phase_type='inverse_exp')
  elif arch == 'absolute':
    kw.update(positional_encoding_type='absolute')
  else:
    raise ValueError(f'model_architecture={arch!r} is unknown; the official ones are '
                     "'absolute', 'visionllama', 'rope_mixed' and 'liere'.")
  return kw


def model_from_official(kw: dict) -> ml_collections.ConfigDict:
  """Our model section for official RoPEViT keyword arguments (what official_spec writes):
  tiled (VisionLlama) -> paper_visionllama, LieRE with 2x2 blocks (the official rope_mixed)
  -> paper_rope_mixed, LieRE with b x b blocks -> liere<b>, absolute -> abs."""
  from liere_jax.config import model_config
  n = int(kw.get('input_dimensionality', 2))
  kind = kw.get('positional_encoding_type')
  if kind == 'tiled' and kw.get('phase_type') == 'inverse_exp':
    pe = 'paper_visionllama'
  elif kind == 'liere' and kw.get('phase_type') in ('naver', 'learned'):
    if 'generator_dim' not in kw:
      raise ValueError("The RoPEViT keyword arguments lack 'generator_dim' (LieRE's block "
                       'size); give every argument the official model was built with.')
    b = int(kw['generator_dim'])
    pe = 'paper_rope_mixed' if b == 2 else f'liere{b}'
  elif kind == 'absolute':
    pe = 'abs'
  else:
    raise ValueError(f"positional_encoding_type={kind!r} with phase_type="
                     f"{kw.get('phase_type')!r} has no liere_jax encoding; the official ones "
                     "are 'liere' (phase_type 'naver'), 'tiled' ('inverse_exp') and 'absolute'.")
  missing = [k for k in ('dim', 'depth', 'heads', 'mlp_dim', 'image_size', 'patch_size',
                         'num_classes') if k not in kw]
  if missing:
    raise ValueError(f'The RoPEViT keyword arguments lack {missing[0]!r}; give every argument '
                     'the official model was built with.')
  if int(kw.get('dim_head', OFFICIAL_HEAD_DIM)) * int(kw['heads']) != int(kw['dim']):
    raise ValueError(f"dim={kw['dim']} is not heads={kw['heads']} x dim_head="
                     f"{kw.get('dim_head', OFFICIAL_HEAD_DIM)}; liere_jax has no inner width.")

  def axes(v):  # The 2D RoPEViT is square (its ViT reads v[1] of a list); 3D: (d, h, w).
    v = [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)] * n
    return (v[-1],) * 2 if n == 2 else tuple(v)

  m = model_config(pe=pe, variant='', patch=axes(kw['patch_size']),
                   input_size=axes(kw['image_size']),
                   channels=int(kw.get('channels', 3)),
                   num_classes=int(kw['num_classes']), pool=kw.get('pool', 'cls'),
                   dropout=float(kw.get('dropout', 0.1)), width=int(kw['dim']),
                   depth=int(kw['depth']), heads=int(kw['heads']),
                   mlp_dim=int(kw['mlp_dim']))
  m.qkv_bias = False
  if kind == 'liere':
    m.pe.share = OFFICIAL_SHARE[(bool(kw.get('rotary_embedding_per_layer', False)),
                                 bool(kw.get('rotary_embedding_per_head', False)))]
  return m
