"""coconet in a PyTorch training loop: data-parallel optimizers whose `step()` is one compiled
coconet program -- the all-reduce of the gradients and the update, scheduled as CoCoNet does
(`ar-c`; `rs-c-ag`, ZeRO-1 style with the optimizer state sliced across ranks; or
`fuse(rs-c-ag)`, reduce-scatter + update + all-gather as one fused collective kernel;
`fuse(ar-c)`, the one-shot form of small models: the all-reduce and the update as one kernel;
or `auto`: the one of these, or the program as written, that the cost model ranks fastest on
this host for the job's ranks, coconet/tune/autotune.py).

    model = Transformer(...)                                 # the same init on every rank
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = coconet.torch.AdamW([{"params": decay, "weight_decay": 0.1},
                               {"params": other, "weight_decay": 0.0}],
                              lr=3e-4, max_grad_norm=1.0, schedule="fuse(rs-c-ag)")
    for x, y in loader:                                      # this rank's shard of the batch
        loss = loss_fn(model(x), y)
        loss.backward()                                      # local gradients: no DDP needed
        opt.step()                                           # reduce + clip + update, one program
        opt.zero_grad()

Run it under torchrun (or mpiexec): the optimizer is collective, as `coconet.compile` is.

Where it runs. CPU parameters run on the cpu backend (the generated kernels on the host);
CUDA parameters on the cuda backend (the same kernels through NVRTC, NCCL for library
collectives), each rank on the GPU its parameters live on: the flat buffers are allocated there
and handed to the program through DLPack, so the update happens in the parameters' own memory.
`backend=` may name the backend, but it must be the one where the parameters are.

Where the tensors live. At construction the trainable parameters of each (param group, dtype)
are moved, once, into one flat buffer, a *segment* (padded so it divides among the ranks), and
every `nn.Parameter` becomes a view of it (`p.data`); their gradients are views of a second
flat buffer. ONE program updates every segment (one per bucket with `overlap=True`: see
"Overlap with backward"): per-group options (`lr`, `weight_decay`,
`betas`, `eps`, `momentum`) are scalar arguments read at every step, so schedulers and hand
edits of `param_groups[i]["lr"]` take effect without recompiling, and `fuse(rs-c-ag)` fuses
the collectives of every segment. The program reads and writes those buffers in place -- no
copy of the user's tensors per step: where a fused kernel's peers read the gradients from
symmetric memory, the gradient buffer IS that memory (the step's `input_buffer`; on the cpu
backend -- the cuda backend still copies the gradient in). Code that replaces `p.grad` (e.g.
`zero_grad(set_to_none=True)` from the module) still works: `step()` copies such gradients
into the buffer first. Gradients are averaged over the ranks, as DDP does. Parameters with
`requires_grad=False` at construction are left out of the buffers (never updated; one that
later has a gradient is refused at `step()`); `add_param_group` adds segments and compiles the
program again once.

Parameters without a gradient. As torch.optim does, a parameter that received no gradient is
left untouched by `step()` (no weight decay, no moment update, its `step` count not advanced).
"Received a gradient" on a rank: backward accumulated into it since the optimizer's last
`zero_grad()` (a post-accumulate-grad hook marks it), or someone wrote a non-zero value into
the gradient view in place or made `p.grad` a non-zero tensor of its own; `p.grad is None`
means none. (The optimizer keeps `p.grad` a zeroed view of its buffer where torch.optim's
`zero_grad()` leaves None, so an all-zero tensor no backward reached counts as none: that is
what DDP with `gradient_as_bucket_view=True` puts in a parameter unused on every rank.)
`zero_grad(set_to_none=False)` keeps the marks, as torch keeps zero gradients then. Across
ranks the semantics are DDP's: a parameter is updated, with the gradient averaged over all
ranks (zeros from ranks that produced none), when ANY rank produced a gradient for it, and
left alone when none did (the ranks agree through one small host all-reduce of the marks per
step). The step where every parameter has a gradient (and, for Adam, every parameter of a
segment the same step count) runs the program as compiled; otherwise a masked variant of it
(a keep mask and, for Adam and AdamW, per-element bias corrections), compiled the first time
it is needed, keeps the others unchanged.

Gradient clipping. `torch.nn.utils.clip_grad_norm_` before `step()` would clip each rank's
LOCAL gradients by their own norm (coconet reduces them later, inside the program); on more
than one rank it warns, once. Clip inside the step instead: `max_grad_norm=` at construction,
or `opt.clip_grad_norm_(max_norm)` before a `step()`: the program computes the norm of the
reduced, averaged gradients over every segment and scales them by min(1, max_norm / (norm +
1e-6)), as `clip_grad_norm_` does after DDP. The norm is computed by the step, so
`clip_grad_norm_` returns a 0-d tensor that holds NaN until the next `step()` fills it with the
total norm (`opt.last_grad_norm` is the latest one).

Overlap with backward. `overlap=True` (off by default) runs each *bucket*'s step inside
backward, as Apex's DistributedFusedAdam overlaps its reduce-scatters: each (param group,
dtype) is cut into segments of consecutive parameters of at most `bucket_cap_mb` MiB (default
25, DDP's; a larger parameter alone; LAMB's one-tensor segments grouped to that size), a
bucket is one segment (LAMB: a run of them), and each bucket has its own compiled program --
the same `build_program` over its segments, so the result is bit for bit the step without
overlap (every segment's arithmetic is per element; tested on 1 and 2 ranks). Each
parameter's post-accumulate-grad hook counts its bucket's arrivals; when backward has
delivered every gradient of a bucket, the bucket's program (reduce + update, as `step()`
would run it) is launched on a worker thread (the host kernels are ctypes calls and the
collectives torch's or MPI's waits, which release the GIL, so backward goes on beside it; on
cuda the worker runs it on a side stream that first waits for an event recorded on backward's
stream, and `step()` makes the current stream wait for the side stream). Buckets launch in ONE
order on every rank -- the order they completed in on rank 0 in the first backward, agreed at
the first step (which overlaps nothing: DDP rebuilds its buckets the same way) -- and a bucket
waits for the ones before it, so every rank issues the same programs in the same order. The
programs' communicator is the worker's alone while buckets are in flight: `step()`'s host
agreement runs on a gloo group of its own, and variants a bucket needs are compiled on the
worker too. `step()` then agrees on the marks and on which buckets any rank launched, launches
(in that order) the ones this rank has not -- a bucket some rank launched has a gradient for
every parameter, so the same variant; the others by the marks, masked where a parameter has
none, as without overlap -- and waits for all of them. Consequences: group options (`lr`)
are read when a bucket launches, i.e. during backward (set them before it, as schedulers
do); what is done to `.grad` after backward (GradScaler's `unscale_`, hand scaling) does not
reach a launched bucket; `zero_grad()`, `state_dict()` and friends between a backward and its
`step()` are refused (buckets are in flight); a second backward into a launched bucket is
refused -- accumulate micro-batches inside `with opt.no_sync():` (backward there launches
nothing; `no_sync()` is accepted without overlap too, and changes nothing there). Use it
without DDP (DDP's own bucket copies would race with the worker): coconet reduces the
gradients itself.

Overlap with clipping. Clipping needs the norm of every reduced gradient before any update,
so with `max_grad_norm=` (given at construction) a bucket's program in backward is its
REDUCTION only, and `step()` runs the norm, the clipping and the update. The segments are
then those of the step without overlap (one per param group and dtype; LAMB's one per
tensor), so that the norm sums the same squares in the same reductions; a bucket is a run of
a segment's parameters to `bucket_cap_mb` (LAMB: of its segments), and its program stores the
sum over the ranks of those gradients into the same range of a replicated buffer of the
optimizer's own (in the gradients' element type, bf16 rounded once, as the step's all_reduce
computes it before its cast and scaling; under the optimizer's schedule, whose fused forms
sum in rank order; `.grad` keeps the local gradients, as without overlap). `step()` reduces
the buckets no rank launched (in the launch order; one no rank gave a gradient is zero
everywhere, so is its sum) and runs ONE program over every segment: `build_program` with each
all_reduce replaced by the reduced gradient it reads -- the same cast, scaling, norm,
clipping and update ops in the same order, the keep masks of parameters without a gradient as
without overlap -- written as the schedule would make it: under `rs-c-ag`, `fuse(rs-c-ag)`
and `auto`, sliced (each rank updates its slice with its slice of the state, ZeRO-1, the norm
from the slices' partial sums, then the parameters are all-gathered), otherwise (and for
LAMB, whose per-tensor norms it does not slice) replicated; its elementwise chains fused into
kernels as `ar-c` fuses them (`FUSE_ELEMENTWISE`). On 2 ranks that is the clipped step
without overlap bit for bit, and `opt.clip_grad_norm_` returns the same norm (tested under
`fuse(rs-c-ag)` and `ar-c`; a sum of two values does not depend on its order); on more ranks a
library collective (the all_reduces of `ar-c` and `rs-c-ag`, the partial norms' all_reduce)
may sum in another order than the step without overlap, so equality there is to rounding, as
it is under `auto` when the step without overlap took a schedule of the other form, and for
LAMB under `rs-c-ag` and `fuse(rs-c-ag)` (which split its per-tensor norms over the slices).
`opt.clip_grad_norm_(max_norm)` (between backward and step, for the norm it returns) sets
that step's max_norm; `max_grad_norm=math.inf` computes the norm without clipping. Without
`max_grad_norm=` it is refused (a CocoError): backward has already launched buckets that
update unclipped by the time it is called, and a clipping that held on some steps (the first,
which launches nothing) and not on others would surprise more. `torch.nn.utils.clip_grad_norm_`
on an overlapped optimizer's parameters is refused either way (it clips local gradients the
buckets have already taken). What overlap buys shrinks with clipping: only the reductions
overlap backward, the update waits for `step()`, and the step after them is not one fused
collective kernel (no reduce_scatter is left to fuse it around) but kernels and library
collectives (the partial norms; sliced, the parameters' all_gather).

With DDP: let coconet do the reduction -- register `local_gradients_hook` as DDP's
communication hook (DDP then only buckets, no all-reduce), or use `no_sync()`. Build the
optimizer before wrapping the model in DDP (DDP keeps references to the parameters' storage).
A DDP that all-reduces the gradients itself gives the right result twice as expensively:
`step()` warns once when the local gradients are identical on every rank in its first steps.

Algorithms: SGD with momentum (torch.optim.SGD, also `nesterov=True`), Adam with L2 weight
decay (torch.optim.Adam), AdamW with decoupled weight decay (torch.optim.AdamW), and LAMB (a
trust ratio per parameter tensor: one program over every tensor, each in its own padded
segment), `maximize=True` for SGD, Adam and AdamW, in f32 state over f32 or bf16 parameters.
torch.optim's `foreach`, `fused`, `capturable` and `differentiable` are accepted and ignored:
the step is already one fused program, on the parameters' device, outside autograd.
`amsgrad=True` and SGD's `dampening` are refused. `state_dict()` is torch.optim's layout
(groups with their options and parameter indices, a state entry per parameter that has state:
`exp_avg`, `exp_avg_sq`, `step`, or `momentum_buffer`), the sliced state gathered into full
tensors, and `load_state_dict()` scatters it back, so checkpoints move between schedules, rank
counts and torch.optim's own optimizers. Sliced state is gathered from every rank (collective)
unless `consolidate_state_dict(to=r)` gathered it on rank r (torch's ZeroRedundancyOptimizer's
convention); torch.distributed.checkpoint's optimizer state_dict functions work (a fresh
optimizer lists every parameter, with zero state, for DCP to fill)."""

from coconet.torch.buffers import (
    ALIGN as ALIGN,
    BACKEND_OF_DEVICE as BACKEND_OF_DEVICE,
    _handed_over as _handed_over,
    parameters_device as parameters_device,
)
from coconet.torch.interop import (
    _OWNERS as _OWNERS,
    _uninstall_clip_warning as _uninstall_clip_warning,
    local_gradients_hook,
)
from coconet.torch.optimizer import SCHEDULES as SCHEDULES, CoconetOptimizer
from coconet.torch.optimizers import LAMB, SGD, Adam, AdamW

__all__ = ["LAMB", "SGD", "Adam", "AdamW", "CoconetOptimizer", "local_gradients_hook"]
