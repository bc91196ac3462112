r"""ImageNet-1k from scratch (paper Table 1, Fig. 7): 224x224, patch 16, 196 tokens.

  python train.py --config configs/imagenet.py:pe=liere8,variant=B --workdir gs://.../in1k

Needs `imagenet2012` prepared as array_record in TFDS (manual download); see README.
"""
from liere_jax import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, pe='liere8', variant='B')
  model = config_lib.model_config(pe=arg.pe, variant=arg.variant, patch=(16, 16),
                                  input_size=(224, 224), channels=3, num_classes=1000,
                                  dropout=0.1)
  data = config_lib.data_config(name='imagenet2012', train_split='train',
                                eval_split='validation', augment='randaug', image_size=224)
  steps_per_epoch = 1_281_167 // 512
  return config_lib.base_config(model=model, data=data, batch_size=512,
                                total_steps=200 * steps_per_epoch, lr=1e-4,
                                warmup_steps=5 * steps_per_epoch)
