r"""The official PyTorch LieRE train step (github.com/StanfordMIMI/LieRE), timed at our shape.

None of the official code is in this repository: `--official DIR` names a checkout of it, and
a worker process (`--official_python PY`, default: this interpreter) imports
DIR/models/rope_vit.py from there (as a private package, so DIR is not put on sys.path), builds
its `RoPEViT` with the keyword arguments of `official_kwargs(config.model)` and runs one train
step (forward, cross-entropy, backward, Adam step; dropout on, as in training) per request.
PY needs torch and the official code's imports (einops; ipdb is imported but never used, so a
stub stands in when it is missing); it needs neither jax nor this package: the worker is this
file run as a script.

  off = peer.Official(config, '/path/to/LieRE')   # OfficialError: bad checkout, failed import
  seconds = off.step()                            # one train step, batch config.batch_size
  off.close()

The shape is liere_jax.convert.official_spec's (the converter's mapping, which the parity tests
load into the real RoPEViT): dim, depth, heads, mlp_dim = our resolved width, depth, heads,
mlp_dim (the official FlexibleAttention asserts a head dim of 64); image_size, patch_size,
channels, num_classes, input_dimensionality from input_size / patch (square 2D, or 3D).
liere<b>: positional_encoding_type='liere', phase_type='naver', generator_dim=b (rope_mixed:
b=2), rotary_embedding_per_layer / _per_head from model.pe.share (share='none': both, as the
official cifar100.yaml); abs and none: 'absolute'. Plus dropout = emb_dropout = ours. Other
encodings have no official counterpart.
"""
import contextlib
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import types

MODULE = os.path.join('models', 'rope_vit.py')  # The file --official DIR must contain.
_PACKAGE = '_liere_official_models'  # DIR/models, imported under this name.


class OfficialError(RuntimeError):
  """The official code could not be found, imported, built or run."""


# ----------------------------------------------------------------------------------------------
# Parent side (imports liere_jax lazily: the worker below must not need it).
# ----------------------------------------------------------------------------------------------
def official_kwargs(model) -> dict:
  """Our model section -> the official RoPEViT keyword arguments of the same shape: those of
  liere_jax.convert.official_spec (which the parity tests load into the real RoPEViT), plus our
  dropout. ValueError naming why when the official code has no such model. A bench edge: the
  section is resolved here."""
  from liere_jax import convert
  from liere_jax.config.model import resolve
  s = resolve(model)
  try:
    kw = convert.official_spec(s)
  except ValueError as e:
    raise ValueError(f'No official model to time: {e}') from e
  kw.update(dropout=s.dropout, emb_dropout=s.dropout)
  return kw


def check_checkout(checkout: str) -> str:
  """The absolute checkout path, or OfficialError when DIR has no models/rope_vit.py."""
  path = os.path.join(os.path.abspath(os.path.expanduser(checkout)), MODULE)
  if not os.path.isfile(path):
    raise OfficialError(
        f'{checkout} has no {MODULE}: point --official to a checkout of '
        'https://github.com/StanfordMIMI/LieRE (git clone https://github.com/StanfordMIMI/LieRE).')
  return os.path.dirname(os.path.dirname(path))


