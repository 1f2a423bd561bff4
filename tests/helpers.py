"""Shared test helpers (plain functions, classes and constants; the fixtures are in conftest.py).

Test modules import from here (`from tests.helpers import ...`), never from one another.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from polykv.eval.results.rows import RunRow
from polykv.eval.suites.fidelity import FidelitySettings
from polykv.methods.base import LayerView
from polykv.methods.eviction import Eviction
from polykv.models import cache_argument_name, output_cache
from polykv.plan import LayerPlan, Phase, PhaseAssignment, Plan, Scope
from polykv.runtime import routed

REPO = Path(__file__).resolve().parents[1]
APP = str(REPO / "app" / "app.py")
MIXED = REPO / "plans" / "demo" / "mixed.json"

# Fidelity settings small enough for a test: a run of a few seconds on the demo model (4 samples), and
# one long enough (24 samples of longer prompts) to be caught running, cancelled or killed.
TINY_FIDELITY = FidelitySettings(
    tasks=("prose", "stories"), samples_per_task=2, prompt_tokens=96, continuation=8, generate=8
)
SLOW_FIDELITY = FidelitySettings(
    tasks=("prose", "stories"), samples_per_task=12, prompt_tokens=200, continuation=16, generate=16
)


# ---- model configs PolyKV refuses ------------------------------------------------------------------------
BERT_CONFIG = {  # a real architecture that PolyKV does not run (transformers would load it as a causal LM)
    "architectures": ["BertForMaskedLM"],
    "model_type": "bert",
    "hidden_size": 64,
    "num_hidden_layers": 5,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 512,
}
# A Llama config whose weights no machine holds (hidden_size 10^9: about 4e18 bytes).
HUGE_CONFIG = {**BERT_CONFIG, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 10**9}


# ---- tiny random-weight models of every supported family -----------------------------------------
_COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention: 2 query heads per KV head
    max_position_embeddings=1024,
)

FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": 4096}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 16}),  # q_norm / k_norm before RoPE
    # hybrid attention: two local layers (a 16-token sliding window, shorter than most test prompts) and a
    # global one, as Gemma 3 interleaves them
    "gemma3": (
        Gemma3TextConfig,
        Gemma3ForCausalLM,
        {
            "head_dim": 16,
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        },
    ),
}


def tiny_model(family: str = "llama", seed: int = 0, **overrides):
    config_cls, model_cls, extra = FAMILIES[family]
    config = config_cls(**{**_COMMON, **extra, **overrides})
    torch.manual_seed(seed)
    # _from_config mutates the config it is given: always hand it a copy.
    return model_cls._from_config(copy.deepcopy(config), attn_implementation="sdpa").eval()


# ---- decoding --------------------------------------------------------------------------------------
STEPS = 16  # decode steps of `run_routed` unless told


def decode_logits(model, ids: torch.Tensor, steps: int, cache_name: str, cache=None, after_prefill=None):
    """Prefill, then `steps` greedy single-token steps with the model deriving positions from the cache.

    Returns the prefill logits and the logits of each decode step, plus the final cache.
    """
    kwargs = {} if cache is None else {cache_name: cache}
    with torch.no_grad():
        out = model(ids, use_cache=True, **kwargs)
        cache = output_cache(out)
        if after_prefill is not None:
            after_prefill(cache)
        logits = [out.logits]
        token = out.logits[:, -1:].argmax(-1)
        for _ in range(steps):
            out = model(token, use_cache=True, **{cache_name: cache})
            logits.append(out.logits)
            token = out.logits[:, -1:].argmax(-1)
    return logits, cache


def assert_batched_as_alone(model, plans, question) -> None:
    """Every plan's answer from one many-plans batch is its answer alone: the same greedy tokens and measured KV, the
    NLL within float rounding."""
    from polykv.eval.suites import answers

    batched = answers.answer_many(model, plans, question, "both")
    for plan, answer in zip(plans, batched):
        alone = answers.answer_alone(model, plan, question, "both")
        assert answer.tokens == alone.tokens and answer.kv_held == alone.kv_held, plan.name
        assert abs(answer.nll - alone.nll) <= 1e-5, plan.name


def evict_positions(layer, positions: torch.Tensor) -> None:
    """Drop the routed `layer`'s slots holding these true positions (the same set for every row and head): a manual
    eviction for exactness tests (methods evict through their step)."""
    drop = torch.isin(layer.positions, positions.to(layer.positions.device))
    keep_count = int((~drop[0, 0]).sum())
    keep = (~drop).float().topk(keep_count, dim=-1, sorted=False).indices.sort(dim=-1).values
    layer._apply(Eviction(keep=keep))


def cache_state(cache) -> list[torch.Tensor]:
    """Copies of every number a later decode step could depend on, layer by layer: positions, keys, values,
    the decode method's per-slot state and its merge threshold (D2O's tau) when it has one."""
    out = []
    for layer in cache.layers:
        method = layer.methods[Phase.DECODE]
        out += [layer.positions, layer.keys, layer.values, *(t for _, t in sorted(method.per_token.items()))]
        if getattr(method, "tau", None) is not None:
            out.append(method.tau)
    return [t.clone() for t in out]


def identical(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """The same tensors, bit for bit (dtypes and shapes included)."""
    same = lambda x, y: x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)  # noqa: E731
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert len(a) == len(b)
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def prompt(model, length=40, batch=1, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (batch, length), generator=g)


def run_routed(model, plan, ids, steps=STEPS, after_prefill=None):
    with routed(model, plan) as session:
        logits, cache = decode_logits(model, ids, steps, cache_argument_name(model), after_prefill=after_prefill)
    assert cache is session.cache
    return logits, cache


def decode_sizes(model, plan, ids, steps: int, each_step: Callable[[Any], None] | None = None):
    """Under `plan`: prefill `ids`, then `steps` greedy decode steps, each step's logits finite (and
    `each_step(cache)` called after it). Returns the slots each layer retains, right after prefill
    and after every step (so `steps + 1` lists), and the cache."""
    name = cache_argument_name(model)
    with routed(model, plan) as session, torch.no_grad():
        out = model(ids, use_cache=True)
        cache = session.cache
        sizes = [cache.retained_per_layer()]
        token = out.logits[:, -1:].argmax(-1)
        for _ in range(steps):
            out = model(token, use_cache=True, **{name: cache})
            token = out.logits[:, -1:].argmax(-1)
            assert torch.isfinite(out.logits).all()
            sizes.append(cache.retained_per_layer())
            if each_step is not None:
                each_step(cache)
    return sizes, cache


# ---- a method's view of one layer ------------------------------------------------------------------
def layer_view(
    n: int | None = None,
    *,
    positions=None,
    heads: int | None = None,
    groups: int = 1,
    phase: Phase = Phase.DECODE,
    keys=None,
    values=None,
    seed: int | None = None,
    num_new: int | None = None,
    rows=None,
    column_sums=None,
) -> LayerView:
    """One layer's cache as a method's rule sees it, for batch row 0 only.

    Slots: `n` at positions 0..n-1, or `positions` ([n], or the whole [1, heads, n]). Keys and values:
    the given ones ([heads, n, d] or [1, heads, n, d]), random from `seed`, else zeros (most rules never
    read them). `heads` KV heads (from the keys when given, else 2), `groups` query heads per KV head.
    `rows` ([query heads, w, n] or fewer dimensions, for one KV head) and `column_sums` ([n], [heads, n]
    or [1, query heads, n]) are the attention the rule reads. `num_new`: 1 at decode, every slot at prefill.
    """
    if keys is not None:
        keys = torch.as_tensor(keys)
        heads = keys.shape[-3]
    heads = 2 if heads is None else heads
    if positions is not None:
        positions = torch.as_tensor(positions)
        n = positions.shape[-1]
        if positions.dim() == 1:
            positions = positions.expand(1, heads, n).clone()
    elif n is None:
        n = keys.shape[-2]
    if positions is None:
        positions = torch.arange(n).expand(1, heads, n)
    if keys is None:
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        draw = torch.zeros if generator is None else lambda *shape: torch.randn(*shape, generator=generator)
        keys, values = draw(1, heads, n, 4), draw(1, heads, n, 4)
    keys, values = (t[None].clone() if t.dim() == 3 else t for t in (keys, torch.as_tensor(values)))
    if rows is not None:
        rows = torch.as_tensor(rows, dtype=torch.float32)
        if rows.dim() < 4:
            rows = rows.reshape(1, heads * groups, -1, n)
    if column_sums is not None:
        column_sums = torch.as_tensor(column_sums, dtype=torch.float32)
        if column_sums.dim() < 3:
            column_sums = column_sums.expand(1, heads * groups, n).clone()
    if num_new is None:
        num_new = n if phase is Phase.PREFILL else 1
    return LayerView(
        phase=phase,
        keys=keys,
        values=values,
        positions=positions,
        num_new=num_new,
        num_kv_groups=groups,
        rows=rows,
        column_sums=column_sums,
    )


def kept(eviction: Eviction, n: int) -> list[list[int]]:
    """Kept slots per KV head of batch row 0, whether the method named them or the one it dropped."""
    if eviction.dropped is not None:
        return [[i for i in range(n) if i != d] for d in eviction.dropped[0, :, 0].tolist()]
    return eviction.keep[0].tolist()


# ---- the CLI ---------------------------------------------------------------------------------------
@dataclass
class CliResult:
    """What one in-process call of the CLI's entry point left: its exit code and output."""

    returncode: int
    stdout: str
    stderr: str


