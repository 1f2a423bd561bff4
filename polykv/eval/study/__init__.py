"""The study of one model: its settings, result and entry point (`run`), its steps (`steps`), its report
(`report`, `sections`, `figures`) and the paper's quoted numbers (`paper`)."""
