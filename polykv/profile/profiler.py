"""Method profiles: how well each method preserves each layer against FullKV.

For every layer l, scope s (prefill or decode) and method r compatible with s, r runs at layer l only
(every other layer and phase keeps everything) at the calibration capacity b_cal, and we record
  cosine C_{l,r}: cosine between layer l's output hidden state, averaged over the continuation tokens,
                  under r and under FullKV (mean over sequences);
  dPPL_{l,r}:     perplexity of the continuation under r minus under FullKV (the mean per-token NLL
                  over all sequences, exponentiated).
Each sequence is a prompt (compressed at the end of prefill in the prefill scope) followed by a
teacher-forced continuation (decoded token by token, evicting every step, in the decode scope).
Per-sequence values are kept too (each sequence's cosine and summed continuation NLL, and FullKV's NLL),
so that intervals can be bootstrapped over the calibration sequences (polykv.profile.confidence).
We also record each layer's attention entropy H_l: the mean entropy of the causal attention of every
prompt query, over heads and sequences, measured during the FullKV prompt pass.

Prefix reuse: layers before l never see the method, so their outputs equal FullKV's; and a prompt's
pass through the layers after l is FullKV's too (a method acts on layer l's cache only after the
prompt has attended in full). One FullKV pass per batch keeps the hidden states entering every layer
and the prompt's keys/values; each (l, r) run then sends the prompt through layer l alone, takes the
later layers' prompt cache from FullKV, and runs the continuation from layer l up.
`reuse_prefix=False` runs every layer every time (the naive loop, for the benchmark).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from polykv import models
from polykv.methods import REGISTRY, for_phase  # profiles and plans use one rule
from polykv.methods import params_that_fit as calibration_params
from polykv.models import cache_argument_name
from polykv.plan import FULL, LayerPlan, Phase, PhaseAssignment, Plan, Scope
from polykv.runtime import routed
from polykv.runtime.attention import record_entropy

CONTINUATION = 32  # teacher-forced tokens scored after each prompt
# Bump whenever what a profile measures changes: profile keys include it. 2: per-sequence values with
# bootstrap intervals; entropy as an expectation over all prompt queries.
PROFILE_REVISION = 2


@dataclass
class MethodProfile:
    """Raw results: rows of (layer, scope, method, cosine, dppl), the per-layer entropy, and the values
    behind each row per sequence: `sequences` rows of (layer, scope, method, sequence, cosine, nll) and
    `reference_nll[k]`, FullKV's continuation NLL of sequence k (NLLs summed over the continuation)."""

    rows: list[dict] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    seconds: float = 0.0
    sequences: list[dict] = field(default_factory=list)
    reference_nll: list[float] = field(default_factory=list)
    continuation: int = CONTINUATION  # tokens scored per sequence: NLL sum / continuation = mean NLL per token


