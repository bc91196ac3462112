"""The exponential's polynomials, and its adjoint, written once over an `Algebra` (the matrix
operations they run in): XLA's batched products at a precision, float32 multiply-adds for small
blocks, or a Pallas kernel's entries layout (liere_jax.expm, liere_jax.kernels.expm). Each
polynomial is exp's Taylor sum to 2e-16 relative (tests/test_expm.py).

The adjoint (`skew_cotangent`, `adjoint_base`, `adjoint_level`, `adjoint_end`; the math and the
figures: docs/decisions/027-expm-adjoint.md). For a skew-symmetric a and R = exp(a) orthogonal,
the VJP of R (after the Newton-Schulz step, which removes the symmetric part of a tangent R K)
for a cotangent G is
  abar = J(a)(W),  W = skew(R^T G),  J(a)(W) = int_0^1 e^{ta} W e^{-ta} dt = L(a, W) R^{-1},
L(a, W) the Frechet derivative of exp at a in direction W. It is computed forward, with the
exponential's own scaling and squaring: L(x, W) at x = a 2^-s as the polynomial's derivative (a
skew x and W make each even power's tangent one product and its transpose), then a level at a
time L(2x, W) = (E L(x, W) + L(x, W) E) / 2 beside E = exp(x) -> E^2, 2 products a level
beside the squaring, and at the end abar = skew(L(a, W) R0^{-1}) with R0 the squarings' result
and R0^{-1} = (2R - R0)^T to second order in R0's loss of orthogonality (R = NS(R0)). The
doubling in J itself, J(2x) = (J + E J E^T) / 2, costs as much but takes E^T for E^{-1}: each
level's E, not quite orthogonal after its squarings, then adds its error (2x the gradient's at
a spectral radius of 600); L's doubling is the derivative of the squarings as computed.
"""
import math
from typing import Callable, Dict, NamedTuple

import jax
import jax.numpy as jnp


class Algebra(NamedTuple):
  """The operations on a stack of matrices that a polynomial needs, in one layout."""
  matmul: Callable[[jax.Array, jax.Array], jax.Array]
  transpose: Callable[[jax.Array], jax.Array]
  plus_identity: Callable[[jax.Array], jax.Array]


def stacked(matmul: Callable) -> Algebra:
  """Matrices [..., b, b] with these products."""
  return Algebra(matmul, lambda x: jnp.swapaxes(x, -1, -2),
                 lambda x: jnp.eye(x.shape[-1], dtype=x.dtype) + x)


class Taylor(NamedTuple):
  """A polynomial for scaling and squaring.

  powers: (alg, a [c, b, b]) -> {k: a^k}, k = 1 included; the highest power bounds the spectral
    radius (rho(a) <= ||a^k||_1^(1/k)).
  polynomial: (alg, the scaled powers {k: x^k}) -> the Taylor polynomial of exp at x.
  theta: the largest scaled spectral radius the polynomial is used at.
  products: matrix products per matrix in powers and polynomial together.
  """
  powers: Callable[[Algebra, jax.Array], Dict[int, jax.Array]]
  polynomial: Callable[[Algebra, Dict[int, jax.Array]], jax.Array]
  theta: float
  products: int


def newton_schulz(alg: Algebra, r):
  """One Newton-Schulz step to the nearest orthogonal matrix: squaring doubles the rounding
  error each time; this removes the part of it that breaks orthogonality."""
  return 1.5 * r - 0.5 * alg.matmul(r, alg.matmul(alg.transpose(r), r))


