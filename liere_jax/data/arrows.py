"""The synthetic spatial task of LieRE (paper Sec. 5.2, Table 3): "where does the Y point?".

An image is a G x G grid of 12 px cells (G = 9 -> 108 px, 14 -> 168 px, 23 -> 276 px), white
glyphs (10 x 10 px, 1 px margin) on black, uint8 with 3 equal channels. Rules, per example:
  * 14 objects in 14 distinct cells: one Y, eight arrows, the letters A, B, C, D, E.
  * The Y is drawn in one of four orientations: its base (the stem) points up, right, down or
    left (uniform). The Y's cell is uniform over the cells whose neighbour in that direction
    is inside the grid.
  * The target arrow sits in that neighbour cell: the cell ADJACENT to the Y on its base side.
    Its direction (0 up, 1 right, 2 down, 3 left, uniform) is the label.
  * The other 7 arrows (uniform directions) and the 5 letters are distractors, in cells drawn
    uniformly without replacement from the 81 - 2 (G = 9) remaining cells. A distractor may
    touch the Y on any other side. (The paper writes "four spurious letters"; A-E are five.)
Everything is drawn from `np.random.default_rng([seed, index])`, so an example is a pure
function of (seed, index, grid): no state, any index in any order, any process. About 12k
examples/s on one CPU core at any grid (only the 14 glyphs are pasted).

A model blind to positions can still predict the most common direction among the eight arrows
(the target is one of them). That floor is 0.4423 exactly (7 uniform distractor directions,
ties split evenly), and `majority_floor(seed=0, n=20_000, grid)`
gives 0.4447 for grids 9, 14 and 23 (the directions do not depend on the grid): the ~44% of
the task's description and the 45.1% of absolute position embeddings in the paper. Well above it
a model must be reading positions.
"""
from typing import Dict

import numpy as np

from liere_jax.config import datasets

CELL = datasets.ARROWS_CELL  # 12 px.
NUM_CLASSES = datasets.ARROWS_CLASSES  # 4 directions.
DIRECTIONS = ('up', 'right', 'down', 'left')
LETTERS = 'ABCDE'
NUM_DISTRACTOR_ARROWS = 7
NUM_OBJECTS = 2 + NUM_DISTRACTOR_ARROWS + len(LETTERS)  # Y, target, distractors, letters.
# (row, col) step of each direction, image coordinates (rows grow downwards).
STEPS = np.array([(-1, 0), (0, 1), (1, 0), (0, -1)], np.int64)

# 10 x 10 glyphs, drawn pointing up; rotated clockwise 90 degrees per direction step.
_ARROW_UP = """
....##....
...####...
..######..
.########.
##########
....##....
....##....
....##....
....##....
....##....
"""
_Y_BASE_UP = """
....##....
....##....
....##....
....##....
....##....
....##....
...####...
..##..##..
.##....##.
##......##
"""
_LETTERS = {
    'A': """
...####...
..##..##..
.##....##.
.##....##.
.##....##.
.########.
.########.
.##....##.
.##....##.
.##....##.
""",
    'B': """
.######...
.##...##..
.##....##.
.##...##..
.######...
.######...
.##...##..
.##....##.
.##...##..
.######...
""",
    'C': """
...#####..
..##...##.
.##.......
.##.......
.##.......
.##.......
.##.......
.##.......
..##...##.
...#####..
""",
    'D': """
.#####....
.##..##...
.##...##..
.##....##.
.##....##.
.##....##.
.##....##.
.##...##..
.##..##...
.#####....
""",
    'E': """
.########.
.##.......
.##.......
.##.......
.#######..
.#######..
.##.......
.##.......
.##.......
.########.
""",
}


def _bitmap(art: str) -> np.ndarray:
  rows = art.strip().splitlines()
  return np.array([[c == '#' for c in r] for r in rows], np.uint8) * 255


def _in_cell(glyph: np.ndarray) -> np.ndarray:
  """[10, 10] -> [CELL, CELL], centred."""
  pad = (CELL - glyph.shape[0]) // 2
  return np.pad(glyph, pad)


def _glyph_bank() -> np.ndarray:
  """[14, CELL, CELL] uint8: blank, arrows (up, right, down, left), A-E, Y (base up..left)."""
  arrow, y = _bitmap(_ARROW_UP), _bitmap(_Y_BASE_UP)
  glyphs = [np.zeros((10, 10), np.uint8)]
  glyphs += [np.rot90(arrow, -d) for d in range(4)]  # k < 0: clockwise.
  glyphs += [_bitmap(_LETTERS[c]) for c in LETTERS]
  glyphs += [np.rot90(y, -d) for d in range(4)]
  return np.stack([_in_cell(g) for g in glyphs])


GLYPHS = _glyph_bank()
ARROW = 1  # GLYPHS[ARROW + d]: arrow pointing in direction d.
LETTER = 5  # GLYPHS[LETTER + i]: LETTERS[i].
Y = 10  # GLYPHS[Y + d]: Y with its base pointing in direction d.
_LETTER_IDS = LETTER + np.arange(len(LETTERS))
_HIGHS = [NUM_CLASSES] * (2 + NUM_DISTRACTOR_ARROWS)
_GLYPHS_RGB = np.repeat(GLYPHS[..., None], 3, axis=-1)


