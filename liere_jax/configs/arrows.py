r"""The synthetic spatial task (paper Sec. 5.2, Table 3): which way does the arrow point that
the base of the Y points at? 12 px cells on a 9x9 (108 px), 14x14 (168 px) or 23x23 grid.

The main job (a small ViT sized for a laptop CPU):
  python train.py --config configs/arrows.py --workdir /tmp/arrows
  python eval.py --workdir /tmp/arrows

Fine-tuning at 168 px from a 108 px run (the paper's recipe 2 in small, App. B.4: the same
steps at a tenth of the learning rate, no warmup; liere_jax/model_init.py):
  python train.py --config configs/arrows.py:grid=14,finetune=/tmp/arrows --workdir /tmp/ft

Arguments: pe (default liere8), variant ('' = the small model below; Ti, S, B, L), grid (9),
finetune (a run to start from: DIR, DIR:best or DIR:STEP).
"""
from liere_jax.config import base_config, data_config, model_config, parse_arg


def get_config(arg=None):
  arg = parse_arg(arg, pe='liere8', variant='', grid=9, finetune='')
  size = 12 * arg.grid
  model = model_config(pe=arg.pe, variant=arg.variant, patch=(12, 12),
                       input_size=(size, size), channels=3, num_classes=4,
                       width=128, depth=2, heads=4, mlp_dim=256, pool='mean')
  if arg.variant:
    model.width = model.depth = model.heads = model.mlp_dim = 0
  data = data_config(name='arrows', augment='none', grid=arg.grid, num_eval=2000)
  # The task has a plateau at the majority-arrow floor (about 44%), left at a random step;
  # depth 2 with mean pooling (which the paper notes suits LieRE) leaves it early, and 300 steps
  # leave room for slower seeds (docs/design.md, "The main job's settings").
  return base_config(model=model, data=data, batch_size=128, total_steps=300,
                     lr=1e-4 if arg.finetune else 1e-3,
                     warmup_steps=0 if arg.finetune else 50, checkpoint_every=100,
                     log_every=20, resolutions=(14 * 12,), model_init=arg.finetune)
