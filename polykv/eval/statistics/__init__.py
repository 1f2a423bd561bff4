"""Statistics: over tasks (`tasks`: paired bootstrap, Wilcoxon, Holm) and over samples (`samples`: the
sign-flip test and the minimal detectable difference)."""