def default_calibration_capacity(prompt_length: int) -> int:
    """256, scaled down for short contexts so that compression actually happens (a quarter of the prompt)."""
    return max(8, min(256, prompt_length // 4))


def profiled_methods(scopes) -> dict[str, int]:
    """{name: revision} of every method a profile of these scopes measures now (`full` included)."""
    names = [FULL, *(m for scope in scopes for m in for_phase(scope))]
    return {name: int(REGISTRY[name].revision) for name in dict.fromkeys(names)}


def single_layer_plan(num_layers: int, layer: int, scope: Phase, method: str, capacity: int) -> Plan:
    """`method` at `layer` in `scope`; everything else full."""
    if method == FULL:
        active = PhaseAssignment(method=FULL)
    else:
        active = PhaseAssignment(method=method, capacity=capacity, params=calibration_params(method, capacity))
    layers = [LayerPlan() for _ in range(num_layers)]
    layers[layer] = LayerPlan(**{scope.value: active})
    return Plan(name=f"profile-{method}-L{layer}-{scope.value}", scope=Scope(scope.value), layers=layers)


class _Stack:
    """Runs the decoder from any layer on given hidden states (the model's own modules, in order)."""

    def __init__(self, model):
        self.model = model
        self.decoder = model.get_decoder()
        self.layers = self.decoder.layers
        self.cache_name = cache_argument_name(model)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.decoder.embed_tokens(ids)

    def run(
        self,
        hidden,
        start: int,
        positions: torch.Tensor,
        cache,
        keep: Callable[[int, torch.Tensor], None] | None = None,
        stop: int | None = None,
    ):
        """Layers start..stop on `hidden` at `positions`; returns logits (None when stopped early).
        `keep(l, h)` sees each layer's input (and the last layer's output as l = number of layers)."""
        position_ids = positions.unsqueeze(0).expand(hidden.shape[0], -1)
        rotary = self.decoder.rotary_emb(hidden, position_ids)
        for idx in range(start, len(self.layers) if stop is None else stop):
            if keep is not None:
                keep(idx, hidden)
            out = self.layers[idx](
                hidden,
                attention_mask=None,
                position_ids=position_ids,
                position_embeddings=rotary,
                use_cache=True,
                **{self.cache_name: cache},
            )
            hidden = out[0] if isinstance(out, tuple) else out
        if stop is not None:
            return None
        if keep is not None:
            keep(len(self.layers), hidden)
        return self.model.lm_head(self.decoder.norm(hidden))


def _nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed negative log-likelihood per batch row."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).sum(-1)


@torch.no_grad()
def profile_methods(
    model,
    sequences: list[list[int]],
    capacity: int,
    scopes: tuple[Phase, ...] = (Phase.PREFILL, Phase.DECODE),
    methods: list[str] | None = None,
    continuation: int = CONTINUATION,
    batch_size: int = 20,
    reuse_prefix: bool = True,
    progress: Callable[[float, str], None] | None = None,
) -> MethodProfile:
    """Profile every (layer, scope, method); see the module docstring."""
    started = time.perf_counter()
    num_layers = models.num_layers(model)
    length = min(len(s) for s in sequences)
    prompt = length - 1 - continuation
    if prompt < 2:
        raise ValueError(f"sequences of {length} tokens are too short for a {continuation}-token continuation")
    if capacity >= prompt:
        raise ValueError(f"b_cal ({capacity}) must be smaller than the prompt ({prompt} tokens) or nothing is evicted")
    device = next(model.parameters()).device
    ids = torch.tensor([s[:length] for s in sequences], device=device)
    batches = [ids[i : i + batch_size] for i in range(0, len(ids), batch_size)]
    stack = _Stack(model)
    # `full` is profiled too: its rows check the pipeline (cosine 1, dPPL 0).
    work = [
        (scope, method, layer)
        for scope in scopes
        for method in [FULL, *(m for m in (methods or for_phase(scope)) if m != FULL and scope in REGISTRY[m].phases)]
        for layer in range(num_layers)
    ]
    # Per (layer, scope, method): each sequence's cosine and continuation NLL, in corpus order.
    per_cell: dict[tuple, tuple[list[float], list[float]]] = {}
    reference_nll: list[float] = []
    entropy_sum = torch.zeros(num_layers, dtype=torch.float64)
    query_heads = 0
    done, steps = 0, len(work) * len(batches)

    full_plan = Plan.homogeneous(FULL, None, num_layers)
    for batch in batches:
        inputs, targets = batch[:, :-1], batch[:, prompt + 1 :]
        positions = torch.arange(inputs.shape[1], device=device)
        # FullKV reference: the prompt (recording every prompt query's attention entropy), then the
        # continuation, keeping the hidden states entering every layer and the prompt's keys/values.
        prompt_part: dict[int, torch.Tensor] = {}
        continuation_part: dict[int, torch.Tensor] = {}
        with routed(model, full_plan) as session:
            cache = session.new_cache()
            with record_entropy() as recorder:
                stack.run(stack.embed(inputs[:, :prompt]), 0, positions[:prompt], cache, keep=prompt_part.__setitem__)
            prompt_kv = [(lay.keys, lay.values) for lay in cache.layers]
            logits = stack.run(
                stack.embed(inputs[:, prompt:]), 0, positions[prompt:], cache, keep=continuation_part.__setitem__
            )
        for layer in range(num_layers):
            entropy_sum[layer] += recorder.sums[layer].sum().cpu()
        query_heads = recorder.sums[0].shape[1]
        entering = {l: torch.cat([prompt_part[l], continuation_part[l]], dim=1) for l in prompt_part}
        reference_nll += _nll(logits, targets).double().tolist()
        ref_mean = [continuation_part[l + 1].mean(1) for l in range(num_layers)]

        for scope, method, layer in work:
            plan = single_layer_plan(num_layers, layer, scope, method, capacity)
            start = layer if reuse_prefix else 0
            hidden = entering[start] if reuse_prefix else stack.embed(inputs)
            outputs: list[torch.Tensor] = []
            grab = lambda idx, h, outputs=outputs, layer=layer: outputs.append(h) if idx == layer + 1 else None  # noqa: E731
            with routed(model, plan) as session:
                cache = session.new_cache()
                if reuse_prefix:  # the prompt through layer l alone; FullKV's prompt cache above it
                    for idx in range(layer + 1, num_layers):
                        cache.layers[idx].adopt(*prompt_kv[idx])
                    stack.run(hidden[:, :prompt], start, positions[:prompt], cache, stop=layer + 1)
                else:
                    stack.run(hidden[:, :prompt], start, positions[:prompt], cache)
                if scope is Phase.PREFILL:  # compression is done: the continuation can go as one block
                    logits = stack.run(hidden[:, prompt:], start, positions[prompt:], cache, keep=grab)
                else:  # the method evicts at every step: teacher-force token by token
                    logits = torch.cat(
                        [
                            stack.run(hidden[:, t : t + 1], start, positions[t : t + 1], cache, keep=grab)
                            for t in range(prompt, inputs.shape[1])
                        ],
                        dim=1,
                    )
            mean = torch.cat(outputs, dim=1).mean(1)
            cosine = torch.nn.functional.cosine_similarity(mean.double(), ref_mean[layer].double(), dim=-1)
            cosines, nlls = per_cell.setdefault((layer, scope.value, method), ([], []))
            cosines += cosine.tolist()
            nlls += _nll(logits, targets).double().tolist()
            done += 1
            if progress is not None:
                progress(done / steps, f"{scope.value} {method} layer {layer}")

    count, tokens = len(sequences), targets.shape[1]
    reference_ppl = math.exp(math.fsum(reference_nll) / (count * tokens))
    rows, per_sequence = [], []
    for (layer, scope, method), (cosines, nlls) in sorted(per_cell.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rows.append(
            {
                "layer": layer,
                "scope": scope,
                "method": method,
                "cosine": math.fsum(cosines) / count,
                "dppl": math.exp(math.fsum(nlls) / (count * tokens)) - reference_ppl,
            }
        )
        per_sequence += [
            {"layer": layer, "scope": scope, "method": method, "sequence": k, "cosine": c, "nll": n}
            for k, (c, n) in enumerate(zip(cosines, nlls))
        ]
    entropy = entropy_sum / (count * query_heads * prompt)  # mean over sequences, query heads, prompt queries
    return MethodProfile(
        rows=rows,
        entropy=entropy.tolist(),
        seconds=time.perf_counter() - started,
        sequences=per_sequence,
        reference_nll=reference_nll,
        continuation=tokens,
    )


def attention_entropy(attention: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of attention distributions over the last dimension."""
    p = attention.double()
    return -(p * p.clamp_min(1e-300).log()).sum(-1)
