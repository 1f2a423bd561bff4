"""What each operation of D2O's one-slot merge costs alone, at `decode_overhead.py`'s shapes.

D2O's usual decode step (`_merge_evicted_slot` and `_threshold_gate` in polykv/methods/merging/d2o.py) is about
27 small operations per layer; on a host-bound step their cost is dispatch, not arithmetic. This times
each kind once, in a tight loop (best of 5 repeats of 2,000 calls, one thread), on one layer of the
host-bound model: batch 1, 2 KV heads, 257 slots, head dim 32. (Since layers merge together,
`polykv.runtime.merges`, these operations run once per step for all the layers of one capacity.)

    python benchmarks/d2o_ops.py
"""

from __future__ import annotations

import timeit

import torch


def main() -> None:
    torch.set_num_threads(1)
    b, h, n, d = 1, 2, 257, 32
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(b, h, n, d, generator=g)
    kv = torch.randn(2, b, h, 1, d, generator=g)
    similarity = torch.rand(b, h, 1, 1, generator=g)
    tau = torch.tensor([0.3], dtype=torch.float64)
    norms = torch.linalg.vector_norm(keys, dim=-1, keepdim=True)
    unit = keys / norms
    picked = unit[:, :, :1].reshape(b * h, 1, d)
    index = torch.zeros(b, h, 1, 1, dtype=torch.long)
    gate = similarity >= 0.5
    tau32 = tau.float().view(b, 1, 1, 1)
    half = torch.tensor(0.5)
    operations = {
        "view": lambda: similarity.view(b, h, 1, 1),
        "expand": lambda: index.expand(b, h, 1, d),
        "key norms (n x d)": lambda: torch.linalg.vector_norm(keys, dim=-1, keepdim=True),
        "clamp_min_": lambda: norms.clamp_min_(1e-12),
        "divide by the norms": lambda: keys / norms,
        "gather one slot": lambda: unit.gather(2, index.expand(b, h, 1, d)),
        "bmm (cosines)": lambda: torch.bmm(picked, unit.reshape(b * h, n, d).mT),
        "max over slots": lambda: keys[..., 0].max(dim=-1, keepdim=True),
        "float64 mean (tau)": lambda: similarity.mean(dim=(1, 2, 3), dtype=torch.float64),
        "lerp (tau)": lambda: torch.lerp(tau, tau, 0.5),
        "tau to float32": lambda: tau.to(torch.float32),
        "compare (gate)": lambda: similarity >= tau32,
        "addcmul": lambda: torch.addcmul(kv, kv, similarity),
        "mul by a 0-d 0.5": lambda: kv.mul(half),  # (in place, repeated, it would reach subnormals)
        "where": lambda: torch.where(gate, kv, kv),
    }
    print(f"torch {torch.__version__}, one thread; [b, h, n, d] = [{b}, {h}, {n}, {d}]")
    for name, call in operations.items():
        call()
        seconds = min(timeit.repeat(call, number=2000, repeat=5)) / 2000
        print(f"{name:<22} {seconds * 1e6:7.2f} us")


if __name__ == "__main__":
    main()
