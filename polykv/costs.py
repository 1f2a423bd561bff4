"""What a launch will cost on this machine, said before it starts, and checked against the run afterwards.

The cost model has two parts:

- **Rates**, measured per model and device (`measure_rates`: a few seconds): one forward pass of `new` tokens
  over `context` cached ones, for `batch` rows, takes

      fixed_s + batch * (token_s * new + pair_s * new * (context + new / 2))

  fixed_s is the per-call overhead (Python, kernel launches), token_s the weights' work per token and pair_s
  attention's per query-key pair. They are fitted (non-negative least squares) to timed prompt passes and
  decode steps at two lengths; a decode step under a plan's routed cache (TOVA evicting in every layer, a cache
  as long) adds routed_s per row, its methods' work. With the model's load time they are kept in
  `$POLYKV_HOME/rates.json`.
- **Work**: what a launch runs, counted as forward passes of those shapes (`polykv.eval.launch.work` counts them
  for each kind of launch: eval, profile, heterogeneity, experiment, study, search).

An estimate is the work priced at the rates, times a correction per kind of launch: the median ratio of
measured time to the model's (uncorrected) estimate over the last finished jobs of that kind on this model and
device (1 until one finished), so what the simple model misses (methods' scoring, Python between steps) is
learned from runs.
Memory is the weights plus the largest batch's full KV cache.
"""

from __future__ import annotations

import datetime
import inspect
import os
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from polykv.errors import FileError
from polykv.files import atomic_write_json, file_lock, read_json
from polykv.text import duration

RATES_FILE = "rates.json"
LOCK_WAIT_S = 30.0  # how long a launch waits for another process writing the rates file, then says so in one line
HISTORY = 5  # finished jobs per kind whose measured / estimated ratio corrects the next estimates
CORRECTION_RANGE = (0.25, 4.0)  # a correction outside this says the model is wrong, not that it needs a factor
# The factor within which a test holds the estimate of a real small run (tests/test_costs.py).
STATED_FACTOR = 3.0
BUSY_STRETCH = 1.5  # a load that would stretch a CPU launch this much is said (one busy core of two, or more)


@dataclass(frozen=True)
class Forward:
    """`count` forward passes of `new` tokens each over `context` cached tokens, `batch` rows at once."""

    count: float
    new: int
    context: int = 0
    batch: int = 1
    routed: bool = True  # under a plan's routed cache: its methods' work per layer comes on top


@dataclass(frozen=True)
class Work:
    """What a launch runs: model loads and forward passes; `kv_tokens` the longest sequence a batch holds in
    full and `kv_rows` how many rows hold it at once (for the memory estimate)."""

    kind: str  # eval, profile, heterogeneity, experiment, study, search
    forwards: tuple[Forward, ...]
    loads: int = 1
    kv_tokens: int = 0
    kv_rows: int = 1
    what: str = ""  # one phrase: "24 samples x 2 plans at 4,096 tokens"
    timed_s: float = 0.0  # seconds priced by timing, not by the rates: building a suite's samples

    def __add__(self, other: Work) -> Work:
        return Work(
            self.kind,
            self.forwards + other.forwards,
            self.loads + other.loads,
            max(self.kv_tokens, other.kv_tokens),
            max(self.kv_rows, other.kv_rows),
            "; ".join(w for w in (self.what, other.what) if w),
            self.timed_s + other.timed_s,
        )

    def loaded(self, loads: int) -> Work:
        return replace(self, loads=loads)


# A stored rate outside these is not a measurement (a hand-edited or damaged file): the rates are measured again.
_MOST_SECONDS = 3600.0  # for one forward pass, or a load
_MOST_BYTES = 2**50


