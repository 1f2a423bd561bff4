"""Executes a plan on a Hugging Face causal LM: the routed cache and PolyKV's attention function."""

from polykv.runtime.attention import ATTN_IMPLEMENTATION
from polykv.runtime.cache import RoutedCache, RoutedCacheError, RoutedLayer
from polykv.runtime.routed import RoutedSession, routed

__all__ = [
    "ATTN_IMPLEMENTATION",
    "RoutedCache",
    "RoutedCacheError",
    "RoutedLayer",
    "RoutedSession",
    "routed",
]
