"""System characterization (in the style of a paper's Appendix E): memory and throughput of every
configuration at several prompt lengths.

For each configuration and each prompt length it runs one prefill and `--new-tokens` greedy decode steps
and measures

  steady KV       the storage the cache's key and value tensors really hold after prefill + decode
                  (`runtime.kv_bytes`: tensor storage bytes, a storage shared by keys and values counted
                  once), next to the nominal bytes the plan's capacities imply (`runtime.nominal_slots` x
                  KV heads x head dim x 2 x bytes per element; vanilla and `full`: prompt + new tokens in
                  every layer; native allocation: L x the average budget, split over layers at run time)
  peak memory     CPU: "peak KV MiB", the largest KV storage held, sampled after prefill and after every
                  decode step (the process's RSS is too coarse and noisy to isolate a cache's growth, so
                  this is the honest number: it does not see transient buffers inside a forward pass).
                  GPU: "peak GPU MiB", `torch.cuda.max_memory_allocated` over the run (stats reset before
                  each run): weights, activations and cache together
  prefill tok/s   prompt length / prefill seconds (one forward pass over the prompt, logits of the last
                  position only)
  decode tok/s    new tokens / decode seconds (the greedy steps; the host time of the KV sampling above is
                  left out)

Configurations: `vanilla HF` (DynamicCache + SDPA, no routed cache), a `full` plan, an H2O/TOVA
composition (fixed plan, scope both, H2O in even layers and TOVA in odd ones, the same capacity
everywhere), then every method of `polykv.eval.method_protocols.baseline_methods()` alone, under its authors'
standalone protocol (`baseline_plan` at the same per-layer capacity; native allocation splits L x that
budget itself). Configurations are interleaved within each repetition; medians are reported.

With `--kvpress`, NVIDIA's kvpress runs side by side: TOVA, StreamingLLM, Knorm and SnapKV presses at the
same capacity and in the same phases as PolyKV's protocol for that method (prefill: compression_ratio so
that `capacity` prompt tokens are kept; decode: `DecodingPress` evicting back to `capacity` every step),
with a vanilla row and PolyKV's row of each of those methods measured in the same process (PolyKV runs
on the transformers version kvpress needs, too). kvpress is never required: it lives in its own
virtualenv, `benchmarks/.kvpress-venv`, created once, that reuses this venv's packages (torch included:
nothing there downloads a torch) and adds kvpress with `--no-deps`, plus the transformers version kvpress
supports when this venv's is newer. If that fails, one line says why and the table goes on without those
rows. Those rows come from a second process run after the main table: compare them with each other and
with their own `vanilla HF (kvpress env)` row.

    python benchmarks/system.py                      # CPU: random Llama (hidden 512, 8 layers), fp32,
                                                     #   prompts 1024 4096 8192, capacity 256, 32 new tokens
    python benchmarks/system.py --threads 2 --reps 3 --kvpress
    python benchmarks/system.py --device cuda        # GPU: Llama-3.1-8B shape, bf16, prompts 8192 32768
                                                     #   65536, capacity 1024 (default when CUDA is present)
    python benchmarks/system.py --quick [--kvpress]  # smoke test in seconds: 2 layers, prompts 256 512

Writes `<out>/system-<device>.json` (every measurement) and `<out>/system-<device>.png` (matplotlib, Agg
backend; the plot is skipped with one line if matplotlib is missing), `system-<device>-quick.*` with
`--quick`. Both are written to a temporary file first and renamed, so no half-written file is left.
Weights are random: no network, only the shapes matter.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(1, str(Path(__file__).resolve().parent))
from gpu_check import LLAMA_31_8B  # noqa: E402
from runtime import CPU_CONFIG, build_model, cpu_name, kv_bytes, nominal_bytes, nominal_slots, run_once  # noqa: E402

from polykv.eval.method_protocols import baseline_methods, baseline_plan  # noqa: E402
from polykv.files import atomic_write_bytes, atomic_write_json  # noqa: E402
from polykv.plan import Phase, Plan, Scope  # noqa: E402
from polykv.runtime import routed  # noqa: E402

HERE = Path(__file__).resolve().parent
KVPRESS_VENV = HERE / ".kvpress-venv"
KVPRESS_VERSION = "0.5.5"
# kvpress 0.5.5 needs transformers >=4.56,<5.3. When this venv's transformers is outside that range the
# kvpress venv gets its own (which wins over this venv's on sys.path), with the huggingface_hub and
# tokenizers versions that transformers accepts and httpx, which huggingface_hub 1.x imports.
KVPRESS_TRANSFORMERS = ">=4.56,<5.3"
TRANSFORMERS_STACK = [
    f"transformers{KVPRESS_TRANSFORMERS}",
    "kernels>=0.10.2,<0.11",  # what those transformers import when it is there (this venv's may be newer)
    "huggingface_hub>=1.3,<2",
    "tokenizers>=0.22,<=0.23.0",
    "httpx<1",
    "httpcore<2",
]
# Imported by `import kvpress` (it imports every press); small pure-Python packages.
KVPRESS_DEPS = ["cachetools>=5.5.2,<6", "fire>=0.6,<0.7", "termcolor"]
# PolyKV methods with a kvpress press of the same rule, and the kvpress parameters of PolyKV's parameters.
KVPRESS_PRESSES = {
    "streamingllm": ("StreamingLLMPress", {"sinks": "n_sink"}),
    "tova": ("TOVAPress", {}),
    "knorm": ("KnormPress", {}),
    "snapkv": ("SnapKVPress", {"window": "window_size", "kernel_size": "kernel_size"}),
}


@dataclass
class Config:
    label: str
    kind: str  # "vanilla" | "polykv" | "kvpress"
    plan: Plan | None  # polykv: the plan run; kvpress: the plan its press mirrors (for nominal bytes)
    press: Callable[[int], Any] | None = None  # kvpress: prompt length -> a fresh press
    positions: bool = False  # explicit decode position ids (kvpress shortens the cache)


@dataclass
class Cell:
    """The measurements of one configuration at one prompt length."""

    config: str
    kind: str
    prompt_len: int
    new_tokens: int
    plan: str | None
    prefill_s: list[float] = field(default_factory=list)
    decode_s_per_token: list[float] = field(default_factory=list)
    kv_held_bytes: list[int] = field(default_factory=list)
    kv_nominal_bytes: int = 0
    peak_kv_bytes: list[int] = field(default_factory=list)
    peak_gpu_bytes: list[int] = field(default_factory=list)
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        med = statistics.median
        done = bool(self.prefill_s)
        return {
            **asdict(self),
            "prefill_tokens_per_s": self.prompt_len / med(self.prefill_s) if done else None,
            "decode_tokens_per_s": 1 / med(self.decode_s_per_token) if done else None,
            "kv_held_bytes_median": med(self.kv_held_bytes) if done else None,
            "peak_kv_bytes_max": max(self.peak_kv_bytes) if done else None,
            "peak_gpu_bytes_max": max(self.peak_gpu_bytes) if self.peak_gpu_bytes else None,
        }


# ---- configurations ---------------------------------------------------------------------------------
def h2o_tova_plan(num_layers: int, capacity: int) -> Plan:
    layers = [
        {phase.value: {"method": "h2o" if i % 2 == 0 else "tova", "capacity": capacity} for phase in Phase}
        for i in range(num_layers)
    ]
    return Plan.model_validate(
        {
            "name": f"h2o-tova-both-{capacity}",
            "description": f"H2O in even layers, TOVA in odd ones, capacity {capacity} in both phases.",
            "scope": "both",
            "allocation": "fixed",
            "provenance": {"built_by": "benchmarks/system.py"},
            "layers": layers,
        }
    )


def protocol_label(plan: Plan, method: str, capacity: int) -> str:
    native = " native" if plan.allocation == "native" else ""
    return f"{method} {plan.scope.value}{native} @{capacity}"


def polykv_configs(num_layers: int, capacity: int) -> list[Config]:
    configs = [
        Config("vanilla HF", "vanilla", None),
        Config("full", "polykv", Plan.homogeneous("full", None, num_layers)),
        Config(f"h2o/tova both @{capacity}", "polykv", h2o_tova_plan(num_layers, capacity)),
    ]
    for method in baseline_methods():  # a new method adds a row
        plan = baseline_plan(method, capacity, num_layers)
        configs.append(Config(protocol_label(plan, method, capacity), "polykv", plan))
    return configs


def keep_ratio(prompt_len: int, capacity: int) -> float:
    """kvpress's compression_ratio that keeps `capacity` prompt tokens: it keeps int(n * (1 - ratio)), so
    aim half a token above to be safe from float rounding."""
    return 0.0 if prompt_len <= capacity else (prompt_len - capacity - 0.5) / prompt_len


def kvpress_configs(kvpress: types.ModuleType, num_layers: int, capacity: int) -> list[Config]:
    configs = [Config("vanilla HF (kvpress env)", "vanilla", None, positions=True)]
    for method, (press_name, names) in KVPRESS_PRESSES.items():
        plan = baseline_plan(method, capacity, num_layers)  # same phases and parameters as PolyKV's row
        params = {names[k]: v for k, v in plan.layers[0][plan.scope.phases[0]].params.items() if k in names}
        scorer = getattr(kvpress, press_name)

        def make(prompt_len: int, scorer=scorer, params=params, scope=plan.scope) -> Any:
            prefill = scorer(compression_ratio=keep_ratio(prompt_len, capacity), **params)
            # interval 1 and no hidden-state buffer: the exact per-step rule, as PolyKV's interval 1
            decode = kvpress.DecodingPress(
                base_press=scorer(**params), compression_interval=1, target_size=capacity, hidden_states_buffer_size=0
            )
            if scope is Scope.PREFILL:
                return prefill
            if scope is Scope.DECODE:
                return decode
            return kvpress.PrefillDecodingPress(prefilling_press=prefill, decoding_press=decode)

        label = f"kvpress {method} {plan.scope.value} @{capacity}"
        configs.append(Config(label, "kvpress", plan, press=make, positions=True))
        # PolyKV's row of the same method in the same process (PolyKV runs on kvpress's transformers too)
        configs.append(Config(f"{protocol_label(plan, method, capacity)} (kvpress env)", "polykv", plan))
    return configs


# ---- measurement ------------------------------------------------------------------------------------
def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in str(exc)


def run_cell(model, config: Config, ids: torch.Tensor, new_tokens: int, device: str) -> dict[str, Any]:
    """One prefill + decode run of `config`; returns its measurements."""
    peak_kv = 0

    def sample(cache) -> None:
        nonlocal peak_kv
        peak_kv = max(peak_kv, kv_bytes(cache)[0])

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    if config.kind == "polykv":
        context = routed(model, config.plan)
    elif config.press is not None:
        context = config.press(ids.shape[1])(model)  # a fresh press: decoding presses keep per-run state
    else:
        context = contextlib.nullcontext()
    with context:
        prefill, decode, cache, _logits = run_once(
            model, ids, new_tokens, device, on_step=sample, positions=config.positions
        )
    del _logits
    held = kv_bytes(cache)[0]
    del cache
    return {
        "prefill": prefill,
        "decode": decode,
        "held": held,
        "peak_kv": peak_kv,
        "peak_gpu": torch.cuda.max_memory_allocated() if cuda else None,
    }


def measure(
    model,
    configs: list[Config],
    lengths: list[int],
    new_tokens: int,
    reps: int,
    device: str,
    dtype: torch.dtype,
    capacity: int,
) -> list[Cell]:
    cells = []
    # Warm-up of every code path (kernels, allocator), not measured: a prompt past the capacity, so that
    # the methods evict, but short, so that it costs little.
    warm_len = min(min(lengths), max(2 * capacity, 256))
    warm = torch.randint(3, model.config.vocab_size, (1, warm_len), generator=torch.Generator().manual_seed(1))
    for config in configs:
        try:
            run_cell(model, config, warm.to(device), 2, device)
        except (torch.OutOfMemoryError, RuntimeError) as exc:
            if not is_oom(exc):
                raise
    for prompt_len in lengths:
        gen = torch.Generator().manual_seed(prompt_len)
        ids = torch.randint(3, model.config.vocab_size, (1, prompt_len), generator=gen).to(device)
        row = {}
        for c in configs:
            slots = (
                nominal_slots(c.plan, prompt_len, new_tokens)
                or [prompt_len + new_tokens] * model.config.num_hidden_layers
            )
            plan_name = c.plan.name if c.plan is not None else None
            row[c.label] = Cell(
                c.label, c.kind, prompt_len, new_tokens, plan_name, kv_nominal_bytes=nominal_bytes(model, slots, dtype)
            )
        for rep in range(reps):
            print(f"  prompt {prompt_len}: repetition {rep + 1}/{reps}", file=sys.stderr, flush=True)
            for config in configs:  # interleaved: a drift in machine load hits every configuration alike
                cell = row[config.label]
                if cell.error:
                    continue
                try:
                    m = run_cell(model, config, ids, new_tokens, device)
                except (torch.OutOfMemoryError, RuntimeError) as exc:
                    if not is_oom(exc):
                        raise
                    cell.error = "out of memory"
                    if device.startswith("cuda"):
                        torch.cuda.empty_cache()
                    continue
                cell.prefill_s.append(m["prefill"])
                cell.decode_s_per_token.append(m["decode"])
                cell.kv_held_bytes.append(m["held"])
                cell.peak_kv_bytes.append(m["peak_kv"])
                if m["peak_gpu"] is not None:
                    cell.peak_gpu_bytes.append(m["peak_gpu"])
        cells.extend(row.values())
    return cells


# ---- kvpress, in its own virtualenv -----------------------------------------------------------------
class KvpressUnavailable(Exception):
    pass


def _tail(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in (proc.stderr or proc.stdout or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"exit status {proc.returncode}"


def _version_in(version: str, spec: str) -> bool:
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(spec).contains(version, prereleases=True)


def kvpress_python() -> Path:
    """The kvpress venv's interpreter, creating the venv first if it is not ready."""
    python = KVPRESS_VENV / "bin" / "python"
    ready = KVPRESS_VENV / ".ready"
    if python.exists() and ready.exists():
        return python
    print(f"kvpress: creating {KVPRESS_VENV.relative_to(HERE.parent)} (once)", file=sys.stderr, flush=True)
    run = dict(capture_output=True, text=True, timeout=900)
    proc = subprocess.run([sys.executable, "-m", "venv", "--clear", "--without-pip", str(KVPRESS_VENV)], **run)
    if proc.returncode:
        raise KvpressUnavailable(f"python -m venv failed: {_tail(proc)}")
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = Path(subprocess.run([str(python), "-c", code], check=True, **run).stdout.strip())
    # addsitedir, not a bare path: it also runs this venv's .pth files (the editable polykv install).
    # Appended after the kvpress venv's own site-packages, so what is installed there wins.
    lines = [f"import site; site.addsitedir({p!r})\n" for p in _site_packages()]
    (purelib / "_polykv_parent.pth").write_text("".join(lines), encoding="utf-8")
    packages = [f"kvpress=={KVPRESS_VERSION}", *KVPRESS_DEPS]
    if not _version_in(importlib.metadata.version("transformers"), KVPRESS_TRANSFORMERS):
        packages += TRANSFORMERS_STACK
    # This venv's pip installs into the other one; --no-deps: never a second torch (gigabytes of CUDA).
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--disable-pip-version-check"]
    proc = subprocess.run([*pip, "--quiet", *packages], **run)
    if proc.returncode:
        raise KvpressUnavailable(f"pip install failed: {_tail(proc)}")
    proc = subprocess.run([str(python), __file__, "--kvpress-check"], **run)
    if proc.returncode:
        raise KvpressUnavailable(f"kvpress does not import: {_tail(proc)}")
    ready.write_text(proc.stdout, encoding="utf-8")
    return python


