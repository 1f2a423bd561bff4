"""Many plans on one prompt: the prompt's pass once for all of them, then their decode steps as one batch.

    with many(model, plans) as session:
        batch, logits = session.prefill(prompt_ids)   # logits: the prompt's last position (FullKV's)
        logits = batch.feed(question_ids, keep=True)  # optional: a block after the prompt, kept in full; [P, vocab]
        logits = batch.step(next_tokens)              # row i runs plans[i]; [P, vocab]
        batch.select(rows_still_running)

An experiment scores dozens of plans on the same samples. Two facts let them share most of the work:
  * Prefill eviction happens after the prompt has attended in full (see the runtime), so the prompt's
    pass is FullKV's whatever the plan: one pass serves every plan. In each layer, every plan's layer
    takes the same keys and values and the attention signals its methods ask for (each distinct signal
    computed once) and evicts as it would alone; the pass's own output is FullKV's (SDPA). The pass can be kept
    (`PromptPasses`: each layer's queries, keys, values and signals) and replayed for other plans on the same
    prompt without running the model: the same calls on the same tensors (a search scores many plans on a few
    samples; a 4K prompt's pass of gemma3 costs tens of seconds on 2 cores, its replay a few).
  * A decode step at batch 1 on a GPU is bound by reading the weights, so P plans' next tokens as one batch
    of P rows cost little more than one (on a 2-core CPU less so: smollm2's forward at 54 rows is 3.2x one
    row's, benchmarks/README.md). Each row runs its own plan's layer: its own slots, positions and method state.
  * What would cost one small operation per row and layer is shared where it can be: at the first one-token
    step each layer puts its rows' keys, values and positions into a few shared blocks
    (`polykv.runtime.row_storage`), whose rows attend with one call per block; rows whose methods drop one slot
    by a score (TOVA, StreamingLLM, H2O: two or more of one method, parameters and length in a block) drop
    together; and a prompt's signals, and what methods make of them (Scissorhands' flags, CAKE's scores:
    `LayerView.once`), are made once for every plan.
The results are those of each plan run alone up to float rounding, not bit for bit: a layer whose method
needs the prompt's column sums (H2O, D2O, CaM) or its last 64 or more queries' rows (Scissorhands) takes its
prompt output from the fused pass or those rows when it runs alone and SDPA's here (equal up to rounding), and a
batch's matrix products round differently from a single row's. tests/test_many_plans.py checks the same greedy
tokens and logits within 1e-4 for every method.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer

from polykv.methods import make_method, validate_plan
from polykv.models import cache_argument_name, context_length, num_layers
from polykv.models.support import eos_ids
from polykv.plan import FULL_ASSIGNMENT, Plan
from polykv.runtime.attention import hand_over, take_updated_layer
from polykv.runtime.attention_step import attend, step_on_shared_prompt
from polykv.runtime.cache import RoutedCache, RoutedLayer
from polykv.runtime.row_storage import SharedRows, attend_shared
from polykv.runtime.swap import swapped_attention


@contextmanager
def many(model, plans: Sequence[Plan]) -> Iterator[Many]:
    """Inside the block this thread's forwards of the model run PolyKV's attention, as in routed() (one block at
    a time on a shared model, `polykv.runtime.swap`); `prefill` starts the plans on one prompt (each in a
    routed cache)."""
    layers, context = num_layers(model), context_length(model)
    for plan in plans:
        validate_plan(plan, layers, context)
    with swapped_attention(model):
        yield Many(model, list(plans))


class Many:
    def __init__(self, model, plans: list[Plan]):
        self.model, self.plans = model, plans

    def prefill(
        self, prompt_ids: Sequence[int] | torch.Tensor, kept: PromptPasses | None = None
    ) -> tuple[PlanBatch, torch.Tensor]:
        """One pass of the prompt (a batch of one) prefilling every plan's cache; returns the batch and the
        logits at the prompt's last position [vocab] (FullKV's: eviction never changes the prompt's pass).
        `kept`: the pass is replayed from there when it holds this prompt's, else run and kept there."""
        device = next(self.model.parameters()).device
        ids = torch.as_tensor(prompt_ids, device=device).view(1, -1)
        caches = [RoutedCache(plan) for plan in self.plans]
        for cache in caches:  # rows share padded storage here: so may D2O's layers (`polykv.runtime.merges`)
            cache.merge_groups.across_capacities = True
        known = None if kept is None else kept.get(self.model, ids)
        if known is not None:
            for step in known.layers:  # as `SharedPrompt.attend` hands the pass to each plan's layer
                step.hand_to([cache.layers[step.layer_idx] for cache in caches])
            kept.trim()  # the replay may have added signals the kept pass now holds
            return PlanBatch(self.model, caches, ids.shape[1]), known.logits
        steps: list[PromptStep] | None = None if kept is None else []
        layers = [SharedPrompt(i, [c.layers[i] for c in caches], steps) for i in range(len(caches[0].layers))]
        logits = _forward(self.model, ids, None, Cache(layers=layers))[0]
        if kept is not None and steps is not None and len(steps) == len(layers):
            kept.put(self.model, ids, PromptPass(steps, logits.clone()))
        return PlanBatch(self.model, caches, ids.shape[1]), logits


