"""The Pallas kernels: attention with rotations inside (`attention`), large rotation blocks
before it (`rotation`), the exponential (`expm`), and what they share (`common`). TPU kernels
(the exponential also Triton on a GPU); on CPU they run in interpret mode (tests).
liere_jax.attention and liere_jax.expm decide where they run."""