def _site_packages() -> list[str]:
    import site

    return [p for p in site.getsitepackages() if Path(p).is_dir()]


def import_kvpress() -> types.ModuleType:
    # `import kvpress` imports every press; two of them (DuoAttention, expected-attention statistics)
    # import `datasets`, which pulls pyarrow. Without it, a stand-in that fails only if they load data.
    try:
        import datasets  # noqa: F401
    except ImportError:
        stub = types.ModuleType("datasets")

        def load_dataset(*args, **kwargs):
            raise ImportError("datasets is not installed in benchmarks/.kvpress-venv")

        stub.load_dataset = load_dataset
        sys.modules["datasets"] = stub
    import kvpress

    return kvpress


def kvpress_versions() -> dict[str, str]:
    import transformers

    return {"kvpress": importlib.metadata.version("kvpress"), "transformers": transformers.__version__}


def kvpress_cells(args: argparse.Namespace) -> tuple[list[Cell], dict[str, Any]]:
    """Runs this script in the kvpress venv (`--kvpress-child`) and reads its cells back."""
    try:
        python = kvpress_python()
    except (KvpressUnavailable, subprocess.SubprocessError, OSError) as exc:
        reason = str(exc) or type(exc).__name__
        print(f"kvpress: skipped ({reason})")
        return [], {"status": f"skipped: {reason}"}
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "kvpress.json"
        cmd = [str(python), __file__, "--kvpress-child", str(result), "--device", args.device]
        cmd += ["--lengths", *map(str, args.lengths), "--new-tokens", str(args.new_tokens)]
        cmd += ["--capacity", str(args.capacity), "--reps", str(args.reps), "--threads", str(args.threads)]
        cmd += ["--layers", str(args.layers)] + (["--model", args.model] if args.model else [])
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)  # stderr (progress) passes through
        if proc.returncode or not result.exists():
            print(f"kvpress: skipped (the kvpress run failed with exit status {proc.returncode})")
            return [], {"status": f"failed: exit status {proc.returncode}"}
        data = json.loads(result.read_text())
    cells = [Cell(**{k: v for k, v in c.items() if k in Cell.__dataclass_fields__}) for c in data["cells"]]
    return cells, {"status": "ok", **data["versions"]}


