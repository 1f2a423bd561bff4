"""Plans for a workload (issue 31): workload calibration sources and their split, danswer in a profile, the
answer_nll objective, and a verdict that tells a plan keeping a planted needle from one dropping it."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polykv.eval.results.store import Store
from polykv.eval.workloads import workload as calibration
from polykv.eval.workloads.workload import calibration_samples, evaluation_samples, parse_workload, prompt_hash
from polykv.plan import Plan, Scope
from polykv.search.local_search import SearchSettings, search
from polykv.search.workload import markdown as workload_markdown
from polykv.search.workload import summary as workload_summary
from polykv.search.workload.objective import AnswerObjective
from polykv.search.workload.report import WorkloadReport
from polykv.search.workload.verdict import contrast, rejudge
from tests.helpers import plan_of
from tests.planted_needle import needle_model, needle_questions

NIAH = "ruler:niah_single_1@512"  # the one RULER task whose prompts fit the demo model's 512 tokens


def _hashes(workload, rows, seed):
    return {prompt_hash(workload, task, sample, seed, payload) for task, sample, payload in rows}


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(min_value=0, max_value=2**31 - 1))
def test_a_workload_source_never_yields_a_sample_of_the_evaluation_split(demo_model, seed):
    model, tokenizer = demo_model
    workload = parse_workload([NIAH])
    evaluation = evaluation_samples(workload, tokenizer, model, 6, seed)
    drawn = calibration_samples(workload, tokenizer, model, 6, seed)
    assert len(drawn) == 6
    assert not _hashes(workload, drawn, seed) & _hashes(workload, evaluation, seed)


def test_a_calibration_sample_equal_to_an_evaluation_one_is_dropped_and_replaced(demo_model, monkeypatch):
    model, tokenizer = demo_model
    workload = parse_workload([NIAH])
    evaluation = evaluation_samples(workload, tokenizer, model, 3, 0)
    honest = calibration_samples(workload, tokenizer, model, 3, 0)
    ruler = calibration._module("ruler")
    real = ruler.build_samples

    def colliding(tok, mdl, settings_, seed):  # the calibration stream opens with an evaluation prompt
        rows = real(tok, mdl, settings_, seed)
        return [evaluation[0], *rows] if seed == calibration.CALIBRATION_SEED else rows

    monkeypatch.setattr(ruler, "build_samples", colliding)
    drawn = calibration_samples(workload, tokenizer, model, 3, 0)
    assert not _hashes(workload, drawn, 0) & _hashes(workload, evaluation, 0)
    assert _hashes(workload, drawn, 0) == _hashes(workload, honest, 0)


@pytest.mark.parametrize(
    ("sources", "problem"),
    [
        (["ruler:no_such_task@512"], "unknown RULER task"),
        (["ruler:niah_single_1@x"], "whole number of tokens"),
        (["ruler:niah_single_1@512", "ruler:vt@1024"], "several RULER lengths"),
        (["ruler:niah_single_1"], "names no length"),
        (["longbench:/nowhere/narrativeqa.jsonl"], "no such file"),
        (["longbench:/nowhere/notatask.jsonl"], "names no LongBench task"),
        (["ruler:vt@512", "ruler:vt@512"], "a task twice"),
    ],
)
def test_bad_workload_sources_are_refused_in_one_line(sources, problem):
    with pytest.raises(ValueError, match=problem) as info:
        parse_workload(sources)
    assert "\n" not in str(info.value)


@pytest.fixture(scope="module")
def workload_profile(tmp_path_factory, demo_model):
    from polykv.eval.workloads.workload import workload_corpus
    from polykv.plan import Phase
    from polykv.profile.build import build_profile
    from polykv.profile.corpus import CorpusSpec

    model, tokenizer = demo_model
    spec = CorpusSpec(sources=(NIAH,), num_sequences=3, max_tokens=512)
    corpus = workload_corpus(tokenizer, model, spec)
    root = tmp_path_factory.mktemp("workload-profile")
    return build_profile("demo", model, tokenizer, root, spec, capacity=64, scopes=(Phase.DECODE,), workload=corpus)


def test_danswer_of_full_is_zero_in_every_layer(workload_profile):
    table = workload_profile.table
    full = table[table["method"] == "full"]
    assert len(full) == workload_profile.num_layers
    assert full["danswer"].abs().max() < 1e-5  # FullKV against itself, up to float rounding
    assert table[table["method"] != "full"]["danswer"].abs().max() > 1e-3  # the methods do change the answer
    assert {"danswer_low", "danswer_high"} <= set(table.columns)
    assert (table["danswer_low"] <= table["danswer"] + 1e-12).all()
    assert (table["danswer"] <= table["danswer_high"] + 1e-12).all()


def test_a_workload_profile_reads_back_with_danswer_and_answer_lengths(workload_profile):
    from polykv.profile.store import load_profile

    again = load_profile(workload_profile.path)
    assert again.is_workload and "danswer" in again.table.columns
    tokens, answer = again.per_sequence_tokens()
    assert list(tokens + 1) == list(answer)  # the first answer token is predicted by the prompt's pass


def test_toprank_and_the_route_confidence_accept_danswer(workload_profile):
    from polykv.routing import route_confidence, toprank

    route = toprank(workload_profile.table, "decode", "danswer", workload_profile.num_layers)
    assert len(route) == workload_profile.num_layers and "full" not in route
    confidence = route_confidence(workload_profile, "decode", "danswer", replicates=50)
    assert list(confidence["winner"]) == route


def test_danswer_on_a_text_profile_says_what_it_needs(small_profile):
    from polykv.routing import toprank

    with pytest.raises(ValueError, match="danswer needs a workload profile"):
        toprank(small_profile.table, "decode", "danswer", small_profile.num_layers)


def _keep_and_drop(capacity: int = 32):
    keep = Plan.homogeneous("streamingllm", capacity, 1, Scope.DECODE, {"sinks": 16}).model_copy(
        update={"name": "keeps"}
    )
    drop = Plan.homogeneous("streamingllm", capacity, 1, Scope.DECODE, {"sinks": 4}).model_copy(
        update={"name": "drops"}
    )
    return keep, drop


def test_the_verdict_ranks_a_plan_that_keeps_a_planted_needle_above_one_that_drops_it():
    model = needle_model()
    keep, drop = _keep_and_drop()
    # held-out: samples of their own seed; both plans keep 32 positions, only one of them the needle's (8)
    held_out = AnswerObjective(model, needle_questions(8, seed=1), ["needle"] * 8)
    scores = {
        plan.name: {"needle": {f"{i:03d}": s.nll for i, s in enumerate(held_out.scores(plan, range(8)))}}
        for plan in (keep, drop)
    }
    result = contrast(scores["keeps"], scores["drops"], "answer_nll")
    assert result["verdict"] == "better" and result["wins"] == 8 and result["difference"] < -1.0
    assert result["p"] < 0.05 and result["mde"] < abs(result["difference"])


def test_the_search_on_the_workload_picks_the_plan_that_keeps_the_needle():
    model = needle_model()
    keep, drop = _keep_and_drop()
    objective = AnswerObjective(model, needle_questions(4, seed=2))
    result = search(objective, [drop, keep], SearchSettings(budget=32, evaluations=40, statistic="danswer"))
    assert result.start == "keeps" and result.starts["keeps"] < result.starts["drops"]
    assert result.objective <= result.starts["keeps"]


def test_the_objective_scores_plans_that_meet_on_a_sample_together_and_once():
    model = needle_model()
    keep, drop = _keep_and_drop()
    objective = AnswerObjective(model, needle_questions(3))
    first = objective.values([keep, drop])
    assert objective.executions == 6
    assert objective.values([keep, drop]) == first and objective.executions == 6  # kept, not run again
    alone = AnswerObjective(model, needle_questions(3))
    assert alone.value(keep) == pytest.approx(first[0], abs=1e-6)


def test_polykv_search_on_a_workload_writes_its_verdict(polykv, tmp_path):
    out = tmp_path / "out"
    result = polykv(
        "search", "--model", "demo", "-o", str(out), "-b", "32", "--objective", "answer_nll",
        "--sources", NIAH, "--search-sequences", "2", "--held-out", "3", "--evaluations", "12",
        "--competence", "0", "--workspace", str(tmp_path / "ws"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    (entry,) = report["budgets"]
    assert set(entry["plans"]) == {"searched", "toprank-workload", "homogeneous", "envelope", "anchor", "tova"}
    family = entry["verdict"]["searched tasks"]
    assert set(family["means"]) >= {"searched", "envelope", "fullkv"}
    assert any(
        c["a"] == "searched" and c["b"] == "envelope" and c["metric"] == "answer_nll" for c in family["contrasts"]
    )
    page = (out / "report.md").read_text()
    assert "## The verdict: the searched plan against the best homogeneous plan of its scope" in page
    assert "## Against the envelope (each baseline under its own protocol)" in page and "MDE" in page
    assert "across protocols: searched acts in decode only" in page  # the envelope here: a two-phase baseline
    assert "## Competence" in page and "## KV memory each plan keeps" in page
    # each plan's held-out run measured what it held: FullKV every token it saw, the searched plan its budget
    kv_lines = [line for line in page.splitlines() if line.startswith("| ") and "MB" in line]
    assert "entering the answer, measured" in page and kv_lines and all("not measured" not in x for x in kv_lines)
    assert any("| fullkv |" in line and line.endswith(" MB, 100%) |") for line in kv_lines)
    # the decode-scope searched plan holds the whole prompt entering the answer, the prefill envelope its budget
    assert "; not at equal KV: entering the answer searched held " in page
    assert (out / "results.sqlite").is_file() and (out / "workload.png").is_file()
    assert "It computes, in order" in result.stderr  # says what it computes before it starts
    assert report["competence"]["samples"] == 3 and set(report["fullkv_accuracy"]) == {"niah_single_1"}
    # one page over searches; every run id it prints is in the database it names
    summary = tmp_path / "summary.md"
    notes = tmp_path / "reading.md"
    notes.write_text("The searched plan wins nothing here.\n")
    assert workload_summary.main(["--out", str(summary), "--reading", str(notes), str(out)]) == 0
    text = summary.read_text()
    assert "## Reading\n\nThe searched plan wins nothing here.\n" in text  # a person's words, before the numbers
    assert "## Like with like: the searched plan against the best homogeneous plan of its scope" in text
    assert "out/results.sqlite" in text and entry["runs"]["answer_nll"]["searched"] in text
    assert "no scope on this page was searched under both question protocols" in text  # one search: no empty table
    assert "entering the answer, measured" in text
    # rendered again: the verdicts recomputed from the database equal the search's own; report.json untouched
    saved = (out / "report.json").read_bytes()
    again = rejudge(WorkloadReport.load(out / "report.json"), Store(out / "results.sqlite", readonly=True))
    assert again.rejudged and again.to_dict()["budgets"][0]["verdict"] == entry["verdict"]
    assert workload_markdown.main([str(out / "report.json"), "--out", str(out / "again.md")]) == 0
    assert (out / "report.json").read_bytes() == saved
    assert "computed again from those runs" in (out / "again.md").read_text()
    assert "computed again" not in page  # the search's own page prints the verdicts it computed


@pytest.mark.slow
def test_the_summary_pairs_the_same_plan_under_both_question_protocols(polykv, tmp_path):
    folders = []
    for question in ("in-prompt", "after-compression"):
        folders.append(tmp_path / question)
        result = polykv(
            "search", "--model", "demo", "-o", str(folders[-1]), "-b", "32", "--objective", "answer_nll",
            "--sources", NIAH, "--search-sequences", "2", "--held-out", "3", "--evaluations", "8",
            "--competence", "0", "--scope", "prefill", "--question", question, "--workspace", str(tmp_path / "ws"),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    reports = [WorkloadReport.load(f / "report.json") for f in folders]
    stores = {f.name: Store(f / "results.sqlite", readonly=True) for f in folders}
    rows = workload_summary.protocol_rows([(f.name, r, f) for f, r in zip(folders, reports)], stores)
    by_plan = {row[2]: row for row in rows}
    assert len(by_plan) == len(rows)  # each plan once, FullKV's control included
    control = by_plan["`fullkv`"]
    assert control[7] == "no significant difference" and abs(float(control[3].split()[0])) < 1e-3
    # a plan is paired with the same plan (its key), whatever role it had in each search
    keys = [{workload_summary._plan_of(e, role) for e in r.budgets for role in e.plans} for r in reports]
    assert len(rows) == 1 + len(keys[0] & keys[1])


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--sources", "ruler:nope@512"], "unknown RULER task"),
        (["--objective", "answer_nll"], "needs --sources"),
        (["--sources", NIAH, "--transfer", "ruler:vt@256"], "share the workload's suite and length"),
        (["--transfer", "ruler:vt@512"], "belongs to a workload search"),
        (["--question", "after-compression"], "--question belongs to a workload search"),
        (["--sources", NIAH, "--question", "before"], "'before' is not one of 'in-prompt', 'after-compression'"),
    ],
)
def test_a_workload_search_refuses_bad_input_in_one_line(polykv, tmp_path, args, problem):
    result = polykv("search", "--model", "demo", "-o", str(tmp_path / "o"), "-b", "32", *args)
    assert result.returncode == 2 and problem in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_a_longbench_file_splits_into_calibration_and_evaluation_samples_that_never_meet(demo_model, tmp_path):
    from tests.test_longbench import samples_for, write_task

    model, tokenizer = demo_model
    folder = tmp_path / "longbench"
    write_task(folder, "passage_count", samples_for("passage_count", n=10, words=40))
    workload = parse_workload([f"longbench:{folder / 'passage_count.jsonl'}"])
    for seed in range(4):
        evaluation = evaluation_samples(workload, tokenizer, model, 4, seed)
        drawn = calibration_samples(workload, tokenizer, model, 6, seed, _hashes(workload, evaluation, seed))
        assert len(drawn) == 6 and not _hashes(workload, drawn, seed) & _hashes(workload, evaluation, seed)
    with pytest.raises(
        ValueError, match=r"holds 6 sample\(s\) apart from the evaluation ones, 7 asked: ask for at most 6"
    ):
        calibration_samples(
            workload, tokenizer, model, 7, 0, _hashes(workload, evaluation_samples(workload, tokenizer, model, 4, 0), 0)
        )


@pytest.mark.parametrize("allocation", ["uniform", "entropy", "ppl"])
def test_a_route_by_danswer_takes_every_allocation(workload_profile, allocation):
    from polykv.routing import plan_from_profile

    plan = plan_from_profile(workload_profile, "decode", 64, "danswer", allocation)
    assert plan.provenance["statistic"] == "danswer"
    assert sum(layer.decode.capacity for layer in plan.layers) == 64 * workload_profile.num_layers


def test_the_kv_a_plan_keeps_is_where_it_evicts():
    from polykv.kv_memory import kv_kept

    lengths = {"prompt": 1000.0, "question": 40.0, "answer": 8.0}  # the question after a 960-token context
    layers = 4
    full = Plan.homogeneous("full", None, layers)
    prefill = Plan.homogeneous("snapkv", 64, layers, "prefill")
    decode = Plan.homogeneous("tova", 64, layers, "decode")
    both = Plan.homogeneous("tova", 64, layers, "both")
    assert kv_kept(full, lengths) == (layers * 1000.0, layers * 1008.0)
    assert kv_kept(prefill, lengths) == (layers * (64 + 40.0), layers * (64 + 40.0 + 8))  # the question kept whole
    assert kv_kept(decode, lengths) == (layers * 1000.0, layers * 64.0)  # the whole prompt until the first answer
    assert kv_kept(both, lengths) == (layers * 104.0, layers * 64.0)
    in_prompt = {**lengths, "question": 0.0}
    assert kv_kept(prefill, in_prompt) == (layers * 64.0, layers * 72.0)
    # a local layer (a 100-token sliding window) holds at most 99 tokens whatever its plan: FullKV's and TOVA's too
    windows = [100, None, 100, None]
    assert kv_kept(full, lengths, windows) == (2 * 99 + 2 * 1000.0, 2 * 99 + 2 * 1008.0)
    assert kv_kept(both, lengths, windows) == (2 * 99 + 2 * 104.0, layers * 64.0)


def test_the_competence_rule_takes_tasks_out_of_both_families_and_names_the_majority_method():
    from polykv.search.workload.verdict import competent_families, majority_method

    accuracy = {"niah_single_2": 100.0, "niah_multikey_1": 19.9, "fwe": 50.0, "vt": 0.0}
    families = competent_families(["niah_single_2", "niah_multikey_1"], ["fwe", "vt"], accuracy)
    assert families == {"searched tasks": ["niah_single_2"], "transfer tasks": ["fwe"]}
    assert competent_families(["niah_multikey_1"], ["vt"], accuracy, threshold=0)["transfer tasks"] == ["vt"]
    route = plan_of(["snapkv", "tova", "snapkv"], [8, 8, 8], "prefill")
    assert majority_method(route) == "snapkv"
    # on a hybrid model only the layers where the method acts count: local layers that keep their window (a
    # capacity at or above W - 1) name a method TopRank picked from a tie
    hybrid = plan_of(
        ["streamingllm", "streamingllm", "tova", "streamingllm", "pyramidkv", "tova"], [16, 16, 8, 16, 8, 8], "prefill"
    )
    windows = [9, 9, None, 9, None, None]
    assert majority_method(hybrid) == "streamingllm" and majority_method(hybrid, windows) == "tova"
