"""Random: the control every eviction result should be read against.

As kvpress's `RandomPress` (NVIDIA kvpress, github.com/NVIDIA/kvpress): uniform scores, the highest kept. No paper.
"""

from __future__ import annotations

from pydantic import Field

from polykv.lazy import torch
from polykv.methods.base import LayerView, Method
from polykv.methods.eviction import Eviction, prompt_cut
from polykv.methods.params import MethodParams
from polykv.plan import Phase


class RandomParams(MethodParams):
    seed: int = Field(
        default=0,
        ge=0,
        le=2**31 - 1,
        description="seed of the uniform scores (the same in every layer, as kvpress's); an integer, 0 .. 2^31 - 1",
    )


class Random(Method):
    """Keep a uniformly random subset of the tokens, per KV head.

    Rule: every token gets a uniform score in [0, 1) when it enters the layer, kept with its slot; whenever the
    layer holds more than `capacity` slots the lowest scores go. At a whole prompt the scores of its n tokens are
    kvpress's draw: `torch.rand(h, n)` from a generator seeded with `seed`, in the keys' dtype (so on a CPU the
    kept positions are kvpress's for one sequence, and every layer draws the same numbers, as there). The tokens
    that enter later in one step (the question after a compressed context, a decode step's token) are drawn from a
    generator seeded with `seed` and the first one's position. Since every token's score is an independent uniform
    draw, what a layer holds at any time is a uniformly random subset of what it has seen, of size `capacity`: in
    decode too, dropping one token a step (in bf16, 1 in about 4 draws ties another at the cut, and the tie goes by
    slot order). A prompt's cut is by top-k even when one slot goes, as kvpress's.

    Differences from kvpress: kvpress draws once for the whole batch (rows of one batch get different numbers from
    the same rows alone); here each sequence of a batch draws from its own generator, so it keeps the same
    positions alone or batched. kvpress's default seed is None (unseeded, a new draw every run); here 0.
    """

    name = "random"
    phases = frozenset({Phase.PREFILL, Phase.DECODE})
    colour = "#7F7F7F"
    Params = RandomParams
    params: RandomParams  # this instance's, parsed
    standalone_source = "a random control (as kvpress's RandomPress): on the prompt and as generation grows"

    def observe_prefill(self, view: LayerView) -> None:
        self.scores(view)  # in decode, the prompt's tokens hold the scores they drew at the prompt

    def step(self, view: LayerView) -> Eviction | None:
        score = self.scores(view)
        if not self.over_capacity(view):
            return None
        return prompt_cut(score, self.capacity, view.phase, view.hidden)

    def scores(self, view: LayerView) -> torch.Tensor:
        """[b, h, n] every slot's draw (stored with the slots): the step's new tokens draw, the others keep theirs."""
        score = self.per_token.get("score")
        old = view.length - view.num_new
        if score is not None and score.shape[-1] == old:
            score = self.grow("score", view.num_new)
            score[..., old:] = self._draws(view, view.num_new, old)
        else:
            score = self._draws(view, view.length, None)
        self.per_token["score"] = score
        return score

    def _draws(self, view: LayerView, n: int, first_slot: int | None) -> torch.Tensor:
        """[b, h, n] uniform scores, one generator per sequence: seeded with `seed` (a whole layer's draw, as
        kvpress's) or, for tokens entering at `first_slot`, with `seed` and the first one's position."""
        b, h = view.keys.shape[:2]
        rows = []
        for row in range(b):
            seed = self.params.seed
            if first_slot is not None:  # the first new token's position (the runtime knows the newest)
                first = view.newest - n + 1 if view.newest is not None else int(view.positions[row, 0, first_slot])
                seed = seed * 1_000_003 + first  # under 2^31 * 1e6 + 2^32 < 2^63
            generator = torch.Generator().manual_seed(seed)
            rows.append(torch.rand(h, n, generator=generator, dtype=view.keys.dtype))
        return torch.stack(rows).to(view.keys.device)
