r"""Benchmarks: the matrix exponential on realistic LieRE cases, whole train/eval steps, input.

  python -m liere_jax.bench expm [--case NAME ...] [--impl NAME ...] [--repeats N] [--json]
  python -m liere_jax.bench rotations [--case NAME ...] [--repeats N] [--json]
  python -m liere_jax.bench step --config configs/cifar100.py:variant=Ti,pe=liere64 --vs pe=abs \
      --config.batch_size=128 [--steps N] [--breakdown] [--json]
      [--official DIR [--official_python PY] [--official_threads N]]
  python -m liere_jax.bench data --config configs/imagenet.py --config.batch_size=32 \
      [--workers 0,1,2] [--batches N] [--repeats N] [--json]
  python -m liere_jax.bench lower --config configs/imagenet.py:pe=liere64 --platform cuda [--json]
  python -m liere_jax.bench compile --config configs/imagenet.py:pe=liere64 --topology v5litepod-256 \
      [--vs pe=abs] [--train_only] [--json]
  python -m liere_jax.bench profile --config configs/imagenet.py:pe=liere64 [--steps N] [--json]
  python -m liere_jax.bench presets [--case NAME] [--json]

expm: for each case (a stack of skew-symmetric generator combinations as LieRE builds them:
U[0, 2 pi) strict upper triangles, 2D, times normalized grid positions in [0, 1]) and each
implementation (liere_jax.expm methods fast / scipy / scipy_remat, and torch.matrix_exp when
torch imports): compile time (lower + compile of forward+backward), forward and
forward+backward time (the gradient of sum(R * G) in A, G a fixed random cotangent), XLA temp
memory of the compiled forward+backward, and errors against float64 SciPy on a subsample (max
|R - R64|, max |R^T R - I|, gradient relative error against scipy.linalg.expm_frechet). A
function whose temp memory would not fit is not run: its row says status 'oom'.

rotations: a whole model's LieRE rotations (rotations.liere_rotations, every layer and head,
2D normalized grid with a CLS token): one exponential per token (general) against the lattice
path (exponentials at the primitive grid points, products for the rest), each with the degree-12
Taylor polynomial of `fast` and a degree-18 one (rotations.py: TAYLOR18, through
expm.fast_expm); forward and forward+backward seconds (variants interleaved, medians), counted
forward GFLOP, and max |R - R(general, 12)|.

step: the config (A) and the same config with --vs applied to its argument string (B);
overrides --config.key=value apply to both, --vs items config.key=value to B only (e.g.
`--config.model.scan_layers=True --vs config.model.scan_layers=False`: scan against loop).
Train steps, then eval steps (rotations cached: computed once outside the timed loop) of the
two alternate in one process (A B, B A, A B, ...);
medians after warm-up, ratios A / B, random inputs of the config's shape. --breakdown adds the
train step with the rotations fed in (their gradient dropped), the encoding's own
forward+backward, and XLA FLOP counts (XLA counts a while loop's body once: the chunked
exponential is undercounted; the steps without it are counted exactly). --official times the
official PyTorch LieRE train step of A's shape in a subprocess (its interpreter needs torch,
einops and the official code's imports), one of its steps after each pair of ours.

data: the config's real train batches (train_dataset: its decode, augmentation, normalisation,
mixup) through to_iterator with each --workers count of Grain worker processes (data.threads
threads and data.prefetch batches ahead in each process, as train.py runs it), on stand-in data
of the real size written to a temporary directory (liere_jax/data/standin.py: ~100 kB JPEGs of
500 x 375 for ImageNet, 32 px PNGs for CIFAR-100, ~150-frame JPEG videos for UCF101) unless
--config.data.data_dir names prepared data. Images/s (video: clips/s and frames/s) after
warm-up, medians over --repeats rounds that visit the counts in turn, and CPU ms per image of
the main process and its workers (read from /proc: the per-core cost, whatever else loads the
machine).

lower: the train step lowered for --platform (cuda, tpu, cpu) on this machine, as that
platform runs it (lower.py): data-dependent conditionals, while loops, and the precisions of
LieRE's products. compile: the train and eval steps compiled for a Cloud TPU slice by the TPU
compiler on this machine (compile.py; needs requirements-tpu.txt): per chip memory against the
chip's HBM, the compiler's FLOPs and bytes, a roofline step estimate, the rotary encodings'
share of the traffic; a run that does not fit is refused in one line (exit 2). profile: a jax.profiler trace of the train step summarized (profile.py):
device-busy fraction, kernels and device-to-host copies per step, top kernels. presets: the
exponential's error with its products at each dot-algorithm preset, emulated on CPU
(presets.py; the CPU computes the BF16 presets in float32 and refuses the TF32 ones).

Timings use block_until_ready and nothing device-specific: the same command runs on CPU, GPU
and TPU. The last line of --json output is the machine-readable result.

Modules: expm.py (bench expm), rotations.py (bench rotations and the degree-18 scheme),
flops.py (counted FLOPs of the exponentials, the model's from its shapes), step.py (bench step), peer.py (the official
code's step), data.py (bench data), lower.py (bench lower), compile.py (bench compile), profile.py (bench profile),
presets.py (bench presets),
__main__.py (the command line).
"""
from liere_jax.bench.expm import (ALL_IMPLS, CASES, DEFAULT_CASES, IMPLS, ROW_KEYS, Case,
                                  available_bytes, bench_expm, case_inputs, expm_table, is_oom,
                                  parse_case)
from liere_jax.bench.data import bench_data, data_table
from liere_jax.bench.flops import fast_flops, liere_flops
from liere_jax.bench.peer import Official, OfficialError, official_kwargs, time_official
from liere_jax.bench.rotations import (ROTATION_CASES, ROTATION_VARIANTS, TAYLOR18, TAYLORS,
                                       bench_rotations, rotations_table)
from liere_jax.bench.step import (bench_step, load_config, random_batches, step_table, vs_overrides,
                                  with_args)

__all__ = ['ALL_IMPLS', 'CASES', 'DEFAULT_CASES', 'IMPLS', 'ROW_KEYS', 'Case', 'available_bytes',
           'bench_expm', 'case_inputs', 'expm_table', 'is_oom', 'parse_case', 'fast_flops',
           'liere_flops',
           'ROTATION_CASES', 'ROTATION_VARIANTS', 'TAYLOR18', 'TAYLORS', 'bench_rotations',
           'rotations_table', 'Official', 'OfficialError', 'official_kwargs', 'time_official',
           'bench_step', 'load_config', 'random_batches', 'step_table', 'vs_overrides', 'with_args',
           'bench_data', 'data_table']