class _RatesFields(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    fixed_s: float = Field(ge=0, le=_MOST_SECONDS)
    token_s: float = Field(ge=0, le=_MOST_SECONDS)
    pair_s: float = Field(ge=0, le=_MOST_SECONDS)
    routed_s: float = Field(ge=0, le=_MOST_SECONDS)
    load_s: float = Field(ge=0, le=_MOST_SECONDS)
    weights_bytes: int = Field(ge=0, le=_MOST_BYTES)
    kv_token_bytes: int = Field(ge=0, le=_MOST_BYTES)
    measured: str = Field(pattern=r"^[0-9T:.+-]{10,40}$")  # an ISO time: nothing a terminal would act on
    # kind -> measured / estimated, newest last
    ratios: dict[str, list[float]] = Field(default_factory=dict)


@dataclass(frozen=True)
class Rates:
    """A model's measured speed on one device (see the module docstring)."""

    model: str
    device: str
    fixed_s: float
    token_s: float
    pair_s: float
    routed_s: float  # what a forward under a plan's routed cache adds, per row (its methods' scoring, the hook)
    load_s: float
    weights_bytes: int
    kv_token_bytes: int  # keys and values of one token in every layer
    measured: str  # when (UTC, ISO)
    ratios: dict[str, list[float]] = field(default_factory=dict)

    def forward_s(self, new: int, context: int = 0, batch: int = 1, routed: bool = False) -> float:
        routing = self.routed_s * batch if routed else 0.0
        return self.fixed_s + routing + batch * (self.token_s * new + self.pair_s * new * (context + new / 2))

    def correction(self, kind: str) -> float:
        ratios = self.ratios.get(kind) or []
        if not ratios:
            return 1.0
        low, high = CORRECTION_RANGE
        return min(high, max(low, statistics.median(ratios)))


@dataclass(frozen=True)
class Estimate:
    seconds: float  # the model's estimate times the correction learned from finished jobs
    memory_bytes: int
    work: Work
    rates: Rates
    correction: float
    load: float | None = None  # the machine's load (1-minute average) when estimated, beside its `cores`
    cores: int = 1

    @property
    def stretch(self) -> float:
        """How much longer other work may make it on a CPU: its cores shared with `load` runnable tasks (else 1)."""
        if self.load is None or not self.rates.device.startswith("cpu"):
            return 1.0
        return 1.0 + self.load / self.cores

    @property
    def model_seconds(self) -> float:
        """The cost model's own estimate, before the correction (what a finished job's time is compared with)."""
        return self.seconds / self.correction

    def line(self) -> str:
        """`estimate: about 3 min 5 s and 1.2 GiB here (cpu; 24 samples x 2 plans at 4,096 tokens)`."""
        learned = f", x{self.correction:.2f} from earlier {self.work.kind} jobs" if self.correction != 1.0 else ""
        what = f"; {self.work.what}" if self.work.what else ""
        busy = (  # threads that outnumber the cores slow each other more than this
            f"; this machine is busy (load {self.load:.1f} on {self.cores} cores): expect x{self.stretch:.1f} that "
            f"or more, about {duration(self.seconds * self.stretch)}"
            if self.stretch >= BUSY_STRETCH
            else ""
        )
        return (
            f"estimate: about {duration(self.seconds)} and {self.memory_bytes / 2**30:.1f} GiB on "
            f"{self.rates.device}{what} (speed measured {self.rates.measured[:10]}{learned}){busy}"
        )


def estimate(work: Work, rates: Rates) -> Estimate:
    raw = work.timed_s + work.loads * rates.load_s
    raw += sum(f.count * rates.forward_s(f.new, f.context, f.batch, f.routed) for f in work.forwards)
    correction = rates.correction(work.kind)
    memory = rates.weights_bytes + rates.kv_token_bytes * work.kv_tokens * max(1, work.kv_rows)
    return Estimate(raw * correction, memory, work, rates, correction, *machine_load())


def machine_load() -> tuple[float | None, int]:
    """(the 1-minute load average, the cores this process may use); None where the system has no load average."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        return os.getloadavg()[0], cores
    except (OSError, AttributeError):
        return None, cores


# ---- stored rates -------------------------------------------------------------------------------------
def rates_path() -> Path:
    from polykv.models import polykv_home

    return polykv_home() / RATES_FILE


def _key(model: str, device: str) -> str:
    return f"{model}|{device}"


def _read_all(path: Path, warn: bool = False) -> dict[str, dict]:
    if not path.is_file():
        return {}
    try:
        data = read_json(path, "rates file")
    except FileError:
        if warn:
            _warn(f"warning: {path}: not a rates file; measuring again")
        return {}  # a damaged rates file is measured again, never fatal
    return data if isinstance(data, dict) else {}


_WARNED: set[str] = set()  # a damaged rates file is said once per process, however often its rates are read


def _warn(line: str) -> None:
    import sys

    if line not in _WARNED:
        _WARNED.add(line)
        print(line, file=sys.stderr)


def stored_rates(model: str, device: str) -> Rates | None:
    """The rates measured for `model` on `device` on this machine, or None (never measured, or damaged: then
    measured again and rewritten, with one warning on stderr)."""
    entry = _read_all(rates_path(), warn=True).get(_key(model, device))
    if entry is None:
        return None
    try:
        fields = _RatesFields.model_validate(entry)
    except (ValidationError, OverflowError, ValueError):
        _warn(f"warning: {rates_path()}: the rates of {model} on {device} are not a measurement; measuring again")
        return None
    ratios = {kind: [r for r in values if 0 < r < 1e6] for kind, values in fields.ratios.items() if kind.isidentifier()}
    return Rates(model, device, **(fields.model_dump() | {"ratios": ratios}))


def _locked():
    """One writer of the rates file at a time (a worker recording its ratio while the app measures a speed)."""
    path = rates_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    return file_lock(path.with_name(RATES_FILE + ".lock"), timeout=LOCK_WAIT_S)


def _save(rates: Rates) -> None:
    path = rates_path()
    everything = _read_all(path)
    data = asdict(rates)
    del data["model"], data["device"]
    everything[_key(rates.model, rates.device)] = data
    atomic_write_json(path, everything)


def save_rates(rates: Rates) -> None:
    with _locked():
        _save(rates)


def record_ratio(model: str, device: str, kind: str, model_estimate_s: float, measured_s: float) -> None:
    """Remember how a finished job's measured time compared with the cost model's own estimate for it (before
    any correction: a corrected estimate would make the correction converge to its square root)."""
    if model_estimate_s <= 0 or measured_s <= 0:
        return
    with _locked():
        rates = stored_rates(model, device)
        if rates is None:
            return
        ratios = dict(rates.ratios)
        ratios[kind] = [*ratios.get(kind, []), measured_s / model_estimate_s][-HISTORY:]
        _save(replace(rates, ratios=ratios))


# ---- measuring ------------------------------------------------------------------------------------------
def _median_time(run, repeats: int = 3, device: str = "cpu") -> float:
    """The median wall time of `run()`; on an accelerator, its queued kernels included (synchronised)."""
    import torch

    def wait():
        if str(device).startswith("cuda"):
            torch.cuda.synchronize(device)

    times = []
    for _ in range(repeats):
        wait()
        start = time.perf_counter()
        run()
        wait()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _fit(rows: Sequence[tuple[int, int]], seconds: Sequence[float]) -> tuple[float, float, float]:
    """(fixed_s, token_s, pair_s) >= 0 fitting forward passes of (new, context) to their measured seconds."""
    import numpy as np
    from scipy.optimize import nnls

    design = np.array([[1.0, new, new * (context + new / 2)] for new, context in rows])
    scale = design.max(axis=0)  # columns of very different sizes: solve in units of each column's largest
    solution, _ = nnls(design / scale, np.array(seconds))
    fixed, token, pair = (solution / scale).tolist()
    return fixed, token, pair


def _routed_step_s(model, ids, length: int, device: str) -> float:
    """A decode step's seconds under a routed plan (TOVA evicting in every layer), after its prompt. Its capacity
    is just under the prompt, so the cache is as long as the plain step's: the difference is the routing's cost,
    not a shorter cache's saving."""
    from polykv.models import cache_argument_name, num_layers, output_cache
    from polykv.plan import Plan
    from polykv.runtime.routed import routed

    plan = Plan.homogeneous("tova", max(1, length - 8), num_layers(model))
    with routed(model, plan):
        cache = output_cache(model(ids, use_cache=True, logits_to_keep=1))
        step_input = {"input_ids": ids[:, -1:], cache_argument_name(model): cache, "use_cache": True}
        return _median_time(lambda: model(**step_input), repeats=5, device=device)


def measure_rates(model, name: str, device: str, load_s: float | None = None, lengths: Iterable[int] = ()) -> Rates:
    """Time prompt passes and decode steps of `model` (loaded on `device`) at two lengths and fit the rates.
    About ten seconds on a 135M model on a laptop CPU; `load_s`: the load time measured by the caller
    (else the stored one, else 0)."""
    import torch

    from polykv.models import cache_argument_name, context_length, output_cache
    from polykv.models.support import dtype_bytes, model_bytes

    context = context_length(model) or 2048
    chosen = tuple(lengths) or (min(128, context // 4), min(512, context // 2))
    vocab = int(model.config.get_text_config().vocab_size)
    generator = torch.Generator().manual_seed(0)
    # a prompt pass as the runs make it: the last position's logits only (a 262K vocabulary's are large)
    last_logits = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    rows, seconds = [], []
    with torch.inference_mode():
        for length in chosen:
            ids = torch.randint(3, vocab, (1, length), generator=generator).to(device)
            prompt = _median_time(lambda ids=ids: model(ids, use_cache=False, **last_logits), device=device)
            rows.append((length, 0))
            seconds.append(prompt)
            cache = output_cache(model(ids, use_cache=True))
            step_input = {"input_ids": ids[:, -1:], cache_argument_name(model): cache, "use_cache": True}

            def step(step_input=step_input):
                model(**step_input)  # the context grows by one per step: 5 steps on hundreds are the same

            rows.append((1, length))
            seconds.append(_median_time(step, repeats=5, device=device))
        # at the longest length: a routed decode step against the plain one just timed
        routed_extra = _routed_step_s(model, ids, length, device) - seconds[-1]
    fixed, token, pair = _fit(rows, seconds)
    previous = stored_rates(name, device)
    config = model.config.get_text_config()
    weights, kv_token = model_bytes(config, dtype_bytes(None, config))
    rates = Rates(
        name,
        device,
        fixed,
        token,
        pair,
        max(0.0, routed_extra),
        load_s if load_s is not None else previous.load_s if previous else 0.0,
        weights,
        kv_token,
        datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        previous.ratios if previous else {},
    )
    save_rates(rates)
    return rates


def rates_for(model, name: str, device: str, load_s: float | None = None) -> Rates:
    """The stored rates, else measured now (the model is loaded)."""
    stored = stored_rates(name, device)
    if stored is not None:
        if load_s is not None and stored.load_s == 0:
            stored = replace(stored, load_s=load_s)
            save_rates(stored)
        return stored
    return measure_rates(model, name, device, load_s)


__all__ = [
    "CORRECTION_RANGE",
    "STATED_FACTOR",
    "Estimate",
    "Forward",
    "Rates",
    "Work",
    "estimate",
    "measure_rates",
    "rates_for",
    "record_ratio",
    "save_rates",
    "stored_rates",
]
