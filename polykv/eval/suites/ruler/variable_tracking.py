"""RULER's variable tracking task (vt): chains of variable assignments hidden among noise lines, placed
as RULER places them, with one worked example in front.

Follows NVIDIA/RULER @ c3f5e3b4, ``scripts/data/synthetic/constants.py`` and
``scripts/data/synthetic/variable_tracking.py`` (read, then re-implemented; no code copied).
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence

from .common import NOISE, _Builder, _encode, _largest_fitting

# The template and answer prefix (scripts/data/synthetic/constants.py); the prompt is the two joined.
VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
VT_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assigned the value {query}, they are: "
)
VT_ARGS = {"num_chains": 1, "num_hops": 4}
VT_EXAMPLE_TOKENS = 500  # RULER sizes its worked vt example to 500 tokens


def _names(rng: random.Random, count: int, letters: int, used: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < count:
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        if name not in used:
            used.add(name)
            out.append(name)
    return out


class _Chains:
    """num_chains chains of num_hops + 1 variables; the first chain's value is the query.

    Placement (RULER's noise haystack, variable_tracking.py): chain after chain, a chain of k lines
    picks k distinct lines, uniformly without replacement, among the lines already there (the noise
    lines and the lines of the chains placed before it), and its j-th line goes right before the j-th
    picked line in text order. So every chain line is followed by a line that was there before it:
    none comes after the last noise line, a chain keeps its order, and two lines of one chain are never
    adjacent (with the standard single chain, no two chain lines are; lines of different chains may
    touch, as in RULER). A chain needs at least k lines to choose from: ``min_noise`` noise lines. The
    draw comes from one seed per sample, so a haystack size always gives the same text.
    """

    def __init__(self, rng: random.Random, num_chains: int, num_hops: int, letters: int):
        used_names: set[str] = set()
        used_values: set[int] = set()
        self.names, self.lines = [], []
        for _ in range(num_chains):
            names = _names(rng, num_hops + 1, letters, used_names)
            value = rng.randint(10000, 99999)
            while value in used_values:
                value = rng.randint(10000, 99999)
            used_values.add(value)
            self.names.append(names)
            self.lines.append(
                [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(num_hops)]
            )
            if len(self.names) == 1:
                self.value = str(value)
        self.placement_seed = rng.getrandbits(64)
        self.num_hops = num_hops
        self.min_noise = num_hops + 1

    def text(self, noise_lines: int) -> tuple[str, str]:
        """(context, prompt) with the chains among noise_lines noise lines, placed as the class says."""
        if noise_lines < self.min_noise:
            raise ValueError(f"variable tracking needs at least {self.min_noise} noise lines, got {noise_lines}")
        lines = [NOISE] * noise_lines
        rng = random.Random(self.placement_seed)
        for chain in self.lines:
            lines = _place_before(lines, chain, rng)
        context = "\n".join(lines)
        prompt = VT_TEMPLATE.format(context=context, query=self.value) + VT_PREFIX.format(
            num_v=self.num_hops + 1, query=self.value
        )
        return context, prompt


def _place_before(lines: list[str], items: Sequence[str], rng: random.Random) -> list[str]:
    """Each item right before one of len(items) distinct lines drawn uniformly, items in their order."""
    picked = sorted(rng.sample(range(len(lines)), len(items)))
    before = dict(zip(picked, items))
    out = []
    for i, line in enumerate(lines):
        if i in before:
            out.append(before[i])
        out.append(line)
    return out


class _VariableTracking(_Builder):
    def __init__(self, tokenizer, length: int, seed: int, num_chains: int, num_hops: int):
        rng = random.Random(seed)
        self.chains = _Chains(rng, num_chains, num_hops, letters=5)
        # The worked example: shorter names (3 letters), its own value, sized to its token budget.
        example = _Chains(random.Random(rng.getrandbits(64)), num_chains, num_hops, letters=3)

        def shot(noise_lines: int) -> str:
            return example.text(noise_lines)[1] + " " + " ".join(example.names[0]) + "\n"

        budget = min(VT_EXAMPLE_TOKENS, length // 8)
        counts: dict[int, int] = {}

        def shot_tokens(n: int) -> int:
            if n not in counts:
                counts[n] = len(_encode(tokenizer, shot(n)))
            return counts[n]

        least = example.min_noise
        if shot_tokens(least) <= budget:
            best = _largest_fitting(lambda n: shot_tokens(n) <= budget, least, None, shot_tokens, budget)
            self.example = shot(best)
        else:
            self.example = ""
        self.min_size = self.chains.min_noise

    def render(self, size: int):
        context, prompt = self.chains.text(size)
        if self.example:
            prompt = self.example + "\n" + prompt
        return (
            prompt,
            list(self.chains.names[0]),
            context,
            {"chain": list(self.chains.lines[0]), "example": self.example},
        )
