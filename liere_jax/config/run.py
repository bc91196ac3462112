"""A config's top-level fields (the run: optimizer, loop, evaluations) and its sections: each
declared once, with its default and doc; liere_jax.run_spec checks them and resolves the whole
config into a RunSpec. `RUN.upgrade` is the one place a stored config gets the fields added
since it was written."""
import ml_collections

from liere_jax.config.data import DATA
from liere_jax.config.fields import REQUIRED, Field, Section
from liere_jax.config.model import MODEL

RUN = Section('', [
    Field('seed', 0, 'Parameters, dropout and the data order: a pure function of (seed, step).'),
    Field('model', MODEL, 'The model (model.* above).'),
    Field('data', DATA, 'The data (data.* above).'),
    Field('batch_size', REQUIRED, 'Global batch, over all devices and processes.'),
    Field('total_steps', REQUIRED, 'Training steps.'),
    Field('lr', REQUIRED, 'Peak learning rate (Adam(W), linear warmup, cosine to 0).'),
    Field('warmup_steps', 0, 'Linear warmup steps; 0 = none.'),
    Field('b1', 0.9, "Adam's beta1."),
    Field('b2', 0.999, "Adam's beta2."),
    Field('eps', 1e-8, "Adam's epsilon."),
    Field('weight_decay', 0.0, 'Decoupled weight decay (AdamW); 0 = Adam.'),
    Field('grad_clip', 0.0, 'Global-norm clipping threshold; 0 = off.'),
    Field('sharding', 'data', "'data' (replicated parameters) or 'fsdp' (parameters sharded "
          'too).'),
    Field('model_parallel', 1, "Devices on the mesh's 'model' axis: heads and MLP split over "
          'them.', added=1),
    Field('log_every', 50, 'Steps between logged metrics.'),
    Field('eval_every', 0, 'Steps between evaluations; 0 = at the end only.'),
    Field('checkpoint_every', 500, 'Steps between checkpoints.'),
    Field('keep', 2, 'Latest checkpoints kept (the best by eval accuracy is kept too).'),
    Field('eval_batch_size', REQUIRED, 'Global eval batch (base_config: batch_size).'),
    Field('resolutions', (), 'eval.py: also evaluate at these input sizes (paper Fig. 7), e.g. '
          '(384,).', added=()),
    Field('model_init', '', 'Start from these parameters: DIR[:best|:STEP], FILE.safetensors, '
          "FILE.ckpt (model_init.py); '' = fresh.", added=''),
    Field('model_init_head', 'load', "'load' the source's head or 'reinit' a new one (e.g. "
          'other classes).', added='load'),
])


def base_config(*, model, data, batch_size, **values) -> ml_collections.ConfigDict:
  """A whole experiment: RUN's defaults, `values` over them (eval_batch_size: batch_size)."""
  return RUN.build(model=model, data=data, batch_size=batch_size,
                   **{'eval_batch_size': batch_size, **values})


def docs_table() -> str:
  """Every field of a config as the Markdown table of docs/configs.md ("Every field")."""
  return '| field | default | what |\n|---|---|---|\n' + RUN.table()


def upgrade(stored: dict) -> dict:
  """A stored config (plain dict, from a config.json or an export's JSON) with the fields added
  since it was written at the values that reproduce it; sections it lacks stay absent."""
  return RUN.upgrade(stored)