@dataclass
class PromptStep:
    """One layer's step of a prompt's pass, as every plan's layer takes it (`SharedPrompt.attend`)."""

    layer_idx: int
    module: torch.nn.Module
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    scaling: float
    window: int | None
    computed: dict  # the signals made for the plans so far, each once (`fill_signals`)

    def hand_to(self, targets: Sequence[RoutedLayer]) -> tuple[torch.Tensor, torch.Tensor]:
        # every plan's layer holds the same keys and values and gathers the slots it keeps from them: laid out
        # once here (a projection's keys are a transposed view, and each gather would copy the whole prompt first)
        held_keys, held_values = self.key.contiguous(), self.value.contiguous()
        for target in targets:
            target.update(held_keys, held_values)
            take_updated_layer(self.layer_idx)  # the target's own hand-over: its step is taken here
            step_on_shared_prompt(
                target, self.module, self.query, self.key, self.value, self.scaling, self.window, self.computed
            )
        return held_keys, held_values


@dataclass
class PromptPass:
    """A prompt's pass kept for other plans (`PromptPasses`): its layers' steps and the last position's logits."""

    layers: list[PromptStep]
    logits: torch.Tensor

    def nbytes(self) -> int:
        """The bytes its tensors hold (each storage once): its steps' queries, keys, values and signals, the logits."""
        todo: list = [self.logits, *(x for s in self.layers for x in (s.query, s.key, s.value, s.computed))]
        storages = {}
        while todo:
            item = todo.pop()
            if isinstance(item, torch.Tensor):
                storages[item.untyped_storage().data_ptr()] = item.untyped_storage().nbytes()
            elif isinstance(item, (dict, list, tuple)):  # a signal may be a tuple of tensors, a method's a dict
                todo += item.values() if isinstance(item, dict) else item
        return sum(storages.values())


class PromptPasses:
    """Prompt passes kept for replay (`Many.prefill`) by model and prompt while they fit in `budget` bytes (gemma3's
    4K prompt: about 430 MB): the first met are kept (a search meets its samples in one order every round: dropping
    the oldest drops the next needed). A replay skips the forward: attention recorders see nothing of it."""

    def __init__(self, budget: int = 6 << 30):
        self.budget = budget
        self._kept: dict[tuple, tuple[weakref.ref, PromptPass]] = {}

    def get(self, model, ids: torch.Tensor) -> PromptPass | None:
        found = self._kept.get((id(model), tuple(ids.view(-1).tolist())))
        return found[1] if found is not None and found[0]() is model else None

    def put(self, model, ids: torch.Tensor, found: PromptPass) -> None:
        if self.nbytes() + found.nbytes() <= self.budget:
            self._kept[(id(model), tuple(ids.view(-1).tolist()))] = (weakref.ref(model), found)

    def nbytes(self) -> int:
        return sum(found.nbytes() for _, found in self._kept.values())  # each pass's own: they share no tensor

    def trim(self) -> None:
        """Drop the latest kept passes while their signals, grown by replays, take them past the budget."""
        while self._kept and self.nbytes() > self.budget:
            self._kept.pop(next(reversed(self._kept)))