def assert_one_line_error(result, *expected: str) -> None:
    """`result` (a CliResult or a CompletedProcess) is a user error: exit code 2, no traceback, and one
    line `error: ...` on stderr that contains every text in `expected`."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in (result.stdout or "")
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for text in expected:
        assert text in lines[0], lines[0]


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300, python: Sequence[str] = (), **kwargs
) -> subprocess.CompletedProcess:
    """`python -m polykv.cli ARGS` as a real process (text output captured); `python`: interpreter options."""
    return subprocess.run(
        [sys.executable, *python, "-m", "polykv.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,
    )


# ---- the fast loop ----------------------------------------------------------------------------------
def slow_after(values: Sequence, keep: int = 1, family: Callable[[Any], str] | None = None) -> list:
    """Parameters for `pytest.mark.parametrize`: the first `keep` values (of each family, when `family`
    names one per value) run in the fast loop, the others under `slow` (CI runs them all). For
    parametrized tests whose every case takes seconds (a real process, an app page)."""
    seen: dict[str, int] = {}
    params = []
    for value in values:
        group = family(value) if family is not None else ""
        seen[group] = seen.get(group, 0) + 1
        if seen[group] <= keep:
            params.append(value)
        else:
            params.append(pytest.param(*(value if isinstance(value, tuple) else (value,)), marks=pytest.mark.slow))
    return params


# ---- the web app through Streamlit's AppTest --------------------------------------------------------
def open_app(page: str | None = None):
    """The app's first page (the designer), or `page` of app/views/, run once; no exception raised."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    if page:
        at.switch_page(f"views/{page}.py")
        at.run()
    assert not at.exception, [(e.value, e.stack_trace) for e in at.exception]
    return at


