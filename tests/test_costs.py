"""The cost model (`polykv.costs`, `polykv.eval.launch.work`, `polykv.jobs.costs`): rates fitted and kept per
model and device, work counted from a launch's own settings, estimates said before a launch (`--dry-run` stops
there), and a real small job's time held within the stated factor of its estimate."""

import json

import numpy as np
import pytest

from polykv import costs, jobs
from polykv.costs import Forward, Rates, Work
from polykv.errors import FileError
from polykv.eval.launch import work as launch_work
from polykv.eval.running.settings import suite_settings
from polykv.eval.running.unit import Unit
from polykv.plan import Plan
from tests.helpers import wait_for_job


def _rates(**changes) -> Rates:
    base = dict(
        model="m",
        device="cpu",
        fixed_s=0.01,
        token_s=0.001,
        pair_s=1e-6,
        routed_s=0.002,
        load_s=2.0,
        weights_bytes=2**30,
        kv_token_bytes=1024,
        measured="2026-12-05T00:00:00+00:00",
    )
    return Rates(**{**base, **changes})


def test_the_fit_recovers_known_rates():
    fixed, token, pair = 0.02, 3e-4, 2e-7
    rows = [(128, 0), (1, 128), (512, 0), (1, 512), (256, 0)]
    seconds = [fixed + token * n + pair * n * (c + n / 2) for n, c in rows]
    fitted = costs._fit(rows, seconds)
    assert np.allclose(fitted, (fixed, token, pair), rtol=1e-6)


def test_an_estimate_prices_each_forward_and_the_load():
    rates = _rates()
    work = Work("eval", (Forward(10, 100), Forward(40, 1, 100, batch=2, routed=False)), kv_tokens=200, kv_rows=3)
    found = costs.estimate(work, rates)
    expected = 2.0 + 10 * (0.01 + 0.002 + 0.1 + 1e-6 * 100 * 50) + 40 * (0.01 + 2 * (0.001 + 1e-6 * 100.5))
    assert found.seconds == pytest.approx(expected)
    assert found.memory_bytes == 2**30 + 1024 * 200 * 3
    assert "estimate: about" in found.line() and "1.0 GiB on cpu" in found.line()


def test_an_estimate_adds_timed_work_and_says_when_the_machines_load_may_stretch_it(monkeypatch):
    work = Work("eval", (Forward(10, 100),), timed_s=30.0)
    monkeypatch.setattr(costs, "machine_load", lambda: (0.2, 2))
    quiet = costs.estimate(work, _rates())
    assert quiet.seconds == pytest.approx(30.0 + costs.estimate(Work("eval", (Forward(10, 100),)), _rates()).seconds)
    assert quiet.stretch == pytest.approx(1.1) and "busy" not in quiet.line()
    monkeypatch.setattr(costs, "machine_load", lambda: (3.0, 2))  # three runnable tasks on two cores
    busy = costs.estimate(work, _rates())
    assert busy.stretch == pytest.approx(2.5)
    assert "this machine is busy (load 3.0 on 2 cores): expect x2.5 that or more" in busy.line()
    monkeypatch.setattr(costs, "machine_load", lambda: (0.6, 2))  # the estimating process's own bit of load
    assert "busy" not in costs.estimate(work, _rates()).line()
    assert costs.estimate(work, _rates(device="cuda")).stretch == 1.0  # an accelerator is not shared by load


