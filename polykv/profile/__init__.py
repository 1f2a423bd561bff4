"""Offline profiling: calibration corpus, attention heterogeneity, per-layer method profiles, storage."""
