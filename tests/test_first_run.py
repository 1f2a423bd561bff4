"""The proposed first run (`polykv.eval.first_run`): a pilot of the plan and the best homogeneous plan of its scope
and budget, then a decisive run sized from the pilot's spread within the time allowed, on tasks where FullKV
succeeds."""

import numpy as np
import pytest

from polykv.eval import first_run
from polykv.eval.runner import run_id_for
from polykv.eval.store import Store
from polykv.eval.workload import expected_mde
from polykv.plan import FULL, Plan


def _run(store, model: str, plan: Plan, settings, seed: int, values: dict[str, list[float]], metric: str) -> str:
    """A finished run of `plan` holding per-sample `metric` values (no model involved)."""
    run_id = run_id_for(model, plan, "ruler", settings.to_dict(), seed)
    store.create_run(
        run_id,
        model=model,
        plan_name=plan.name,
        plan_hash="h",
        plan_json=plan.to_json(),
        suite="ruler",
        settings=settings.to_dict(),
        seed=seed,
        total_samples=sum(len(v) for v in values.values()),
        versions={},
    )
    for task, samples in values.items():
        for i, value in enumerate(samples):
            store.add_sample(run_id, task, str(i), {metric: value}, 0.1)
    store.set_task_scores(run_id, {t: {metric: float(np.mean(v))} for t, v in values.items()}, {t: 1 for t in values})
    store.set_status(run_id, "finished")
    return run_id


@pytest.fixture
def plan():
    return Plan.homogeneous("h2o", 32, 5, scope="decode", name="designed")


def test_without_a_pilot_it_proposes_the_pilot_against_the_papers_anchor(tmp_path, plan):
    store = Store(tmp_path / "results.sqlite")
    proposed = first_run.propose("demo", plan, store, 512)
    assert proposed.pilot and proposed.baseline == "tova" and proposed.samples is None
    assert proposed.settings.mode == "score" and proposed.settings.samples_per_task == first_run.PILOT_SAMPLES
    assert proposed.settings.tasks == first_run.NEEDLES and proposed.seed == first_run.PILOT_SEED_OFFSET
    labels = [label["series"] for label, _ in proposed.plans]
    assert labels == ["route", "tova"]
    rival = proposed.plans[1][1]
    assert rival.scope == plan.scope and all(layer.decode.capacity == 32 for layer in rival.layers)
    assert "unchecked" in proposed.reasons[0]
    with pytest.raises(ValueError, match="keeps every token"):
        first_run.propose("demo", Plan.homogeneous(FULL, None, 5), store, 512)


def test_fullkvs_competence_in_the_workspace_chooses_the_tasks(tmp_path, plan):
    from polykv.eval.suites.ruler import RulerSettings

    store = Store(tmp_path / "results.sqlite")
    generated = RulerSettings(tasks=("niah_single_1", "vt"), length=512, samples_per_task=2)
    full = Plan.homogeneous(FULL, None, 5)
    _run(store, "demo", full, generated, 0, {"niah_single_1": [100, 0], "vt": [0, 0]}, "score")
    tasks, why = first_run.competent("demo", store, 512)
    assert tasks == ("niah_single_1",) and "20%" in why
    assert first_run.competent("smollm2", store, 512)[0] == first_run.ON_RECORD["smollm2"]


def test_after_the_pilot_the_decisive_run_is_sized_from_its_spread(tmp_path, plan):
    store = Store(tmp_path / "results.sqlite")
    pilot = first_run.propose("demo", plan, store, 512)
    rng = np.random.default_rng(0)
    tasks = pilot.settings.tasks
    base = {t: list(rng.normal(2.0, 0.5, first_run.PILOT_SAMPLES)) for t in tasks}
    noise = {t: rng.normal(0.05, 0.1, first_run.PILOT_SAMPLES) for t in tasks}
    ours = {t: list(np.asarray(base[t]) + noise[t]) for t in tasks}
    for p, values in zip([p for _, p in pilot.plans], (ours, base)):
        _run(store, "demo", p, pilot.settings, pilot.seed, values, "answer_nll")
    decisive = first_run.propose("demo", plan, store, 512, seconds_per_sample=1.0, allowance_s=600)
    assert not decisive.pilot and decisive.seed == 0
    assert [label["series"] for label, _ in decisive.plans] == ["route", "tova", "full"]
    chosen = decisive.samples
    assert decisive.settings.samples_per_task == chosen.samples_per_task <= 600 // (3 * len(tasks))
    sds = [float(np.std(noise[t], ddof=1)) for t in tasks]
    assert chosen.expected_mde == pytest.approx(expected_mde(sds, chosen.samples_per_task))
    assert chosen.expected_mde <= first_run.TARGET_MDE or "time allowance" in chosen.reason
    # a pilot of every homogeneous plan there: the best one becomes the baseline
    snap = Plan.homogeneous("streamingllm", 32, 5, scope="decode")
    _run(store, "demo", snap, pilot.settings, pilot.seed, {t: [v - 1 for v in base[t]] for t in tasks}, "answer_nll")
    method, why = first_run.best_homogeneous(plan, store, pilot.settings.to_dict(), "demo", pilot.seed)
    assert method == "streamingllm" and "pilots" in why
