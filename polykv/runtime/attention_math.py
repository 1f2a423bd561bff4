"""The arithmetic of PolyKV's attention steps: one query's softmax row and output, the probabilities of chosen
queries under a causal (and windowed) mask built from true slot positions, the column sums over every query,
a fresh prompt's fused causal pass that gives the output and the column sums at once, and attention entropies.
Probabilities are fp32, as the methods score; long steps are computed in query chunks so memory stays bounded.
"""

from __future__ import annotations

import torch

# Bound the [b, heads, chunk, n] fp32 block used for column sums to about this many elements
# (small enough to stay in cache-friendly sizes, large enough to keep the matmuls efficient).
_COLUMN_SUM_BLOCK = 1 << 24


def decode_output(query, key, value, scaling, lengths: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One query's attention output [b, 1, h*g, dv] over every held slot, and its probabilities [b*h, g, n].
    `lengths`: row r of the batch sees only its first lengths[r] slots (many plans' rows in one shared block,
    `polykv.runtime.row_storage`; the slots past them hold finite numbers and get probability exactly 0)."""
    b, qh = query.shape[:2]
    h, n = key.shape[1], key.shape[2]
    probs = _decode_probs(query, key, scaling, lengths)  # [b*h, g, n]
    weights = probs if value.dtype == probs.dtype else probs.to(value.dtype)
    attn_output = torch.bmm(weights, value.reshape(b * h, n, value.shape[-1])).view(b, 1, qh, value.shape[-1])
    return attn_output, probs


def _decode_probs(query, key, scaling, lengths: list[int] | None = None) -> torch.Tensor:
    """Softmax attention [b*h, g, n] (fp32) of one query per head over every held slot (or each row's first
    `lengths[r]`), in as few operations as the step allows (it runs for every layer at every decode step)."""
    b, qh, _, d = query.shape
    h, n = key.shape[1], key.shape[2]
    grouped_q = query.reshape(b * h, qh // h, d)
    grouped_k = key.reshape(b * h, n, d)
    if grouped_q.dtype != torch.float32:
        grouped_q, grouped_k = grouped_q.float(), grouped_k.float()
    scores = torch.bmm(grouped_q * scaling, grouped_k.transpose(1, 2))
    if lengths is not None and min(lengths) < n:
        length = torch.tensor(lengths, device=scores.device).repeat_interleave(h).view(b * h, 1, 1)
        scores = scores.masked_fill(torch.arange(n, device=scores.device) >= length, float("-inf"))
    return torch.softmax(scores, dim=-1)


def rows_output(rows: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The output [b, w, h*g, dv] of w queries from their probabilities `rows` [b, h*g, w, n] (fp32) over the values
    [b, h, n, dv]: in the values' dtype, as eager attention does."""
    b, qh, w, n = rows.shape
    h, dv = value.shape[1], value.shape[-1]
    weights = rows if value.dtype == rows.dtype else rows.to(value.dtype)
    out = torch.bmm(weights.reshape(b * h, (qh // h) * w, n), value.reshape(b * h, n, dv))  # [b*h, g*w, dv]
    return out.view(b, qh, w, dv).transpose(1, 2)


def entropy_sums(query, key, query_pos, key_pos, scaling, window) -> torch.Tensor:
    """Entropy of each query's (causal, windowed) attention summed over the queries, [b, h*g] float64;
    in query chunks, like `column_sums`, so memory stays bounded."""
    b, qh, q_len, _ = query.shape
    n = key.shape[2]
    chunk = max(1, min(q_len, _COLUMN_SUM_BLOCK // max(1, b * qh * n)))
    total = torch.zeros(b, qh, dtype=torch.float64, device=query.device)
    for start in range(0, q_len, chunk):
        stop = min(q_len, start + chunk)
        probs = _grouped_probs(query[:, :, start:stop], key, query_pos[start:stop], key_pos, scaling, window)
        # xlogy: masked slots (p = 0) add 0, not 0 * -inf
        entropy = -torch.special.xlogy(probs, probs).sum(dim=-1)  # [b, h, g, w]
        total += entropy.sum(dim=-1).reshape(b, qh).double()
    return total


def allowed(key_pos: torch.Tensor, query_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Boolean [b, h, q, n]: may the query at each position see each slot (causal, optional window; a slot at
    position -1 is padding, `RoutedLayer.padded`, which no query sees)."""
    kp = key_pos[:, :, None, :]
    qp = query_pos[None, None, :, None]
    allowed = (kp <= qp) & (kp >= 0)
    if window is not None:
        allowed = allowed & (kp > qp - window)
    return allowed


def attention_probs(query, key, query_pos, key_pos, scaling, window=None, fresh: bool = False) -> torch.Tensor:
    """Softmax attention [b, h*g, w, n] in fp32 for the given queries over the held slots. `fresh`: the slots are a
    whole prompt in order (slot i holds position i) and the queries its last w positions, each seeing every slot
    up to its own (no window cuts it): only the last w slots can be masked."""
    b, qh, w, _ = query.shape
    return _grouped_probs(query, key, query_pos, key_pos, scaling, window, fresh).reshape(b, qh, w, -1)


def _grouped_probs(query, key, query_pos, key_pos, scaling, window, fresh: bool = False) -> torch.Tensor:
    """Softmax attention [b, h, g, w, n] (fp32), computed in place to spare memory traffic."""
    b, qh, w, d = query.shape
    h, n = key.shape[1], key.shape[2]
    # [b*h, g*w, d] @ [b*h, d, n]: one batched matmul per KV head, no broadcast copy of the keys (bmm
    # directly: what matmul would call, without its reshaping on every decode step)
    grouped_q = query.reshape(b * h, (qh // h) * w, d).float() * scaling
    scores = torch.bmm(grouped_q, key.float().reshape(b * h, n, d).transpose(-1, -2)).view(b, h, qh // h, w, n)
    if fresh and w > 1:  # the same -inf as the general mask, written only where it can fall: the last w slots
        future = torch.ones(w, w, dtype=torch.bool, device=scores.device).triu_(1)
        scores[..., n - w :].masked_fill_(future, float("-inf"))
    elif w > 1 or window is not None or key_pos is not None:  # a caller that passes positions may hold padding
        # (a head-level split's room, position -1); else the newest query sees every held slot: no mask needed
        scores.masked_fill_(~allowed(key_pos, query_pos, window)[:, :, None], float("-inf"))
    scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()
    return scores.div_(scores.sum(dim=-1, keepdim=True))


def column_sums(query, key, query_pos, key_pos, scaling, window) -> torch.Tensor:
    """Attention summed over every query, [b, h*g, n], in query chunks to bound memory."""
    b, qh, q_len, _ = query.shape
    n = key.shape[2]
    chunk = max(1, min(q_len, _COLUMN_SUM_BLOCK // max(1, b * qh * n)))
    total = torch.zeros(b, qh, n, dtype=torch.float32, device=query.device)
    for start in range(0, q_len, chunk):
        stop = min(q_len, start + chunk)
        probs = _grouped_probs(query[:, :, start:stop], key, query_pos[start:stop], key_pos, scaling, window)
        total += probs.sum(dim=3).reshape(b, qh, n)
    return total


# Query chunk of the fused prompt attention: smaller chunks skip more of the masked upper triangle (at 64,
# a 1,024-token prompt computes 53% of the score matrix) and keep each softmax block in cache; larger
# ones issue fewer operations (the bound that matters on a GPU).
_CAUSAL_CHUNK = {"cpu": 64}
_CAUSAL_CHUNK_DEFAULT = 512
# Accelerators get 8x the CPU's block bound (512 MiB of fp32 scores), so that long prompts still use
# chunks of dozens of queries instead of thousands of tiny launches.
_ACCELERATOR_BLOCK = 8 * _COLUMN_SUM_BLOCK


def causal_attention_and_column_sums(
    query, key, value, scaling, with_output: bool = True
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """A fresh prompt's causal attention (query i and slot i both at position i): the layer's output
    [b, n, h*g, d] (as SDPA's, in the query's dtype) and the attention every slot received, summed over
    all queries, [b, h*g, n] (fp32), from one pass in query chunks: each chunk scores only the keys it
    can see, takes one softmax, multiplies it by the values and sums it over its queries. Equal to
    SDPA's output and to `column_sums` up to float rounding. `with_output` False: the sums alone (the same
    numbers), and None for the output, whose product is skipped (many plans' shared prompt takes SDPA's)."""
    b, qh, n, d = query.shape
    h, dv = key.shape[1], value.shape[-1]
    g, dtype = qh // h, query.dtype
    if dtype != torch.float32:  # scores, softmax and output in fp32, as the methods score
        query, key = query.float(), key.float()
        value = value.float() if with_output else value
    # One KV head's queries as rows ordered (position, query head), scaled once: a chunk of positions is
    # then a contiguous block of rows, and its output block is written in place.
    rows = (query.view(b, h, g, n, d).transpose(2, 3) * scaling).reshape(b * h, n * g, d)
    keys_t = key.reshape(b * h, n, d).transpose(1, 2)
    values = value.reshape(b * h, n, dv) if with_output else None
    chunk = _CAUSAL_CHUNK.get(query.device.type, _CAUSAL_CHUNK_DEFAULT)
    block = _COLUMN_SUM_BLOCK if query.device.type == "cpu" else _ACCELERATOR_BLOCK
    chunk = max(1, min(chunk, n, block // max(1, b * qh * n)))
    # -inf on the keys after each query of a chunk, 0 elsewhere: adding it masks exactly as masked_fill
    # would, in one dense operation
    future = torch.ones(chunk, chunk, dtype=torch.bool, device=query.device).triu_(1)
    bias = torch.zeros(chunk, g, chunk, device=query.device).masked_fill_(future[:, None], float("-inf"))
    output = query.new_empty(b * h, n * g, dv) if with_output else None
    total = query.new_zeros(b * h, g, n)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        w = stop - start
        scores = torch.bmm(rows[:, start * g : stop * g], keys_t[..., :stop]).view(b * h, w, g, stop)
        scores[..., start:].add_(bias[:w, :, :w])
        probs = torch.softmax(scores, dim=-1)
        total[..., :stop] += probs.sum(dim=1)
        if output is not None:
            torch.bmm(probs.view(b * h, w * g, stop), values[:, :stop], out=output[:, start * g : stop * g])
    if output is None:
        return None, total.view(b, qh, n)
    output = output.view(b, h, n, g, dv).permute(0, 2, 1, 3, 4).reshape(b, n, qh, dv)
    return output.to(dtype), total.view(b, qh, n)


def repeat_for_query_heads(kv: torch.Tensor, module) -> torch.Tensor:
    return kv.repeat_interleave(module.num_key_value_groups, dim=1)
