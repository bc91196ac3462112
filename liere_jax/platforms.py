"""What runs where: every choice the library makes by platform, in one table.

A program takes the row of the platform it is lowered for: the exponential through
`jax.lax.platform_dependent` (liere_jax.expm.per_platform, so a program lowered here for 'cuda'
or 'tpu' takes that row), attention and rotations likewise (liere_jax.model), except cuDNN's
attention, chosen by the backend it is traced on. 'cuda' stands for every GPU. Why each,
measured where (docs/benchmarks.md):

  platform  exponential  pieces     products ('auto')       attention       rotations      measured on
  cpu       fast_cond    64 KiB     float32                 XLA             swap (matmul)  this CPU
  tpu       Pallas       the stack  HIGHEST (6 bf16);       Pallas kernel;  b<=8 in the    TPU compiler
            (b>=16);                b <= 8 multiply-adds    rotations in    kernel; 16-128:
            fast_loop                                       it              rotation kernel
  cuda      fast_select  16 MiB     bf16 x6 (preset X6)     cuDNN (bf16)    blocks         H100, H200

  exponential  model.pe.expm='fast' in this form (liere_jax.expm: fast_loop is one scale for the
               stack and its squarings a loop on the device; on the H200 its LieRE64 step was 1.03x
               fast_select's, so a GPU keeps fast_select). On a TPU, blocks of 16 to 256 take the
               Pallas kernel (`expm_kernel`; liere_jax.expm_kernel: each matrix read once, its
               squarings its own): the 2-layer v5e-8 ImageNet LieRE64 proxy moved 23.02 GB a step
               instead of 25.32 (docs/benchmarks.md). Where it runs, every token's exponential
               replaces the lattice table of powers (liere_jax.rotations.liere_rotations; proxy
               18.82 -> 17.91 GB); LieRE8 keeps the table (its v5e-8 cell moved 78.8 GB without,
               78.1 with, though its 2-layer proxy moved 14.24 without and 15.48 with), its
               points' exponentials the kernel in its entries layout (cell 72.52 -> 71.97 GB).
  pieces       fast_cond's chunks of one scale each and remat's chunks (fast_select,
               scipy_remat), in bytes of matrices; fast_loop chunks only on CPU.
  products     the exponential's and the lattice table's products at expm_precision='auto'
               (liere_jax.dots; on CPU LIERE_EXPM_EMULATE=cuda|tpu emulates the others'); on a
               TPU those of blocks up to 8 are float32 multiply-adds on the vector units
               (`elementwise_blocks`): a 2-layer ViT-B/16 LieRE8 step on one v5e chip moves
               35.9 GB instead of 55.4 (abs 20.1). This CPU lost with them (1.16x the LieRE8
               step); a GPU keeps dots until timed (gpu_figures.sh ab_blocks).
  attention    a TPU's is one Pallas kernel a pass (liere_jax.attention_kernel; switch
               `attention`): the logits never leave the chip, q, k and v are read in place from
               the qkv product, and rotations of blocks up to 8 (every RoPE, LieRE8) are applied
               inside it, to q and k as they are read; blocks of 16 to 128 dividing 128 (LieRE64)
               by the rotation kernel before it (liere_jax.rotation_kernel: the batch as M; it
               reads q and k in place too; it gathers each layer's rotations, which every
               device computes for its tokens, in bf16, two heads' blocks side by side on 128
               lanes). With both and the Pallas exponential the v5e-8 cell's LieRE64 moved
               80.8 GB (154.4 before), 1.18x abs; LieRE8 72.5, 1.06x (docs/benchmarks.md, third
               to fifth rounds). ImageNet ViT-B/16 on v5e-8 at 128 a chip, GB a step, XLA's
               attention -> the kernel: abs 113.1 -> 68.6, rope_mixed 146.8 -> 69.1, LieRE8
               155.3 -> 82.6 (docs/benchmarks.md). An encoding with a logit bias (ALiBi) keeps
               XLA's.
  pairs        how blocks of 2 (every RoPE) rotate outside that kernel
               (liere_jax.rotations.rotate): 'swap' on x's own layout, x' = c0 x + c1 swap(x),
               the pair swap a product with the permutation (matmul) or two lane shifts and a
               select (roll); 'blocks', x as [..., k, 2] pairs times [2, 2] blocks. On the H200
               blocks made the rope_mixed step 1.11x faster than swap (matmul), and roll lost to
               matmul (1.09x); on the TPU compiler roll won (docs/benchmarks.md).
  split_qkv    where the einsum rotates q and k before XLA's attention (blocks above 8 past the
               kernels: LieRE64 on UCF101's 785 tokens) a TPU takes them from three products,
               not one (liere_jax.model's qkv): the v5e-8 cell moved 204.7 GB instead of 222.9.
               Before the rotation kernel one product, then split, moves less (2-layer v5e-8
               proxy: 20.57 GB against 21.45).
The same on every platform (their A/B forms are switches, liere_jax.switches): rotations apply
blocks above 8 (outside a TPU's kernels, above 2) by one einsum (liere_jax.rotations). The Pallas
exponential is opt-in elsewhere (model.pe.expm=pallas): on the H200 its LieRE64 step was 1.05x
fast_select's (its forward alone 2.4x faster, forward + backward 1.24x; one matrix a program).
"""
from typing import Dict, NamedTuple

import jax

from liere_jax import dots


class Platform(NamedTuple):
  expm_form: str  # liere_jax.expm.FORMS
  chunk_bytes: int
  products: dots.Dots
  attention: str  # 'kernel' (liere_jax.attention_kernel), 'cudnn' (where it takes the shapes,
  # else XLA's) or 'xla'
  pairs: str  # 'swap' (on x's layout) or 'blocks'
  pair_swap: str  # pairs='swap': 'matmul' or 'roll'
  elementwise_blocks: int = 0  # products of blocks up to this size as multiply-adds, not dots
  split_qkv: bool = False  # q, k (and v) from three products, not one, where q, k rotate first
  expm_kernel: bool = False  # model.pe.expm='fast' is the Pallas kernel where it takes the blocks


PLATFORMS: Dict[str, Platform] = {
    'cpu': Platform(expm_form='cond', chunk_bytes=2**16, products=dots.CPU, attention='xla',
                    pairs='swap', pair_swap='matmul'),
    'tpu': Platform(expm_form='loop', chunk_bytes=16 * 2**20, products=dots.TPU,
                    attention='kernel', pairs='swap', pair_swap='roll', elementwise_blocks=8,
                    split_qkv=True, expm_kernel=True),
    'cuda': Platform(expm_form='select', chunk_bytes=16 * 2**20, products=dots.GPU,
                     attention='cudnn', pairs='blocks', pair_swap='matmul'),
}


def current() -> str:
  """The row of the backend this process traces on ('cuda' for any GPU)."""
  backend = jax.default_backend()
  return 'cuda' if backend == 'gpu' else backend