# ---- report -----------------------------------------------------------------------------------------
def mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.2f}"


def report(cells: list[Cell], cuda: bool) -> str:
    peak = "peak GPU MiB" if cuda else "peak KV MiB"
    head = (
        f"{'configuration':<36} {'KV MiB held':>12} {'KV MiB nominal':>15} {'held/nominal':>13} {peak:>13} "
        f"{'prefill tok/s':>14} {'decode tok/s':>13}"
    )
    lines = []
    for prompt_len in sorted({c.prompt_len for c in cells}):
        lines += ["", f"prompt {prompt_len} tokens, {cells[0].new_tokens} new tokens", head]
        for cell in (c for c in cells if c.prompt_len == prompt_len):
            s = cell.summary()
            if s["prefill_tokens_per_s"] is None:
                lines.append(f"{cell.config:<36} {cell.error or 'no run':>12}")
                continue
            held = s["kv_held_bytes_median"]
            peak_bytes = s["peak_gpu_bytes_max"] if cuda else s["peak_kv_bytes_max"]
            lines.append(
                f"{cell.config:<36} {mib(held):>12} {mib(cell.kv_nominal_bytes):>15} "
                f"{held / cell.kv_nominal_bytes:>13.4f} {mib(peak_bytes):>13} "
                f"{s['prefill_tokens_per_s']:>14.1f} {s['decode_tokens_per_s']:>13.1f}"
            )
    return "\n".join(lines)


