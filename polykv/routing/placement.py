"""Random placements: the "same methods, random layers" control for a routing result.

`sample_placements` draws distinct orderings of a route's methods over its layers (exactly the route's
method counts); `placement_count` says how many there are besides the route itself.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterator, Sequence

_ENUMERATE_LIMIT = 10_000  # placement spaces up to this size are enumerated rather than sampled


def _placements(counts: Counter[str]) -> int:
    """The multinomial coefficient: how many distinct orderings the method counts allow."""
    out = math.factorial(sum(counts.values()))
    for n in counts.values():
        out //= math.factorial(n)
    return out


def _all_placements(route: Sequence[str]) -> Iterator[tuple[str, ...]]:
    """Every distinct ordering of the route's methods, in lexicographic order."""
    counts = Counter(route)
    methods = sorted(counts)
    prefix: list[str] = []

    def extend() -> Iterator[tuple[str, ...]]:
        if len(prefix) == len(route):
            yield tuple(prefix)
            return
        for method in methods:
            if counts[method]:
                counts[method] -= 1
                prefix.append(method)
                yield from extend()
                prefix.pop()
                counts[method] += 1

    return extend()


def placement_count(route: Sequence[str]) -> int:
    """How many distinct placements with the route's method counts differ from the route itself."""
    return _placements(Counter(route)) - 1


def sample_placements(
    route: Sequence[str], k: int, seed: int = 0, exclude: Sequence[str] | None = None
) -> list[list[str]]:
    """k distinct random placements with exactly the route's method counts, none equal to `exclude`
    (default: the route itself). Deterministic for a seed."""
    if k < 0:
        raise ValueError(f"k must be non-negative, got {k}")
    route = list(route)
    counts = Counter(route)
    excluded = tuple(route if exclude is None else exclude)
    space = _placements(counts)
    available = space - (Counter(excluded) == counts)
    if k > available:
        mix = " + ".join(f"{n} {m}" for m, n in sorted(counts.items()))
        raise ValueError(
            f"asked for {k} placements but only {available} distinct placements of {mix} over {len(route)} layers "
            f"differ from the excluded one"
        )
    rng = random.Random(seed)
    if space <= max(_ENUMERATE_LIMIT, 2 * k):
        pool = [p for p in _all_placements(route) if p != excluded]
        return [list(p) for p in rng.sample(pool, k)]
    seen: set[tuple[str, ...]] = {excluded}
    out: list[list[str]] = []
    while len(out) < k:
        draw = route[:]
        rng.shuffle(draw)
        if tuple(draw) not in seen:
            seen.add(tuple(draw))
            out.append(draw)
    return out


__all__ = ["placement_count", "sample_placements"]
