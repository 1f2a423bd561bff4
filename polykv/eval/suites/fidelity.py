"""The `fidelity` suite: how closely a plan tracks FullKV on long offline text (any model, CPU-friendly).

Tasks draw long prompts from the evaluation part of offline sources (never the text profiles are built
from; see polykv.profile.corpus for the sources):
  prose         the King James Bible (kjv)
  jargon        the Jargon File (jargon)
  code          the Python standard library (stdlib)
  stories       text the model itself samples from BOS at temperature 1 (model)
  stories-t0.7  its samples at temperature 0.7: plainer, more repetitive stories (model@0.7)
  stories-t1.2  its samples at temperature 1.2: looser, more surprising text (model@1.2)
  tale-park     its samples after the opening "Lily and Ben went to the park" (model:...)
  tale-dog      ... after "A little dog named Max"
  tale-ball     ... after "Tom had a red ball"
  tale-sun      ... after "The sun was shining"
`default_tasks(model_name)` gives a model's default tasks: the seven story tasks for the demo model
(stories260K knows only TinyStories: FullKV perplexity about 2-6 on each of them, against hundreds on
prose, jargon and code, where a plan's differences would be noise), `TEXT_TASKS` (the texts, nothing
sampled) for smollm2, `GENERAL_TASKS` for any other model.
`FidelitySettings()` keeps the model-independent `GENERAL_TASKS`; callers that know the model pass
`tasks=default_tasks(model_name)`.

For each sample:
  ppl     perplexity of the next `continuation` tokens of the text, teacher-forced, under the plan
  kl      mean KL(FullKV || plan) of the next-token distributions over those steps
  top1    share of those steps where the plan's most likely token is FullKV's
  rougeL  ROUGE-L F1 (LCS over token ids) of the plan's greedy `generate`-token continuation
          against FullKV's
FullKV is the unmodified model, so the `full` plan scores KL 0, top-1 1 and ROUGE-L 1. FullKV's
reference (teacher-forced logits and greedy continuation) depends only on the model and the sample: it
is computed once per sample and process and reused by every plan scored on it (`clear_reference_cache`).
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from dataclasses import asdict, dataclass

from polykv.lazy import no_grad, torch
from polykv.models import cache_argument_name, context_length, output_cache
from polykv.models.support import eos_ids, greedy_needs_generate
from polykv.plan import Plan
from polykv.profile.corpus import CorpusSpec, build_corpus, model_source

from .answers import Scored

TASK_SOURCES = {
    "prose": "kjv",
    "jargon": "jargon",
    "code": "stdlib",
    "stories": "model",
    "stories-t0.7": "model@0.7",
    "stories-t1.2": "model@1.2",
    "tale-park": "model:Lily and Ben went to the park",
    "tale-dog": "model:A little dog named Max",
    "tale-ball": "model:Tom had a red ball",
    "tale-sun": "model:The sun was shining",
}
GENERAL_TASKS = ("prose", "jargon", "code", "stories")
TEXT_TASKS = ("prose", "jargon", "code")  # the held-out texts alone (corpus.TEXT_SOURCES)
# The demo's tasks are the demo's calibration families (corpus.DEMO_SOURCES), drawn from the evaluation split.
DEMO_TASKS = ("stories", "stories-t0.7", "stories-t1.2", "tale-park", "tale-dog", "tale-ball", "tale-sun")
METRICS = ("ppl", "kl", "top1", "rougeL")


def default_tasks(model_name: str | None) -> tuple[str, ...]:
    """A model's default fidelity tasks: `DEMO_TASKS` (text it models well) for the demo model, `TEXT_TASKS`
    (no sampling: a CPU model's sampled prompts cost minutes) for smollm2, `GENERAL_TASKS` for any other."""
    from polykv.models import DEMO_MODEL, SMOLLM2_MODEL

    if model_name in (None, DEMO_MODEL):
        return DEMO_TASKS
    return TEXT_TASKS if model_name == SMOLLM2_MODEL else GENERAL_TASKS


@dataclass(frozen=True)
class FidelitySettings:
    tasks: tuple[str, ...] = GENERAL_TASKS  # model-independent; see default_tasks(model_name)
    samples_per_task: int = 4
    prompt_tokens: int = 1024  # clipped so that prompt + continuation fits the model's context
    continuation: int = 32
    generate: int = 32

    def __post_init__(self):
        unknown = [t for t in self.tasks if t not in TASK_SOURCES]
        if unknown:
            raise ValueError(f"unknown fidelity task(s) {', '.join(unknown)} (tasks: {', '.join(TASK_SOURCES)})")
        if not self.tasks or len(set(self.tasks)) < len(self.tasks):
            raise ValueError(
                f"fidelity tasks must be listed once each, at least one (got {', '.join(self.tasks) or 'none'})"
            )
        if self.samples_per_task < 1 or self.continuation < 1 or self.generate < 1 or self.prompt_tokens < 8:
            raise ValueError(
                "fidelity settings: samples_per_task, continuation and generate must be >= 1, prompt_tokens >= 8"
            )

    def to_dict(self) -> dict:
        return {**asdict(self), "tasks": list(self.tasks)}


Settings = FidelitySettings  # every suite module exposes Settings, build_samples and score_sample
# Bump whenever samples or scoring change: run ids include it, so older results are never reused.
REVISION = 2  # 2: in-distribution story tasks for the demo model; model samples seeded per split


def build_samples(tokenizer, model, settings: FidelitySettings, seed: int) -> list[tuple[str, str, list[int]]]:
    """(task, sample id, token ids of prompt + continuation + 1) for every sample, deterministic for a seed.

    A task's samples do not depend on the other tasks listed. The tasks the model samples are drawn in one
    corpus (one sampling batch: round-robin, so sample i of the j-th such task is sequence i * n + j).
    """
    context = context_length(model) or 10**9
    tail = max(settings.continuation + 1, settings.generate)
    prompt = min(settings.prompt_tokens, context - tail - 1)
    if prompt < 8:
        raise ValueError(f"the model's context ({context}) is too short for these fidelity settings")

    def corpus(sources: tuple[str, ...]) -> list[list[int]]:
        spec = CorpusSpec(
            sources=sources,
            num_sequences=settings.samples_per_task * len(sources),
            max_tokens=prompt + settings.continuation + 1,
            seed=seed,
            split="evaluation",
        )
        return build_corpus(tokenizer, spec, model=model, context_length=context).sequences

    sampled = tuple(t for t in settings.tasks if model_source(TASK_SOURCES[t]) is not None)
    drawn = corpus(tuple(TASK_SOURCES[t] for t in sampled)) if sampled else []
    out = []
    for task in settings.tasks:
        if task in sampled:
            j = sampled.index(task)
            sequences = drawn[j :: len(sampled)]
        else:
            sequences = corpus((TASK_SOURCES[task],))
        out += [(task, f"{i:03d}", ids) for i, ids in enumerate(sequences)]
    return out


def prompt_tokens(ids: list[int]) -> list[int]:
    """The tokens a sample's id hashes: the whole text (prompt, continuation and the one token after)."""
    return ids


@no_grad
def score_sample(model, plan: Plan, ids: list[int], settings: FidelitySettings) -> Scored:
    """One plan alone: the metrics, and the KV its teacher-forced cache held entering the continuation and at its
    end (`RoutedCache.kv_held`)."""
    device = next(model.parameters()).device
    tokens = torch.tensor([ids], device=device)
    prompt = tokens.shape[1] - settings.continuation - 1
    ref_logits, ref_greedy = _reference(model, ids, tokens, prompt, settings)
    logits, greedy, held = _trace(model, plan, tokens, prompt, settings.generate)
    return Scored(_metrics(logits, greedy, ref_logits, ref_greedy, tokens[0, prompt + 1 :]), kv_held=held)


@no_grad
def score_samples(model, plans: list[Plan], ids: list[int], settings: FidelitySettings) -> list[Scored]:
    """`score_sample` for several plans on one sample at once (`polykv.runtime.many_plans`): one prompt pass
    prefills two copies of every plan, one teacher-forced over the continuation and one generating
    greedily, all stepping as one batch."""
    from polykv.runtime import many_plans  # torch and transformers: when a plan runs

    if greedy_needs_generate(model):
        return [score_sample(model, plan, ids, settings) for plan in plans]
    device = next(model.parameters()).device
    tokens = torch.tensor([ids], device=device)
    prompt = tokens.shape[1] - settings.continuation - 1
    ref_logits, ref_greedy = _reference(model, ids, tokens, prompt, settings)
    count = len(plans)
    steps: list[list[torch.Tensor]] = [[] for _ in plans]  # each plan's teacher-forced logits

    def keep(step: int, logits: torch.Tensor) -> None:
        for plan_steps, row in zip(steps, logits):
            plan_steps.append(row)

    with torch.inference_mode(), many_plans.many(model, list(plans) * 2) as session:
        # rows [0, count): teacher-forced over the continuation; rows [count, 2 count): greedy, end-of-sequence
        # masked throughout (min_new_tokens = generate)
        rows, first = session.prefill(tokens[0, :prompt])
        caches = list(rows.caches)  # the teacher-forced rows first; each keeps what it held after leaving the batch
        rows.reserve(max(settings.continuation, settings.generate))
        greedy = many_plans.force_and_generate(
            rows,
            first,
            forced=count,
            feed=tokens[0, prompt:-1].tolist(),
            on_forced=keep,
            max_new_tokens=settings.generate,
            stop=eos_ids(model),
            min_new_tokens=settings.generate,
        )
        targets = tokens[0, prompt + 1 :]
        metrics = [_metrics(torch.stack(steps[i]), greedy[i], ref_logits, ref_greedy, targets) for i in range(count)]
        return [Scored(values, kv_held=cache.kv_held()) for values, cache in zip(metrics, caches)]


def _metrics(logits, greedy: list[int], ref_logits, ref_greedy: list[int], targets) -> dict[str, float]:
    """A sample's metrics from the plan's teacher-forced logits and greedy tokens and FullKV's."""
    logits = logits.double()
    logp, ref_logp = torch.log_softmax(logits, -1), torch.log_softmax(ref_logits, -1)
    nll = -logp.gather(-1, targets[:, None]).mean().item()
    kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1).clamp_min(0).mean().item()
    return {
        "ppl": math.exp(nll),
        "kl": kl,
        "top1": (logits.argmax(-1) == ref_logits.argmax(-1)).double().mean().item(),
        "rougeL": rouge_l(greedy, ref_greedy),
    }


