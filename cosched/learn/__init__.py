"""Learned queue and backfill policies: observations, NumPy inference, environments, training.

Running a trained policy needs NumPy only (`features`, `network`, `models`); the
environments need Gymnasium and training needs the `train` extra (torch, sb3-contrib).
"""
