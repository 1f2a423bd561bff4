"""PolyKV: per-layer, per-phase KV-cache eviction plans for Hugging Face causal LMs."""

__version__ = "0.1.0"
