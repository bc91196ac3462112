"""`python eval.py ...` = `python -m liere_jax.eval ...` (liere_jax/eval.py)."""
from liere_jax.cli import evaluate

if __name__ == '__main__':
  evaluate.run()