class Official:
  """The official train step in a worker process; step() runs one and returns its seconds."""

  def __init__(self, config, checkout, *, python=None, threads=None, device=None, seed=0):
    """config: our experiment config (model section, batch_size, lr). device: 'cpu' or 'cuda'
    (default: cuda when JAX runs on a GPU). Raises ValueError (no official counterpart) or
    OfficialError (checkout, imports, construction)."""
    self.kwargs = official_kwargs(config.model)
    checkout = check_checkout(checkout)
    if device is None:
      import jax
      device = 'cuda' if jax.devices()[0].platform == 'gpu' else 'cpu'
    self.python = python or sys.executable
    # Our bfloat16 models are timed against the official run's precision, bf16-mixed autocast.
    job = dict(checkout=checkout, kwargs=self.kwargs, batch_size=int(config.batch_size),
               lr=float(config.get('lr', 1e-4)), threads=int(threads or os.cpu_count() or 1),
               device=device, seed=seed, bf16=config.model.dtype == 'bfloat16')
    env = dict(os.environ)
    # torch's OpenMP threads otherwise spin between steps while ours run.
    env.setdefault('OMP_WAIT_POLICY', 'PASSIVE')
    self._stderr = tempfile.TemporaryFile(mode='w+')  # The official code prints; kept here.
    self.proc = None
    try:
      self.proc = subprocess.Popen([self.python, os.path.abspath(__file__), json.dumps(job)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=self._stderr, text=True, env=env)
    except OSError as e:
      raise OfficialError(f'--official_python {self.python}: {e}') from e
    self.info = self._read('starting')
    if 'error' in self.info:
      message = self.info['error']
      self.close()
      raise OfficialError(message)

  def _read(self, what):
    line = self.proc.stdout.readline()
    if not line:
      self.proc.wait()
      self._stderr.seek(0)
      tail = self._stderr.read()[-2000:]
      raise OfficialError(f'the official worker ({self.python}) exited while {what} '
                          f'(status {self.proc.returncode}):\n{tail}')
    return json.loads(line)

  def step(self) -> float:
    self.proc.stdin.write('step\n')
    self.proc.stdin.flush()
    out = self._read('running a step')
    if 'error' in out:
      raise OfficialError(f"the official train step failed: {out['error']}")
    return out['s']

  def close(self):
    if self.proc is not None:
      try:
        self.proc.stdin.close()
      except OSError:
        pass
      self.proc.wait()
      self.proc = None
    self._stderr.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def time_official(config, checkout, *, steps=3, warmup=1, **kw) -> dict:
  """Runs warmup + steps official train steps: {'train_s': median, 'times': [...], **info}."""
  import statistics
  with Official(config, checkout, **kw) as off:
    times = [off.step() for _ in range(warmup + steps)][warmup:]
    return dict(off.info, train_s=statistics.median(times), times=times)


# ----------------------------------------------------------------------------------------------
# Worker side: torch and the official code only.
# ----------------------------------------------------------------------------------------------
def load_rope_vit(checkout: str):
  """The official RoPEViT class, imported from checkout/models/rope_vit.py."""
  models = os.path.join(checkout, 'models')
  if not os.path.isfile(os.path.join(models, 'rope_vit.py')):
    raise OfficialError(f'{checkout} has no {MODULE}; not a StanfordMIMI/LieRE checkout.')
  if importlib.util.find_spec('ipdb') is None:  # Imported, never used, by the official code.
    sys.modules['ipdb'] = types.ModuleType('ipdb')
  package = types.ModuleType(_PACKAGE)
  package.__path__ = [models]  # Their relative imports (from .vit import ...) resolve in DIR.
  sys.modules[_PACKAGE] = package
  try:
    module = importlib.import_module(f'{_PACKAGE}.rope_vit')
  except ImportError as e:
    raise OfficialError(
        f'importing {os.path.join(models, "rope_vit.py")} with {sys.executable} failed: '
        f'{type(e).__name__}: {e}. Install the official code\'s imports there (e.g. '
        f'{sys.executable} -m pip install einops) or pass --official_python.') from e
  if not hasattr(module, 'RoPEViT'):
    raise OfficialError(f'{os.path.join(models, "rope_vit.py")} defines no RoPEViT.')
  return module.RoPEViT


def _worker(job, proto):
  import torch
  torch.set_num_threads(job['threads'])
  torch.manual_seed(job['seed'])
  device = torch.device(job['device'])
  model = load_rope_vit(job['checkout'])(**job['kwargs']).to(device)
  model.train()
  opt = torch.optim.Adam(model.parameters(), lr=job['lr'])
  loss_fn = torch.nn.CrossEntropyLoss()
  kw = job['kwargs']
  size = kw['image_size'] if isinstance(kw['image_size'], list) else [kw['image_size']] * 2
  x = torch.randn(job['batch_size'], kw['channels'], *size, device=device)
  y = torch.randint(0, kw['num_classes'], (job['batch_size'],), device=device)
  sync = torch.cuda.synchronize if device.type == 'cuda' else (lambda: None)
  print(json.dumps({'torch': torch.__version__, 'device': str(device),
                    'threads': torch.get_num_threads(), 'python': sys.executable,
                    'params': sum(p.numel() for p in model.parameters() if p.requires_grad)}),
        file=proto, flush=True)
  for _ in sys.stdin:
    sync()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=job['bf16']):
      loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    loss.item()
    sync()
    print(json.dumps({'s': time.perf_counter() - t0}), file=proto, flush=True)


def main(argv):
  # Run as a script: its own folder (liere_jax/bench) must not shadow modules.
  if sys.path and os.path.abspath(sys.path[0] or '.') == os.path.dirname(__file__):
    sys.path.pop(0)
  # The protocol gets the original stdout; anything else printed (the official code prints
  # while building its model) goes to stderr.
  proto = os.fdopen(os.dup(1), 'w')
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  try:
    job = json.loads(argv[1])
    with contextlib.redirect_stdout(sys.stderr):
      _worker(job, proto)
  except Exception as e:  # pylint: disable=broad-except
    message = str(e) if isinstance(e, OfficialError) else f'{type(e).__name__}: {e}'
    print(json.dumps({'error': message}), file=proto, flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
