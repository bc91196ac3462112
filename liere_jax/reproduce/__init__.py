r"""The paper's synthetic-task experiments (Sec. 5.2) as suites: train + eval runs, then a report.

  python -m liere_jax.reproduce --list
  python -m liere_jax.reproduce --suite table3 [--dry_run] [--runs runs/reproduce]
  python -m liere_jax.reproduce --suite table3 --report     # rebuild the report, no training
  python -m liere_jax.reproduce --index                     # the results index, no training

Every run is an ordinary workdir of `python -m liere_jax.train` / `liere_jax.eval` under --runs
(resumable: running the suite again resumes a run from its checkpoint and skips finished ones;
a run's name is its encoding, size, seed and overrides, so suites share runs). The report goes
to --out/<suite>.md, <suite>.json (one row per run: pe, px, seed, top1, top1_ci95,
shuffled_top1, plateau_exit, steps, wall_s, commit, command, ...) and <suite>*.png. Every run
uses the library's configs/arrows.py (the main job's model and budget) plus the suite's
overrides, including the budget of the larger grids (BUDGET); `--set total_steps=2000`
(repeatable) changes all runs of a larger-scale reproduction (their workdir names end in a hash
of the --set values, so they never reuse the runs made without them).

The paper's baseline columns ran the official LieRE code's definitions: its "RoPE-Mixed" is
LieRE with 2x2 blocks (pe=paper_rope_mixed) and its "VisionLlama" the fixed-frequency "tiled"
encoding on [0, 1] positions (pe=paper_visionllama). The suites run those in the paper's rows
and naver-ai's RoPE-Mixed (rope_mixed) and rope-vit's axial RoPE (rope_axial) as extra rows.
"""
from liere_jax.reproduce.paper import (CELL, FIG7_EXAMPLES, FIG7_GRIDS, HEAD_DIM,
                                       LIBRARY_BASELINES, PAPER_ENCODINGS, PAPER_TABLE3,
                                       PLATEAU_EXIT, SUCCESSORS, TRAIN_GRID, label, paper_key)
from liere_jax.reproduce.reports import write_index, write_report
from liere_jax.reproduce.runner import (command, commit, config_file, machine, merge_rows,
                                        plateau_exit, row, rows, run_suite)
from liere_jax.reproduce.suites import (BUDGET, LARGE_GRID_ENCODINGS, SUITES, THIRD_SEED, Eval,
                                        Run, Suite)
