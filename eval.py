"""`python eval.py ...` = `python -m liere_jax.eval ...` (liere_jax/eval.py)."""
import liere_jax.eval

if __name__ == '__main__':
  liere_jax.eval.run()
