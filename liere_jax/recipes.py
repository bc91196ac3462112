"""The official recipe behind the paper's Table 1, in our config's terms, and every place where
liere_jax/configs/{cifar100,imagenet,ucf101}.py still differ from it.

One place: tests/test_recipes.py resolves each paper config and compares it with OFFICIAL field
by field (a difference must be listed in DIFFERENCES, with its reason and the flag that removes
it), and the "Table 1, as a command" section of docs/configs.md is `python -m liere_jax.recipes`
(a test checks that it carries that text unchanged).

Sources: O = github.com/StanfordMIMI/LieRE at b27b41b (paths relative to that repo); P = the ICML
paper, appendix B. Where the released scripts disagree with the paper (UCF101 batch and block
size), the paper wins: the configs reproduce the paper's numbers.
"""
import math
import sys
from typing import Dict, NamedTuple, Tuple

DATASETS = ('cifar100', 'imagenet', 'ucf101')
# Table 1 columns -> pe names; the paper's RoPE-Mixed and VisionLlama are LieRE-b2 and fixed
# axial frequencies on [0, 1] positions (liere_jax.encodings), not naver-ai's / rope-vit's.
COLUMNS = {'Absolute': 'abs', 'VisionLlama': 'paper_visionllama',
           'RoPE-Mixed': 'paper_rope_mixed', 'LieRE8': 'liere8', 'LieRE64': 'liere64'}
PAPER_TABLE1 = {  # Top-1 %, ViT-B (P, Table 1).
    'cifar100': {'Absolute': 63.9, 'VisionLlama': 65.5, 'RoPE-Mixed': 68.8, 'LieRE8': 70.3,
                 'LieRE64': 70.0},
    'imagenet': {'Absolute': 66.1, 'VisionLlama': 65.4, 'RoPE-Mixed': 68.8, 'LieRE8': 69.6,
                 'LieRE64': 69.3},
    'ucf101': {'Absolute': 40.9, 'VisionLlama': 45.0, 'RoPE-Mixed': 46.3, 'LieRE8': 47.0,
               'LieRE64': 44.7},
}


def _epochs(examples: int, batch: int, epochs: int = 200) -> int:
  """Optimizer steps of `epochs` epochs where each epoch ends on a partial batch (O: the
  PyTorch loaders keep the last batch)."""
  return epochs * math.ceil(examples / batch)


_COMMON = {
    # Optimisation (O lightning_modules/lightning_liere_image_classification.py:233-241).
    'lr': 1e-4, 'b1': 0.9, 'b2': 0.999, 'eps': 1e-8, 'weight_decay': 0.0, 'grad_clip': 0.0,
    'warmup_steps': 0,
    # Model (O models/vit.py, models/rope_vit.py, lightning_conf/base.yaml:8).
    'model.variant': 'B', 'model.pool': 'cls', 'model.qkv_bias': False, 'model.dropout': 0.1,
    'model.dropout_sites': ('embed', 'attn', 'mlp_hidden', 'mlp'), 'model.init': 'official',
    'model.dtype': 'bfloat16', 'model.pe.name': 'liere8', 'model.pe.positions': None,
    'model.pe.init_scale': 2 * math.pi, 'data.mixup': 0.0,
}
OFFICIAL: Dict[str, Dict[str, object]] = {
    'cifar100': {  # O lightning_cifar100.sh, lightning_conf/cifar100.yaml, data_image.py:96-119.
        **_COMMON, 'batch_size': 512, 'total_steps': _epochs(50_000, 512),
        'model.patch': (4, 4), 'model.input_size': (32, 32), 'model.num_classes': 100,
        'data.name': 'cifar100', 'data.augment': 'official_randaug', 'data.crop': 'pad',
        'data.eval_split': 'test'},
    # O lightning_imagenet.sh, lightning_conf/imagenet_224.yaml, data_image.py:193-216.
    'imagenet': {
        **_COMMON, 'batch_size': 512, 'total_steps': _epochs(1_281_167, 512),
        'model.patch': (16, 16), 'model.input_size': (224, 224), 'model.num_classes': 1000,
        'data.name': 'imagenet2012', 'data.augment': 'official_randaug', 'data.crop': 'rrc',
        'data.eval_crop': 'center', 'data.eval_split': 'validation'},
    'ucf101': {  # O lightning_ucf101.sh, dataset/videodataset.py, data_image.py:237-278.
        **_COMMON, 'batch_size': 64, 'total_steps': _epochs(9_537, 64),
        'model.patch': (2, 16, 16), 'model.input_size': (8, 224, 224), 'model.num_classes': 101,
        'data.name': 'ucf101/ucf101_1', 'data.augment': 'videomae', 'data.crop': 'rrc',
        'data.randaug_policy': 'rand-m7-n4-mstd0.5-inc1', 'data.random_erasing': 0.25,
        'data.num_frames': 8, 'data.frame_stride': 4, 'data.eval_views': (5, 3),
        'data.eval_split': 'test'},
}