def button(at, label: str):
    found = [b for b in at.button if b.label == label]
    assert found, f"no button {label!r}: {[b.label for b in at.button]}"
    return found[0]


def texts(elements) -> list[str]:
    return [e.value for e in elements]


# ---- results and jobs --------------------------------------------------------------------------------
def fake_run(
    store,
    run_id: str,
    scores: dict[str, dict[str, float]],
    status: str = "finished",
    *,
    model: str = "demo",
    plan_name: str | None = None,
    samples: bool = True,
    plan_json: str = "{}",
    suite: str = "fidelity",
    settings: dict | None = None,
) -> None:
    """A run in `store` with the given task scores and status, computing nothing; `samples`: one stored
    sample per task (so that it reads as done), else none."""
    store.create_run(
        run_id,
        model=model,
        plan_name=plan_name or run_id,
        plan_hash="h",
        plan_json=plan_json,
        suite=suite,
        settings=settings or {},
        seed=0,
        total_samples=len(scores),
        versions={},
    )
    if samples:
        for task, metrics in scores.items():
            store.add_sample(run_id, task, "0", metrics, 0.1)
    store.set_task_scores(run_id, scores, {t: 1 for t in scores})
    store.set_status(run_id, status)


def run_row(run_id: str, status: str = "finished", **fields: Any) -> RunRow:
    """A run as the store reads it back, made by hand (what a test says about it in `fields`, the rest filler)."""
    filler = dict(model="demo", plan_name=run_id, plan_hash="h", plan_json="{}", suite="fidelity", settings="{}")
    filler |= dict(seed=0, total_samples=1, versions="{}", created="2026-01-01T00:00:00.000+00:00")
    return RunRow(id=run_id, status=status, **{**filler, **fields})