def plot(cells: list[Cell], cuda: bool, title: str, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot: skipped (matplotlib is not installed)")
        return False
    panels = [
        ("prefill tokens/s", lambda s: s["prefill_tokens_per_s"], False),
        ("decode tokens/s", lambda s: s["decode_tokens_per_s"], False),
        ("steady KV MiB (held)", lambda s: s["kv_held_bytes_median"] / 2**20, True),
        (
            "peak GPU MiB" if cuda else "peak KV MiB",
            lambda s: (s["peak_gpu_bytes_max"] if cuda else s["peak_kv_bytes_max"]) / 2**20,
            True,
        ),
    ]
    labels = list(dict.fromkeys(c.config for c in cells))
    colors = plt.get_cmap("tab20")
    fig, axes = plt.subplots(2, 2, figsize=(14, 10))
    for ax, (name, value, log) in zip(axes.flat, panels):
        for i, label in enumerate(labels):
            done = [c.summary() for c in cells if c.config == label and c.prefill_s]
            if not done:
                continue
            style = "--" if label.startswith("kvpress") or "kvpress env" in label else "-"
            ax.plot(
                [s["prompt_len"] for s in done],
                [value(s) for s in done],
                style,
                marker="o",
                color=colors(i % 20),
                label=label,
            )
        ax.set_xscale("log", base=2)
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("prompt tokens")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=4, fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.12, 1, 0.96))
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    atomic_write_bytes(path, png.getvalue())
    plt.close(fig)
    return True


