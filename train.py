"""`python train.py ...` = `python -m liere_jax.train ...` (liere_jax/train.py)."""
import liere_jax.train

if __name__ == '__main__':
  liere_jax.train.run()
