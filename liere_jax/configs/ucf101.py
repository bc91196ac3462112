r"""UCF101 video classification (paper Table 1): 8 frames at stride 4, 224x224, tubelets 2x16x16.

  python train.py --config configs/ucf101.py:pe=liere8 --workdir runs/ucf101_liere8

Arguments: pe (abs, paper_visionllama, paper_rope_mixed, liere8, liere64 are the paper's Table 1
columns), variant (B; Ti, S, paper_tiny, L).
The official recipe (liere_jax/recipes.py): batch 64, Adam lr 1e-4, cosine over 200 epochs, no
warmup, no mixup; native 320x240 frames (`ucf101/ucf101_1`), VideoMAE's augmentation (timm
RandAugment rand-m7-n4-mstd0.5-inc1, RandomResizedCrop, flip, random erasing 0.25); evaluation on
5 temporal x 3 spatial views (eval accuracy = per view, as the official code reports; per video
beside it). One centred clip instead: --config.data.eval_views="(1, 1)".
"""
import math

from liere_jax.config import OFFICIAL_MODEL, base_config, data_config, model_config, parse_arg


def get_config(arg=None):
  arg = parse_arg(arg, pe='liere8', variant='B')
  model = model_config(pe=arg.pe, variant=arg.variant, patch=(2, 16, 16),
                       input_size=(8, 224, 224), channels=3, num_classes=101)
  model.update(OFFICIAL_MODEL)
  data = data_config(name='ucf101/ucf101_1', train_split='train', eval_split='test',
                     augment='videomae', crop='rrc', random_erasing=0.25,
                     eval_views=(5, 3), image_size=224, num_frames=8, frame_stride=4)
  steps_per_epoch = math.ceil(9_537 / 64)
  return base_config(model=model, data=data, batch_size=64,
                     total_steps=200 * steps_per_epoch, lr=1e-4)
