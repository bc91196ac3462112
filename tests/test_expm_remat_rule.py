"""fast_select's memory rule (expm.select_remat) weighs its residuals in bytes: n matrices of
b x b count as 4n of (b/2) x (b/2), whatever the threshold (a mutation survivor:
docs/mutation.md)."""
from liere_jax import expm


def test_the_remat_rule_counts_matrix_entries_so_halving_the_block_is_four_times_the_stack(
    monkeypatch):
  monkeypatch.setattr(expm, 'REMAT_ABOVE_BYTES', 4 * 64 * 100 * 40)  # A flip inside n < 400.
  big = [expm.select_remat(expm.TAYLOR12, n, 8) for n in range(1, 400)]
  small = [expm.select_remat(expm.TAYLOR12, 4 * n, 4) for n in range(1, 400)]
  assert not big[0] and big[-1], 'the threshold must fall inside the range'
  assert big == small
