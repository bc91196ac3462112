"""`python eval.py ...` = `python -m liere_jax.eval ...` (liere_jax/eval.py)."""
from liere_jax import eval as eval_lib

if __name__ == '__main__':
  eval_lib.run()
