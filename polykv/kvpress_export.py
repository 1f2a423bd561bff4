"""A plan as a NVIDIA kvpress press (`polykv plan export --to kvpress`): a short Python file that builds the press
keeping, at a prompt of N tokens, what the plan keeps in each layer, for the library a researcher deploys with.

kvpress can express a plan that runs one of its scorers in the prefill phase only (every decode cell `full`), the
same method and parameters in every layer, with capacities written per layer (fixed allocation): one scorer press
when every layer keeps the same count, else `PerLayerCompressionPress(press, compression_ratios)`. A press keeps
int(n x (1 - ratio)) tokens of an n-token prompt, so the ratios are fixed for one prompt length: (N - c - 0.5) / N
keeps c (half a token above, safe from float rounding), 0 when N <= c.

PolyKV method -> kvpress press (PolyKV's parameter names -> kvpress's), where kvpress has the same rule:
  tova -> TOVAPress; knorm -> KnormPress; keydiff -> KeyDiffPress; random -> RandomPress (seed);
  streamingllm -> StreamingLLMPress (sinks -> n_sink); lagkv -> LagKVPress (sinks -> n_sink, lag_size);
  expected_attention -> ExpectedAttentionPress (n_future_positions, n_sink, use_covariance, use_vnorm, epsilon);
  snapkv -> SnapKVPress (window -> window_size, kernel_size) with average pooling only: kvpress pools SnapKV's
  votes by average, PolyKV by max unless told (PolyKV's defaults window 32, kernel 7, max; kvpress's 64, 5, avg).
The kept positions of the first seven were compared with kvpress 0.5.5 on a real model (benchmarks/README.md,
`kvpress_positions.py`); SnapKV's were not. H2O, Scissorhands, CAKE, CaM and D2O have no press of the same rule here,
and a native or run-time allocation is decided by the rule, not written: such plans are refused in one line.
"""

from __future__ import annotations

from polykv.methods import REGISTRY
from polykv.plan import FULL, Phase, Plan, PlanError

# PolyKV method -> (kvpress press, {PolyKV parameter: kvpress parameter})
PRESSES = {
    "tova": ("TOVAPress", {}),
    "knorm": ("KnormPress", {}),
    "keydiff": ("KeyDiffPress", {}),
    "random": ("RandomPress", {"seed": "seed"}),
    "streamingllm": ("StreamingLLMPress", {"sinks": "n_sink"}),
    "lagkv": ("LagKVPress", {"sinks": "n_sink", "lag_size": "lag_size"}),
    "expected_attention": (
        "ExpectedAttentionPress",
        {k: k for k in ("n_future_positions", "n_sink", "use_covariance", "use_vnorm", "epsilon")},
    ),
    "snapkv": ("SnapKVPress", {"window": "window_size", "kernel_size": "kernel_size"}),
}


def keep_ratio(tokens: int, capacity: int) -> float:
    """kvpress's compression_ratio that keeps `capacity` of `tokens` prompt tokens."""
    return 0.0 if tokens <= capacity else (tokens - capacity - 0.5) / tokens


def _exportable(plan: Plan) -> tuple[str, dict]:
    """The plan's one prefill method and its parameters (defaults filled in), or a PlanError naming what kvpress
    cannot express."""
    if plan.allocation != "fixed":
        raise PlanError(f"{plan.name}: allocation {plan.allocation!r} splits the budget at run time; kvpress needs "
                        "capacities written per layer (allocation 'fixed')")  # fmt: skip
    if any(layer[Phase.DECODE].method != FULL for layer in plan.layers):
        raise PlanError(f"{plan.name}: kvpress compresses the prompt only; this plan evicts in the decode phase")
    cells = [layer[Phase.PREFILL] for layer in plan.layers]
    methods = sorted({c.method for c in cells})
    if len(methods) != 1 or methods[0] == FULL:
        raise PlanError(f"{plan.name}: kvpress runs one method in every layer; this plan runs {', '.join(methods)}")
    method = methods[0]
    if method not in PRESSES:
        raise PlanError(f"{plan.name}: {method} has no kvpress press of the same rule (those: {', '.join(PRESSES)})")
    params = [{**REGISTRY[method].defaults(), **c.params} for c in cells]
    if any(p != params[0] for p in params):
        raise PlanError(f"{plan.name}: kvpress runs one press in every layer; this plan's {method} parameters differ")
    if method == "snapkv" and params[0].get("pooling") != "avg":
        raise PlanError(f"{plan.name}: kvpress's SnapKVPress pools the votes by average; this plan's snapkv pools by "
                        f"{params[0].get('pooling')} (set pooling=avg to export it)")  # fmt: skip
    return method, params[0]


