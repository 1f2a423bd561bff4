"""One model shared by threads (the app caches one model for every browser session): a routed block belongs to
the thread that opened it. Blocks on one model run one after another, another thread's plan never runs in a
block, another thread's plain forward (padded included) stays the vanilla computation, attention recorders see
only their own thread's forwards, and a block inside another on the same model, in the same thread, is
refused."""

from __future__ import annotations

import threading

import pytest
import torch

from polykv.models import cache_argument_name
from polykv.plan import Plan
from polykv.runtime import RoutedCacheError, routed
from polykv.runtime.attention import record_attention
from polykv.runtime.many_plans import many
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
    assert all(torch.equal(a, b) for a, b in zip(got, vanilla))  # the model's own attention: the same bits


def test_a_second_threads_block_opens_only_once_the_first_has_put_the_model_back():
    """The second thread asks for its block while the first holds one open, and decodes once the first has closed.

    Without the model lock the second block would open inside the first: the first's exit would put the model's
    own attention back under the second, whose decode would then evict nothing (logits unlike its plan's alone),
    and the second's exit would leave the model on PolyKV's attention, the implementation it found on entry."""
    model, ids = _model()
    layers = model.config.num_hidden_layers
    first, second = Plan.homogeneous("streamingllm", 12, layers), Plan.homogeneous("tova", 16, layers)
    expected = _alone(model, second, ids)
    assert not torch.allclose(expected[-1], _alone(model, None, ids)[-1])  # a lost plan would show
    got: list[torch.Tensor] = []
    first_inside, second_inside, first_closed = threading.Event(), threading.Event(), threading.Event()

    def run_first():
        with routed(model, first):
            first_inside.set()
            second_inside.wait(WAIT)  # the second block would open here if nothing kept it out
        first_closed.set()

    def run_second():
        first_inside.wait(10)
        with routed(model, second):
            second_inside.set()
            first_closed.wait(10)
            got.extend(decode_logits(model, ids, STEPS, CACHE)[0])

    _run_threads(run_first, run_second)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_another_threads_padded_forward_keeps_its_mask_while_a_routed_block_is_open(implementation):
    model, _ = _model()
    model.set_attn_implementation(implementation)
    ids = prompt(model, length=24, batch=2)
    mask = torch.ones_like(ids)
    mask[1, :9] = 0  # the second prompt is 9 tokens shorter: left padding
    ids[1, :9] = 0

    def padded_forward() -> torch.Tensor:
        with torch.no_grad():
            return model(ids, attention_mask=mask).logits

    vanilla = padded_forward()
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits[1], vanilla[1])  # a lost mask would show
    got: list[torch.Tensor] = []
    inside, plain_done = threading.Event(), threading.Event()

    def run_routed():
        with routed(model, Plan.homogeneous("streamingllm", 8, model.config.num_hidden_layers)):
            inside.set()
            plain_done.wait(WAIT)

    def run_plain():
        inside.wait(10)
        got.append(padded_forward())
        plain_done.set()

    _run_threads(run_routed, run_plain)
    assert torch.equal(got[0], vanilla)
    assert model.config._attn_implementation == implementation


def test_a_block_inside_another_on_the_same_model_is_refused_and_the_outer_one_goes_on():
    model, ids = _model()
    layers = model.config.num_hidden_layers
    outer, inner = Plan.homogeneous("tova", 16, layers), Plan.homogeneous("streamingllm", 8, layers)
    expected = _alone(model, outer, ids)
    with routed(model, outer):
        for nested in (lambda: routed(model, inner), lambda: many(model, [inner])):
            with pytest.raises(RoutedCacheError, match="already open on this model in this thread"):
                with nested():
                    pass
        got = decode_logits(model, ids, STEPS, CACHE)[0]
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert model.config._attn_implementation == "sdpa"
    with routed(model, inner), routed(tiny_model("llama", seed=1), inner):  # another model: its own block
        pass


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


def test_a_forward_between_a_closing_blocks_mask_and_its_layers_gets_the_models_own_attention_and_mask():
    """Another thread's forward may build its mask while a block is open and run its layers after the block has put
    the model back: its attention and mask are then the model's own setting as it is now (eager here), never
    SDPA's in its place; an implementation with no mask function gets none, as transformers gives it."""
    import sys

    from polykv.runtime.swap import own_attention, own_mask

    model = tiny_model("llama")
    model.set_attn_implementation("eager")
    attention = model.model.layers[0].self_attn
    with routed(model, Plan.homogeneous("full", None, model.config.num_hidden_layers)):
        pass  # opened and closed: nothing of the block is left to look up
    eager = sys.modules[type(attention).__module__].eager_attention_forward
    assert own_attention(attention) is eager
    model.config._attn_implementation = "some_hub_kernel"  # registered nowhere: no mask function either
    assert own_mask(config=model.config) is None
