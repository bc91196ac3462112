r"""CIFAR-100 from scratch (paper Table 1): 32x32 images, patch 4, 64 tokens.

  python train.py --config configs/cifar100.py:pe=liere8,variant=B --workdir /tmp/cifar_liere8

Arguments: pe (none, abs, sincos, rope_axial, rope_mixed, alibi, liere<b>), variant (Ti, S, B,
L). Paper recipe: Adam lr 1e-4, cosine over 200 epochs, batch 512, RandAugment, dropout 0.1.
"""
from liere_jax import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, pe='liere8', variant='B')
  model = config_lib.model_config(pe=arg.pe, variant=arg.variant, patch=(4, 4),
                                  input_size=(32, 32), channels=3, num_classes=100,
                                  dropout=0.1)
  data = config_lib.data_config(name='cifar100', train_split='train', eval_split='test',
                                augment='randaug')
  steps_per_epoch = 50_000 // 512
  return config_lib.base_config(model=model, data=data, batch_size=512,
                                total_steps=200 * steps_per_epoch, lr=1e-4,
                                warmup_steps=5 * steps_per_epoch)
