"""One model shared by threads (the app caches one model for every browser session): a routed block belongs to
the thread that opened it. Another thread's plan never runs in it, another thread's plain forward stays the
vanilla computation, and attention recorders see only their own thread's forwards."""

from __future__ import annotations

import threading

import torch

from polykv.models import cache_argument_name
from polykv.plan import Plan
from polykv.runtime import routed
from polykv.runtime.attention import record_attention
from tests.helpers import decode_logits, prompt, tiny_model

STEPS = 6
CACHE = cache_argument_name(tiny_model("llama"))  # the forward's cache argument in this transformers
WAIT = 1.0  # how long the first thread holds its block open for the other to act inside it (seconds)


def _model():
    model = tiny_model("llama")
    return model, prompt(model, length=40)


def _alone(model, plan: Plan | None, ids) -> list[torch.Tensor]:
    if plan is None:
        return decode_logits(model, ids, STEPS, CACHE)[0]
    with routed(model, plan):
        return decode_logits(model, ids, STEPS, CACHE)[0]


def _run_threads(*targets) -> None:
    errors: list[BaseException] = []

    def guarded(target):
        try:
            target()
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a thread did not finish"
    assert not errors, errors


def test_a_second_threads_plan_runs_as_its_own_while_the_first_holds_its_block():
    model, ids = _model()
    layers = model.config.num_hidden_layers
    first, second = Plan.homogeneous("streamingllm", 12, layers), Plan.homogeneous("tova", 16, layers)
    expected = {"first": _alone(model, first, ids), "second": _alone(model, second, ids)}
    got: dict[str, list[torch.Tensor]] = {}
    inside, second_done = threading.Event(), threading.Event()

    def run_first():
        with routed(model, first):
            inside.set()
            second_done.wait(WAIT)  # the other thread's run would fall inside this block if nothing kept it out
            got["first"] = decode_logits(model, ids, STEPS, CACHE)[0]

    def run_second():
        inside.wait(10)
        with routed(model, second):
            got["second"] = decode_logits(model, ids, STEPS, CACHE)[0]
        second_done.set()

    _run_threads(run_first, run_second)
    for name in ("first", "second"):
        assert all(torch.equal(a, b) for a, b in zip(got[name], expected[name])), name


def test_another_threads_plain_forward_is_vanilla_while_a_routed_block_is_open():
    model, ids = _model()
    layers = model.config.num_hidden_layers
    evicting = Plan.homogeneous("streamingllm", 8, layers)
    vanilla = _alone(model, None, ids)
    assert not torch.allclose(_alone(model, evicting, ids)[-1], vanilla[-1])  # the plan would show
    got: list[torch.Tensor] = []
    inside, plain_done = threading.Event(), threading.Event()

    def run_routed():
        with routed(model, evicting):
            inside.set()
            plain_done.wait(WAIT)

    def run_plain():
        inside.wait(10)
        got.extend(decode_logits(model, ids, STEPS, CACHE)[0])
        plain_done.set()

    _run_threads(run_routed, run_plain)
    assert [a.argmax(-1).tolist() for a in got] == [a.argmax(-1).tolist() for a in vanilla]
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, vanilla))  # SDPA under another name


def test_two_threads_recording_attention_on_one_model_keep_their_own_rows():
    model, ids = _model()
    other = prompt(model, length=24, seed=7)
    layers = model.config.num_hidden_layers
    plans = {"a": Plan.homogeneous("full", None, layers), "b": Plan.homogeneous("tova", 16, layers)}
    inputs = {"a": ids, "b": other}

    def record(name: str, hold: threading.Event | None = None, wait: threading.Event | None = None):
        if wait is not None:
            wait.wait(10)
        with routed(model, plans[name]), record_attention() as recorder:
            if hold is not None:
                hold.set()
            decode_logits(model, inputs[name], 1, CACHE)
        return {layer: rows.shape for layer, rows in recorder.rows.items()}, recorder

    alone = {name: record(name)[0] for name in plans}
    assert alone["a"] != alone["b"]  # different prompts and plans leave differently shaped rows
    together: dict[str, dict] = {}
    started = threading.Event()

    def run(name, hold=None, wait=None):
        shapes, recorder = record(name, hold, wait)
        together[name] = shapes
        assert set(recorder.rows) == set(range(layers))

    _run_threads(lambda: run("a", hold=started), lambda: run("b", wait=started))
    assert together == alone
