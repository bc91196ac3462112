"""The HBM traffic of a compiled XLA module, read from its HLO text (`compiled.as_text()`):
each top-level instruction's bytes read and written, as laid out in the TPU's tiles and times
the trip count of the loops around it, and the part of the step it belongs to (SCOPES, the
library's jax.named_scope names). `bench compile` sums it for LieRE's part of a step and its
largest instructions (compile.py).
"""
import math
import re

# Named scopes (jax.named_scope in the library) -> the part of the step they are.
SCOPES = (('liere_expm', 'exponential'), ('liere_lattice', 'lattice'),
          ('pe_rotate', 'rotation application'))
_DTYPE_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 's4': 1, 'u4': 1, 'bf16': 2, 'f16': 2, 's16': 2,
                'u16': 2, 'f32': 4, 's32': 4, 'u32': 4, 'f64': 8, 's64': 8, 'u64': 8,
                'c64': 8, 'c128': 16}
_SKIP = {'parameter', 'constant', 'get-tuple-element', 'tuple', 'bitcast', 'after-all',
         'partition-id', 'replica-id', 'while', 'conditional', 'call', 'opt-barrier'}
_ARRAY = re.compile(r'(\w+)\[([\d,]*)\](?:\{([\d,]*)(?::T\((\d+),(\d+)\))?[^}]*\})?')
_INSTR = re.compile(r'^\s*(?:ROOT )?%(\S+) = ')
_COST = re.compile(r'"cost_estimate":\{([^}]*)\}')  # A Pallas kernel's CostEstimate
_HEADER = re.compile(r'^(?:ENTRY )?%(\S+) .*\{$')


def _array_bytes(type_str: str):
  """(logical, as laid out) bytes of an HLO type: tiled layouts T(a,b) round the two most
  minor dimensions up to the tile (an 8 x 8 float32 block takes an 8 x 128 tile on a TPU)."""
  logical = padded = 0
  for dtype, dims, layout, ta, tb in _ARRAY.findall(type_str):
    size = _DTYPE_BYTES.get(dtype, 0)
    shape = [int(d) for d in dims.split(',') if d]
    n = math.prod(shape)
    logical += size * n
    if ta and layout and shape:
      order = [int(i) for i in layout.split(',')]
      padded_shape = list(shape)
      for i, tile in zip(order[:2], (int(tb), int(ta))):
        padded_shape[i] = -(-shape[i] // tile) * tile
      n = math.prod(padded_shape)
    padded += size * n
  return logical, padded


def _split_type(rest: str):
  """'TYPE opcode(operands), attrs' -> (TYPE, opcode, operands, attrs)."""
  if rest.startswith('('):
    depth = 0
    for i, ch in enumerate(rest):
      depth += ch == '('
      depth -= ch == ')'
      if depth == 0:
        break
    type_str, rest = rest[:i + 1], rest[i + 2:]
  else:
    type_str, _, rest = rest.partition(' ')
  opcode, _, rest = rest.partition('(')
  depth, i = 1, 0
  while depth and i < len(rest):
    depth += rest[i] == '('
    depth -= rest[i] == ')'
    i += 1
  return type_str, opcode, rest[:i - 1], rest[i:]


def hlo_traffic(text: str) -> list:
  """The compiled module's top-level instructions (fusions, custom calls, copies, collectives;
  not the computations fused into them), each with its HBM bytes (operands read + result
  written, logical and as laid out) times the trip count of the loops around it:
  [{'name', 'opcode', 'type', 'scope', 'op_name', 'bytes', 'padded_bytes', 'count'}]; a Pallas
  kernel's custom call also its 'cost_estimate' ({'flops', 'transcendentals',
  'bytes_accessed'} a call, as its CostEstimate declares them)."""
  comps, order, fused, calls = {}, [], set(), {}
  current = None
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header and not line.startswith(' '):
      current = header.group(1)
      comps[current] = []
      order.append(current)
      if line.startswith('ENTRY'):
        entry = current
      continue
    m = _INSTR.match(line)
    if m and current:
      type_str, opcode, operands, attrs = _split_type(line[m.end():])
      comps[current].append((m.group(1), type_str, opcode, operands, attrs))
      for key in ('calls', 'to_apply'):
        fused.update(re.findall(key + r'=%([\w.\-]+)', attrs))
      trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', attrs)
      for sub in re.findall(r'(?:body|condition)=%([\w.\-]+)', attrs):
        calls.setdefault(current, []).append((sub, int(trip.group(1)) if trip else 1))
      for sub in re.findall(r'%([\w.\-]+)', (re.search(r'branch_computations=\{([^}]*)\}',
                                                      attrs) or re.search('()', '')).group(1)):
        calls.setdefault(current, []).append((sub, 1))
  count = {entry: 1}
  stack = [entry]
  while stack:
    c = stack.pop()
    for sub, n in calls.get(c, []):
      count[sub] = count.get(sub, 0) + count[c] * n
      stack.append(sub)
  out = []
  for comp, mult in count.items():
    sizes = {name: _array_bytes(t) for name, t, *_ in comps.get(comp, [])}
    names = {}  # An instruction the compiler added (a copy, a layout change) has no op_name:
    for name, type_str, opcode, operands, attrs in comps.get(comp, []):  # its operand's, marked.
      args = re.findall(r'%([\w.\-]+)', operands)
      own = re.search(r'op_name="([^"]*)"', attrs)
      names[name] = own.group(1) if own else next(
          (f'({opcode} of) {names[a].removeprefix("(")}' for a in args if names.get(a)), '')
      if opcode in _SKIP or comp in fused:
        continue
      read = [sizes.get(o, (0, 0)) for o in args]
      written = sizes[name]
      op_name = names[name]
      scope = next((part for key, part in SCOPES if key in op_name), 'other')
      out.append({'name': name, 'opcode': opcode, 'type': type_str, 'scope': scope,
                  'op_name': op_name, 'count': mult,
                  'bytes': mult * (written[0] + sum(r[0] for r in read)),
                  'padded_bytes': mult * (written[1] + sum(r[1] for r in read))})
      cost = _COST.search(attrs) if opcode == 'custom-call' else None
      if cost:  # once a call, as declared (not times the count)
        out[-1]['cost_estimate'] = {k: int(v) for k, v in re.findall(r'"(\w+)":"?(\d+)',
                                                                     cost.group(1))}
  return out
