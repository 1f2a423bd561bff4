"""Methods that merge what they evict into what they keep: CaM, D2O."""