def _check(seed: int, index: int, grid: int):
  if seed < 0 or index < 0:
    raise ValueError(f'seed={seed} and index={index} must be >= 0 (numpy seeds are unsigned).')
  if grid < 4:  # 16 cells for 14 objects.
    raise ValueError(f'grid={grid} has too few cells for {NUM_OBJECTS} objects; use grid >= 4 '
                     '(the paper uses 9, 14 and 23).')


def make_layout(seed: int, index: int, grid: int = 9) -> Dict[str, np.ndarray]:
  """Where everything is, drawn from default_rng([seed, index]).

  Returns dict of:
    rows, cols: int64 [14], cell of each object; object 0 is the Y, 1 the target arrow,
      2..8 the distractor arrows, 9..13 the letters A..E.
    glyphs: int64 [14], index into GLYPHS of each object.
    y_direction: int, where the Y's base points (0 up, 1 right, 2 down, 3 left).
    label: int, direction of the target arrow.
  """
  _check(seed, index, grid)
  rng = np.random.default_rng([seed, index])
  # label, y direction, a cell among the G * (G - 1) with a neighbour on the Y's base side,
  # and the distractor arrows' directions, in one draw.
  draws = rng.integers(_HIGHS[:2] + [grid * (grid - 1)] + _HIGHS[2:])
  label, y_dir, y_pos, arrow_dirs = draws[0], draws[1], draws[2], draws[3:]
  dr, dc = STEPS[y_dir]
  cols = grid - abs(dc)  # Valid columns for the Y.
  y_row, y_col = max(0, -dr) + y_pos // cols, max(0, -dc) + y_pos % cols
  y_cell, t_cell = y_row * grid + y_col, (y_row + dr) * grid + (y_col + dc)
  # 12 more distinct cells among the other G*G - 2: draw from a range of that size and shift
  # past the two taken cells (smaller one first).
  cells = rng.choice(grid * grid - 2, NUM_OBJECTS - 2, replace=False)
  for taken in sorted((y_cell, t_cell)):
    cells += cells >= taken
  cells = np.concatenate([[y_cell, t_cell], cells])
  glyphs = np.concatenate([[Y + y_dir, ARROW + label], ARROW + arrow_dirs, _LETTER_IDS])
  return dict(rows=cells // grid, cols=cells % grid, glyphs=glyphs,
              y_direction=int(y_dir), label=int(label))


def render(layout: Dict[str, np.ndarray], grid: int) -> np.ndarray:
  """Layout -> uint8 [grid * CELL, grid * CELL, 3]."""
  # Paste the 14 glyphs into a black [row, y, col, x, rgb] canvas: cheaper than a full gather.
  image = np.zeros((grid, CELL, grid, CELL, 3), np.uint8)
  image[layout['rows'], :, layout['cols']] = _GLYPHS_RGB[layout['glyphs']]
  return image.reshape(grid * CELL, grid * CELL, 3)


def make_example(seed: int, index: int, grid: int = 9) -> Dict[str, np.ndarray]:
  """One example: dict(image=uint8 [grid * 12, grid * 12, 3], label=int32 [])."""
  layout = make_layout(seed, index, grid)
  return dict(image=render(layout, grid), label=np.int32(layout['label']))


def split_seed(seed: int, split: str) -> int:
  """The example stream of a split: train and test never share an example (even / odd)."""
  if split not in ('train', 'test'):
    raise ValueError(f"split={split!r} is unknown; arrows has 'train' and 'test'.")
  return 2 * seed + (split == 'test')


class ArrowsSource:
  """Random-access source (grain.RandomAccessDataSource) of `size` examples of one stream."""

  def __init__(self, seed: int, size: int, grid: int = 9):
    _check(seed, 0, grid)
    if size < 1:
      raise ValueError(f'size={size} must be >= 1.')
    self.seed, self.size, self.grid = seed, size, grid

  def __len__(self) -> int:
    return self.size

  def __getitem__(self, index: int) -> Dict[str, np.ndarray]:
    index = int(index)
    if not 0 <= index < self.size:
      raise IndexError(f'index={index} is outside this source of {self.size} examples.')
    return make_example(self.seed, index, self.grid)

  def __repr__(self) -> str:
    return f'ArrowsSource(seed={self.seed}, size={self.size}, grid={self.grid})'


def majority_floor(seed: int = 0, n: int = 20_000, grid: int = 9) -> float:
  """Accuracy of guessing the most common direction among the 8 arrows (ties split evenly)."""
  credit = 0.0
  for index in range(n):
    layout = make_layout(seed, index, grid)
    dirs = layout['glyphs'][1:1 + 1 + NUM_DISTRACTOR_ARROWS] - ARROW
    counts = np.bincount(dirs, minlength=NUM_CLASSES)
    if counts[layout['label']] == counts.max():
      credit += 1.0 / np.sum(counts == counts.max())
  return credit / n


def save_examples_png(path: str, seed: int = 0, n: int = 6, grid: int = 9):
  """Tiles examples 0..n-1 of stream `seed` side by side, each captioned with its label."""
  from PIL import Image, ImageDraw  # Only needed here.
  size, caption, gap = grid * CELL, 14, 4
  sheet = Image.new('RGB', (n * (size + gap) - gap, size + caption), (40, 40, 40))
  draw = ImageDraw.Draw(sheet)
  for i in range(n):
    ex = make_example(seed, i, grid)
    x = i * (size + gap)
    sheet.paste(Image.fromarray(ex['image']), (x, caption))
    draw.text((x + 2, 1), f'{i}: {DIRECTIONS[ex["label"]]}', fill=(255, 255, 0))
  sheet.save(path)