def wait_until(condition: Callable[[], Any], timeout: float, describe: Callable[[], str] = lambda: "") -> Any:
    """Poll `condition` until it returns something true, and return that. A hang guard, not a timing
    check: `timeout` (seconds) only turns a hang into a failure, so make it generous."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {timeout:.0f} s (a hang?) {describe()}")
        time.sleep(0.2)


def wait_for_job(job, workspace: Path, until: Callable[[Any], bool] | None = None, timeout: float = 600):
    """The job's state once `until(state)` holds (default: the job has ended and its worker exited);
    AssertionError with its log as soon as the job ends without it, or if it never holds (see
    `wait_until`)."""
    from polykv import jobs

    ended = until is None  # then also wait for the worker to exit: it writes its final state just before
    until = until or (lambda s: s.status in jobs.FINAL)

    def reached():
        state = jobs.state(jobs.load_job(workspace, job.id), workspace)
        if until(state):
            return state
        assert state.status not in jobs.FINAL, f"the job ended first: {state}\n{jobs.log_tail(job, workspace)}"
        return None

    def why():
        return f"{jobs.state(job, workspace)}\n{jobs.log_tail(job, workspace)}"

    state = wait_until(reached, timeout, why)
    if ended:  # a loaded machine can take seconds to tear an interpreter down
        wait_until(lambda: not jobs._alive(jobs.load_job(workspace, job.id), workspace), timeout, why)
    return state


def stop(*processes: subprocess.Popen) -> None:
    """Kill and reap each process that is still running."""
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


# ---- processes a test leaves behind -------------------------------------------------------------------
class LeftoverProcessWarning(UserWarning):
    """A test left a process running (a job worker, a backend's subprocess, a `sleep`); it was stopped.
    `-W error::tests.helpers.LeftoverProcessWarning` makes that an error of the test."""


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str
    start: int  # clock ticks since boot: with the pid, it names one process even after the pid is reused


def _read_stat(pid: int) -> Proc | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return Proc(pid, int(fields[1]), fields[0], int(fields[19]))


def descendants(root: int | None = None) -> dict[int, Proc]:
    """Every live process (zombies left out) whose parent chain leads to `root` (this process)."""
    root = os.getpid() if root is None else root
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (proc := _read_stat(int(entry.name))) is not None:
            table[proc.pid] = proc
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = table[pid]
        todo.extend(children.get(pid, []))
    return {pid: proc for pid, proc in found.items() if proc.state not in ("Z", "X")}


def started_since(before: dict[int, Proc], root: int | None = None) -> dict[int, Proc]:
    """The live descendants of `root` (this process) started since `before` (a `descendants()`) through
    new processes only: what `root` itself started and what those started, not what a process that
    was already there (a server, a browser) started meanwhile."""
    root = os.getpid() if root is None else root
    now = descendants(root)
    new = {pid: proc for pid, proc in now.items() if pid not in before or before[pid].start != proc.start}
    started = {}
    for pid, proc in new.items():
        while proc is not None and proc.ppid != root:
            proc = new.get(proc.ppid)
        if proc is not None:
            started[pid] = new[pid]
    return started


def command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200]


def _still_there(procs: dict[int, Proc]) -> dict[int, Proc]:
    left = {}
    for pid, proc in procs.items():
        now = _read_stat(pid)
        if now is not None and now.start == proc.start and now.state not in ("Z", "X"):
            left[pid] = proc
    return left


def stop_processes(procs: dict[int, Proc], grace: float = 2.0, term_wait: float = 5.0) -> dict[int, str]:
    """Stop `procs`: give them `grace` seconds to end by themselves (a worker that has just written its
    final state), then SIGTERM, then SIGKILL what is left after `term_wait` seconds. Returns the
    command line of each one that had to be signalled. A pid is signalled only while it still names the
    same process (same start time)."""
    deadline = time.monotonic() + grace
    while (procs := _still_there(procs)) and time.monotonic() < deadline:
        time.sleep(0.05)
    signalled = {pid: command_line(pid) for pid in procs}
    for sig, wait in ((signal.SIGTERM, term_wait), (signal.SIGKILL, term_wait)):
        for pid in _still_there(procs):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while (procs := _still_there(procs)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not procs:
            break
    return signalled


def with_profile(workspace: Path, profile) -> Path:
    """`workspace` with a copy of `profile` in its profiles folder (as the app and the jobs find it)."""
    import shutil

    shutil.copytree(profile.path, Path(workspace) / "profiles" / profile.key)
    return Path(workspace)


def plan_of(methods: list[str], capacities: list[int], scope: str = "decode") -> Plan:
    """A validated plan with method[l] at capacity[l] in every phase of `scope` (parameters that fit)."""
    from polykv.methods import params_that_fit, validate_plan

    phases = Scope(scope).phases
    layers = [
        LayerPlan(**{p.value: PhaseAssignment(method=m, capacity=c, params=params_that_fit(m, c)) for p in phases})
        for m, c in zip(methods, capacities)
    ]
    return validate_plan(Plan(name="-".join(methods), scope=scope, layers=layers))


def random_sequences(n: int, length: int, vocab: int, seed: int = 1, bos: int = 1) -> list[list[int]]:
    """n token sequences: `bos`, then length - 1 random ids in [2, vocab)."""
    g = torch.Generator().manual_seed(seed)
    return [[bos] + torch.randint(2, vocab, (length - 1,), generator=g).tolist() for _ in range(n)]


# ---- GGUF files ------------------------------------------------------------------------------------------
def write_tiny_gguf(path: Path, architecture: str = "llama", layers: int = 2, random_bytes: bool = False) -> Path:
    """A tiny random-weight GGUF model file (float32 tensors, a byte-level BPE vocabulary and a chat template),
    written with the `gguf` package the way llama.cpp lays one out. `random_bytes`: the header and the
    tensor table are real, the tensor data random bytes (NaN and infinities among them), as in a damaged file."""
    import gguf
    import numpy as np
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    writer = gguf.GGUFWriter(str(path), architecture)
    d, heads, kv, ff = 64, 4, 2, 128
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *bytes_to_unicode().values(), "Ġt", "he"]
    writer.add_name("tiny-test")
    writer.add_block_count(layers)
    writer.add_context_length(512)
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_rope_dimension_count(d // heads)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_token_merges(["Ġ t", "h e"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    rng = np.random.default_rng(0)

    def tensor(name: str, *shape: int) -> None:
        if random_bytes:
            writer.add_tensor(name, np.frombuffer(rng.bytes(4 * int(np.prod(shape))), np.float32).reshape(shape))
        else:
            writer.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    tensor("token_embd.weight", len(tokens), d)
    writer.add_tensor("output_norm.weight", np.ones(d, np.float32))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(d, np.float32))
        tensor(f"blk.{i}.attn_q.weight", d, d)
        tensor(f"blk.{i}.attn_k.weight", kv * d // heads, d)
        tensor(f"blk.{i}.attn_v.weight", kv * d // heads, d)
        tensor(f"blk.{i}.attn_output.weight", d, d)
        tensor(f"blk.{i}.ffn_gate.weight", ff, d)
        tensor(f"blk.{i}.ffn_up.weight", ff, d)
        tensor(f"blk.{i}.ffn_down.weight", d, ff)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
