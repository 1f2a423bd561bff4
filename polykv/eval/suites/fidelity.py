"""The `fidelity` suite: how closely a plan tracks FullKV on long offline text (any model, CPU-friendly).

Tasks draw long prompts from the evaluation part of offline sources (never the text profiles are built
from): `prose` (King James Bible), `jargon` (the Jargon File), `code` (the Python standard library) and
`stories` (text the model itself samples: in-domain for a small specialised model). For each sample:
  ppl     perplexity of the next `continuation` tokens of the text, teacher-forced, under the plan
  kl      mean KL(FullKV || plan) of the next-token distributions over those steps
  top1    share of those steps where the plan's most likely token is FullKV's
  rougeL  ROUGE-L F1 (LCS over token ids) of the plan's greedy `generate`-token continuation
          against FullKV's
FullKV is the unmodified model, so the `full` plan scores KL 0, top-1 1 and ROUGE-L 1.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from polykv.plan import Plan
from polykv.profile.corpus import CorpusSpec, build_corpus
from polykv.runtime import routed
from polykv.runtime.routed import cache_argument_name, output_cache

TASK_SOURCES = {"prose": "kjv", "jargon": "jargon", "code": "stdlib", "stories": "model"}
METRICS = ("ppl", "kl", "top1", "rougeL")


@dataclass(frozen=True)
class FidelitySettings:
    tasks: tuple[str, ...] = tuple(TASK_SOURCES)
    samples_per_task: int = 4
    prompt_tokens: int = 1024  # clipped so that prompt + continuation fits the model's context
    continuation: int = 32
    generate: int = 32

    def __post_init__(self):
        unknown = [t for t in self.tasks if t not in TASK_SOURCES]
        if unknown:
            raise ValueError(f"unknown fidelity task(s) {', '.join(unknown)} (tasks: {', '.join(TASK_SOURCES)})")
        if self.samples_per_task < 1 or self.continuation < 1 or self.generate < 1 or self.prompt_tokens < 8:
            raise ValueError("fidelity settings: samples_per_task, continuation and generate must be >= 1, prompt_tokens >= 8")

    def to_dict(self) -> dict:
        return {**asdict(self), "tasks": list(self.tasks)}


Settings = FidelitySettings  # every suite module exposes Settings, build_samples and score_sample


def build_samples(tokenizer, model, settings: FidelitySettings, seed: int) -> list[tuple[str, str, list[int]]]:
    """(task, sample id, token ids of prompt + continuation + 1) for every sample, deterministic for a seed."""
    context = getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None) or 10**9
    tail = max(settings.continuation + 1, settings.generate)
    prompt = min(settings.prompt_tokens, context - tail - 1)
    if prompt < 8:
        raise ValueError(f"the model's context ({context}) is too short for these fidelity settings")
    out = []
    for task in settings.tasks:
        spec = CorpusSpec(
            sources=(TASK_SOURCES[task],), num_sequences=settings.samples_per_task,
            max_tokens=prompt + settings.continuation + 1, seed=seed, split="evaluation",
        )
        corpus = build_corpus(tokenizer, spec, model=model, context_length=context)
        out += [(task, f"{i:03d}", ids) for i, ids in enumerate(corpus.sequences)]
    return out


@torch.no_grad()
def score_sample(model, plan: Plan, ids: list[int], settings: FidelitySettings) -> dict[str, float]:
    device = next(model.parameters()).device
    tokens = torch.tensor([ids], device=device)
    prompt = tokens.shape[1] - settings.continuation - 1
    ref_logits, ref_greedy = _trace(model, None, tokens, prompt, settings.generate)
    logits, greedy = _trace(model, plan, tokens, prompt, settings.generate)
    targets = tokens[0, prompt + 1 :]
    logp, ref_logp = torch.log_softmax(logits, -1), torch.log_softmax(ref_logits, -1)
    nll = -logp.gather(-1, targets[:, None]).mean().item()
    kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1).clamp_min(0).mean().item()
    return {
        "ppl": math.exp(nll),
        "kl": kl,
        "top1": (logits.argmax(-1) == ref_logits.argmax(-1)).double().mean().item(),
        "rougeL": rouge_l(greedy, ref_greedy),
    }


def _trace(model, plan: Plan | None, tokens: torch.Tensor, prompt: int, generate: int):
    """Teacher-forced next-token logits over the continuation [M, vocab] (fp64), then a greedy continuation."""
    if plan is None:
        return _teacher_forced(model, tokens, prompt), _greedy(model, tokens[:, :prompt], generate)
    with routed(model, plan):
        return _teacher_forced(model, tokens, prompt), _greedy(model, tokens[:, :prompt], generate)


def _teacher_forced(model, tokens: torch.Tensor, prompt: int) -> torch.Tensor:
    name = cache_argument_name(model)
    out = model(tokens[:, :prompt], use_cache=True, logits_to_keep=1)
    cache, steps = output_cache(out), []
    for t in range(prompt, tokens.shape[1] - 1):  # token by token: decode-phase methods act every step
        out = model(tokens[:, t : t + 1], use_cache=True, **{name: cache})
        steps.append(out.logits[0, -1].double())
    return torch.stack(steps)


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
