r"""UCF101 video classification (paper Table 1): 8 frames at stride 4, 224x224, tubelets 2x16x16.

  python train.py --config configs/ucf101.py:pe=liere8,variant=B --workdir /tmp/ucf_liere8

Paper recipe: batch 64, mixup, Adam lr 1e-4, cosine.
"""
from liere_jax import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, pe='liere8', variant='B')
  model = config_lib.model_config(pe=arg.pe, variant=arg.variant, patch=(2, 16, 16),
                                  input_size=(8, 224, 224), channels=3, num_classes=101,
                                  dropout=0.1)
  data = config_lib.data_config(name='ucf101', train_split='train', eval_split='test',
                                augment='light', image_size=224, num_frames=8, frame_stride=4,
                                mixup=0.8)
  steps_per_epoch = 9_537 // 64
  return config_lib.base_config(model=model, data=data, batch_size=64,
                                total_steps=200 * steps_per_epoch, lr=1e-4,
                                warmup_steps=5 * steps_per_epoch)