def squarings(powers, theta, cap=None):
  """Squarings per matrix [c], from the highest power a^k of the unscaled matrices: the scaled
  spectral radius ends at most theta (up to 2**cap; no cap: as far as float32 goes). A matrix
  with a non-finite entry gets none (its result is NaN either way: no endless loop)."""
  # A skew-symmetric matrix is normal: the Taylor remainder at x is bounded through rho(x) in
  # the 2-norm, and rho(a) <= ||a^k||_1^(1/k) <= ||a||_1 (tighter than the 1-norm, and free:
  # the powers are needed anyway). ||a||_1 where a^k overflows.
  k = max(powers)
  norm = lambda p: jnp.max(jnp.sum(jnp.abs(p), axis=-2), axis=-1)
  bound = norm(powers[k]) ** (1 / k)
  bound = jax.lax.stop_gradient(jnp.where(jnp.isfinite(bound), bound, norm(powers[1])))
  s = jnp.ceil(jnp.log2(jnp.maximum(bound / theta, 1e-30)))
  return jnp.where(jnp.isfinite(s), jnp.clip(s, 0, cap), 0).astype(jnp.int32)


def scaled_polynomial(alg: Algebra, taylor: Taylor, powers, s):
  """The Taylor polynomial at a * 2^-s (s per matrix [c] or one scalar)."""
  scale = jnp.exp2(-s.astype(jnp.float32)).reshape(s.shape + (1, 1))
  return taylor.polynomial(alg, {k: p * scale**k for k, p in powers.items()})


def skew_cotangent(alg: Algebra, r, g):
  """W = skew(R^T G) = (R^T G - G^T R) / 2: the cotangent that reaches a through R = exp(a)
  orthogonal (the Newton-Schulz step's adjoint at R keeps R skew(R^T G); exp's adjoint is
  R^T-equivariant). One product."""
  w = g - alg.matmul(alg.transpose(alg.plus_identity(-r)), g)  # G + (R - I)^T G: as below
  return 0.5 * (w - alg.transpose(w))


def _times_near_identity(alg, m, c):
  """m c^T for c near I as m + m (c - I)^T: the product's sums then run over small terms (a
  float32 sum rounds at its running total's size: m c^T itself costs sqrt(b) ulps of m where c
  is near I, at small generators)."""
  return m - alg.matmul(m, alg.transpose(alg.plus_identity(-c)))