# ---- main -------------------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument(
        "--lengths", type=int, nargs="+", help="prompt lengths (CPU 1024 4096 8192; GPU 8192 32768 65536)"
    )
    parser.add_argument("--new-tokens", type=int, help="greedy decode steps (default 32)")
    parser.add_argument("--capacity", type=int, help="per-layer capacity (CPU 256, GPU 1024)")
    parser.add_argument("--reps", type=int, help="interleaved repetitions, medians reported (default 3)")
    parser.add_argument("--layers", type=int, help="number of layers (default: the model's)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 2 layers, prompts 256 512, 8 tokens, 1 rep")
    parser.add_argument("--kvpress", action="store_true", help="add kvpress rows (own venv, created once)")
    parser.add_argument("--out", type=Path, default=Path("docs/system"), help="output folder")
    parser.add_argument(
        "--model", help="a real model ('smollm2', a directory, a .gguf file): its weights instead of random ones"
    )
    parser.add_argument("--kvpress-child", type=Path, help=argparse.SUPPRESS)  # inside the kvpress venv
    parser.add_argument("--kvpress-check", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = args.device == "cuda"
    if args.quick:
        defaults = {"lengths": [256, 512], "new_tokens": 8, "capacity": 64, "reps": 1, "layers": 2}
    else:
        lengths = [8192, 32768, 65536] if cuda else [1024, 2048, 4096, 8192] if args.model else [1024, 4096, 8192]
        defaults = {"lengths": lengths, "new_tokens": 32, "capacity": 1024 if cuda else 256, "reps": 3}
    for key, value in defaults.items():  # explicit arguments win over --quick
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.model:
        from polykv.models import resolve_model_path

        config = json.loads((Path(resolve_model_path(args.model)) / "config.json").read_text())
        model_config = {k: config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads")}
        model_config["num_hidden_layers"] = config["num_hidden_layers"]
        if args.layers not in (None, config["num_hidden_layers"]):
            parser.error("--layers takes the random models only: a real model has its own")
    else:
        model_config = LLAMA_31_8B if cuda else CPU_CONFIG
    args.layers = args.layers or model_config["num_hidden_layers"]
    args.model_config = {**model_config, "num_hidden_layers": args.layers}
    return args


def load(args, dtype):
    """The model measured: the named one (its real weights), else a random one of the chosen shape."""
    if not args.model:
        return build_model(args.model_config, args.device, dtype)
    from polykv.models import load_model

    return load_model(args.model, device=args.device, dtype=dtype)[0]


def main() -> None:
    args = parse_args()
    if args.kvpress_check:
        import_kvpress()
        print(json.dumps(kvpress_versions()))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    model = load(args, dtype)

    if args.kvpress_child:  # in the kvpress venv: its vanilla row and the kvpress rows
        configs = kvpress_configs(import_kvpress(), args.layers, args.capacity)
        cells = measure(model, configs, args.lengths, args.new_tokens, args.reps, args.device, dtype, args.capacity)
        data = {"versions": kvpress_versions(), "cells": [asdict(c) for c in cells]}
        args.kvpress_child.write_text(json.dumps(data))
        return

    configs = polykv_configs(args.layers, args.capacity)
    cells = measure(model, configs, args.lengths, args.new_tokens, args.reps, args.device, dtype, args.capacity)
    del model
    if cuda:
        torch.cuda.empty_cache()  # room for the kvpress process's own copy of the model
    kvpress_info: dict[str, Any] = {"status": "not requested (--kvpress)"}
    if args.kvpress:
        more, kvpress_info = kvpress_cells(args)
        cells += more

    cfg = args.model_config
    where = (
        f"{torch.cuda.get_device_name()}, bf16" if cuda else f"{cpu_name()}, fp32, {torch.get_num_threads()} threads"
    )
    shape = "Llama-3.1-8B shape" if cuda else "random Llama"
    title = (
        f"{args.model or shape} (hidden {cfg['hidden_size']}, "
        f"{cfg['num_hidden_layers']} layers, {cfg['num_attention_heads']} heads, {cfg['num_key_value_heads']} "
        f"KV heads), {'its own' if args.model else 'random'} weights; {where}; capacity {args.capacity}, "
        f"{args.new_tokens} new tokens; "
        f"medians of {args.reps} interleaved runs"
        + (
            f"; kvpress {kvpress_info['kvpress']} (transformers {kvpress_info['transformers']})"
            if "kvpress" in kvpress_info
            else ""
        )
    )
    print(title)
    print(report(cells, cuda))

    args.out.mkdir(parents=True, exist_ok=True)
    model_tag = f"-{Path(args.model).stem}" if args.model else ""
    stem = f"system-{args.device}{model_tag}{'-quick' if args.quick else ''}"
    import transformers

    data = {
        "title": title,
        "device": args.device,
        "device_name": where,
        "dtype": str(dtype).removeprefix("torch."),
        "model_config": cfg,
        "settings": {k: getattr(args, k) for k in ("lengths", "new_tokens", "capacity", "reps", "threads", "quick")},
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "kvpress": kvpress_info,
        "peak_column": "peak GPU MiB: torch.cuda.max_memory_allocated"
        if cuda
        else "peak KV MiB: largest KV storage held, sampled after prefill and each decode step",
        "cells": [c.summary() for c in cells],
    }
    json_path = args.out / f"{stem}.json"
    atomic_write_json(json_path, data)
    png_path = args.out / f"{stem}.png"
    written = [json_path] + ([png_path] if plot(cells, cuda, title, png_path) else [])
    print("\nwrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()
