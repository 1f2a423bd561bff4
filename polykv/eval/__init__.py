"""Evaluation of KV-cache plans: runs, their per-task scores, and statistics to compare them."""
