"""The data section's fields (`config.data`): each declared once, with its default and doc;
liere_jax.data.spec checks them and resolves the section into a DataSpec. O = the official
code, github.com/StanfordMIMI/LieRE; S = the training size (image_size, or the native one)."""
import ml_collections

from liere_jax.config.fields import REQUIRED, Field, Section

_RRC = "'rrc'"
DATA = Section('data', [
    Field('name', REQUIRED, "'cifar100', 'imagenet2012', 'ucf101' or 'arrows' (see "
          "liere_jax/data/spec.py), or a TFDS name with a config or version "
          "('ucf101/ucf101_1', 'cifar100:3.0.2')."),
    Field('data_dir', None, 'TFDS data directory; None: the TFDS default ($TFDS_DATA_DIR or '
          '~/tensorflow_datasets), and arrows rendered on the fly.', kind=str),
    Field('train_split', 'train', "Training split (TFDS slicing like 'train[:90%]' works for "
          'cifar100 and imagenet2012).'),
    Field('eval_split', 'test', 'Evaluation split.'),
    Field('fraction', 1.0, 'Train on the first fraction of the training split, in (0, 1] '
          '(paper Fig. 4).'),
    Field('augment', 'none', "What a training example goes through: 'none'; 'light' (crop, "
          "flip); 'randaug' (crop, flip, our RandAugment(2, 14)); 'official_randaug' (O's "
          "RandAugment(2, 14), then crop, flip); 'videomae' (timm RandAugment(randaug_policy), "
          "then crop, flip, VideoMAE's clip sampling). Arrows needs 'none'."),
    Field('crop', 'pad', "The crop of augment != 'none': 'pad' (decode to S, zero-pad S/8, "
          f"random S x S crop) or {_RRC} (RandomResizedCrop of the native image, area "
          '0.08-1, ratio 3/4-4/3).', added='pad'),
    Field('randaug_policy', 'rand-m7-n4-mstd0.5-inc1', "augment='videomae': the timm policy "
          "(O's default).", added='rand-m7-n4-mstd0.5-inc1'),
    Field('random_erasing', 0.0, 'Probability of one random N(0, 1) box per training example, '
          "after normalisation (O's UCF101: 0.25); 0 = off.", added=0.0),
    Field('eval_crop', 'resize_center', "'resize_center' (shorter side to S, centre crop) or "
          "'center' (the native image's centre S x S, zero-padded: O's ImageNet).",
          added='resize_center'),
    Field('eval_views', (1, 1), 'ucf101: (temporal, spatial) views of every video; (5, 3) is '
          "O's protocol (accuracy per view and per video).", added=(1, 1)),
    Field('mixup', 0.0, 'Beta(alpha, alpha) mixup of each batch with its reverse: alpha; '
          '0 = off.'),
    Field('image_size', 0, 'S: imagenet2012 and ucf101 are resized to it (required there); '
          'cifar100 and arrows: 0 (native 32 / 12 grid).'),
    Field('num_frames', 8, 'ucf101: frames per clip.'),
    Field('frame_stride', 4, 'ucf101: frames t0, t0 + stride, ... (t0 random in training, '
          'centred in eval).'),
    Field('grid', 9, 'arrows: cells per side (12 px cells).'),
    Field('num_eval', 2000, 'arrows: held-out examples.'),
    Field('num_train', 0, 'arrows: training-set size; 0 = unlimited (rendered on the fly).'),
    Field('seed', 0, 'arrows on the fly: the example streams (the order and augmentation come '
          'from the run seed).'),
    Field('workers', 0, 'The train iterator: Grain worker processes; 0 = none.', added=0),
    Field('threads', 2, 'The train iterator: threads in each process.', added=2),
    Field('prefetch', 2, 'The train iterator: batches computed ahead by each process.',
          added=2),
    Field('normalise', 'host', "'host' (float32 train batches) or 'device' (uint8 pixels, "
          'normalised by the trainer: 4x less to copy; not with mixup or random erasing).',
          added='host'),
])


def data_config(*, name: str, **values) -> ml_collections.ConfigDict:
  """The data section: DATA's defaults, `values` over them."""
  return DATA.build(name=name, **values)
