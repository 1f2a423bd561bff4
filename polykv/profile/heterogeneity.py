"""Attention heterogeneity across layers (the seed paper's Figure 1).

For each input, the prompt runs through the model under a `full` plan, then one greedy decoding step
records every layer's attention from the new token. Averaged over query heads, each layer's row gives
its *support size*: the fewest positions that together hold ``coverage`` (default 90%) of the attention.
Layers whose support is small can be compressed hard; layers with a wide support cannot. Over the inputs
we report each layer's median support size with a bootstrap 95% interval, and for the first input where
in the context each layer's support lies (a histogram over equal position bins).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from polykv import models
from polykv.models import cache_argument_name, output_cache
from polykv.plan import Plan
from polykv.progress import Progress
from polykv.runtime.attention import record_attention
from polykv.runtime.routed import routed

__all__ = [
    "HeterogeneityResult",
    "bootstrap_median_interval",
    "layer_attention",
    "measure_heterogeneity",
    "support_density",
    "support_positions",
    "support_size",
]

# Cumulative sums of fp32 attention land a hair either side of round coverages such as 0.9.
_TOLERANCE = 1e-6


def _check_coverage(coverage: float) -> float:
    coverage = float(coverage)
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage must be in (0, 1] (got {coverage})")
    return coverage


def _ranked(attention: torch.Tensor, coverage: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(descending order of the positions, support size) along the last dimension."""
    coverage = _check_coverage(coverage)
    values, order = torch.sort(attention.double(), dim=-1, descending=True, stable=True)
    reached = values.cumsum(-1) >= coverage - _TOLERANCE
    # positions before the first one at which the cumulative sum reaches the coverage, plus that one
    size = (~reached).sum(-1) + 1
    return order, size.clamp(max=attention.shape[-1])


def support_size(attention: torch.Tensor, coverage: float = 0.9) -> torch.Tensor:
    """Smallest number of positions whose attention sums to >= coverage, for every row of [..., n].

    Returns an int64 tensor of shape [...]. A row summing to less than ``coverage`` counts all n positions.
    """
    attention = torch.as_tensor(attention)
    if attention.dim() == 0 or attention.shape[-1] == 0:
        raise ValueError("support_size needs attention of shape [..., n] with n >= 1")
    return _ranked(attention, coverage)[1]


def support_positions(
    attention_row: torch.Tensor, coverage: float = 0.9, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """The positions in that smallest set, ascending (slot indices, or ``positions[slot]`` when given)."""
    attention_row = torch.as_tensor(attention_row)
    if attention_row.dim() != 1 or attention_row.numel() == 0:
        raise ValueError(f"support_positions needs one attention row [n] (got shape {tuple(attention_row.shape)})")
    order, size = _ranked(attention_row, coverage)
    chosen = order[: int(size)]
    if positions is not None:
        chosen = torch.as_tensor(positions, device=chosen.device)[chosen]
    return chosen.sort().values


def support_density(positions: torch.Tensor, length: int, bins: int = 32) -> torch.Tensor:
    """Histogram of positions over ``bins`` equal bins of [0, length), normalised to sum to 1 (fp32 [bins]).

    Bin k covers [k*length/bins, (k+1)*length/bins). No positions give all zeros.
    """
    if length < 1 or bins < 1:
        raise ValueError(f"support_density needs length >= 1 and bins >= 1 (got length={length}, bins={bins})")
    positions = torch.as_tensor(positions).reshape(-1).long().cpu()
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= length):
        raise ValueError(f"support_density: positions must lie in [0, {length})")
    index = torch.div(positions * bins, length, rounding_mode="floor")
    counts = torch.bincount(index, minlength=bins).float()
    total = counts.sum()
    return counts / total if total > 0 else counts


