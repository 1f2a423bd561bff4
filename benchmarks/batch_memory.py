"""Does a process that runs batched blocks one sample after another hold on to earlier samples? (the leak fixed in
`polykv.runtime.garbage`, 2026-12-07). One `many()` block per "sample" (the same prompt, prefilled for three plans,
then a 10-token question), as the suite runner does; every `--every` samples it prints the objects the garbage
collector has frozen, the tensors it has not (frozen ones are not listed) and the process's resident memory.

    .venv/bin/python benchmarks/batch_memory.py --model demo --tokens 400 --samples 30
"""

from __future__ import annotations

import argparse
import gc
import os

import torch


def resident_mb() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--every", type=int, default=3)
    args = parser.parse_args()
    from polykv.models import load_model
    from polykv.plan import Plan
    from polykv.runtime.many_plans import many

    model, _ = load_model(args.model)
    layers = len(model.model.layers)
    plans = [Plan.homogeneous(m, 64, layers, "prefill") for m in ("tova", "snapkv", "keydiff")]
    prompt = torch.randint(3, 200, (args.tokens,), generator=torch.Generator().manual_seed(0))
    torch.set_grad_enabled(False)
    for sample in range(args.samples):
        with many(model, plans) as batched:
            frozen = gc.get_freeze_count()
            batch, _ = batched.prefill(prompt)
            batch.feed(list(range(5, 15)))
        if sample % args.every == 0:
            tensors = sum(isinstance(o, torch.Tensor) for o in gc.get_objects())
            print(f"sample {sample:3d}  frozen {frozen:7d}  unfrozen tensors {tensors:5d}  RSS {resident_mb()} MB")
    print(f"a full collection at the end frees {gc.collect()} objects; RSS {resident_mb()} MB")


if __name__ == "__main__":
    main()
