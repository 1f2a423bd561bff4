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
"""

from __future__ import annotations

import inspect
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
        # one rotary embedding for every layer, or one per layer type where the model has several (Gemma 3:
        # local layers rotate with another base than global ones)
        types = getattr(models.text_config(model), "layer_types", None)
        typed = types and "layer_type" in inspect.signature(self.decoder.rotary_emb.forward).parameters
        self.layer_types = list(types) if typed else None

    def _rotary(self, hidden, position_ids) -> list:
        """Each layer's rotary embedding (cos, sin) at these positions."""
        rotary = self.decoder.rotary_emb
        if self.layer_types is None:
            return [rotary(hidden, position_ids)] * len(self.layers)
        by_type = {kind: rotary(hidden, position_ids, kind) for kind in set(self.layer_types)}
        return [by_type[kind] for kind in self.layer_types]

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
        """Layers start..stop on `hidden` at `positions`; returns logits (the hidden state leaving layer
        stop - 1 when stopped early). `keep(l, h)` sees each layer's input (and the last layer's output as
        l = number of layers)."""
        position_ids = positions.unsqueeze(0).expand(hidden.shape[0], -1)
        rotary = self._rotary(hidden, position_ids)
        for idx in range(start, len(self.layers) if stop is None else stop):
            if keep is not None:
                keep(idx, hidden)
            out = self.layers[idx](
                hidden,
                attention_mask=None,  # the routed cache masks by position (causal, and a local layer's window)
                position_ids=position_ids,
                position_embeddings=rotary[idx],
                use_cache=True,
                **{self.cache_name: cache},
            )
            hidden = out[0] if isinstance(out, tuple) else out
        if stop is not None:
            return hidden
        if keep is not None:
            keep(len(self.layers), hidden)
        return self.model.lm_head(self.decoder.norm(hidden))


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
    progress: Callable[[float, str], None] | None = None,
    continuations: list[int] | None = None,
    scored: list[int] | None = None,
    kept: list[int] | None = None,
) -> MethodProfile:
    """Profile every (layer, scope, method); see the module docstring.

    Text sequences are cut to the shortest one's length and score their last `continuation` tokens. With
    `continuations` (a workload's prompt + gold answer, `polykv.eval.calibration.workload_corpus`), sequence k
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


def _prefilled_at(stack: _Stack, layer: int, cells, capacity: int, prompt_hidden, positions) -> dict:
    """For each (scope, method) cell, a routed cache of its single-layer plan whose layer `layer` holds the
    prompt as the method leaves it: the prompt goes through the layer once, and each cell's layer takes its
    keys, values and attention signals from that pass (`polykv.runtime.many_plans`'s shared prompt)."""
    from transformers.cache_utils import Cache, DynamicLayer

    from polykv.runtime.many_plans import SharedPrompt

    num_layers = len(stack.layers)
    caches = {cell: RoutedCache(single_layer_plan(num_layers, layer, *cell, capacity)) for cell in cells}
    shared = SharedPrompt(layer, [caches[cell].layers[layer] for cell in cells])
    only_this_layer = Cache(layers=[shared if i == layer else DynamicLayer() for i in range(num_layers)])
    stack.run(prompt_hidden, layer, positions[: prompt_hidden.shape[1]], only_this_layer, stop=layer + 1)
    return caches


def _only(layer: int, cache_layer, num_layers: int):
    """A cache whose layer `layer` is `cache_layer` (for a pass through that layer alone)."""
    from transformers.cache_utils import Cache, DynamicLayer

    return Cache(layers=[cache_layer if i == layer else DynamicLayer() for i in range(num_layers)])


def _layer_outputs(
    stack: _Stack, layer: int, cells, caches: dict, entering, prompt: int, positions, keep: int = 0
) -> dict:
    """Layer `layer`'s output over the continuation for every cell [b, M, d], each cell's prompt already in its
    cache; the cells of a scope go through the layer as one batch (`PlanRows`: each its own cache). In the
    decode scope the layer evicts at every step, so the continuation goes token by token (its first `keep`
    tokens, kept in full, as one block); in the prefill scope compression is done and it goes as one block."""
    from polykv.runtime.many_plans import PlanRows

    hidden, later = entering[:, prompt:], positions[prompt:]
    width, outputs = hidden.shape[0], {}
    for scope in (Phase.PREFILL, Phase.DECODE):
        group = [cell for cell in cells if cell[0] is scope]
        if not group:
            continue
        rows = PlanRows(layer, [caches[cell].layers[layer] for cell in group], width)
        cache = _only(layer, rows, len(stack.layers))
        repeated = hidden.repeat(len(group), 1, 1)
        if scope is Phase.PREFILL:
            result = stack.run(repeated, layer, later, cache, stop=layer + 1)
        else:
            spans = ([(0, keep)] if keep else []) + [(t, t + 1) for t in range(keep, hidden.shape[1])]
            steps = [stack.run(repeated[:, a:b], layer, later[a:b], cache, stop=layer + 1) for a, b in spans]
            result = torch.cat(steps, dim=1)
        outputs.update(zip(group, result.split(width)))
    return outputs


# The layers above the profiled one take many cells' continuations as one batch; a chunk of cells is sized so
# that its logits and its attention scores over the prompt stay under this many bytes each.
_CHUNK_BYTES = 1 << 28


def _chunks(cells: list, width: int, continuation: int, prompt: int, model) -> list[list]:
    config = models.text_config(model)
    per_cell = width * continuation * 4 * max(config.vocab_size, config.num_attention_heads * (prompt + continuation))
    size = max(1, _CHUNK_BYTES // per_cell)
    return [cells[i : i + size] for i in range(0, len(cells), size)]


def _above(stack: _Stack, layer: int, hidden, prompt_kv, later, width: int):
    """Logits over the continuation of cells whose layer `layer` output is `hidden` ([cells * width, M, d]),
    through the FullKV layers above it: each attends to FullKV's prompt keys and values (held once for all
    the cells) and to its own continuation (`_PrefixBlock`)."""
    num_layers = len(stack.layers)
    groups = hidden.shape[0] // width
    from transformers.cache_utils import Cache, DynamicLayer

    cache = Cache(
        layers=[_PrefixBlock(j, *prompt_kv[j], groups) if j > layer else DynamicLayer() for j in range(num_layers)]
    )
    return stack.run(hidden, layer + 1, later, cache)


class _PrefixBlock:
    """A FullKV layer above the profiled one, for a block of continuation queries of many cells at once: the
    prompt's keys and values (FullKV's, [b, h, p, d]) are held once and shared by every cell; each cell's
    rows attend to them and, causally, to their own continuation (the block just given to `update`). The
    same attention as a FullKV cache holding prompt + continuation, up to float rounding."""

    is_sliding = False
    is_compileable = False

    def __init__(self, layer_idx: int, keys, values, groups: int):
        self.layer_idx, self.groups = layer_idx, groups
        self.prompt_keys, self.prompt_values = keys, values
        self.new_keys = self.new_values = None

    def update(self, key_states, value_states, *args, **kwargs):
        from polykv.runtime.attention import hand_over

        self.new_keys, self.new_values = key_states, value_states
        hand_over(self)
        return key_states, value_states

    def get_seq_length(self) -> int:
        return self.prompt_keys.shape[-2] + (0 if self.new_keys is None else self.new_keys.shape[-2])

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.prompt_keys.shape[-2] + query_length, 0

    def attend(self, module, query, key, value, dropout: float, scaling: float, kwargs):
        rows, qh, m, d = query.shape
        b, h, p, _ = self.prompt_keys.shape
        c, g = self.groups, qh // h
        # [cells * b, h * g, m, d] -> [cells, b, h, g * m, d]: a KV head's query rows, ordered (head, position)
        q = query.reshape(c, b, h, g * m, d)
        scores = torch.cat(
            [
                torch.matmul(q, self.prompt_keys.transpose(-1, -2)),  # the prompt: shared, broadcast over cells
                torch.matmul(q, key.reshape(c, b, h, m, key.shape[-1]).transpose(-1, -2)),
            ],
            dim=-1,
        ).float()
        scores.mul_(scaling)
        position = torch.arange(m, device=query.device).repeat(g)  # each row's query, 0..m-1 in the block
        keys_at = torch.cat([torch.arange(-p, 0, device=query.device), torch.arange(m, device=query.device)])
        allowed = keys_at[None, :] <= position[:, None]
        window = kwargs.get("sliding_window")
        if window is not None:
            allowed &= keys_at[None, :] > position[:, None] - window
        scores.masked_fill_(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(value.dtype)
        new_values = value.reshape(c, b, h, m, value.shape[-1])
        out = torch.matmul(probs[..., :p], self.prompt_values) + torch.matmul(probs[..., p:], new_values)
        # [cells, b, h, g * m, dv] -> [cells * b, m, h * g, dv], the attention functions' output layout
        out = out.view(c, b, h, g, m, -1).permute(0, 1, 4, 2, 3, 5).reshape(rows, m, qh, -1)
        return out, None


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


def attention_entropy(attention: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of attention distributions over the last dimension."""
    p = attention.double()
    return -(p * p.clamp_min(1e-300).log()).sum(-1)