# ---- FullKV's reference, once per (model, sample) in this process -----------------------------------
# Entries hold the teacher-forced logits in the model's own dtype on the CPU (fp64 only when used, an
# exact widening) and are dropped least recently used first beyond REFERENCE_CACHE_BYTES.
REFERENCE_CACHE_BYTES = 512 * 2**20
_reference_cache: OrderedDict[tuple, tuple[weakref.ref, torch.Tensor, list[int]]] = OrderedDict()
_reference_lock = threading.Lock()


def clear_reference_cache() -> None:
    """Forget every cached FullKV reference (e.g. after changing a model's weights in place)."""
    with _reference_lock:
        _reference_cache.clear()


def _reference(model, ids: list[int], tokens: torch.Tensor, prompt: int, settings: FidelitySettings):
    """FullKV's teacher-forced logits [M, vocab] (fp64) and greedy continuation for one sample, cached.

    The key names the model object (with its device and dtype, which change its logits) and everything
    the reference depends on; a weak reference guards against a new model reusing a freed one's id.
    """
    parameter = next(model.parameters())
    key = (id(model), str(parameter.device), str(parameter.dtype), tuple(ids), settings.continuation, settings.generate)
    with _reference_lock:
        entry = _reference_cache.get(key)
        if entry is not None and entry[0]() is model:
            _reference_cache.move_to_end(key)
            return entry[1].to(tokens.device).double(), list(entry[2])
    logits, greedy, _ = _trace(model, None, tokens, prompt, settings.generate)
    stored = logits.cpu()
    if stored.element_size() * stored.nelement() <= REFERENCE_CACHE_BYTES:
        with _reference_lock:
            _reference_cache[key] = (weakref.ref(model), stored, list(greedy))
            total = sum(e[1].element_size() * e[1].nelement() for e in _reference_cache.values())
            while total > REFERENCE_CACHE_BYTES:
                _, (_, dropped, _) = _reference_cache.popitem(last=False)
                total -= dropped.element_size() * dropped.nelement()
    return logits.double(), list(greedy)


