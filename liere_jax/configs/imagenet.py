r"""ImageNet-1k from scratch (paper Table 1, Fig. 7): 224x224, patch 16, 196 tokens.

  python train.py --config configs/imagenet.py:pe=liere8 --workdir gs://.../in1k

Arguments: pe (abs, paper_visionllama, paper_rope_mixed, liere8, liere64 are the paper's Table 1
columns), variant (B; Ti, S, paper_tiny, L), finetune (below).
The official recipe (liere_jax/recipes.py): batch 512, Adam lr 1e-4, cosine over 200 epochs, no
warmup; the official RandAugment(2, 14) on the full-resolution image, then RandomResizedCrop(224,
0.08-1, 3/4-4/3) and a flip; evaluation on the 224 centre crop of the full-resolution image.
The usual evaluation instead (shorter side to 224, centre crop):
--config.data.eval_crop=resize_center.

Recipe 2 (paper App. B.4, Fig. 7 right): 30 more epochs at 256x256 with lr 1e-5 and cosine
decay (no warmup) from the parameters of the 224 run (DIR, DIR:best or DIR:STEP; see
liere_jax/model_init.py), then evaluate at other sizes:
  python train.py --config configs/imagenet.py:pe=liere8,finetune=DIR --workdir DIR256
  python eval.py --workdir DIR256 --resolutions=196,320,384,448

Needs `imagenet2012` prepared as array_record (python -m liere_jax.data.prepare;
docs/configs.md, "Data").
"""
import math

from liere_jax.config import OFFICIAL_MODEL, base_config, data_config, model_config, parse_arg


def get_config(arg=None):
  arg = parse_arg(arg, pe='liere8', variant='B', finetune='')
  size = 256 if arg.finetune else 224
  model = model_config(pe=arg.pe, variant=arg.variant, patch=(16, 16),
                       input_size=(size, size), channels=3, num_classes=1000)
  model.update(OFFICIAL_MODEL)
  data = data_config(name='imagenet2012', train_split='train',
                     eval_split='validation', augment='official_randaug', crop='rrc',
                     eval_crop='center', image_size=size, normalise='device')
  steps_per_epoch = math.ceil(1_281_167 / 512)
  epochs, lr = (30, 1e-5) if arg.finetune else (200, 1e-4)
  return base_config(model=model, data=data, batch_size=512,
                     total_steps=epochs * steps_per_epoch, lr=lr,
                     model_init=arg.finetune)