class PlanBatch:
    """The caches of several plans after one shared prompt, stepping together: row i runs its plan."""

    def __init__(self, model, caches: list[RoutedCache], seen: int):
        self.model = model
        self.caches = caches
        self.seen = seen  # tokens every row has seen (they all advance together)
        self._cache = self._rows_cache()

    def __len__(self) -> int:
        return len(self.caches)

    def step(self, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Feed one token to each row (in row order); returns each row's next-token logits [rows, vocab]."""
        device = next(self.model.parameters()).device
        ids = torch.as_tensor(tokens, device=device).view(len(self.caches), 1)
        positions = torch.full_like(ids, self.seen)
        logits = _forward(self.model, ids, positions, self._cache)
        self.seen += 1
        return logits

    def feed(self, tokens: Sequence[int], keep: bool = False) -> torch.Tensor:
        """Feed the same block of tokens to every row (a question after the prompt); returns each row's logits
        at the block's last position [rows, vocab]. `keep`: the block is kept in full in every row whatever
        its plan (`RoutedCache.keep_until`), eviction resuming with the next token."""
        device = next(self.model.parameters()).device
        block = torch.as_tensor(tokens, device=device).view(1, -1)
        if keep:
            for cache in self.caches:
                cache.keep_until(self.seen + block.shape[1])
        positions = torch.arange(self.seen, self.seen + block.shape[1], device=device).view(1, -1)
        logits = _forward(
            self.model, block.expand(len(self.caches), -1), positions.expand(len(self.caches), -1), self._cache
        )
        self.seen += block.shape[1]
        return logits

    def reserve(self, steps: int) -> None:
        """Room for `steps` more tokens in every layer that keeps everything (`RoutedLayer.reserve`)."""
        for cache in self.caches:
            for layer in cache.layers:
                layer.reserve(steps)

    def select(self, rows: Sequence[int]) -> None:
        """Keep only these rows (e.g. the sequences still generating), in this order."""
        self.caches = [self.caches[i] for i in rows]
        self._cache = self._rows_cache()

    def _rows_cache(self) -> Cache:
        if not self.caches:
            return Cache(layers=[])
        layers = len(self.caches[0].layers)
        return Cache(layers=[PlanRows(i, [c.layers[i] for c in self.caches]) for i in range(layers)])


def greedy(batch: PlanBatch, logits: torch.Tensor, max_new_tokens: int, stop: set[int], min_new_tokens: int = 0):
    """Each row's greedy continuation (as `generate(do_sample=False)`: the argmax of fp32 logits, end-of-
    sequence tokens masked until `min_new_tokens`, a row stops after emitting a `stop` token, which is
    kept). `logits`: the first step's [vocab] (shared) or [rows, vocab]. Returns one token list per row."""
    return force_and_generate(batch, logits, max_new_tokens=max_new_tokens, stop=stop, min_new_tokens=min_new_tokens)


def force_and_generate(
    batch: PlanBatch,
    logits: torch.Tensor,
    *,
    forced: int = 0,
    feed: Sequence[int] = (),
    on_forced: Callable[[int, torch.Tensor], None] | None = None,
    max_new_tokens: int = 0,
    stop: set[int] | frozenset[int] = frozenset(),
    min_new_tokens: int = 0,
) -> list[list[int]]:
    """Step two groups of rows together. Rows [0, forced) are teacher-forced: step t feeds them `feed[t]`
    and hands their next-token logits [forced, vocab] to `on_forced(t, logits)`. The other rows continue
    greedily as `greedy` says. Each group leaves the batch once it is done. `logits`: the first step's
    [vocab] (shared by every row) or [rows, vocab]. Returns the greedy rows' tokens, one list per row."""
    rows = len(batch)
    out: list[list[int]] = [[] for _ in range(rows - forced)]
    alive = list(range(rows - forced))  # the greedy rows still generating, by their index in `out`
    forcing = forced  # forced rows in the batch now (they come first)
    banned = sorted(stop)
    if logits.dim() == 1:
        logits = logits.unsqueeze(0).expand(rows, -1)
    for step in range(max(len(feed), max_new_tokens)):
        chosen: list[int] = []
        keep: list[int] = []  # positions in `alive` of the greedy rows that go on
        if alive:
            scores = logits[forcing:].float()
            if step < min_new_tokens and banned:
                scores = scores.clone()
                scores[:, banned] = float("-inf")
            chosen = scores.argmax(dim=-1).tolist()
            for i, (row, token) in enumerate(zip(alive, chosen)):
                out[row].append(token)
                if token not in stop and step < max_new_tokens - 1:
                    keep.append(i)
        next_forcing = forced if step < len(feed) else 0
        if not next_forcing and not keep:
            break
        if next_forcing + len(keep) < forcing + len(alive):
            batch.select(list(range(next_forcing)) + [forcing + i for i in keep])
        alive = [alive[i] for i in keep]
        logits = batch.step(([feed[step]] * next_forcing if next_forcing else []) + [chosen[i] for i in keep])
        if next_forcing and on_forced is not None:
            on_forced(step, logits[:next_forcing])
        forcing = next_forcing
    return out


def _forward(model, ids: torch.Tensor, positions: torch.Tensor | None, cache: Cache) -> torch.Tensor:
    """The model on `ids` with `cache`; the last position's logits [rows, vocab]."""
    kwargs = {cache_argument_name(model): cache, "use_cache": True}
    if positions is not None:
        kwargs["position_ids"] = positions
    if _keeps_logits(model):
        kwargs["logits_to_keep"] = 1
    return model(input_ids=ids, **kwargs).logits[:, -1]


def _keeps_logits(model) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


class SharedPrompt(DynamicLayer):
    """One layer of the shared prompt pass: FullKV's layer computes the output; then every plan's layer
    takes the same keys, values and signals and settles its prefill (see the module docstring)."""

    def __init__(self, layer_idx: int, targets: list[RoutedLayer], steps: list[PromptStep] | None = None):
        super().__init__()
        self.layer_idx = layer_idx
        self.reference = RoutedLayer(layer_idx, make_method(FULL_ASSIGNMENT), make_method(FULL_ASSIGNMENT))
        self.targets = targets
        self.steps = steps  # the pass's steps, kept for a replay (`PromptPasses`)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values = self.reference.update(key_states, value_states)
        hand_over(self)
        return keys, values

    def get_seq_length(self) -> int:
        return self.reference.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.reference.get_mask_sizes(query_length)

    def attend(self, module, query, key, value, dropout: float, scaling: float, kwargs):
        output = self.reference.attend(module, query, key, value, dropout, scaling, kwargs)
        step = PromptStep(self.layer_idx, module, query, key, value, scaling, kwargs.get("sliding_window"), {})
        # FullKV's layer holds the laid-out copy too, so the prompt is held once until the pass ends
        self.reference.keys, self.reference.values = step.hand_to(self.targets)
        if self.steps is not None:
            self.steps.append(step)
        return output


class PlanRows(DynamicLayer):
    """One layer of a step of several plans: rows [i * width, (i + 1) * width) of the batch are `layers[i]`,
    plan i's layer (its own slots and methods; a plan may hold `width` sequences)."""

    def __init__(self, layer_idx: int, layers: list[RoutedLayer], width: int = 1):
        super().__init__()
        self.layer_idx = layer_idx
        self.layers = layers
        self.width = width
        self.shared: SharedRows | None = None  # made at the first one-token step (`polykv.runtime.row_storage`)

    def _rows(self, tensor: torch.Tensor, i: int) -> torch.Tensor:
        return tensor[i * self.width : (i + 1) * self.width]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.shared is None and key_states.shape[-2] == 1 and len(self.layers) > 1:
            self.shared = SharedRows(self.layers, self.width)
        for i, layer in enumerate(self.layers):
            layer.update(self._rows(key_states, i), self._rows(value_states, i))
        hand_over(self)
        return key_states, value_states

    def get_seq_length(self) -> int:
        return self.layers[0].seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return max(layer.retained for layer in self.layers) + query_length, 0

    def attend(self, module, query, key, value, dropout: float, scaling: float, kwargs):
        together = {}
        if self.shared is not None and query.shape[2] == 1:
            together = attend_shared(self.shared, module, query, dropout, scaling, kwargs)
        outputs = []
        for i, layer in enumerate(self.layers):
            if i not in together:
                rows = self._rows(query, i)
                together[i] = attend(layer, module, rows, layer.keys, layer.values, dropout, scaling, kwargs, True)[0]
            outputs.append(together[i])
        return torch.cat(outputs, dim=0), None


@torch.inference_mode()
def generate_many(
    model,
    plans: Sequence[Plan],
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    eos_token_id: int | Sequence[int] | None = None,
    min_new_tokens: int = 0,
) -> list[list[int]]:
    """Each plan's greedy continuation of one prompt (the new tokens, an ending end-of-sequence token
    included), as `model.generate(do_sample=False)` under `routed(model, plan)` gives it, for all the
    plans at once. `eos_token_id`: what ends a generation (default: the generation config's)."""
    with many(model, plans) as session:
        batch, logits = session.prefill(prompt_ids)
        batch.reserve(max_new_tokens)
        return greedy(batch, logits, max_new_tokens, eos_ids(model, eos_token_id), min_new_tokens)


__all__ = [
    "Many",
    "PlanBatch",
    "PlanRows",
    "PromptPass",
    "PromptPasses",
    "PromptStep",
    "SharedPrompt",
    "force_and_generate",
    "generate_many",
    "greedy",
    "many",
]
