"""Learned queue and backfill policies: observations, NumPy inference, environments, training.

Running a trained policy needs NumPy only (`features`, `network`, `models`); the
environments need Gymnasium and training needs the `train` extra (torch, sb3-contrib).
"""

REWARDS = {"rlbf": ("paper", "trace"), "dbf": ("paper", "bsld"), "osdec": ("paper",)}
"""What each environment may reward (`envs`). RLBackfilling: the paper's bsld improvement over
EASY relative to the window's own EASY bsld, or relative to the trace's mean one. DBF: the
paper's mix of idle cores, queue length and wait, or the bounded slowdown queued jobs accrue.
OSDEC: its eq. 6 over the deferrable jobs started (`envs.DeferrableEnv`)."""
