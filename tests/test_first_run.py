"""The proposed first run (`polykv.eval.launch.first_run`): a pilot of the plan and the best homogeneous plan of its
scope and budget, then a decisive run sized from the pilot's spread within the time allowed, on tasks where FullKV
succeeds."""

import numpy as np
import pytest

from polykv.eval.launch import first_run
from polykv.eval.results.store import Store
from polykv.eval.running.suite_runner import run_id_for
from polykv.eval.statistics.samples import expected_mde, samples_for
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
    decisive = first_run.propose("demo", plan, store, 512, seconds_per_sample=99.0, allowance_s=600)
    assert not decisive.pilot and decisive.seed == 0
    assert [label["series"] for label, _ in decisive.plans] == ["route", "tova", "full"]
    chosen = decisive.samples
    # timed by the pilot's own samples (0.1 s each, two plans), with FullKV's third: not the 99 s given
    assert chosen.seconds_per_sample == pytest.approx(0.3)
    assert chosen.for_time == int(600 // (chosen.seconds_per_sample * len(tasks)))
    sds = [float(np.std(noise[t], ddof=1)) for t in tasks]
    assert chosen.for_target == samples_for(sds, first_run.TARGET_MDE)
    assert decisive.settings.samples_per_task == chosen.samples_per_task == min(chosen.for_target, chosen.for_time)
    assert chosen.expected_mde == pytest.approx(expected_mde(sds, chosen.samples_per_task))
    # one pilot of a homogeneous plan: it is the only one, not "the best"
    method, why = first_run.best_homogeneous(plan, store, pilot.settings.to_dict(), "demo", pilot.seed)
    assert method == "tova" and why.startswith("tova: the only homogeneous plan in this workspace's pilots")
    # a pilot of another homogeneous plan there that did better: it becomes the baseline
    rival = first_run.rivals(plan)["streamingllm"]
    _run(store, "demo", rival, pilot.settings, pilot.seed, {t: [v - 1 for v in base[t]] for t in tasks}, "answer_nll")
    method, why = first_run.best_homogeneous(plan, store, pilot.settings.to_dict(), "demo", pilot.seed)
    assert method == "streamingllm" and why.startswith("streamingllm: the best of the 2 homogeneous plans in this")


def test_the_baseline_is_never_the_plan_itself_and_always_runs_at_the_budget(tmp_path):
    tova = Plan.homogeneous("tova", 32, 5, scope="decode")
    assert "tova" not in first_run.rivals(tova)  # the plan is homogeneous TOVA: another method is its rival
    proposed = first_run.propose("demo", tova, Store(tmp_path / "results.sqlite"), 512)
    assert proposed.baseline != "tova" and proposed.plans[1][1].layers != tova.layers
    small = Plan.homogeneous("h2o", 8, 5, scope="prefill")  # SnapKV's default window (32) does not fit 8
    from polykv.methods import validate_plan

    for rival in first_run.rivals(small).values():
        validate_plan(rival, 5)


def test_a_pilot_with_no_difference_sizes_no_run(tmp_path, plan):
    store = Store(tmp_path / "results.sqlite")
    pilot = first_run.propose("demo", plan, store, 512)
    same = {t: [2.0] * first_run.PILOT_SAMPLES for t in pilot.settings.tasks}
    for _, p in pilot.plans:
        _run(store, "demo", p, pilot.settings, pilot.seed, same, "answer_nll")
    with pytest.raises(ValueError, match="same answer_nll on every pilot sample"):
        first_run.propose("demo", plan, store, 512)


def test_the_cost_model_times_a_decisive_sample_once_the_speed_is_measured(tmp_path, monkeypatch, demo_model):
    from polykv import costs

    monkeypatch.setenv("POLYKV_HOME", str(tmp_path))
    tasks = ("niah_single_1", "fwe")
    assert first_run.cost_per_sample("demo", "cpu", *demo_model, tasks, 512) is None  # not measured yet
    costs.measure_rates(demo_model[0], "demo", "cpu")
    costs.record_ratio("demo", "cpu", "eval", 1.0, 1.5)  # a learned correction is part of it
    seconds = first_run.cost_per_sample("demo", "cpu", *demo_model, tasks, 512)
    assert seconds > 0 and first_run.cost_per_sample("demo", "cpu", *demo_model, tasks, 512) == seconds
