"""`python train.py ...` = `python -m liere_jax.train ...` (liere_jax/train.py)."""
from liere_jax.cli import train

if __name__ == '__main__':
  train.run()