def skew_tangents(alg: Algebra, powers, w):
  """The tangents {k: d(x^k)} of the powers {k: x^k} of a skew-symmetric x in a skew-symmetric
  direction w (keys 1 and up, each even k's half or each odd k's predecessor among them).
  d(x^j)^T = (-1)^j d(x^j) and (x^j)^T = (-1)^j x^j, so (x^j d(x^j))^T = d(x^j) x^j: an even
  power's tangent is u + u^T with u = x^j d(x^j), one product (jax.jvp: two); an odd one
  d(x^(k-1)) x + x^(k-1) w, two."""
  out = {1: w}
  for k in sorted(powers)[1:]:
    if k % 2 == 0 and k // 2 in out:
      u = alg.matmul(powers[k // 2], out[k // 2])
      out[k] = u + alg.transpose(u)
    else:
      out[k] = alg.matmul(out[k - 1], powers[1]) + alg.matmul(powers[k - 1], w)
  return out


def adjoint_base(alg: Algebra, taylor: 'Taylor', powers, scale, w):
  """(p(x), L_p(x, w)) at x = a * scale: the polynomial at the scaled powers of a ({k: a^k}) and
  its derivative in the skew-symmetric direction w (`skew_tangents`, then jax.jvp through the
  polynomial: a tangent product two products). scale: 2^-s, shaped to multiply a's powers."""
  x = {k: p * scale**k for k, p in powers.items()}
  return jax.jvp(lambda y: taylor.polynomial(alg, y), (x,), (skew_tangents(alg, x, w),))


def adjoint_level(alg: Algebra, e, m):
  """One level up: (exp(2x), L(2x, w)) = (E^2, (E M + M E) / 2) from (E, M) = (exp(x), L(x, w)).
  Three products (two given E^2 from the forward)."""
  return alg.matmul(e, e), 0.5 * (alg.matmul(e, m) + alg.matmul(m, e))


def adjoint_end(alg: Algebra, m, r, r0, squared):
  """abar = skew(L(a, w) R0^{-1}) from M = L(a, w) as the squarings left it, R0 their result and
  R = NS(R0): R0^{-1} = (2R - R0)^T to second order in R0^T R0 - I. Where no squaring ran
  (`squared` false: a bool that broadcasts against the matrices) R0 is orthogonal to its
  rounding, and R^T alone leaves out the Newton-Schulz step's rounding that 2R - R0 doubles.
  One product; the skew part is what a skew-symmetric parametrisation of a sees, and all the
  exact adjoint has."""
  y = _times_near_identity(alg, m, jnp.where(squared, 2 * r - r0, r))
  return 0.5 * (y - alg.transpose(y))


def _powers4(alg, a):
  a2 = alg.matmul(a, a)
  return {1: a, 2: a2, 4: alg.matmul(a2, a2)}


def _combine(c, x):
  """c[0] x + c[1] x^2 + c[2] x^3 from the powers x (no identity term)."""
  return sum(ci * x[k] for ci, k in zip(c[1:], (2, 3))) + c[0] * x[1]


def _taylor12_ps(alg, x):
  """Degree 12 by Paterson-Stockmeyer from x, x^2, x^4 (one more product: x^3)."""
  x1, x2, x4 = x[1], x[2], x[4]
  x = {1: x1, 2: x2, 3: alg.matmul(x2, x1)}
  eye = jnp.eye(x1.shape[-1], dtype=x1.dtype)  # Stacked layouts only ('cond', 'select').
  c = [1.0 / math.factorial(k) for k in range(13)]
  block = lambda j: c[j] * eye + _combine(c[j + 1:j + 4], x)
  r = block(8) + c[12] * x4
  r = block(4) + alg.matmul(x4, r)
  return block(0) + alg.matmul(x4, r)


def _powers3(alg, a):
  a2 = alg.matmul(a, a)
  return {1: a, 2: a2, 3: alg.matmul(a2, a)}


# Bader, Blanes and Casas (2019), "Computing the matrix exponential with an optimized Taylor
# polynomial approximation": Taylor's degree 12 in 4 products (x^2, x^3 and 2), coefficients as
# published there (rows: B_i's of I, x, x^2, x^3). theta: the float32 threshold the paper gives
# for unit roundoff 2^-24 (also torch.linalg.matrix_exp's), here on the spectral-radius bound.
_B12 = ((9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740),
        (5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031,
         0.01108844528519167989),
        (0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968,
         0.00610700528898058230),
        (-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079,
         -0.00675951846863086359))


def _taylor12(alg, x):
  """T = B1 + (B2 + X6) X6 with X6 = B3 + B4^2. Apart from I: X6 = a I + x6, B2 + X6 = c I + y,
  T = (b1_0 + c a) I + B1' + c x6 + a y + y x6 with b1_0 + c a = 1 (b1_0 and b4_0, below 1e-12,
  left out). Formed as published, the I of T came out of the product c a in float32, an error
  of ~4e-7 that the squarings amplify (gradient 1.2e-5 off, against 2e-6): here I enters once,
  exactly, and every other term is O(x)."""
  b1, b2, b3, b4 = (_combine(c[1:], x) for c in _B12)
  a = _B12[2][0]
  c = _B12[1][0] + a
  x6 = b3 + alg.matmul(b4, b4)
  y = b2 + x6
  return alg.plus_identity(b1) + c * x6 + a * y + alg.matmul(y, x6)


# Degree 12 up to a scaled spectral radius of 1 (remainder < 1/13! ~ 2e-10) in 5 products: a^2,
# a^4, x^3 and 2 in the polynomial ('cond' and 'select').
TAYLOR12_PS = Taylor(powers=_powers4, polynomial=_taylor12_ps, theta=1.0, products=5)
# Bader-Blanes-Casas ('loop' and the Pallas kernel).
TAYLOR12 = Taylor(powers=_powers3, polynomial=_taylor12, theta=1.461661507209034, products=4)
TAYLORS = {'loop': TAYLOR12, 'cond': TAYLOR12_PS, 'select': TAYLOR12_PS}  # By form.
