"""Workloads: a workload's sources and its calibration split (`workload`), the competence checks and sample sizes
(`competence`)."""
