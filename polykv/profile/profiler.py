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

Prefix reuse: layers before l never see the method, so their outputs equal FullKV's; a prompt's pass
through layer l and above is FullKV's too (a method acts on layer l's cache only after the prompt has
attended in full); and the layers above l are FullKV layers, whose input over the continuation is
layer l's output. So one FullKV pass per batch keeps the hidden states entering every layer and the
prompt's keys/values. Then, per layer l:
  * the prompt goes through layer l once, and every (scope, method) cell's layer-l cache is prefilled
    from that one pass (`polykv.runtime.many_plans.SharedPrompt`: the keys, values and attention signals the
    method alone would compute);
  * the continuation goes through layer l for all the cells of a scope as one batch, each on its own
    cache (token by token in the decode scope, where the method evicts at every step; as one block in
    the prefill scope);
  * the layers above take every cell's layer-l output as one batch and one block (`_PrefixBlock`: each
    row attends to FullKV's prompt keys and values, held once for all, and causally to its own
    continuation).
The numbers are the naive loop's up to float rounding (a batch and a block of queries round differently
from single rows and steps; tests/test_profile.py). `reuse_prefix=False` runs every layer every time,
token by token (the naive loop, for the benchmark and the equivalence test).

Where the parts live: the prefix reuse in `polykv.profile.prefix_reuse`, the decoder run from any layer in
`polykv.profile.decoder_stack`, a cell's single-layer plan in `polykv.profile.cell_plan`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from polykv import models
from polykv.methods import REGISTRY, for_phase  # profiles and plans use one rule
from polykv.plan import FULL, Phase, Plan
from polykv.profile.cell_plan import single_layer_plan
from polykv.profile.decoder_stack import _Stack
from polykv.profile.prefix_reuse import _above, _chunks, _layer_outputs, _prefilled_at
from polykv.progress import Fraction
from polykv.runtime import RoutedCache, routed
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


def _nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed negative log-likelihood per batch row."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).sum(-1)


def _batches(sequences, continuations, batch_size: int, scored=None, kept=None) -> list[tuple[list[int], tuple]]:
    """(sequence indices, (continuation, scored, kept)) per batch: sequences of one length and one split together,
    in corpus order, at most `batch_size` a batch (the batch bounds the profiler's memory)."""
    scored = continuations if scored is None else scored
    kept = [0] * len(sequences) if kept is None else kept
    groups: dict[tuple, list[int]] = {}
    for k, sequence in enumerate(sequences):
        groups.setdefault((len(sequence), continuations[k], scored[k], kept[k]), []).append(k)
    return [
        (members[i : i + batch_size], split)
        for (_, *split), members in groups.items()
        for i in range(0, len(members), batch_size)
    ]


