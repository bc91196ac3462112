r"""CIFAR-100 from scratch (paper Table 1): 32x32 images, patch 4, 64 tokens.

  python train.py --config configs/cifar100.py:pe=liere8 --workdir runs/cifar100_liere8

Arguments: pe (abs, paper_visionllama, paper_rope_mixed, liere8, liere64 are the paper's Table 1
columns; any of liere_jax.encodings.NAMES), variant (B; Ti, S, paper_tiny, L).
The official recipe (liere_jax/recipes.py; docs/configs.md, "Table 1, as a command"): Adam lr
1e-4, cosine over 200 epochs, no warmup, batch 512, the official RandAugment(2, 14) then pad-4
crop and flip, dropout 0.1 at four sites, PyTorch's inits, no qkv bias, bf16 compute. Ours instead:
--config.data.augment=randaug (torchvision-style RandAugment), --config.model.init=jax.
"""
import math

from liere_jax.config import OFFICIAL_MODEL, base_config, data_config, model_config, parse_arg


def get_config(arg=None):
  arg = parse_arg(arg, pe='liere8', variant='B')
  model = model_config(pe=arg.pe, variant=arg.variant, patch=(4, 4),
                       input_size=(32, 32), channels=3, num_classes=100)
  model.update(OFFICIAL_MODEL)
  data = data_config(name='cifar100', train_split='train', eval_split='test',
                     augment='official_randaug', normalise='device')
  steps_per_epoch = math.ceil(50_000 / 512)  # The official loader keeps the last partial batch.
  return base_config(model=model, data=data, batch_size=512,
                     total_steps=200 * steps_per_epoch, lr=1e-4)