def test_rates_are_kept_per_model_and_device_and_finished_jobs_correct_them(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYKV_HOME", str(tmp_path))
    assert costs.stored_rates("m", "cpu") is None
    costs.save_rates(_rates())
    assert costs.stored_rates("m", "cpu") == _rates()
    assert costs.stored_rates("m", "cuda") is None  # another device: measured on its own
    for ratio in (2.0, 2.5, 1.5):
        costs.record_ratio("m", "cpu", "eval", 10.0, 10.0 * ratio)  # measured against the model's own estimate
    rates = costs.stored_rates("m", "cpu")
    assert rates.correction("eval") == 2.0 and rates.correction("profile") == 1.0
    work = Work("eval", (Forward(1, 10),), loads=0)
    assert costs.estimate(work, rates).seconds == pytest.approx(2 * rates.forward_s(10, routed=True))
    for _ in range(costs.HISTORY):
        costs.record_ratio("m", "cpu", "eval", 1.0, 100.0)  # only the last few count, and within a range
    assert costs.stored_rates("m", "cpu").correction("eval") == costs.CORRECTION_RANGE[1]
    (tmp_path / costs.RATES_FILE).write_text("{not json")
    assert costs.stored_rates("m", "cpu") is None  # damaged: measured again, never fatal


def test_the_correction_converges_to_the_true_factor(tmp_path, monkeypatch):
    """Jobs that always take twice the model's estimate: the correction becomes 2 (measured against the model's
    own figure, not the corrected one shown, which would settle at the square root)."""
    monkeypatch.setenv("POLYKV_HOME", str(tmp_path))
    costs.save_rates(_rates())
    work = Work("eval", (Forward(100, 64),))
    for _ in range(costs.HISTORY):
        found = costs.estimate(work, costs.stored_rates("m", "cpu"))
        costs.record_ratio("m", "cpu", "eval", found.model_seconds, 2.0 * found.model_seconds)
    assert costs.estimate(work, costs.stored_rates("m", "cpu")).correction == pytest.approx(2.0)


def test_measured_rates_are_positive_and_stored(tmp_path, monkeypatch, demo_model):
    model, _ = demo_model
    monkeypatch.setenv("POLYKV_HOME", str(tmp_path))
    rates = costs.measure_rates(model, "demo", "cpu", load_s=1.5)
    assert rates.forward_s(256) > rates.forward_s(1, 256) > 0
    assert rates.load_s == 1.5 and rates.kv_token_bytes == 2 * 5 * 4 * 8 * 4  # 5 layers, 4 KV heads of 8, fp32
    assert costs.stored_rates("demo", "cpu") == rates


def test_suite_work_counts_each_sample_as_a_run_builds_it(demo_model):
    model, tokenizer = demo_model
    settings = suite_settings("ruler", {"tasks": ["niah_single_1", "fwe"], "length": 512, "samples_per_task": 3})
    shapes = launch_work.sample_shapes("ruler", settings, model, tokenizer)
    assert [s.task for s in shapes] == ["niah_single_1", "fwe"] and all(s.count == 3 for s in shapes)
    from polykv.eval.suites.ruler import build_samples

    first: dict = {}
    for task, _, payload in build_samples(tokenizer, model, settings, 0):
        first.setdefault(task, payload)
    for shape in shapes:
        assert shape.prompt == len(first[shape.task]["prompt_ids"])
        assert shape.steps == shape.reference_steps == first[shape.task]["tokens_to_generate"]
    fidelity = suite_settings("fidelity", {"tasks": ["prose", "stories"], "samples_per_task": 2, "prompt_tokens": 100})
    (prose, stories) = launch_work.sample_shapes("fidelity", fidelity, model, tokenizer)
    assert (prose.count, prose.prompt, prose.steps, prose.prompts) == (2, 100, 32 + 32, 2)  # from the settings
    sampled = launch_work.samples_work("fidelity", fidelity, model)  # the stories are generated first
    assert [(f.count, f.batch) for f in sampled.forwards] == [(100 + 33, 2)]
    alone = launch_work.suite_work("eval", shapes, plans=4, batched=False)
    batched = launch_work.suite_work("eval", shapes, plans=4, batched=True)
    prompts = lambda w: sum(f.count for f in w.forwards if f.new > 1)  # noqa: E731
    assert prompts(alone) == 6 * 4 + 6 and prompts(batched) == 6 + 6  # FullKV's reference once per sample
    assert batched.kv_rows == 4 and alone.kv_rows == 1
    # building the samples (timed on the first of each task) is priced too: once batched, once per run alone
    assert all(s.build_s > 0 for s in shapes) and batched.timed_s == pytest.approx(sum(3 * s.build_s for s in shapes))
    assert alone.timed_s == pytest.approx(4 * batched.timed_s)


def test_dry_run_states_the_estimate_and_starts_no_work(polykv, tmp_path):
    ws = tmp_path / "ws"
    result = polykv(
        "eval", "--model", "demo", "--suite", "ruler", "--settings", '{"tasks": ["fwe"], "length": 512}', "--dry-run",
        "-w", str(ws),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("estimate: about ") and "4 samples x 1 plan" in result.stdout
    assert not (ws / "results.sqlite").exists()
    result = polykv("profile", "--model", "demo", "--sequences", "2", "--max-tokens", "64", "--dry-run", "-w", str(ws))
    assert result.returncode == 0 and result.stdout.startswith("estimate: about ") and not (ws / "profiles").exists()


def test_an_estimate_that_cannot_be_made_never_stops_a_launch(workspace, demo_model, monkeypatch, tmp_path):
    from polykv.jobs import costs as job_costs

    monkeypatch.setenv("POLYKV_HOME", str(tmp_path / "home"))
    costs.save_rates(_rates(model="demo"))
    settings = suite_settings("ruler", {"tasks": ["niah_single_1"], "length": 512, "samples_per_task": 1})
    job = jobs.eval_job([({}, Unit.of("demo", Plan.homogeneous("tova", 64, 5), "ruler", settings))], "x")

    def broken(*args):
        raise OSError("the task file went away")

    monkeypatch.setattr(job_costs, "job_work", broken)
    assert job_costs.with_estimate(job, *demo_model, workspace) == job  # launched without an estimate


@pytest.mark.slow  # a real job in a worker process, for ten seconds or more
def test_a_real_small_job_takes_within_the_stated_factor_of_its_estimate(workspace, demo_model, monkeypatch, tmp_path):
    """The estimate written into an evaluation job before it starts, against the time its worker took
    (recorded by the worker, and kept as a correction for the next estimates of its kind). A generous factor
    (these machines are shared), on a job long enough that start-up is not all of it."""
    import time

    from polykv.jobs.costs import with_estimate
    from polykv.models import load_model

    monkeypatch.setenv("POLYKV_HOME", str(tmp_path / "home"))
    started = time.perf_counter()
    model, tokenizer = load_model("demo")
    costs.measure_rates(model, "demo", "cpu", load_s=time.perf_counter() - started)
    settings = suite_settings("ruler", {"tasks": ["niah_single_1", "fwe"], "length": 512, "samples_per_task": 4})
    plans = [Plan.homogeneous("tova", 64, 5), Plan.homogeneous("snapkv", 64, 5, scope="prefill")]
    units = [({"series": p.name}, Unit.of("demo", p, "ruler", settings)) for p in plans]
    job = with_estimate(jobs.eval_job(units, "cost check"), model, tokenizer, workspace)
    assert job.estimate_s is not None and job.estimate_s > 0
    jobs.start(job, workspace)
    done = wait_for_job(job, workspace)
    assert done.status == "finished", done.error
    ratio = done.measured_s / job.estimate_s
    assert 1 / costs.STATED_FACTOR <= ratio <= costs.STATED_FACTOR, done.cost_line()
    assert costs.stored_rates("demo", "cpu").ratios["eval"] == [pytest.approx(done.measured_s / job.estimate_model_s)]
    assert "took" in done.summary()
    saved = json.loads((workspace / "jobs" / f"{job.id}.json").read_text())
    assert saved["estimate_s"] == job.estimate_s


def test_a_text_search_counts_the_sequences_it_samples_from_the_model():
    plain = launch_work.text_search_work(4, 8, 256, 40, 1, "decode", ("kjv", "jargon"))
    sampled = launch_work.text_search_work(4, 8, 256, 40, 1, "decode", ("kjv", "model"))
    generated = [f for f in sampled.forwards if f not in plain.forwards]
    # half of the 4 search and 8 held-out sequences come from the model: 256 steps each, in one batch per split
    assert [(f.count, f.batch) for f in generated] == [(256, 2), (256, 4)]


@pytest.mark.parametrize(
    "damage",
    [
        {"fixed_s": 1e308},
        {"token_s": 10**400},
        {"load_s": float("nan")},
        {"measured": "2026\x1b[2J"},
        {"ratios": {"eval": [1e308]}},
    ],  # fmt: skip
)
def test_rates_that_are_not_a_measurement_are_measured_again_with_one_warning(tmp_path, monkeypatch, capsys, damage):
    monkeypatch.setenv("POLYKV_HOME", str(tmp_path))
    costs.save_rates(_rates())
    path = tmp_path / costs.RATES_FILE
    data = json.loads(path.read_text())
    data["m|cpu"] |= damage
    text = (
        json.dumps(data)
        if "token_s" not in damage
        else json.dumps(data).replace('"token_s": 1', f'"token_s": 1{"0" * 400}')
    )
    path.write_text(text)
    rates = costs.stored_rates("m", "cpu")
    if "ratios" in damage:  # one ratio out of range: the rates stand, that ratio is dropped
        assert rates is not None and rates.ratios == {"eval": []}
        return
    assert rates is None  # the launch measures again and `save_rates` rewrites the entry
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "measuring again" in err and "\x1b" not in err
    costs.stored_rates("m", "cpu")  # read again, as a launch does (its estimate, then its measurement)
    assert capsys.readouterr().err == ""  # said once
    costs.save_rates(_rates())
    assert costs.stored_rates("m", "cpu") == _rates()


def test_a_lock_held_by_another_process_is_waited_for_then_said_in_one_line(tmp_path, monkeypatch):
    import fcntl

    monkeypatch.setenv("POLYKV_HOME", str(tmp_path))
    monkeypatch.setattr(costs, "LOCK_WAIT_S", 0.3)
    with (tmp_path / (costs.RATES_FILE + ".lock")).open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as another process would (flock locks belong to the open file)
        with pytest.raises(FileError, match="another process has held this lock for over 0.3 s"):
            costs.save_rates(_rates())