def kvpress_source(plan: Plan, tokens: int, windows=None) -> str:
    """The Python file that builds the press equivalent to `plan` at a prompt of `tokens` tokens (PlanError, one
    line, when kvpress cannot express it). `windows`: the model's sliding windows (None: not known); kvpress
    compresses what a local layer holds, its window, not the prompt, so a model with local layers is refused."""
    if tokens < 1:
        raise PlanError(f"the prompt length must be a positive number of tokens (got {tokens})")
    if windows is not None and any(w is not None for w in windows):
        raise PlanError(f"{plan.name}: kvpress compresses what a sliding-window layer holds (its window), not the "
                        "prompt, so ratios for this model's local layers would keep other counts")  # fmt: skip
    method, params = _exportable(plan)
    press, names = PRESSES[method]
    arguments = ", ".join(f"{names[k]}={params[k]!r}" for k in names if k in params)
    capacities = [layer[Phase.PREFILL].capacity for layer in plan.layers]
    ratios = [round(keep_ratio(tokens, tokens if c is None else c), 12) for c in capacities]
    per_layer = len(set(capacities)) > 1
    adakv = plan.head_allocation == "adakv"
    if adakv and per_layer:
        raise PlanError(f"{plan.name}: kvpress's AdaKVPress (the adakv head rule) takes one compression ratio, and "
                        "PerLayerCompressionPress only a scorer press: give every layer the same capacity")  # fmt: skip
    head = (
        f'"""kvpress press equivalent to PolyKV plan {plan.name!r} at a prompt of {tokens} tokens\n'
        f"(written by `polykv plan export --to kvpress --tokens {tokens}`).\n\n"
        f"PolyKV runs {method} in the prefill phase with these capacities per layer (tokens kept per KV head):\n"
        f"{capacities}\n"
        "kvpress keeps int(n * (1 - ratio)) tokens of an n-token prompt: these ratios keep exactly those counts at\n"
        f"{tokens} tokens. Another prompt length needs other ratios: export again with its --tokens. On a model\n"
        "with sliding-window layers kvpress compresses a local layer's window, not the prompt: other counts there.\n"
        + ("kvpress's PerLayerCompressionPress works only with flash attention (its warning).\n" if per_layer else "")
        + (
            "Head budgets: Ada-KV (AdaKVPress); kvpress masks the pruned tokens where PolyKV evicts them: the same\n"
            "tokens, ties aside. AdaKVPress needs an attention other than eager.\n"
            if adakv
            else ""
        )
        + '"""\n\n'
    )
    if adakv:
        given = ", ".join([f"compression_ratio={ratios[0]!r}", *([arguments] if arguments else [])])
        alpha = plan.head_allocation_params.get("alpha_safeguard", 0.2)
        body = (
            f"from kvpress import AdaKVPress, {press}\n\n"
            f"press = AdaKVPress(press={press}({given}), alpha_safeguard={alpha!r})\n"
        )
    elif not per_layer:
        given = ", ".join([f"compression_ratio={ratios[0]!r}", *([arguments] if arguments else [])])
        body = f"from kvpress import {press}\n\npress = {press}({given})\n"
    else:
        body = (
            f"from kvpress import PerLayerCompressionPress, {press}\n\n"
            f"compression_ratios = {ratios!r}\n"
            f"press = PerLayerCompressionPress(press={press}({arguments}), compression_ratios=compression_ratios)\n"
        )
    return head + body


__all__ = ["PRESSES", "keep_ratio", "kvpress_source"]
