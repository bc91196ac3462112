"""The official-format fixtures (tests/fixtures/official/): what the official StanfordMIMI/LieRE
code computed once for a few tiny models, read back without the official code.

A fixture holds numbers only: each case's RoPEViT arguments, its state_dict keys and shapes (as
the official model lists them), the seeds of its parameter values and input, and the logits the
official model gives. The values themselves are not stored: `state_dict` draws them again from
the seed (numpy's PCG64 streams are the same on every platform: liere_jax/convert/
official_values.py), the same draw the script scripts/official_fixtures.py loaded into the
official model.
"""
import json
import os

from liere_jax.convert.official_layout import GENERATORS  # noqa: F401 (the tests' name for it)
from liere_jax.convert.official_values import draw_input as inputs  # noqa: F401
from liere_jax.convert.official_values import draw_state_dict as state_dict  # noqa: F401

DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixtures', 'official')
PATH = os.path.join(DIR, 'cases.json')


def load():
  with open(PATH) as f:
    return json.load(f)
