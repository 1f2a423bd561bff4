"""The app's thread count belongs to its model (`app.session.run_forwards_on_threads`): that model's forwards run on
its count, in whichever thread calls them, and the process's other work (another model included) keeps torch's."""

from __future__ import annotations

import threading

import pytest
import torch

from app.session import run_forwards_on_threads
from tests.helpers import prompt, tiny_model


def _threads_inside(model, ids) -> int:
    """torch's thread count during a forward of `model` (seen from its first decoder layer)."""
    seen: list[int] = []
    handle = model.model.layers[0].register_forward_hook(lambda *args: seen.append(torch.get_num_threads()))
    with torch.no_grad():
        model(ids)
    handle.remove()
    return seen[0]


@pytest.fixture
def process_threads():
    """The process at 2 threads, so that a model's own count (1) can be told from it."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_models_forwards_run_on_its_thread_count_and_everything_else_on_torchs(process_threads):
    app_model, other = tiny_model("llama"), tiny_model("llama", seed=1)
    run_forwards_on_threads(app_model, 1)
    ids = prompt(app_model, length=8)
    assert _threads_inside(app_model, ids) == 1
    assert torch.get_num_threads() == 2  # put back after the forward
    assert _threads_inside(other, ids) == 2  # another model: the process's count
    in_thread: list[int] = []
    worker = threading.Thread(target=lambda: in_thread.append(_threads_inside(app_model, ids)))
    worker.start()
    worker.join(timeout=60)
    assert in_thread == [1]  # another thread's forward of the model: the model's count
    with pytest.raises(IndexError), torch.no_grad():
        app_model(torch.tensor([[app_model.config.vocab_size]]))  # a forward that fails
    assert torch.get_num_threads() == 2  # put back all the same
