"""Where a plan keeps its KV memory: the tokens each layer holds, and their bytes, against FullKV's.

Nominal counts, as the methods behave: an evicting layer keeps min(capacity, what it has seen); a local layer
(sliding-window attention, e.g. 15 of Gemma 3 270M's 18 layers) never holds more than its window less the
coming token (W - 1), whatever its plan says, as transformers' sliding-window cache does; a `full` layer keeps
everything it may still attend. Native allocation splits the same total over the layers (on a hybrid model what a
local layer cannot hold goes to the others, `polykv.methods.shared.within_bounds`), so its sum is the same; its
per-layer split is decided at run time and counted here as written. What a run held is measured
(`polykv.eval.results.kv_measured`).

One token in one layer costs a key and a value for every KV head: 2 x kv_heads x head_dim numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Required, TypedDict

from polykv.plan import FULL, Phase, Plan


class KVHeld(TypedDict, total=False):
    """The KV a plan's cache held, measured (`RoutedCache.kv_held`; stored with each sample as JSON): tokens per KV
    head in each layer (the mean over heads and rows) entering the answer and at the end, the tokens seen by then,
    and each head's where a layer's heads hold different numbers (None for the other layers)."""

    entering: Required[list[float]]
    end: Required[list[float]]
    seen_entering: Required[int]
    seen_end: Required[int]
    heads_entering: list[list[float] | None]
    heads_end: list[list[float] | None]


def window_bound(window: int | None) -> float:
    """The most tokens a layer holds between steps: a local layer its window less the coming token."""
    return float("inf") if window is None else window - 1


def layer_tokens(
    plan: Plan, prompt: float, question: float = 0, answer: float = 0, windows: Sequence[int | None] | None = None
) -> list[tuple[float, float]]:
    """Per layer, the tokens (per KV head) a plan holds on a sample of these lengths (the prompt, a question fed
    after compression and kept in full, the answer): (entering the answer, once the answer is in). A decode-only
    plan holds the whole prompt until the first answer token."""
    windows = windows or [None] * plan.num_layers
    out = []
    for layer, window in zip(plan.layers, windows):
        bound = window_bound(window)
        prefill, decode = layer[Phase.PREFILL], layer[Phase.DECODE]
        context = prompt - question
        held = min(prefill.kept(context) + question, bound)
        after = decode.kept(held + answer)
        out.append((held, min(after, bound)))
    return out


def fullkv_tokens(length: float, windows: Sequence[int | None]) -> list[float]:
    """What FullKV holds per layer after `length` tokens: all of them, a local layer its window less one."""
    return [min(length, window_bound(w)) for w in windows]


def kv_kept(
    plan: Plan, lengths: Mapping[str, float], windows: Sequence[int | None] | None = None
) -> tuple[float, float]:
    """The KV tokens a plan keeps per KV head, summed over the layers, on a sample of these mean `lengths`
    (prompt, question fed after compression, answer): (entering the answer, once the answer is in)."""
    per_layer = layer_tokens(plan, lengths["prompt"], lengths["question"], lengths["answer"], windows)
    return sum(e for e, _ in per_layer), sum(a for _, a in per_layer)


def kv_dimensions(model) -> dict:
    """What one retained token costs in a loaded model's KV cache: layers, KV heads, head size, bytes per number,
    and each layer's sliding window (None: a global layer)."""
    from polykv.models import layer_windows, text_config

    config = text_config(model)
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {
        "layers": config.num_hidden_layers,
        "kv_heads": heads,
        "head_dim": head_dim,
        "bytes": next(model.parameters()).element_size(),
        "windows": layer_windows(model),
    }


def token_bytes(dimensions: Mapping) -> int:
    """One token's key and value in one layer, in bytes: 2 x KV heads x head size x bytes per number."""
    return 2 * dimensions["kv_heads"] * dimensions["head_dim"] * dimensions["bytes"]