def _trace(model, plan: Plan | None, tokens: torch.Tensor, prompt: int, generate: int):
    """Teacher-forced next-token logits over the continuation [M, vocab] (the model's dtype), a greedy
    continuation, and the KV the teacher-forced cache held (None without a plan)."""
    if plan is None:
        return teacher_forced_logits(model, tokens, prompt), _greedy(model, tokens[:, :prompt], generate), None
    from polykv.runtime import routed  # torch and transformers: when a plan runs

    with routed(model, plan):
        logits, cache = teacher_forced_logits(model, tokens, prompt, with_cache=True)
        return logits, _greedy(model, tokens[:, :prompt], generate), cache.kv_held()


def teacher_forced_logits(model, tokens: torch.Tensor, prompt: int, with_cache: bool = False):
    """The next-token logits over the continuation [M, vocab], token by token after the prompt's pass; with
    `with_cache`, (those logits, the cache)."""
    name = cache_argument_name(model)
    out = model(tokens[:, :prompt], use_cache=True, logits_to_keep=1)
    cache, steps = output_cache(out), []
    for t in range(prompt, tokens.shape[1] - 1):  # token by token: decode-phase methods act every step
        out = model(tokens[:, t : t + 1], use_cache=True, **{name: cache})
        steps.append(out.logits[0, -1])
    return (torch.stack(steps), cache) if with_cache else torch.stack(steps)


def _greedy(model, prompt: torch.Tensor, generate: int) -> list[int]:
    out = model.generate(prompt, max_new_tokens=generate, min_new_tokens=generate, do_sample=False)
    return out[0, prompt.shape[1] :].tolist()


def rouge_l(candidate: list[int], reference: list[int]) -> float:
    """ROUGE-L F1 from the longest common subsequence of two token sequences."""
    if not candidate or not reference:
        return float(candidate == reference)
    previous = [0] * (len(reference) + 1)
    for c in candidate:
        current = [0]
        for j, r in enumerate(reference):
            current.append(previous[j] + 1 if c == r else max(previous[j + 1], current[j]))
        previous = current
    lcs = previous[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(candidate), lcs / len(reference)
    return 2 * precision * recall / (precision + recall)
