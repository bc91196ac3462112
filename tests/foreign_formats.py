"""Files in formats liere_jax does not own, written by their owners' libraries or from their
published definitions, never by liere_jax's writers (issue 31): what a reader of ours must
take from the outside world.

- `write_safetensors`: the safetensors layout as its specification publishes it
  (huggingface/safetensors README, "Format"): an unsigned little-endian 64-bit header size N,
  N bytes of UTF-8 JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, optionally
  "__metadata__": {str: str}}, then the raw little-endian data, offsets relative to its start.
- `write_lightning_checkpoint`: a PyTorch Lightning `.ckpt` as Lightning's
  `_CheckpointConnector.dump_checkpoint` lays it out (Lightning 2.x; the official
  StanfordMIMI/LieRE trains with Lightning), written by `torch.save`, the state_dict produced
  by torch itself (nn.Module.state_dict), the Adam and cosine-schedule states in the layout of
  torch's Optimizer.state_dict / LRScheduler.state_dict (built by hand: torch.optim imports
  torch._dynamo, seconds a test process).
"""
import contextlib
import json
import math
import struct

import numpy as np

# The specification's dtype names (the subset our models hold).
SAFETENSORS_DTYPES = {np.dtype(np.float32): 'F32', np.dtype(np.float16): 'F16',
                      np.dtype(np.int64): 'I64'}


def write_safetensors(path, tensors, metadata=None):
  """{name: np.ndarray} -> a .safetensors file per the specification. The data are laid out in
  reverse name order (the library sorts by dtype then name): readers must follow the offsets."""
  header, chunks, offset = {}, [], 0
  for name in sorted(tensors, reverse=True):
    data = np.ascontiguousarray(tensors[name]).astype(tensors[name].dtype.newbyteorder('<'))
    raw = data.tobytes()
    header[name] = {'dtype': SAFETENSORS_DTYPES[data.dtype], 'shape': list(data.shape),
                    'data_offsets': [offset, offset + len(raw)]}
    chunks.append(raw)
    offset += len(raw)
  if metadata is not None:
    header['__metadata__'] = metadata
  text = json.dumps(header).encode()
  text += b' ' * (-len(text) % 8)  # The specification allows trailing spaces (8-byte aligned).
  with open(path, 'wb') as f:
    f.write(struct.pack('<Q', len(text)) + text + b''.join(chunks))


def read_safetensors(path):
  """(tensors {name: np.ndarray}, metadata) of a .safetensors file, decoded per the
  specification alone."""
  with open(path, 'rb') as f:
    blob = f.read()
  (size,) = struct.unpack('<Q', blob[:8])
  header = json.loads(blob[8:8 + size].decode())
  metadata = header.pop('__metadata__', None)
  names = {v: k for k, v in SAFETENSORS_DTYPES.items()}
  data = blob[8 + size:]
  tensors = {}
  for name, entry in header.items():
    begin, end = entry['data_offsets']
    tensors[name] = np.frombuffer(data[begin:end], names[entry['dtype']].newbyteorder('<')
                                  ).reshape(entry['shape'])
  assert sum(e['data_offsets'][1] - e['data_offsets'][0] for e in header.values()) == len(data)
  return tensors, metadata


@contextlib.contextmanager
def saved_on(torch, location):
  """Within it, torch.save tags every storage with `location` (e.g. 'cuda:0': a checkpoint saved
  on a GPU, as the official training saved its own) through torch.serialization's registry of
  device taggers, whatever device the tensors are on here."""
  registry = torch.serialization._package_registry
  saved = list(registry)
  registry.insert(0, (0, lambda storage: location, lambda storage, where: None))
  try:
    yield
  finally:
    registry[:] = saved