def bootstrap_median_interval(
    values: np.ndarray | Sequence, bootstrap: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of the median over axis 0 (inputs resampled with replacement).

    ``values`` is [inputs] or [inputs, columns]; returns (low, high) shaped like one row. Deterministic for
    a seed (numpy Generator).
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 0 or values.shape[0] == 0:
        raise ValueError("bootstrap_median_interval needs at least one input")
    if bootstrap < 1:
        raise ValueError(f"bootstrap must be at least 1 (got {bootstrap})")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1) (got {level})")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, values.shape[0], size=(bootstrap, values.shape[0]))
    medians = np.median(values[picks], axis=1)  # [bootstrap, ...]
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(medians, [tail, 100.0 - tail], axis=0)
    return low, high


@dataclass
class HeterogeneityResult:
    """Support sizes [inputs x layers], their per-layer median and bootstrap interval, and a density."""

    sizes: np.ndarray  # int [inputs, layers]
    lengths: list[int]  # positions attended by the decoding step, per input (prompt + the new token)
    median: np.ndarray  # [layers]
    ci_low: np.ndarray  # [layers]
    ci_high: np.ndarray  # [layers]
    density: np.ndarray  # [layers, bins], first input, rows sum to 1
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return int(self.sizes.shape[1])

    @property
    def num_inputs(self) -> int:
        return int(self.sizes.shape[0])

    def to_frame(self, kind: str = "layers"):
        """A pandas DataFrame. kind="layers": one row per layer (median, interval, mean, min, max, median
        fraction of the context); "sizes": one row per input and layer; "density": one row per layer and bin."""
        import pandas as pd

        if kind == "layers":
            fractions = self.sizes / np.asarray(self.lengths, dtype=np.float64)[:, None]
            return pd.DataFrame(
                {
                    "layer": np.arange(self.num_layers),
                    "median": self.median,
                    "ci_low": self.ci_low,
                    "ci_high": self.ci_high,
                    "mean": self.sizes.mean(axis=0),
                    "min": self.sizes.min(axis=0),
                    "max": self.sizes.max(axis=0),
                    "median_fraction": np.median(fractions, axis=0),
                }
            )
        if kind == "sizes":
            inputs, layers = np.meshgrid(np.arange(self.num_inputs), np.arange(self.num_layers), indexing="ij")
            return pd.DataFrame(
                {
                    "input": inputs.reshape(-1),
                    "layer": layers.reshape(-1),
                    "support_size": self.sizes.reshape(-1),
                    "length": np.repeat(np.asarray(self.lengths), self.num_layers),
                }
            )
        if kind == "density":
            layers, bins = np.meshgrid(np.arange(self.num_layers), np.arange(self.density.shape[1]), indexing="ij")
            return pd.DataFrame(
                {"layer": layers.reshape(-1), "bin": bins.reshape(-1), "density": self.density.reshape(-1)}
            )
        raise ValueError(f"unknown frame kind {kind!r}: use 'layers', 'sizes' or 'density'")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every array as nested lists, plus the parameters."""
        return {
            "params": dict(self.params),
            "lengths": [int(n) for n in self.lengths],
            "sizes": self.sizes.astype(int).tolist(),
            "median": self.median.astype(float).tolist(),
            "ci_low": self.ci_low.astype(float).tolist(),
            "ci_high": self.ci_high.astype(float).tolist(),
            "density": self.density.astype(float).tolist(),
        }


def layer_attention(rows: torch.Tensor, positions: torch.Tensor, length: int | None = None) -> torch.Tensor:
    """One recorded layer, batch row 0, as attention per token position averaged over query heads.

    ``rows`` [b, q_heads, 1, n] and ``positions`` [b, kv_heads, n] as `record_attention()` gives them;
    returns fp32 [length] (default: the largest position + 1), zero at positions no slot holds.
    """
    row = rows[0, :, -1, :].float()  # [q_heads, n]
    pos = positions[0].to(row.device).long()  # [kv_heads, n]
    q_heads, kv_heads = row.shape[0], pos.shape[0]
    if q_heads % kv_heads:
        raise ValueError(f"{q_heads} query heads do not group over {kv_heads} KV heads")
    pos = pos.repeat_interleave(q_heads // kv_heads, dim=0)
    length = int(pos.max()) + 1 if length is None else int(length)
    dense = torch.zeros(q_heads, length, dtype=torch.float32, device=row.device)
    dense.scatter_add_(1, pos, row)
    return dense.mean(0)


def _as_sequences(sequences) -> list[list[int]]:
    sequences = getattr(sequences, "sequences", sequences)  # a Corpus
    if isinstance(sequences, torch.Tensor):
        sequences = sequences.tolist() if sequences.dim() == 2 else [sequences.tolist()]
    out = [list(map(int, s)) for s in sequences]
    if not out or any(len(s) == 0 for s in out):
        raise ValueError("measure_heterogeneity needs at least one non-empty token sequence")
    return out


@torch.no_grad()
def measure_heterogeneity(
    model,
    sequences,
    coverage: float = 0.9,
    bins: int = 32,
    bootstrap: int = 1000,
    seed: int = 0,
    progress: Progress | None = None,
) -> HeterogeneityResult:
    """Per-layer support sizes of the first decoding step's attention over each input sequence.

    ``sequences``: token-id lists (or a `Corpus`, or a [inputs, n] tensor), run one at a time. Prompts
    longer than the model's ``max_position_embeddings - 1`` are cut to fit, so that the decoded token
    still has a trained position; ``params["truncated_inputs"]`` counts them. ``progress(done, total, "")`` (a
    `polykv.progress.Progress`) is told after each input (for a progress bar).
    """
    coverage = _check_coverage(coverage)
    if bins < 1:
        raise ValueError(f"bins must be at least 1 (got {bins})")
    sequences = _as_sequences(sequences)
    num_layers = models.num_layers(model)
    plan = Plan.homogeneous("full", None, num_layers)
    cache_name = cache_argument_name(model)
    device = next(model.parameters()).device
    limit = models.context_length(model)
    max_prompt = None if limit is None or limit < 2 else limit - 1

    sizes = np.zeros((len(sequences), num_layers), dtype=np.int64)
    lengths: list[int] = []
    density = np.zeros((num_layers, bins), dtype=np.float64)
    truncated = 0
    with routed(model, plan):
        for i, seq in enumerate(sequences):
            if max_prompt is not None and len(seq) > max_prompt:
                seq, truncated = seq[:max_prompt], truncated + 1
            ids = torch.tensor([seq], dtype=torch.long, device=device)
            out = model(input_ids=ids, use_cache=True)
            cache = output_cache(out)
            token = out.logits[:, -1:].argmax(-1)
            with record_attention() as recorder:
                model(input_ids=token, use_cache=True, **{cache_name: cache})
            missing = [layer for layer in range(num_layers) if layer not in recorder.rows]
            if missing:
                raise RuntimeError(f"no attention was recorded for layers {missing}: is this model's attention routed?")
            length = len(seq) + 1
            lengths.append(length)
            for layer in range(num_layers):
                attention = layer_attention(recorder.rows[layer], recorder.positions[layer], length)
                sizes[i, layer] = int(support_size(attention, coverage))
                if i == 0:
                    chosen = support_positions(attention, coverage)
                    density[layer] = support_density(chosen, length, bins).double().numpy()
            if progress is not None:
                progress(i + 1, len(sequences), "")

    low, high = bootstrap_median_interval(sizes, bootstrap=bootstrap, seed=seed)
    params = {
        "coverage": coverage,
        "bins": bins,
        "bootstrap": bootstrap,
        "seed": seed,
        "confidence": 0.95,
        "num_inputs": len(sequences),
        "num_layers": num_layers,
        "plan": plan.name,
        "decode_steps": 1,
        "head_average": "mean over query heads",
        "truncated_inputs": truncated,
        "max_prompt_tokens": max_prompt,
        "model": getattr(model.config, "_name_or_path", None),
    }
    return HeterogeneityResult(
        sizes=sizes,
        lengths=lengths,
        median=np.median(sizes, axis=0).astype(np.float64),
        ci_low=np.asarray(low, dtype=np.float64),
        ci_high=np.asarray(high, dtype=np.float64),
        density=density,
        params=params,
    )
