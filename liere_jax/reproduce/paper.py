"""The paper's numbers that the suites are compared with, and the constants of the synthetic
task the suites run (configs/arrows.py)."""
from liere_jax.encodings import registry

CELL = 12  # Pixels per grid cell.
TRAIN_GRID = 9  # 108 px: the main job.
HEAD_DIM = 32  # configs/arrows.py: width 128, 4 heads.
FIG7_GRIDS = (7, 8, 9, 10, 11, 12, 14, 16, 18)  # 84 .. 216 px.
FIG7_EXAMPLES = 500
# The extrapolation suite: 1x, 1.5x (rounded up to whole cells: 14 = 1.56x), 2x and 3x the
# training grid; at least three seeds each.
EXTRAPOLATION_GRIDS = (TRAIN_GRID, 14, 18, 27)
EXTRAPOLATION_SEEDS = (0, 1, 2)
PLATEAU = 0.442  # The majority-arrow floor: the accuracy of a model that ignores positions.
PLATEAU_EXIT = 0.6  # Train accuracy that marks a run as having left the plateau.

# Paper, Table 3 (synthetic task, ViT-B): top-1 % and 95% CI per (pe, px).
PAPER_TABLE3 = {
    ('abs', 108): (45.1, 43.1, 47.7), ('abs', 168): (41.0, 39.0, 43.2),
    ('abs', 276): (40.1, 38.2, 42.0),
    ('paper_visionllama', 108): (46.4, 44.0, 47.9), ('paper_visionllama', 168): (48.6, 46.0, 49.9),
    ('paper_visionllama', 276): (48.6, 46.2, 50.1),
    ('paper_rope_mixed', 108): (100., 99.5, 100.), ('paper_rope_mixed', 168): (98.6, 97.6, 98.7),
    ('paper_rope_mixed', 276): (88.6, 87.4, 89.9),
    ('liere8', 108): (99.5, 99.2, 99.8), ('liere8', 168): (99.7, 99.4, 99.9),
    ('liere8', 276): (99.7, 99.5, 99.9),
    ('liere_head', 108): (100., 99.5, 100.), ('liere_head', 168): (100., 99.6, 100.),
    ('liere_head', 276): (100., 99.7, 100.),
}
# The paper has no synthetic-task numbers for its other experiments; these are its CIFAR-100
# ones (ViT-B), shown beside ours as the finding being tested, not as a like-for-like number.
PAPER_CIFAR_SHUFFLE_DROP = {'abs': 69.3, 'paper_visionllama': 54.8, 'paper_rope_mixed': 75.1,
                            'liere8': 82.5, 'liere_head': 84.6}  # Table 5, relative drop %.
PAPER_CIFAR_BLOCKS = {2: 68.84, 4: 69.28, 8: 70.32, 16: 69.85, 32: 69.65, 64: 69.99}  # Table 10.
# Table 4 rows, by our share mode: (RoPE-Mixed, LieRE64, LieRE8). Its first row is Table 1's
# default (per layer and head, with LieRE64's 5.684 GFLOP of Table 8); the FLOPs drop (5.613G)
# in the two rows that share over heads (fewer exponentials); the last row shares both.
PAPER_CIFAR_SHARE = {
    'none': (68.8, 70.0, 70.3), 'layers': (68.7, 69.5, 69.8),
    'heads': (69.5, 69.7, 69.7), 'all': (68.3, 69.4, 69.5)}
# Table 7 (CIFAR-100, paired z-test of init scale 2 pi against 1): points and p-value.
PAPER_CIFAR_INIT = {'liere8': (-1.18, 0.07), 'paper_rope_mixed': (-2.55, 0.0001)}

# The table3 rows, in the report's order. The paper's baseline columns ran the official LieRE
# code's definitions: its "RoPE-Mixed" is LieRE with 2x2 blocks (paper_rope_mixed), its
# "VisionLlama" the fixed-frequency encoding on [0, 1] positions (paper_visionllama).
PAPER_ENCODINGS = ('none', 'abs', 'sincos', 'paper_visionllama', 'paper_rope_mixed', 'alibi',
                   'liere8', f'liere{HEAD_DIM}')
LIBRARY_BASELINES = ('rope_axial', 'rope_mixed')  # rope-vit's / naver-ai's, beside the paper's.
SUCCESSORS = ('comrope_ap8', 'comrope_ld8', 'string_cayley', 'string_circulant8')
# Rotary and bias encodings head to head across resolutions (issue 53): the paper's baselines,
# LieRE, its successors, PaPE (arXiv 2602.01418) and a composition (rotate, then lift).
EXTRAPOLATION_ENCODINGS = ('abs', 'sincos', 'alibi', 'rope_mixed', 'liere8', f'liere{HEAD_DIM}',
                           'comrope_ld8', 'string_cayley', 'pape', 'pape_ri', 'liere8+pape')
ORDER = PAPER_ENCODINGS + LIBRARY_BASELINES + SUCCESSORS + ('pape', 'pape_ri', 'liere8+pape')


def paper_key(pe: str) -> str:
  """The paper's name of our encoding: LieRE at the head dim is its "LieRE64" column."""
  return 'liere_head' if pe == f'liere{HEAD_DIM}' else pe


def label(pe: str) -> str:
  """The report label of an encoding; every baseline says whose definition it is."""
  text = registry.label(pe)
  return f'{text} (= head dim)' if pe == f'liere{HEAD_DIM}' else text