def budget_lines(plan: Plan, windows: Sequence[int | None]) -> list[str]:
    """On a hybrid model, what a plan's budget counts: the capacities as written, and what the local layers can
    hold of them (at most their window less one); then `window_notes`. [] when every layer is global."""
    if all(w is None for w in windows):
        return []
    lines = []
    for phase in plan.scope.phases:
        caps = [c for c in (layer[phase].capacity for layer in plan.layers) if c is not None]
        if len(caps) < plan.num_layers:
            continue  # a `full` layer: no budget to count
        held = sum(min(c, window_bound(w)) for c, w in zip(caps, windows))
        lines.append(
            f"{phase.value} budget: the capacities as written add up to {sum(caps):,} ({sum(caps) / len(caps):g} a "
            f"layer); a local layer holds at most its window less one, so the plan holds at most {held:,.0f} "
            f"token-layers ({held / len(caps):.4g} a layer)"
        )
    return lines + [f"note: {n}" for n in window_notes(plan, windows)]


def kept_line(plan: Plan, prompt: float, windows: Sequence[int | None], token_bytes: int | None) -> str:
    """One line: what `plan` keeps entering the answer after a prompt of `prompt` tokens against FullKV, in
    token-layers (per KV head) and, with one token's bytes in one layer, in MiB."""
    kept = sum(entering for entering, _ in layer_tokens(plan, prompt, windows=windows))
    full = sum(fullkv_tokens(prompt, windows))
    memory = (
        ""
        if token_bytes is None
        else f" ({kept * token_bytes / 2**20:,.1f} MiB of {full * token_bytes / 2**20:,.1f} MiB)"
    )
    return f"{kept:,.0f} of FullKV's {full:,.0f} token-layers{memory}, {kept / full:.1%}"


def layer_ranges(layers: Sequence[int]) -> str:
    """0-4, 6-10, 12: consecutive layer indices joined."""
    spans: list[list[int]] = []
    for i in layers:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def window_notes(plan: Plan, windows: Sequence[int | None]) -> list[str]:
    """One line for each way a plan asks a local layer for what its window decides instead: a capacity at or
    above the window (the layer keeps its window, as `full` does) and StreamingLLM's sink tokens (they leave
    the window once the layer has seen W tokens: a local layer's queries can never see them again)."""
    notes: dict[str, list[str]] = {}  # a note -> the phases it holds in
    for phase in plan.scope.phases:
        roomy: dict[tuple[int, int], list[int]] = {}
        sinks: dict[int, list[int]] = {}
        for idx, (layer, window) in enumerate(zip(plan.layers, windows)):
            a = layer[phase]
            if window is None or a.method == FULL:
                continue
            if a.capacity is not None and a.capacity >= window - 1:
                roomy.setdefault((window, a.capacity), []).append(idx)
            if a.method == "streamingllm" and a.params.get("sinks", 4):
                sinks.setdefault(window, []).append(idx)
        for (window, capacity), layers in roomy.items():
            note = (
                f"layers {layer_ranges(layers)} are local (sliding window {window}): capacity {capacity} keeps the "
                f"window there (at most {window - 1} tokens), as 'full' does"
            )
            notes.setdefault(note, []).append(phase.value)
        for window, layers in sinks.items():
            note = (
                f"layers {layer_ranges(layers)} are local (sliding window {window}): streamingllm's sink tokens leave "
                f"the window once the layer has seen {window} tokens (its queries cannot see them)"
            )
            notes.setdefault(note, []).append(phase.value)
    out = [f"{' and '.join(phases)}: {note}" for note, phases in notes.items()]
    local = [i for i, w in enumerate(windows) if w is not None]
    if plan.allocation != "fixed" and local:
        rule = "the method's rule" if plan.allocation == "native" else f"the {plan.allocation} rule"
        out.append(
            f"{plan.allocation} allocation: {rule} splits the budget over the layers at run time; layers "
            f"{layer_ranges(local)} are local and hold at most their window less one, so what the rule gives them "
            "beyond goes to the layers that can hold it (the total is kept)"
        )
    return out
