"""Independent NumPy references for the example programs (examples/*.mlir, examples/*.py).

Each reference takes the logical inputs (the convention of core/values.py: a tensor that is
`local` on some grid axes carries those axes' sizes as leading dims, then its global shape) and
the rank count, and computes the logical outputs the way an SPMD execution would: rank by rank,
each rank slicing what it holds, collectives written out by hand. It imports nothing from
coconet (not the sim, not values.py), so it checks the interpreter rather than restating it.

Numerics, as the dialects define them: an op on f16/bf16/f32 computes in f32 and rounds its
result to the element type; a collective or full reduction accumulates in f64, in rank order,
and rounds once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import ml_dtypes
import numpy as np

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)

Inputs = dict[str, np.ndarray]


# --------------------------------------------------------------------------------------------
# Numerics and collectives, written out
# --------------------------------------------------------------------------------------------


def f32(x) -> np.ndarray:
    """Widen to the compute precision (scalars stay 0-d arrays, so ufuncs see arrays)."""
    return np.asarray(x).astype(F32)


def ew(fn: Callable[..., np.ndarray], *xs, out: np.dtype) -> np.ndarray:
    """One elementwise op: compute in f32, round to `out`."""
    with np.errstate(all="ignore"):
        return np.asarray(fn(*(f32(x) for x in xs))).astype(out)


def all_reduce_sum(pieces: Sequence[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """What every rank of the group receives: the f64 sum in rank order, rounded once."""
    acc = np.asarray(pieces[0]).astype(F64)
    for p in pieces[1:]:
        acc = acc + np.asarray(p).astype(F64)
    return acc.astype(dtype)


def norm(x: np.ndarray) -> np.ndarray:
    """L2 norm accumulated in f64 (exactly rounded with fsum), rounded once."""
    x64 = np.asarray(x).astype(F64).ravel()
    return np.asarray(math.sqrt(math.fsum(x64 * x64))).astype(np.asarray(x).dtype)


def agree(per_rank: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Replicated results must be bit-identical on every rank; return rank 0's."""
    first = per_rank[0]
    for r, outs in enumerate(per_rank[1:], start=1):
        for k, v in outs.items():
            assert np.array_equal(v, first[k], equal_nan=True), f"rank {r} disagrees on {k}"
    return first


def block(n: int, parts: int, i: int) -> slice:
    """Part i of n elements cut in `parts` equal contiguous pieces."""
    size = n // parts
    return slice(i * size, (i + 1) * size)