class Difference(NamedTuple):
  """A setting where a paper config does not do what the official code did."""
  datasets: Tuple[str, ...]
  what: str
  ours: str
  official: str
  why: str
  flag: str  # What makes ours do the official thing, or closer to it ('-': no flag does).


DIFFERENCES = (
    Difference(DATASETS, 'LieRE generators per layer', 'per layer and head',
               "layer 0's for every layer (models/vit.py:105-125 overwrites the slice)",
               'the paper says per layer; the official computation is a bug (Table 4: <= 0.5 pt)',
               '--config.model.pe.share=layers'),
    Difference(DATASETS, 'cosine schedule', 'per step', 'per epoch (CosineAnnealingLR, T_max 200)',
               'the same curve sampled finer; immaterial', '-'),
    Difference(('cifar100', 'imagenet'), 'normalisation', "the dataset's mean / std",
               'CIFAR-10 constants for CIFAR-100 and ImageNet (data_image.py:105-107, 201-214)',
               'a constant affine map the first layer absorbs', '-'),
    Difference(('cifar100',), 'the last batch of an epoch', 'full batches from an endless '
               'shuffled stream', 'a partial batch per epoch', 'same step count; batch k is a pure '
               'function of (seed, k), which makes resume exact', '-'),
    Difference(DATASETS, 'bf16 residual stream', 'bf16 tokens between blocks; logits, softmax '
               'and rotations float32', "bf16-mixed autocast: the residual adds stay float32 "
               "(the float32 CLS token promotes them)", 'one rounding per block in bf16; our '
               'logits are float32 where theirs come out of a bf16 matmul',
               '--config.model.dtype=float32'),
    Difference(DATASETS, 'positions at another input size (Fig. 7 only)', 'step 1/(n_train - 1)',
               'linspace(0, s / s_train, s): step s / (s_train (s - 1))', 'identical at the '
               'training size; ours keeps the training step', '-'),
    Difference(('ucf101',), 'batch and block size', 'batch 64, LieRE8 (P, B.3)',
               'lightning_ucf101.sh: batch 1 x 4 x 2 = 8, LieRE64 (no generator_dim)',
               'the paper states 64 and reports LieRE8', '--config.batch_size=8 / pe=liere64'),
    Difference(('ucf101',), 'eval views: resize', 'PIL bilinear with antialias, long side rounded '
               '(crops at 0 / 37 / 75 px)', 'cv2 INTER_LINEAR, long side floored (0 / 37 / 74)',
               'one pipeline for every dataset; under a pixel of offset', '-'),
    Difference(('ucf101',), 'training crop precision', 'RandomResizedCrop on uint8 frames, then '
               'normalised', 'on normalised float frames', 'at most 0.5 / 255 per pixel', '-'),
    Difference(('ucf101',), 'eval CI and remainder', 'bootstrap over videos, every video',
               "t-interval over views; each rank drops its remainder", 'views of a video are '
               'correlated; nothing is dropped', '-'),
)


def table() -> str:
  """The docs section: one command per (dataset, column), then every difference."""
  lines = ['| dataset | column | command | paper top-1 |', '|---|---|---|---|']
  for dataset in DATASETS:
    for column, pe in COLUMNS.items():
      cmd = (f'python train.py --config configs/{dataset}.py:pe={pe} '
             f'--workdir runs/{dataset}_{pe}')
      lines.append(f'| {dataset} | {column} | `{cmd}` | {PAPER_TABLE1[dataset][column]} |')
  lines += ['', '| datasets | setting | ours | official code | why | flag |',
            '|---|---|---|---|---|---|']
  for d in DIFFERENCES:
    flag = '-' if d.flag == '-' else f'`{d.flag}`'
    lines.append(f"| {', '.join(d.datasets)} | {d.what} | {d.ours} | {d.official} | {d.why} | "
                 f'{flag} |')
  return '\n'.join(lines) + '\n'


if __name__ == '__main__':
  sys.stdout.write(table())
