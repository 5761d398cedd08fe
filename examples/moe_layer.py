"""A mixture-of-experts layer with expert parallelism, GShard-style (Lepikhin et al. 2020):
static capacity, top-2 routing, experts spread over the ranks. The tokens come in G groups
of S tokens, the groups sliced over the ranks (x [G, S, M], sliced<0>); the E experts' FFN
weights too (w1 [E, M, F], w2 [E, F, M], sliced<0>: each rank holds its experts).

Each rank routes its groups' tokens: the gating matmul (wg [M, E]) and a softmax over the
experts give each token's gate probabilities; its first choice is the first expert of the
highest logit, its second the best of the others (gates renormalized over the two). A token
takes the next free slot of its expert's buffer in its group (GShard's cumsum, here the
count of the group's earlier tokens choosing that expert, plus, for second choices, the
first choices the expert kept); past the capacity C it is dropped for that expert. The
dispatch mask [E, G, C, S] (token s of group g in slot c of expert e) gathers the tokens
into the dispatch buffers [E, G, C, M], still sliced by group: the dispatch all_to_all
re-cuts them by expert (sliced<0>), each rank runs its experts' FFN (relu(x w1) w2) on every
group's slots, and the combine all_to_all re-cuts the result by group again; each token sums
its experts' outputs weighted by its gates, plus the residual. Same IR as moe_layer.mlir.

Routing is written with the front end's elementwise ops and row reductions: argmax as the
smallest expert index attaining the row max, the cumsum as a sum over a lower-triangular
constant, the masks as comparisons of each token's expert and slot with constant index
ranges. GShard's dispatch and combine einsums are batched matmuls over (expert, group): the
dispatch mask [E, G, C, S] times the tokens (repeated per expert: a batched matmul's
operands share their batch dims), the combine weights [E, G, S, C] times the returned
buffers, summed over the experts. The groups (10) and the experts (8) need not divide by the
rank count.

Schedules: as written (the library all_to_alls: MPI Alltoallv, NCCL grouped send/recv, gloo
all_to_all_single); the enumerator's other schedules (coconet.schedule.
enumerate_scheduled_programs) are checked too. `build(k=1)` gives Switch-style top-1 routing.
"""

import numpy as np

from coconet import frontend
from coconet.frontend import (
    F32,
    AllToAll,
    AMax,
    AMin,
    Cast,
    Constant,
    Eq,
    Ite,
    MatMul,
    Relu,
    Replicated,
    Reshape,
    Sliced,
    Softmax,
    Sum,
    Tensor,
)

G, S, M, E, C, F = 10, 8, 8, 8, 3, 16  # groups, tokens a group, model dim, experts, capacity, FFN


def build(g=G, s=S, m=M, e=E, c=C, f=F, k=2, dtype=F32):
    @frontend.program(grid=[None])
    def moe_layer(
        x: Tensor(dtype, [g, s, m], Sliced(0)),
        wg: Tensor(dtype, [m, e], Replicated),
        w1: Tensor(dtype, [e, m, f], Sliced(0)),
        w2: Tensor(dtype, [e, f, m], Sliced(0)),
    ):
        logits = MatMul(x, wg)  # [g, s, e]
        probs = Softmax(logits)
        expert = Constant(np.arange(e), dtype)
        earlier = Constant(np.tril(np.ones((s, s)))[..., None], dtype)  # [s, s', 1]: s' <= s
        expert_e = Constant(np.arange(e).reshape(e, 1, 1, 1), dtype)  # expert e at dim 0
        slot_c = Constant(np.arange(c), dtype)
        never = Constant(np.array(-np.inf), dtype)  # a logit no expert is chosen by
        left, kept, dispatch, weights, gates = logits, None, [], [], []
        for choice in range(k):
            best = AMin(Ite(Eq(left, AMax(left, keepdims=True)), expert, e), keepdims=True)
            chosen = Cast(dtype, Eq(best, expert))  # [g, s, e], one-hot
            position = Sum(Reshape(chosen, [g, 1, s, e]) * earlier, dims=2)  # 1-based
            if kept is not None:  # after the slots the first choices took
                position = position + kept
            slot = Sum(chosen * position, keepdims=True) - 1  # [g, s, 1]; >= c: dropped
            to_expert = Cast(dtype, Eq(best, expert_e))  # [e, g, s, 1]
            to_slot = Cast(dtype, Eq(slot, slot_c))  # [g, s, c]
            route = to_expert * to_slot  # [e, g, s, c]: token s in slot c of expert e
            to_slot_t = Cast(dtype, Eq(Reshape(slot, [g, 1, s]), Reshape(slot_c, [c, 1])))
            sends = Reshape(to_expert, [e, g, 1, s]) * to_slot_t  # route's [e, g, c, s]
            gate = Sum(probs * chosen, keepdims=True)  # [g, s, 1]
            dispatch.append(sends)
            weights.append(route)
            gates.append(gate)
            if choice + 1 < k:  # the next choice: among the other experts, after these slots
                taken = Sum(chosen * Cast(dtype, position < c + 1), dims=1, keepdims=True)
                kept = taken if kept is None else kept + taken
                left = Ite(Eq(chosen, 1), never, left)
        if k > 1:  # GShard: the chosen experts' gates sum to 1
            gate_total = gates[0]
            for gate in gates[1:]:
                gate_total = gate_total + gate
            gates = [gate / gate_total for gate in gates]
        dispatch_mask, combine_weights = dispatch[0], weights[0] * gates[0]
        for sends, route, gate in zip(dispatch[1:], weights[1:], gates[1:], strict=True):
            dispatch_mask = dispatch_mask + sends
            combine_weights = combine_weights + route * gate
        # the tokens as every expert sees them (a batched matmul's operands share batch dims)
        tokens = x * Constant(np.ones((e, 1, 1, 1)), dtype)  # [e, g, s, m]
        buffers = MatMul(dispatch_mask, tokens)  # [e, g, c, m]: GShard's dispatch einsum
        expert_in = AllToAll(buffers, dim=0)  # groups -> experts
        up = MatMul(Reshape(expert_in, [e, g * c, m]), w1)  # each rank's experts
        down = MatMul(Relu(up), w2)
        expert_out = Reshape(down, [e, g, c, m])
        back = AllToAll(expert_out, dim=1)  # experts -> groups
        per_expert = MatMul(combine_weights, back)  # [e, g, s, m]: the combine einsum
        combined = Sum(per_expert, dims=0)
        out = x + combined
        return out

    return moe_layer


program = build()  # what coconet.load() picks up