@torch.no_grad()
def profile_methods(
    model,
    sequences: list[list[int]],
    capacity: int,
    scopes: tuple[Phase, ...] = (Phase.PREFILL, Phase.DECODE),
    methods: list[str] | None = None,
    continuation: int = CONTINUATION,
    batch_size: int = 4,
    reuse_prefix: bool = True,
    progress: Fraction | None = None,
    continuations: list[int] | None = None,
    scored: list[int] | None = None,
    kept: list[int] | None = None,
) -> MethodProfile:
    """Profile every (layer, scope, method); see the module docstring.

    Text sequences are cut to the shortest one's length and score their last `continuation` tokens. With
    `continuations` (a workload's prompt + gold answer, `polykv.eval.workloads.workload.workload_corpus`), sequence k
    keeps its own length, feeds its last `continuations[k]` tokens after the prompt's pass and scores the last
    `scored[k]` of them (default: all); the first `kept[k]` fed tokens (a question after the compressed
    context) are kept in full whatever the method (`RoutedCache.keep_until`)."""
    started = time.perf_counter()
    num_layers = models.num_layers(model)
    if continuations is None:
        length = min(len(s) for s in sequences)
        sequences = [s[:length] for s in sequences]
        continuations = [continuation] * len(sequences)
    elif len(continuations) != len(sequences):
        raise ValueError(f"{len(continuations)} continuations for {len(sequences)} sequences")
    scored = list(continuations) if scored is None else list(scored)
    kept = [0] * len(sequences) if kept is None else list(kept)
    if not len(scored) == len(kept) == len(sequences):
        raise ValueError(f"{len(scored)} scored and {len(kept)} kept counts for {len(sequences)} sequences")
    for sequence, tokens, score, keep in zip(sequences, continuations, scored, kept):
        prompt = len(sequence) - 1 - tokens
        if not (1 <= score <= tokens and 0 <= keep <= tokens):
            raise ValueError(f"a {tokens}-token continuation cannot score {score} tokens and keep {keep}")
        if tokens < 1 or prompt < 2:
            raise ValueError(f"sequences of {len(sequence)} tokens are too short for a {tokens}-token continuation")
        if capacity >= prompt:
            raise ValueError(
                f"b_cal ({capacity}) must be smaller than the prompt ({prompt} tokens) or nothing is evicted"
            )
    device = next(model.parameters()).device
    batches = _batches(sequences, continuations, batch_size, scored, kept)
    stack = _Stack(model)
    # `full` is profiled too: its rows check the pipeline (cosine 1, dPPL 0).
    work = [
        (scope, method, layer)
        for scope in scopes
        for method in [FULL, *(m for m in (methods or for_phase(scope)) if m != FULL and scope in REGISTRY[m].phases)]
        for layer in range(num_layers)
    ]
    count = len(sequences)
    # Per (layer, scope, method): each sequence's cosine and continuation NLL, in corpus order.
    per_cell: dict[tuple, tuple[list[float], list[float]]] = {}
    reference_nll = [math.nan] * count
    entropy_sum = torch.zeros(num_layers, dtype=torch.float64)
    query_heads = prompt_queries = 0
    done, steps = 0, len(work) * len(batches)

    full_plan = Plan.homogeneous(FULL, None, num_layers)
    for members, (tokens, score, keep) in batches:
        batch = torch.tensor([sequences[k] for k in members], device=device)
        prompt = batch.shape[1] - 1 - tokens
        inputs, targets = batch[:, :-1], batch[:, batch.shape[1] - score :]
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
        prompt_queries += len(members) * prompt
        entering = {l: torch.cat([prompt_part[l], continuation_part[l]], dim=1) for l in prompt_part}
        for k, nll in zip(members, _nll(logits[:, tokens - score :], targets).double().tolist()):
            reference_nll[k] = nll
        ref_mean = [continuation_part[l + 1].mean(1) for l in range(num_layers)]
        del prompt_part, continuation_part, logits

        for layer in range(num_layers):
            cells = [(scope, method) for scope, method, l in work if l == layer]
            with routed(model, full_plan):  # PolyKV's attention, with the caches made here
                if reuse_prefix:
                    caches = _prefilled_at(stack, layer, cells, capacity, entering[layer][:, :prompt], positions)
                    for cache in caches.values():
                        cache.keep_until(prompt + keep)
                    outputs = _layer_outputs(stack, layer, cells, caches, entering[layer], prompt, positions, keep)
                    del caches
                    results = []  # (cell, layer output, each sequence's continuation NLL)
                    width = batch.shape[0]
                    for chunk in _chunks(cells, width, inputs.shape[1] - prompt, prompt, model):
                        hidden = torch.cat([outputs[cell] for cell in chunk])
                        logits = _above(stack, layer, hidden, prompt_kv, positions[prompt:], width)
                        for cell, part in zip(chunk, logits.split(width)):
                            results.append((cell, outputs[cell], _nll(part[:, tokens - score :], targets)))
                        del logits
                else:
                    results = []
                    for scope, method in cells:
                        plan = single_layer_plan(num_layers, layer, scope, method, capacity)
                        logits, output = _naive(stack, plan, scope, layer, inputs, prompt, positions, keep)
                        results.append(((scope, method), output, _nll(logits[:, tokens - score :], targets)))
                for (scope, method), output, nll in results:
                    cosine = torch.nn.functional.cosine_similarity(
                        output.mean(1).double(), ref_mean[layer].double(), dim=-1
                    )
                    cell = (layer, scope.value, method)
                    cosines, nlls = per_cell.setdefault(cell, ([math.nan] * count, [math.nan] * count))
                    for k, c, n in zip(members, cosine.tolist(), nll.double().tolist()):
                        cosines[k], nlls[k] = c, n
                    done += 1
                    if progress is not None:
                        progress(done / steps, f"{scope.value} {method} layer {layer}")

    total_tokens = sum(scored)
    reference_ppl = math.exp(math.fsum(reference_nll) / total_tokens)
    rows, per_sequence = [], []
    for (layer, scope, method), (cosines, nlls) in sorted(per_cell.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rows.append(
            {
                "layer": layer,
                "scope": scope,
                "method": method,
                "cosine": math.fsum(cosines) / count,
                "dppl": math.exp(math.fsum(nlls) / total_tokens) - reference_ppl,
            }
        )
        per_sequence += [
            {"layer": layer, "scope": scope, "method": method, "sequence": k, "cosine": c, "nll": n}
            for k, (c, n) in enumerate(zip(cosines, nlls))
        ]
    entropy = entropy_sum / (query_heads * prompt_queries)  # mean over sequences, query heads, prompt queries
    return MethodProfile(
        rows=rows,
        entropy=entropy.tolist(),
        seconds=time.perf_counter() - started,
        sequences=per_sequence,
        reference_nll=reference_nll,
        continuation=scored[0],
    )


def _naive(stack: _Stack, plan: Plan, scope: Phase, layer: int, inputs, prompt: int, positions, keep: int = 0):
    """The naive loop: every layer runs every time, the continuation token by token in the decode scope (its
    first `keep` tokens kept in full, as one block)."""
    outputs: list[torch.Tensor] = []
    grab = lambda idx, h: outputs.append(h) if idx == layer + 1 else None  # noqa: E731
    cache = RoutedCache(plan)
    cache.keep_until(prompt + keep)
    hidden = stack.embed(inputs)
    stack.run(hidden[:, :prompt], 0, positions[:prompt], cache)
    if scope is Phase.PREFILL:
        spans = [(prompt, inputs.shape[1])]
    else:
        spans = ([(prompt, prompt + keep)] if keep else []) + [
            (t, t + 1) for t in range(prompt + keep, inputs.shape[1])
        ]
    logits = torch.cat([stack.run(hidden[:, a:b], 0, positions[a:b], cache, keep=grab) for a, b in spans], dim=1)
    return logits, torch.cat(outputs, dim=1)