def _module_holding(torch, state):
  """A torch module whose state_dict() is `state` ({dotted name: np.ndarray}), as
  nn.Module.state_dict() returns it (an OrderedDict with its `_metadata`)."""
  root = torch.nn.Module()
  for name, value in state.items():
    *path, leaf = name.split('.')
    module = root
    for part in path:
      if not hasattr(module, part):
        module.add_module(part, torch.nn.Module())
      module = getattr(module, part)
    module.register_parameter(leaf, torch.nn.Parameter(torch.from_numpy(np.array(value))))
  return root


def write_lightning_checkpoint(path, state, epoch=199, steps_per_epoch=3,
                               hyper_parameters=None):
  """The official LightningModule (its RoPEViT as `self.model`) checkpointed by Lightning after
  `epoch` + 1 epochs: 'model.' + the RoPEViT's state_dict, the official optimizer's state
  (Adam, cosine schedule over the epochs), Lightning's loop, callback and hyper-parameter
  entries. `state`: the RoPEViT's {key: np.ndarray}."""
  import torch
  lightning_module = torch.nn.Module()
  lightning_module.add_module('model', _module_holding(torch, state))
  state_dict = lightning_module.state_dict()
  global_step = (epoch + 1) * steps_per_epoch
  lr, t_max = 1e-3, epoch + 1
  last_lr = 0.5 * lr * (1 + math.cos(math.pi * (epoch + 1) / t_max))
  adam = {
      'state': {i: {'step': torch.tensor(float(global_step)), 'exp_avg': torch.zeros_like(v),
                    'exp_avg_sq': torch.zeros_like(v)} for i, v in enumerate(state_dict.values())},
      'param_groups': [{'lr': last_lr, 'betas': (0.9, 0.999), 'eps': 1e-08, 'weight_decay': 0,
                        'amsgrad': False, 'maximize': False, 'foreach': None,
                        'capturable': False, 'differentiable': False, 'fused': None,
                        'decoupled_weight_decay': False, 'initial_lr': lr,
                        'params': list(range(len(state_dict)))}]}
  cosine = {'T_max': t_max, 'eta_min': 0.0, 'base_lrs': [lr], 'last_epoch': epoch + 1,
            '_step_count': epoch + 2, '_get_lr_called_within_step': False,
            '_last_lr': [last_lr]}
  progress = {'ready': global_step, 'completed': global_step}
  checkpoint = {
      'epoch': epoch,
      'global_step': global_step,
      'pytorch-lightning_version': '2.2.1',
      'state_dict': state_dict,
      'loops': {'fit_loop': {'state_dict': {}, 'epoch_progress': {
          'total': {**progress, 'started': epoch + 1, 'processed': epoch + 1},
          'current': {**progress, 'started': epoch + 1, 'processed': epoch + 1}},
          'epoch_loop.state_dict': {'_batches_that_stepped': global_step},
          'epoch_loop.batch_progress': {'total': {**progress, 'started': global_step,
                                                  'processed': global_step},
                                        'is_last_batch': True}},
                'validate_loop': {'state_dict': {}}},
      'callbacks': {"ModelCheckpoint{'monitor': 'val_acc', 'mode': 'max', "
                    "'every_n_train_steps': 0, 'every_n_epochs': 1, "
                    "'train_time_interval': None}": {
                        'monitor': 'val_acc', 'best_model_score': torch.tensor(12.5),
                        'best_model_path': f'checkpoints/epoch={epoch}.ckpt',
                        'current_score': torch.tensor(12.5), 'dirpath': 'checkpoints',
                        'best_k_models': {}, 'kth_best_model_path': '',
                        'kth_value': torch.tensor(float('-inf')), 'last_model_path': ''}},
      'optimizer_states': [adam],
      'lr_schedulers': [cosine],
      # The official module's save_hyperparameters({'initialization_factor': ...}); Lightning
      # stores dict(hparams).
      'hparams_name': None,
      'hyper_parameters': dict(hyper_parameters or {'initialization_factor': 2 * math.pi}),
  }
  torch.save(checkpoint, path)
