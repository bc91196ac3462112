"""Data: Grain pipelines over TFDS (CIFAR-100, ImageNet-1k, UCF101) and the arrows task."""
from liere_jax.data.arrows import ArrowsSource, make_example, make_layout, majority_floor
from liere_jax.data.pipeline import dataset_info, eval_batches, to_iterator, train_dataset
