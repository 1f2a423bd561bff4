"""Parallel candidate evaluation (`polykv.search.parallel`): rungs go to the executor as batches, and any
executor gives the sequential search's plan, trace, execution count and budget behaviour."""

from __future__ import annotations

import os

import pytest
import torch

from polykv.search import Objective, SearchSettings, search
from polykv.search.objective import BudgetExhausted, executing, plan_key
from polykv.search.parallel import LocalExecutor, RayExecutor, executor
from tests.helpers import plan_of, random_sequences, tiny_model


class Recording(LocalExecutor):
    """Scores the pairs in this process and records each batch as [(plan key, token ids)]."""

    def __init__(self, model):
        super().__init__(model)
        self.batches: list[list[tuple[str, tuple[int, ...]]]] = []

    def __call__(self, pairs, continuation):
        self.batches.append([(plan_key(p), tuple(ids)) for p, ids in pairs])
        return super().__call__(pairs, continuation)


@pytest.fixture(scope="module")
def tiny():
    model = tiny_model("llama", seed=3)
    return model, random_sequences(4, 48, model.config.vocab_size)


def trace_of(result) -> list[dict]:
    return [t.to_dict() for t in result.trace]


def run_both(model, sequences, starts, **settings):
    options = {"budget": 8, "evaluations": 120, "candidates": 4, "first_rung": 1, "seed": 0, **settings}
    plain = Objective(model, sequences, continuation=8)
    recorder = Recording(model)
    batched = Objective(model, sequences, continuation=8, executor=recorder)
    return (
        (plain, search(plain, starts, SearchSettings(**options))),
        (batched, search(batched, starts, SearchSettings(**options))),
        recorder,
    )


@pytest.mark.slow  # runs the search twice (sequential and batched)
def test_rungs_go_to_the_executor_as_batches_with_the_sequential_result(tiny):
    model, sequences = tiny
    starts = [plan_of(["streamingllm"] * 3, [8] * 3), plan_of(["knorm"] * 3, [8] * 3)]
    (plain, a), (batched, b), recorder = run_both(model, sequences, starts)
    assert plan_key(a.plan) == plan_key(b.plan)
    assert trace_of(a) == trace_of(b)  # same arithmetic in this process: exactly equal
    assert [m.describe() for m in a.moves] == [m.describe() for m in b.moves]
    assert a.evaluations == b.evaluations and plain.executions == batched.executions
    assert set(plain._scores) == set(batched._scores)  # the very same (plan, sequence) pairs ran
    # Every pair ran once, in batches: the starts (2 plans x 4 sequences) first, then one per rung.
    sent = [pair for batch in recorder.batches for pair in batch]
    assert len(sent) == len(set(sent)) == batched.executions
    assert len(recorder.batches[0]) == 8 and len({k for k, _ in recorder.batches[0]}) == 2
    assert len(recorder.batches) < batched.executions / 2
    assert any(len({k for k, _ in batch}) > 1 for batch in recorder.batches[1:])  # a rung: several candidates


@pytest.mark.slow  # runs the search twice
def test_a_batch_that_crosses_the_budget_stops_where_the_sequential_loop_would(tiny):
    model, sequences = tiny
    starts = [plan_of(["h2o"] * 3, [8] * 3)]
    (plain, a), (batched, b), recorder = run_both(model, sequences, starts, evaluations=23)
    assert a.stopped == b.stopped == "budget" and b.trace[-1].event == "budget"
    assert a.evaluations == b.evaluations <= 23 and batched.executions == plain.executions
    assert trace_of(a) == trace_of(b) and plan_key(a.plan) == plan_key(b.plan)
    assert set(plain._scores) == set(batched._scores)
    assert sum(map(len, recorder.batches)) == batched.executions

    # Directly: a batch of 2 plans x 4 sequences with room for 3 runs the first plan's first 3 sequences.
    x, y = plan_of(["tova"] * 3, [8] * 3), plan_of(["knorm"] * 3, [8] * 3)
    outcome = {}
    for name, ex in (("plain", None), ("batched", Recording(model))):
        objective = Objective(model, sequences, continuation=8, executor=ex)
        objective.value(y, [3])  # cached: costs nothing later
        objective.limit = objective.executions + 3
        with pytest.raises(BudgetExhausted):
            objective.values([x, y], range(4))
        outcome[name] = (objective.executions, set(objective._scores))
        if ex is not None:
            assert [len(b) for b in ex.batches] == [1, 3]
    assert outcome["plain"] == outcome["batched"]
    assert outcome["plain"][1] == {(plan_key(y), 3)} | {(plan_key(x), i) for i in range(3)}


