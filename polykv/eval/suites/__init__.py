"""Evaluation suites: samples, how each is scored, and the per-task metrics."""