# --------------------------------------------------------------------------------------------
# Dropout's counter hash, from its definition (dialects/coco.py DropoutOp)
# --------------------------------------------------------------------------------------------

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64_int(z: int) -> int:
    z &= _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _mix64_array(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def dropout_keep(seed: int, shape: Sequence[int], stream: int, p: float) -> np.ndarray:
    """keep iff (h >> 40) >= ceil(p 2^24), h = mix64(index + mix64(seed ^ (stream * GOLDEN))),
    index = the element's row-major index in the global tensor."""
    key = _mix64_int((seed & _MASK64) ^ ((stream * _GOLDEN) & _MASK64))
    index = np.arange(int(np.prod(shape)), dtype=np.uint64).reshape(shape)
    with np.errstate(over="ignore"):
        h = _mix64_array(index + np.uint64(key))
    return (h >> np.uint64(40)) >= np.uint64(math.ceil(p * (1 << 24)))


def dropout(x: np.ndarray, p: float, seed: int, stream: int = 0) -> np.ndarray:
    keep = dropout_keep(seed, x.shape, stream, p)
    scale = np.float32(1.0 / (1.0 - p))
    return np.where(keep, f32(x) * scale, np.float32(0)).astype(x.dtype)


# --------------------------------------------------------------------------------------------
# Data parallel: SGD, Adam, LAMB
# --------------------------------------------------------------------------------------------


def sgd(inputs: Inputs, ranks: int) -> dict[str, np.ndarray]:
    g, w, lr = inputs["g"], inputs["w"], f32(inputs["lr"])
    held = [g[r] for r in range(ranks)]  # local: rank r holds row r
    per_rank = []
    for _ in range(ranks):
        g1 = all_reduce_sum(held, g.dtype)
        t = ew(np.multiply, lr, g1, out=F32)
        w1 = ew(np.subtract, w, t, out=F32)
        per_rank.append({"w": w1})
    return agree(per_rank)


def _adam_moments(g1, m, v, beta1, beta2, step):
    """The moments and their bias corrections, one f32 op per line in the program's order."""

    def op(fn, *xs):
        return ew(fn, *xs, out=F32)

    def pow_(a, b):
        # Transcendentals compute in f64 and round once to f32 (dialects/coco.py numerics).
        return np.power(np.float64(a), np.float64(b)).astype(F32)

    one = np.float32(1.0)
    m1 = op(np.add, op(np.multiply, beta1, m), op(np.multiply, op(np.subtract, one, beta1), g1))
    t = op(np.multiply, op(np.subtract, one, beta2), g1)
    v1 = op(np.add, op(np.multiply, beta2, v), op(np.multiply, t, g1))
    mhat = op(np.divide, m1, op(np.subtract, one, pow_(beta1, step)))
    vhat = op(np.divide, v1, op(np.subtract, one, pow_(beta2, step)))
    return m1, v1, mhat, vhat


def _scalars(inputs: Inputs, *names: str) -> list[np.ndarray]:
    return [f32(inputs[n]) for n in names]


def adam(inputs: Inputs, ranks: int) -> dict[str, np.ndarray]:
    """Adam with the gradient in its own dtype (f32, f16 or bf16): all-reduced in that dtype,
    then cast to f32 (a no-op for f32 gradients, as adam.mlir has no cast)."""
    g, w, m, v = inputs["g"], inputs["w"], inputs["m"], inputs["v"]
    lr, beta1, beta2, eps, step = _scalars(inputs, "lr", "beta1", "beta2", "eps", "step")
    held = [g[r] for r in range(ranks)]
    per_rank = []
    for _ in range(ranks):
        g1 = all_reduce_sum(held, g.dtype).astype(F32)
        m1, v1, mhat, vhat = _adam_moments(g1, m, v, beta1, beta2, step)
        num = ew(np.multiply, lr, mhat, out=F32)
        den = ew(np.add, ew(np.sqrt, vhat, out=F32), eps, out=F32)
        w1 = ew(np.subtract, w, ew(np.divide, num, den, out=F32), out=F32)
        per_rank.append({"w": w1, "m": m1, "v": v1})
    return agree(per_rank)


def zero3_adamw(inputs: Inputs, ranks: int) -> dict[str, np.ndarray]:
    """AdamW on sliced weights and moments: each rank's slice of the reduce-scattered gradient
    is the f64 rank-order sum rounded once, as an all_reduce's; the logical results are the
    slices side by side, which is the update of the whole arrays."""
    g, w, m, v = inputs["g"], inputs["w"], inputs["m"], inputs["v"]
    lr, beta1, beta2, eps, wd, step = _scalars(
        inputs, "lr", "beta1", "beta2", "eps", "weight_decay", "step"
    )
    g1 = all_reduce_sum([g[r] for r in range(ranks)], g.dtype)
    m1, v1, mhat, vhat = _adam_moments(g1, m, v, beta1, beta2, step)
    den = ew(np.add, ew(np.sqrt, vhat, out=F32), eps, out=F32)
    r = ew(np.add, ew(np.divide, mhat, den, out=F32), ew(np.multiply, wd, w, out=F32), out=F32)
    w1 = ew(np.subtract, w, ew(np.multiply, lr, r, out=F32), out=F32)
    return {"w": w1, "m": m1, "v": v1}


def adamw_state(rng: np.random.Generator, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """The moments and scalars of an AdamW step (zero3_adamw's arguments but w and g): m, v
    of `shape` and the hyperparameters at step 3."""
    f32 = np.float32
    return {
        "m": (0.1 * rng.standard_normal(shape)).astype(f32),
        "v": (0.01 * rng.random(shape)).astype(f32),
        "lr": np.asarray(1e-3, f32),
        "beta1": np.asarray(0.9, f32),
        "beta2": np.asarray(0.999, f32),
        "eps": np.asarray(1e-6, f32),
        "weight_decay": np.asarray(0.01, f32),
        "step": np.asarray(3.0, f32),
    }


def fsdp_step(inputs: Inputs, ranks: int) -> dict[str, np.ndarray]:
    """One FSDP linear layer's step: each rank's y = x_r W (W whole: the shards side by
    side), its weight gradient xt_r dy_r, summed over the ranks as an all_reduce sums
    (zero3_adamw's reduce_scatter), then AdamW on the whole arrays. Dyadic operands keep the
    GEMMs exact in any order."""
    x, xt, dy, w = inputs["x"], inputs["xt"], inputs["dy"], inputs["w"]
    y = np.stack([np.matmul(x[r], w, dtype=F32) for r in range(ranks)])
    dw = np.stack([np.matmul(xt[r], dy[r], dtype=F32) for r in range(ranks)])
    return {"y": y} | zero3_adamw(inputs | {"g": dw}, ranks)


def lamb(inputs: Inputs, ranks: int) -> dict[str, np.ndarray]:
    g, w, m, v = inputs["g"], inputs["w"], inputs["m"], inputs["v"]
    lr, beta1, beta2, eps, wd, step = _scalars(
        inputs, "lr", "beta1", "beta2", "eps", "weight_decay", "step"
    )
    held = [g[r] for r in range(ranks)]
    per_rank = []
    for _ in range(ranks):
        g1 = all_reduce_sum(held, g.dtype)
        m1, v1, mhat, vhat = _adam_moments(g1, m, v, beta1, beta2, step)
        den = ew(np.add, ew(np.sqrt, vhat, out=F32), eps, out=F32)
        r = ew(np.add, ew(np.divide, mhat, den, out=F32), ew(np.multiply, wd, w, out=F32), out=F32)
        trust = ew(np.divide, norm(w), norm(r), out=F32)
        step_size = ew(np.multiply, lr, trust, out=F32)
        w1 = ew(np.subtract, w, ew(np.multiply, step_size, r, out=F32), out=F32)
        per_rank.append({"w": w1, "m": m1, "v": v1})
    return agree(per_rank)


# --------------------------------------------------------------------------------------------
# Model parallel: matmul of K-sliced operands -> all_reduce -> bias -> dropout -> residual
# --------------------------------------------------------------------------------------------


def _stage_output(
    x: np.ndarray, w: np.ndarray, b: np.ndarray, r: np.ndarray, p: int, rank: int,
    group: Sequence[int], seed: int, stream: int,
) -> np.ndarray:  # fmt: skip
    """One rank of a tensor-parallel group of `p` ranks (`rank` is its position in it)."""
    k = x.shape[-1]
    partial = {}
    for j in group:  # every member's partial sum: [.., K/p] x [K/p, H] in f32, rounded
        xs, ws = x[..., block(k, p, j)], w[block(k, p, j), :]
        partial[j] = np.matmul(f32(xs), f32(ws)).astype(x.dtype)
    total = all_reduce_sum([partial[j] for j in group], x.dtype)
    biased = ew(np.add, total, b, out=x.dtype)
    dropped = dropout(biased, 0.1, seed, stream)
    return ew(np.add, dropped, r, out=x.dtype)


def model_parallel(seed: int) -> Callable[[Inputs, int], dict[str, np.ndarray]]:
    def reference(inputs: Inputs, ranks: int) -> dict[str, np.ndarray]:
        x, w, b, r = inputs["x"], inputs["w"], inputs["b"], inputs["r"]
        group = list(range(ranks))
        per_rank = [
            {"out": _stage_output(x, w, b, r, ranks, me, group, seed, stream=0)} for me in group
        ]
        return agree(per_rank)

    return reference


model_parallel_attention = model_parallel(seed=1)
model_parallel_mlp = model_parallel(seed=2)


def pipeline_boundary(inputs: Inputs, ranks: int, stages: int = 2) -> dict[str, np.ndarray]:
    """Grid [stages, p]: rank = stage * p + j. Tensors are local on the stage axis (leading
    dim of the logical value); dropout's stream is the stage; the send shifts by one stage."""
    x, w, b, r = inputs["x"], inputs["w"], inputs["b"], inputs["r"]
    p = ranks // stages
    out: dict[int, np.ndarray] = {}
    for rank in range(ranks):
        stage, j = divmod(rank, p)
        group = list(range(p))
        mine = _stage_output(x[stage], w[stage], b[stage], r[stage], p, j, group, 3, stage)
        if stage in out:
            assert np.array_equal(out[stage], mine), f"stage {stage}: rank {rank} disagrees"
        out[stage] = mine
    recv = np.zeros((stages, *out[0].shape), dtype=out[0].dtype)  # stage 0: no sender
    for stage in range(1, stages):
        recv[stage] = out[stage - 1]  # the same rank of the previous stage sent it
    return {"recv": recv}


def row_mean(x: np.ndarray) -> np.ndarray:
    """The mean over the last dim, kept as size 1: summed in f64 (exact, so in any order, for
    f16 rows and for rows of f32 values of similar magnitude), divided in f64, rounded once."""
    x64 = np.asarray(x).astype(F64)
    return (x64.sum(axis=-1, keepdims=True) / x64.shape[-1]).astype(x.dtype)


def rms_norm(h: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x * rsqrt(mean(x * x) + eps) * weight, each op rounded to the element type."""
    dt = h.dtype
    mean_square = row_mean(ew(np.multiply, h, h, out=dt))
    inv = ew(lambda v: 1 / np.sqrt(v), ew(np.add, mean_square, np.asarray(eps, dt), out=dt), out=dt)
    return ew(np.multiply, ew(np.multiply, h, inv, out=dt), weight, out=dt)


def layer_norm(h: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """(x - mean) * rsqrt(var + eps) * gamma + beta (biased variance), each op rounded."""
    dt = h.dtype
    centered = ew(np.subtract, h, row_mean(h), out=dt)
    variance = row_mean(ew(np.multiply, centered, centered, out=dt))
    inv = ew(lambda v: 1 / np.sqrt(v), ew(np.add, variance, np.asarray(eps, dt), out=dt), out=dt)
    scaled = ew(np.multiply, ew(np.multiply, centered, inv, out=dt), gamma, out=dt)
    return ew(np.add, scaled, beta, out=dt)


def allreduce_rmsnorm(inputs: Inputs, ranks: int) -> dict[str, np.ndarray]:
    """x: every rank's partial sums (the leading dim of the local value)."""
    x, residual, weight = inputs["x"], inputs["residual"], inputs["weight"]
    total = all_reduce_sum([x[j] for j in range(ranks)], x.dtype)
    hidden = ew(np.add, total, residual, out=x.dtype)
    return {"hidden": hidden, "normed": rms_norm(hidden, weight, 1e-6)}


def megatron_sp_layernorm(inputs: Inputs, ranks: int) -> dict[str, np.ndarray]:
    x, w, b, r = inputs["x"], inputs["w"], inputs["b"], inputs["r"]
    group = list(range(ranks))
    per_rank = []
    for me in group:
        hidden = _stage_output(x, w, b, r, ranks, me, group, seed=4, stream=0)
        out = layer_norm(hidden, inputs["gamma"], inputs["beta"], 1e-5)
        per_rank.append({"hidden": hidden, "out": out})
    return agree(per_rank)


def row_sum(x: np.ndarray, lanes: int = 32) -> np.ndarray:
    """The sum over the last dim, kept as size 1, in the order the dialect fixes for row
    reductions: lane l sums elements l, l + 32, ... in f64 from 0, then the lanes add up in
    lane order (from 0); rounded once."""
    x64 = np.asarray(x).astype(F64)
    acc = [np.zeros(x64.shape[:-1], F64) for _ in range(lanes)]
    for e in range(x64.shape[-1]):
        acc[e % lanes] = acc[e % lanes] + x64[..., e]
    total = np.zeros(x64.shape[:-1], F64)
    for lane in range(lanes):
        total = total + acc[lane]
    return total[..., None].astype(x.dtype)


def softmax(x: np.ndarray) -> np.ndarray:
    """exp(x - max) / sum(exp(x - max)) over the last dim: exp in f64 rounded once, the rest
    in f32 rounded to the element type."""
    dt = x.dtype
    shifted = ew(np.subtract, x, np.max(x, axis=-1, keepdims=True), out=dt)
    with np.errstate(all="ignore"):
        exps = np.exp(shifted.astype(F64)).astype(dt)
    return ew(np.divide, exps, row_sum(exps), out=dt)


def alibi_causal_bias(queries: int, keys: int, slope: float) -> np.ndarray:
    """Query i sits at position keys - queries + i: slope * (j - position) for key j at or
    before it, -inf after."""
    bias = np.full((queries, keys), -np.inf)
    for i in range(queries):
        position = keys - queries + i
        for j in range(position + 1):
            bias[i, j] = slope * (j - position)
    return bias


def softmax_rows(inputs: Inputs, ranks: int) -> dict[str, np.ndarray]:
    """q [16, D] sliced on D, kt [D, 40] sliced on D: rank r's partial scores are its
    slice's product (exact for dyadic inputs), all_reduced in rank order in f64."""
    q, kt = inputs["q"], inputs["kt"]
    d = q.shape[1]
    parts = np.array_split(np.arange(d), ranks)
    partial = [(q[:, p].astype(F64) @ kt[p, :].astype(F64)).astype(q.dtype) for p in parts]
    scores = all_reduce_sum(partial, q.dtype)
    scaled = ew(np.multiply, scores, np.asarray(1 / math.sqrt(d), q.dtype), out=q.dtype)
    bias = alibi_causal_bias(q.shape[0], kt.shape[1], 0.5).astype(q.dtype)
    return {"probs": softmax(ew(np.add, scaled, bias, out=q.dtype))}


# --------------------------------------------------------------------------------------------
# all_to_all: Ulysses attention and a GShard MoE layer, rank by rank
# --------------------------------------------------------------------------------------------


def split(n: int, parts: int) -> list[np.ndarray]:
    """The indices of each rank's part of n elements, as MPI_Reduce_scatter's recvcounts cut
    them: the first n % parts ranks hold one more."""
    size, extra = divmod(n, parts)
    starts = [i * size + min(i, extra) for i in range(parts + 1)]
    return [np.arange(starts[i], starts[i + 1]) for i in range(parts)]


def matmul_f32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A matmul of f32 operands, accumulated in f64 and rounded once (equal to any f32
    accumulation order where the products and partial sums are exact; within a few ulps
    elsewhere)."""
    return np.matmul(a.astype(F64), b.astype(F64)).astype(F32)


def sum_dim(x: np.ndarray, dim: int) -> np.ndarray:
    """A row reduction over `dim` in the dialect's lane order (row_sum), dim dropped."""
    moved = np.moveaxis(np.asarray(x), dim, -1)
    return row_sum(moved)[..., 0]


def ulysses_attention(inputs: Inputs, ranks: int) -> dict[str, np.ndarray]:
    """Rank r holds sequence part r of q [H, S, D], v [H, S, D] and kt [H, D, S]; the
    all_to_all gives rank j the whole sequence of its heads (every rank's sequence part of
    them, in rank order); causal attention per head; the second all_to_all gives rank r its
    sequence part of every head's output; out = sum over heads of out_h @ wo[h] (lane order),
    rank r holding its sequence part."""
    q, kt, v, wo = (np.asarray(inputs[k]) for k in ("q", "kt", "v", "wo"))
    h, s, d = q.shape
    seq, heads = split(s, ranks), split(h, ranks)
    # what each rank holds
    held = [{"q": q[:, seq[r]], "kt": kt[:, :, seq[r]], "v": v[:, seq[r]]} for r in range(ranks)]

    def to_heads(name: str, axis: int) -> list[np.ndarray]:
        return [
            np.concatenate([held[i][name][heads[j]] for i in range(ranks)], axis=axis)
            for j in range(ranks)
        ]

    qh, kh, vh = to_heads("q", 1), to_heads("kt", 2), to_heads("v", 1)
    mask = np.where(np.arange(s)[None, :] <= np.arange(s)[:, None], 0.0, -np.inf).astype(F32)
    scale = np.asarray(1 / math.sqrt(d), F32)
    outputs = []
    for j in range(ranks):
        scaled = ew(np.multiply, matmul_f32(qh[j], kh[j]), scale, out=F32)
        scores = ew(np.add, scaled, mask, out=F32)
        outputs.append(matmul_f32(softmax(scores), vh[j]))  # [heads of j, S, D]
    pieces = []
    for r in range(ranks):
        back = np.concatenate([outputs[j][:, seq[r]] for j in range(ranks)], axis=0)
        projected = np.stack([matmul_f32(back[i], wo[i]) for i in range(h)])  # [H, S_r, E]
        pieces.append(sum_dim(projected, 0))
    return {"out": np.concatenate(pieces, axis=0)}


def moe_layer(inputs: Inputs, ranks: int, k: int = 2, capacity: int = 3) -> dict[str, np.ndarray]:
    """GShard's top-k MoE layer with static capacity, rank by rank: rank r routes the tokens
    of its groups (array_split of G), fills each expert's dispatch buffer [G, C, M] slot by
    slot (first choices in token order, then second choices after the first choices the
    expert kept), sends expert e's buffers to the rank holding e (array_split of E), runs
    relu(x w1[e]) w2[e], sends them back; each token adds its kept experts' outputs times its
    gates (renormalized over the k chosen: GShard) to itself."""
    x, wg, w1, w2 = (np.asarray(inputs[n]) for n in ("x", "wg", "w1", "w2"))
    g_count, s, m = x.shape
    e_count = wg.shape[1]
    groups, experts = split(g_count, ranks), split(e_count, ranks)
    # routing on each rank: per token, its (expert, slot or None, gate) choices
    routes: dict[tuple[int, int], list[tuple[int, int | None, np.float32]]] = {}
    sent = [np.zeros((e_count, len(groups[r]), capacity, m), F32) for r in range(ranks)]
    for r in range(ranks):
        for gi, g in enumerate(groups[r]):
            logits = matmul_f32(x[g], wg)  # [S, E], exact for dyadic inputs
            probs = softmax(logits)
            choices: list[list[int]] = []  # each token's experts, best first
            for t in range(s):
                left = logits[t].copy()
                choices.append([])
                for _ in range(k):
                    e = int(np.argmax(left))  # the first expert of the highest logit
                    choices[t].append(e)
                    left[e] = -np.inf
            gates = [[probs[t, e] for e in choices[t]] for t in range(s)]
            if k > 1:
                for t in range(s):
                    total = np.float32(0)
                    for gate in gates[t]:
                        total = np.float32(total + gate)
                    gates[t] = [np.float32(gate / total) for gate in gates[t]]
            # slots: replay the choices in GShard's order
            filled = np.zeros(e_count, int)
            for c in range(k):
                count = filled.copy()
                for t in range(s):
                    e = choices[t][c]
                    slot = int(count[e])
                    count[e] += 1
                    keep = slot < capacity
                    route = (e, slot if keep else None, gates[t][c])
                    routes.setdefault((int(g), t), []).append(route)
                    if keep:
                        sent[r][e, gi, slot] = x[g, t]
                filled = np.minimum(count, capacity)
    # dispatch all_to_all: rank j receives its experts' buffers of every group
    returned = [np.zeros((e_count, len(groups[r]), capacity, m), F32) for r in range(ranks)]
    for j in range(ranks):
        for e in experts[j]:
            buf = np.concatenate([sent[i][e] for i in range(ranks)], axis=0)  # [G, C, M]
            hidden = np.maximum(matmul_f32(buf.reshape(-1, m), w1[e]), np.float32(0))
            y = matmul_f32(hidden, w2[e]).reshape(buf.shape)
            for i in range(ranks):  # combine all_to_all: each group back to its rank
                returned[i][e] = y[groups[i]]
    out = np.empty_like(x)
    for r in range(ranks):
        for gi, g in enumerate(groups[r]):
            for t in range(s):
                # f32 products, summed over the experts in f64 in expert order, rounded once
                acc = np.zeros(m, F64)
                for e, slot, gate in sorted(routes[(int(g), t)], key=lambda c: c[0]):
                    if slot is not None:
                        acc = acc + ew(np.multiply, gate, returned[r][e, gi, slot], out=F32)
                out[g, t] = ew(np.add, x[g, t], acc.astype(F32), out=F32)
    return {"out": out}


REFERENCES: dict[str, Callable[[Inputs, int], dict[str, np.ndarray]]] = {
    "sgd": sgd,
    "adam": adam,
    "adam_f16_grads": adam,
    "adam_bf16_grads": adam,
    "lamb": lamb,
    "zero3_adamw": zero3_adamw,
    "fsdp_step": fsdp_step,
    "model_parallel_attention": model_parallel_attention,
    "model_parallel_mlp": model_parallel_mlp,
    "pipeline_boundary": pipeline_boundary,
    "allreduce_rmsnorm": allreduce_rmsnorm,
    "megatron_sp_layernorm": megatron_sp_layernorm,
    "softmax_rows": softmax_rows,
    "ulysses_attention": ulysses_attention,
    "moe_layer": moe_layer,
}
