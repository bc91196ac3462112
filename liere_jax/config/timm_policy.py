"""timm's RandAugment policy strings ('rand-m7-n4-mstd0.5-inc1'), parsed without PIL: the
config checks read them (liere_jax/config/data.py), the augmentation applies them
(liere_jax/data/randaugment.py)."""
import functools
import re
from typing import NamedTuple

TIMM_MAX_LEVEL = 10.0  # timm's _LEVEL_DENOM: magnitudes are out of 10.


class TimmPolicy(NamedTuple):
  """A parsed 'rand-...' string; the defaults are timm's for a token left out."""
  magnitude: int = 10  # m, of 10.
  num_ops: int = 2  # n, drawn with replacement.
  magnitude_std: float = 0.0  # mstd: per application, magnitude ~ N(m, mstd) clipped to [0, 10].
  increasing: bool = False  # inc1: TIMM_INCREASING, inc0: TIMM_STANDARD.
  prob: float = 0.5  # p: the probability that each drawn op is applied.


_FLOAT = r'\d+(\.\d*)?|\.\d+'
_POLICY_TOKENS = {  # key -> (value pattern, field, parse).
    'm': (r'\d+', 'magnitude', int),
    'n': (r'\d+', 'num_ops', int),
    'mstd': (_FLOAT, 'magnitude_std', float),
    'inc': (r'[01]', 'increasing', lambda v: v == '1'),
    'p': (_FLOAT, 'prob', float),
}


@functools.lru_cache(maxsize=64)
def parse_timm_policy(policy: str) -> TimmPolicy:
  """'rand-m7-n4-mstd0.5-inc1[-p0.5]' -> TimmPolicy; tokens after 'rand' in any order."""
  head, *tokens = policy.split('-')
  if head != 'rand':
    raise ValueError(f"timm policy {policy!r} must start with 'rand-' (e.g. "
                     "'rand-m7-n4-mstd0.5-inc1').")
  fields = {}
  for token in tokens:
    key, value = re.fullmatch(r'([a-z]*)(.*)', token).groups()
    pattern, field, parse = _POLICY_TOKENS.get(key, ('', None, None))
    if field is None or not re.fullmatch(pattern, value):
      raise ValueError(f'timm policy {policy!r}: token {token!r} is not one of m<int>, n<int>, '
                       'mstd<float>, inc<0|1>, p<float>.')
    fields[field] = parse(value)
  parsed = TimmPolicy(**fields)
  if parsed.magnitude > TIMM_MAX_LEVEL:
    raise ValueError(f'timm policy {policy!r}: m{parsed.magnitude} is out of 10 (timm would '
                     'clip it to 10); use m <= 10.')
  if parsed.prob > 1:
    raise ValueError(f'timm policy {policy!r}: p{parsed.prob} is a probability; use p <= 1.')
  return parsed
