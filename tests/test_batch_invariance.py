"""A sequence's result never depends on the other sequences in its batch: for every method and phase, a
row keeps its logits, step after step, when the other rows of the batch are replaced by other prompts
(the merging methods' thresholds and random draws are per sequence).

The batch keeps its size and the row its place: the model's own matrix products may round differently
for another batch size, and a rule deciding an exact tie (two keys of the same token at different
positions have the same norm after RoPE) may then go either way, which says nothing about leaks."""

from __future__ import annotations

import pytest
import torch

from polykv.methods import REGISTRY, params_that_fit
from polykv.plan import Plan
from tests.helpers import prompt, run_routed, tiny_model

CAPACITY, STEPS = 16, 12


def _plans(layers: int):
    for name, cls in REGISTRY.items():
        if name == "full":
            continue
        for phase in sorted(cls.phases, key=lambda phase: phase.value):  # a set: one order in every process
            yield (
                f"{name}-{phase.value}",
                Plan.homogeneous(name, CAPACITY, layers, phase.value, params_that_fit(name, CAPACITY)),
            )


PLANS = dict(_plans(3))


@pytest.mark.parametrize("label", list(PLANS))
def test_each_row_of_a_batch_is_unaffected_by_the_other_rows(label):
    model = tiny_model()
    ids = prompt(model, length=40, batch=3)
    together, _ = run_routed(model, PLANS[label], ids, steps=STEPS)
    others = prompt(model, length=40, batch=3, seed=7)
    for row in range(ids.shape[0]):
        mixed = others.clone()
        mixed[row] = ids[row]  # the same row in the same place, among other prompts
        apart, _ = run_routed(model, PLANS[label], mixed, steps=STEPS)
        for step, (batched, single) in enumerate(zip(together, apart)):  # the prefill, then every decode step
            torch.testing.assert_close(batched[row], single[row], atol=1e-4, rtol=1e-4, msg=f"step {step}")
