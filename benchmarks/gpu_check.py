"""GPU check: exactness and overhead of the routed cache at Llama-3.1-8B scale.

On a CUDA machine, builds a random-weight model with the Llama-3.1-8B configuration in bf16 and
  1. checks that a `full` plan reproduces vanilla Hugging Face logits on an 8K-token prompt (the last
     prompt positions at prefill, then every greedy decode step), and
  2. prints the `benchmarks/runtime.py` table (prefill, per-token decode, KV bytes held vs nominal),
     with one row per method at the decode-phase capacity.

    python benchmarks/gpu_check.py                 # 8192-token prompt, 64 new tokens, capacity 256
    python benchmarks/gpu_check.py --reps 5 --capacity 1024

Needs no network: the weights are random, only the shapes are Llama-3.1-8B's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runtime import benchmark, build_model, method_rows, report, run_config, standard_rows  # noqa: E402

from polykv.models import cache_argument_name, output_cache  # noqa: E402
from polykv.plan import Plan  # noqa: E402
from polykv.runtime import routed  # noqa: E402

LLAMA_31_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)


@torch.no_grad()
def exactness(model, ids: torch.Tensor, steps: int, keep: int = 64) -> dict:
    """Max |logit difference| between vanilla and a `full` plan, at prefill and each decode step."""

    def trace(plan):
        name = cache_argument_name(model)

        def go():
            out = model(ids, use_cache=True, logits_to_keep=keep)
            cache = output_cache(out)
            logits = [out.logits.float()]
            token = out.logits[:, -1:].argmax(-1)
            for _ in range(steps):
                out = model(token, use_cache=True, **{name: cache})
                logits.append(out.logits.float())
                token = out.logits[:, -1:].argmax(-1)
            return logits

        if plan is None:
            return go()
        with routed(model, plan):
            return go()

    vanilla = trace(None)
    routed_logits = trace(Plan.homogeneous("full", None, model.config.num_hidden_layers))
    diffs = [(a - b).abs().max().item() for a, b in zip(vanilla, routed_logits)]
    agree = sum(int(a[:, -1].argmax() == b[:, -1].argmax()) for a, b in zip(vanilla, routed_logits))
    return {"prefill": diffs[0], "decode_max": max(diffs[1:]), "top1_agreement": f"{agree}/{len(diffs)}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-len", type=int, default=8192)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--capacity", type=int, default=256)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--exact-steps", type=int, default=16)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_check.py needs a CUDA device")

    device, dtype = "cuda", torch.bfloat16
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | transformers {transformers.__version__}")
    model = build_model(LLAMA_31_8B, device, dtype)
    ids = torch.randint(3, LLAMA_31_8B["vocab_size"], (1, args.prompt_len), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    run_config(model, standard_rows(32, args.capacity)[0], ids[:, :512], 2, device)  # warm-up

    result = exactness(model, ids, args.exact_steps)
    print(
        f"exactness, full plan vs vanilla (bf16, prompt {args.prompt_len}, {args.exact_steps} decode steps): "
        f"max |dlogit| prefill {result['prefill']:.3g}, decode {result['decode_max']:.3g}; "
        f"top-1 agreement {result['top1_agreement']}"
    )
    rows = standard_rows(32, args.capacity) + method_rows(32, args.capacity)
    rows = benchmark(model, rows, args.prompt_len, args.new_tokens, args.reps, device, dtype)
    print(
        report(
            rows,
            f"Llama-3.1-8B shape, random bf16 weights; prompt {args.prompt_len}, {args.new_tokens} new tokens; "
            f"{args.reps} repetitions, each configuration in lockstep with vanilla; "
            f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB",
        )
    )


if __name__ == "__main__":
    main()
