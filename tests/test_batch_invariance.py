"""A sequence's result never depends on the other sequences in its batch: for every method and phase, a
batch of equal-length prompts gives each row the logits it gets alone (the merging methods' thresholds and
random draws are per sequence)."""

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
        for phase in cls.phases:
            yield (
                f"{name}-{phase.value}",
                Plan.homogeneous(name, CAPACITY, layers, phase.value, params_that_fit(name, CAPACITY)),
            )


PLANS = dict(_plans(3))


@pytest.mark.parametrize("label", list(PLANS))
def test_each_row_of_a_batch_gets_what_it_gets_alone(label):
    model = tiny_model()
    ids = prompt(model, length=40, batch=3)
    together, _ = run_routed(model, PLANS[label], ids, steps=STEPS)
    for row in range(ids.shape[0]):
        alone, _ = run_routed(model, PLANS[label], ids[row : row + 1], steps=STEPS)
        for step, (batched, single) in enumerate(zip(together, alone)):  # the prefill, then every decode step
            torch.testing.assert_close(batched[row : row + 1], single, atol=1e-4, rtol=1e-4, msg=f"step {step}")