def test_values_counts_each_uncached_pair_once_and_matches_value(tiny):
    model, sequences = tiny
    x, y = plan_of(["tova"] * 3, [8] * 3), plan_of(["h2o"] * 3, [8] * 3)
    recorder = Recording(model)
    batched = Objective(model, sequences, continuation=8, executor=recorder)
    plain = Objective(model, sequences, continuation=8)
    assert batched.values([x, y, x], [0, 2]) == plain.values([x, y, x], [0, 2])
    assert batched.executions == plain.executions == 4  # x repeated: run once
    assert batched.values([x, y], range(4)) == [plain.value(x), plain.value(y)]
    assert [len(b) for b in recorder.batches] == [4, 4] and batched.executions == plain.executions == 8
    assert batched.scores(y, range(4)) == plain.scores(y, range(4))


def test_objectives_built_inside_executing_use_its_executor(tiny):
    model, sequences = tiny
    recorder = Recording(model)
    with executing(recorder):
        inside = Objective(model, sequences, continuation=8)
    assert inside.executor is recorder and Objective(model, sequences, continuation=8).executor is None
    assert executor("local", "demo") is None and isinstance(executor("ray", "demo"), RayExecutor)


def test_search_command_refuses_an_unknown_backend(polykv, tmp_path):
    result = polykv("search", "--out", str(tmp_path / "out"), "-w", str(tmp_path / "ws"), "-b", "16", "--backend", "x")
    assert result.returncode != 0 and "--backend" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_ray_executor_gives_the_local_search(demo_model):
    import ray  # installed by the test set-up (`.[test]`)

    from polykv.search.objective import build_sequences

    model, tokenizer = demo_model
    found = build_sequences(tokenizer, model, "demo", search=4, held_out=2, max_tokens=64, continuation=8)
    layers = model.config.num_hidden_layers
    starts = [plan_of(["streamingllm"] * layers, [16] * layers), plan_of(["tova"] * layers, [16] * layers)]
    settings = SearchSettings(budget=16, evaluations=60, candidates=4, first_rung=1, seed=0)

    env = {"POLYKV_HOME": os.environ["POLYKV_HOME"], "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env["RAY_USAGE_STATS_ENABLED"] = os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    try:
        remote = Objective(model, found.search, continuation=8, executor=RayExecutor("demo", "cpu"))
        far = search(remote, starts, settings)
    finally:
        ray.shutdown()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the Ray workers' arithmetic (OMP_NUM_THREADS=1)
    try:
        local = Objective(model, found.search, continuation=8)
        near = search(local, starts, settings)
    finally:
        torch.set_num_threads(threads)
    assert near.rounds >= 2 and near.evaluations > 8  # the starts and then real rungs
    assert plan_key(far.plan) == plan_key(near.plan)
    assert far.evaluations == near.evaluations and remote.executions == local.executions
    assert [m.describe() for m in far.moves] == [m.describe() for m in near.moves]
    assert len(far.trace) == len(near.trace)
    for f, n in zip(far.trace, near.trace):
        assert (f.evaluations, f.round, f.event, f.move, f.plan) == (n.evaluations, n.round, n.event, n.move, n.plan)
        assert f.objective == pytest.approx(n.objective, abs=1e-6)
        assert (f.candidate is None) == (n.candidate is None)
        if f.candidate is not None:
            assert f.candidate == pytest.approx(n.candidate, abs=1e-6)
    assert far.objective == pytest.approx(near.objective, abs=1e-6)
