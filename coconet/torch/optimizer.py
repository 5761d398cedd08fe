"""`CoconetOptimizer`: the data-parallel optimizer whose `step()` is one compiled coconet
program (the package docstring, coconet/torch/__init__.py, says what it does); SGD, Adam,
AdamW and LAMB (optimizers.py) build their programs on it."""

from __future__ import annotations

import contextlib
import datetime
import functools
import itertools
import math
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from coconet.core import env
from coconet.core.program import CocoError
from coconet.torch.buffers import (
    ALIGN,
    BACKEND_OF_DEVICE,
    _handed_over,
    _Marks,
    _padded,
    _Segment,
    parameters_device,
)
from coconet.torch.interop import _OWNERS, _install_clip_warning

SCHEDULES = ("ar-c", "rs-c-ag", "fuse(rs-c-ag)", "fuse(ar-c)")

# Overlap with clipping: the step after the reductions has no all_reduce for a named schedule;
# what ar-c does to its computation (elementwise chains fused into kernels) is this pass.
FUSE_ELEMENTWISE = "coco-fuse{mode=elementwise}"

# How many first steps look for gradients already reduced by someone else (DDP's own hook).
DDP_CHECK_STEPS = 3

# The optimizer's own host collectives begin with one all-reduce of the same shape saying which
# call each rank is in, so a rank alone in state_dict() meets its peers' step() with a message
# (not a gloo mismatch, an abort or a hang); the codes are positive.
_STEP, _STATE_DICT, _CONSOLIDATE = 1, 2, 3
_BUILT = itertools.count()  # optimizers built by this process
_CALLS = {_STEP: "step()", _STATE_DICT: "state_dict()", _CONSOLIDATE: "consolidate_state_dict()"}


_FROZEN_GRADIENT = (
    "a parameter that had requires_grad=False when the optimizer was built has a gradient: "
    "coconet left it out of its buffers and cannot update it. Set its grad to None, or build "
    "the optimizer again after unfreezing it (or add it with add_param_group)"
)
_OVERLAP_CLIP = (
    "opt.clip_grad_norm_ with overlap=True but no max_grad_norm= at construction: by the time "
    "it is called, backward has launched buckets that reduce and update their parameters "
    "unclipped. Pass max_grad_norm= to the constructor (the buckets then only reduce their "
    "gradients in backward; the norm, the clipping and the update run in step(), and "
    "opt.clip_grad_norm_(max_norm) sets that step's max_norm), or use overlap=False"
)
_OVERLAP_TORCH_CLIP = (
    "torch.nn.utils.clip_grad_norm_ on the parameters of an overlap=True optimizer: it would "
    "clip LOCAL gradients that the buckets launched in backward have already taken. Clip the "
    "averaged gradients in the step: max_grad_norm= at construction (and opt.clip_grad_norm_ "
    "between backward and step(), for the norm)"
)


def _arrival(opt: CoconetOptimizer, slot: int) -> Callable[[torch.Tensor], None]:
    """overlap=True: the post-accumulate-grad hook of the parameter in `slot` (after its mark),
    which launches its bucket when backward completed it. (A weak reference: the parameters
    must not keep the optimizer alive.)"""
    ref = weakref.ref(opt)

    def arrive(_p: torch.Tensor) -> None:
        owner = ref()
        if owner is not None:
            owner._arrive(slot)  # pyright: ignore[reportPrivateUsage]

    return arrive


class CoconetOptimizer(torch.optim.Optimizer):
    """The shared machinery (see the module docstring); `SGD`, `Adam`, `AdamW`, `LAMB` pick the
    algorithm: its state, its per-group scalars and options, and its update rule."""

    algorithm = ""
    state_names: tuple[str, ...] = ()
    # options of a param group passed to the program as f32 scalars, by program name
    option_scalars: tuple[str, ...] = ()
    bias_corrected = False  # Adam's bias corrections from per-parameter step counts
    per_tensor = False  # one segment per parameter tensor (LAMB's trust ratio)

    def __init__(
        self,
        params: Any,
        defaults: dict[str, Any],
        *,
        schedule: str = "fuse(rs-c-ag)",
        backend: str | None = None,
        max_grad_norm: float | None = None,
        step_timeout: float | None = None,
        overlap: bool = False,
        bucket_cap_mb: float = 25.0,
    ):
        if schedule not in SCHEDULES and schedule != "auto":
            raise CocoError(
                f"schedule {schedule!r}: use one of {', '.join(SCHEDULES)}, or 'auto' (the one "
                "the cost model ranks fastest on this host: coconet/tune/autotune.py)"
            )
        if max_grad_norm is not None and not float(max_grad_norm) > 0:
            raise CocoError(f"max_grad_norm={max_grad_norm}: a positive number (or None)")
        if not float(bucket_cap_mb) > 0:
            raise CocoError(f"bucket_cap_mb={bucket_cap_mb}: a positive number of MiB")
        self.overlap = bool(overlap)
        self._bucket_bytes = float(bucket_cap_mb) * 2**20
        self._ready = False
        self.schedule = schedule
        # how long a rank waits for its peers in a call of the optimizer (None: for ever)
        self.step_timeout = env.step_timeout(step_timeout)
        self._uid = next(_BUILT)  # the same on every rank: they build their optimizers alike
        self._meetings = 0
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        # overlap with clipping: backward's bucket programs only reduce (into each segment's
        # `reduced`), and step() runs the norm, the clipping and the update
        self._reduce_only = bool(overlap) and self.max_grad_norm is not None
        # ... and that step written as rs-c-ag schedules it (sliced state), to round as the
        # step without overlap under the schedules that slice it (LAMB's per-tensor norms: no)
        self._sliced_step = (
            self._reduce_only
            and not self.per_tensor
            and schedule in ("rs-c-ag", "fuse(rs-c-ag)", "auto")
        )
        self.world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.rank = dist.get_rank() if self.world > 1 else 0
        self.segments: list[_Segment] = []
        self._params: list[torch.nn.Parameter] = []  # trainable, by slot
        self._grad_views: list[torch.Tensor] = []  # by slot
        self._slot_of: dict[int, int] = {}  # id(parameter) -> slot
        self._frozen: list[torch.nn.Parameter] = []
        self._steps: list[int] = []  # by slot: steps that updated the parameter
        self._marks = _Marks()
        self._hooks: list[Any] = []
        self._sizes: set[int] = set()
        self._programs: dict[tuple[Any, ...], Any] = {}
        self._concrete: str | None = schedule  # `auto`: the schedule it chose
        self._inputs: dict[str, Any] = {}  # the buffers as the programs take them
        self._clip_next: float | None = None
        self._norm_next: torch.Tensor | None = None
        self.last_grad_norm: torch.Tensor | None = None
        self._ddp_checks_left = DDP_CHECK_STEPS
        self._warned: set[str] = set()
        self._version = 0  # bumped by whatever changes the state: a step, a load, a new group
        # (version, rank it went to, the state_dict there or None elsewhere)
        self._consolidated: tuple[int, int, dict[str, Any] | None] | None = None
        # overlap=True: buckets (runs of segments), what backward has completed of them, and
        # the programs launched on the worker (see "Overlap with backward")
        self._buckets: list[list[int]] = []  # segment indices
        # what each bucket's program reads: (segment, begin, end) element ranges (a whole
        # segment, but for overlap with clipping: a run of a segment's parameters)
        self._bucket_ranges: list[list[tuple[int, int, int]]] = []
        self._range_inputs: dict[int, dict[str, Any]] = {}  # by bucket: reductions' buffers
        self._bucket_slots: list[list[int]] = []  # the slots of each bucket's parameters
        self._bucket_of: list[int] = []  # by slot
        self._order: list[int] | None = None  # launch order, agreed at the first step
        self._completed: list[int] = []  # buckets in the order the first backward completed
        self._arrivals: list[set[int]] = []  # by bucket: slots backward reached, syncing
        self._launched: list[bool] = []  # by bucket, since the last step
        self._next = 0  # position in _order of the next bucket to launch
        self._futures: list[Future[None]] = []
        self._launch_checksum = 0  # DDP check: the launched buckets' local gradients
        self._syncing = True  # False inside no_sync()
        self._worker: ThreadPoolExecutor | None = None
        self._side: Any = None  # cuda: the bucket programs' stream
        self._agree_group: Any = None  # the step's host all-reduce, apart from the programs'
        self._overlap_lock = threading.Lock()
        super().__init__(params, defaults)
        trainable = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        if not trainable:
            raise CocoError("no parameter of the optimizer requires grad: nothing to train")
        self.device = parameters_device(trainable, backend)
        self.backend = BACKEND_OF_DEVICE[self.device.type]
        for k in range(len(self.param_groups)):
            self._add_segments(k)
        if self.overlap:
            if self.world > 1:  # (collective: every rank builds its optimizer)
                self._agree_group = dist.new_group(backend="gloo")
            if self.device.type == "cuda":
                self._side = torch.cuda.Stream(device=self.device)
        self._ready = True
        self._recompile()
        _OWNERS.add(self)
        _install_clip_warning()

    # -- param groups ------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch.optim's, then (after construction) the new group's trainable parameters join
        as segments of their own and the program is compiled again, once; the other segments
        keep their buffers and state."""
        params = param_group.get("params")
        listed: list[Any] = []
        if isinstance(params, torch.Tensor):
            listed = [params]
        elif isinstance(params, Iterable) and not isinstance(params, set):
            param_group = {**param_group, "params": list(params)}
            listed = [p[1] if isinstance(p, tuple) else p for p in param_group["params"]]
            if len({id(p) for p in listed}) != len(listed):
                raise CocoError("a parameter group lists a parameter twice")
        # (refused before torch.optim takes the group: a refusal leaves the optimizer as it was)
        trainable = [p for p in listed if isinstance(p, torch.Tensor) and p.requires_grad]
        for p in trainable:
            if p.dtype not in (torch.float32, torch.bfloat16):
                raise CocoError(f"a parameter of dtype {p.dtype}: use float32 or bfloat16")
        if self._ready:
            self._refuse_in_flight("add_param_group()")
            parameters_device([self._params[0], *trainable], self.backend)
        super().add_param_group(param_group)
        try:
            self._check_group(self.param_groups[-1])
        except CocoError:
            self.param_groups.pop()
            raise
        if self._ready:
            self._add_segments(len(self.param_groups) - 1)
            self._order, self._completed = None, []  # (learned again at the next step)
            self._recompile()
            self._version += 1

    def _check_group(self, group: dict[str, Any]) -> None:
        """Refuses the options coconet does not compute (torch.optim would)."""
        if group.get("amsgrad"):
            raise CocoError(
                "amsgrad=True: coconet's Adam and AdamW do not keep max_exp_avg_sq (use "
                "torch.optim's, or amsgrad=False)"
            )

    def group_key(self, group: dict[str, Any]) -> tuple[Any, ...]:
        """The options of a group that shape the program (not scalars): a change compiles a
        variant."""
        return ()

    def group_scalars(self, group: dict[str, Any]) -> dict[str, float]:
        raise NotImplementedError

    def _add_segments(self, k: int) -> None:
        group = self.param_groups[k]
        by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
        for p in group["params"]:
            if not p.requires_grad:
                self._frozen.append(p)
                continue
            by_dtype.setdefault(p.dtype, []).append(p)
        for dtype, ps in by_dtype.items():
            if self.per_tensor:
                parts = [[p] for p in ps]
            elif self.overlap and not self._reduce_only:
                parts = self._chunks(ps, dtype)
            else:
                # (with clipping, the segments the step without overlap has: the norm sums the
                # squares of each in one reduction, so they must be the same to round the same)
                parts = [ps]
            first = len(self.segments)
            for part in parts:
                self.segments.append(self._flatten(k, dtype, part))
            if not self.overlap:
                continue
            if self._reduce_only and not self.per_tensor:
                # a bucket: a run of the segment's parameters to the cap (the last one to the
                # segment's end: its padding is zero on every rank, so is its sum)
                s = self.segments[first]
                runs = self._chunks(list(range(len(s.params))), dtype, params_of=s)
                ranges = []
                for r, run in enumerate(runs):
                    begin = s.offsets[run[0]]
                    last = run[-1]
                    end = (
                        s.numel if r == len(runs) - 1 else s.offsets[last] + s.params[last].numel()
                    )
                    ranges.append([(first, begin, end)])
                slots = [[s.slots[j] for j in run] for run in runs]
            else:
                # a bucket: one segment, or (LAMB) consecutive one-tensor segments to the cap
                runs = self._chunks(list(range(first, len(self.segments))), dtype, segments=True)
                ranges = [[(i, 0, self.segments[i].numel) for i in run] for run in runs]
                slots = [[j for i in run for j in self.segments[i].slots] for run in runs]
            for bucket_ranges, bucket_slots in zip(ranges, slots, strict=True):
                self._buckets.append(sorted({i for i, _b, _e in bucket_ranges}))
                self._bucket_ranges.append(bucket_ranges)
                self._bucket_slots.append(bucket_slots)
                self._arrivals.append(set())
                self._launched.append(False)
                for slot in bucket_slots:
                    self._bucket_of.append(len(self._buckets) - 1)
                    assert len(self._bucket_of) == slot + 1

    def _chunks(
        self,
        items: list[Any],
        dtype: torch.dtype,
        segments: bool = False,
        params_of: _Segment | None = None,
    ) -> list[Any]:
        """`items` (parameters, segment indices, or indices of the parameters of segment
        `params_of`) cut into runs of consecutive ones of at most `bucket_cap_mb` (an item
        larger than that alone)."""
        size = torch.empty((), dtype=dtype).element_size()
        runs: list[list[Any]] = []
        total = 0.0
        for item in items:
            if params_of is not None:
                n = params_of.params[item].numel()
            else:
                n = self.segments[item].numel if segments else item.numel()
            if not runs or total + n * size > self._bucket_bytes:
                runs.append([])
                total = 0.0
            runs[-1].append(item)
            total += n * size
        return runs

    def _segment_size(self, n: int) -> int:
        """n padded to divide among the ranks, and to a size no other segment has: chains of
        one size would look like one chain to coco-fuse where a global norm couples them."""
        unit = self.world * ALIGN
        size = _padded(n, unit)
        while size in self._sizes:
            size += unit
        self._sizes.add(size)
        return size

    def _flatten(self, k: int, dtype: torch.dtype, params: list[torch.nn.Parameter]) -> _Segment:
        offsets, total = [], 0
        for p in params:
            offsets.append(total)
            total += p.numel()
        padded = self._segment_size(total)
        flat_param = torch.zeros(padded, dtype=dtype, device=self.device)
        flat_grad = torch.zeros(padded, dtype=dtype, device=self.device)
        slots = []
        with torch.no_grad():
            for p, o in zip(params, offsets, strict=True):
                slot = len(self._params)
                slots.append(slot)
                view = flat_param[o : o + p.numel()].view_as(p)
                view.copy_(p.data)
                p.data = view
                grad = flat_grad[o : o + p.numel()].view_as(p)
                self._marks.marked.append(0)
                if p.grad is not None:  # a gradient from before: the first step takes it
                    grad.copy_(p.grad)
                    self._marks.marked[slot] = 1
                p.grad = grad
                self._params.append(p)
                self._grad_views.append(grad)
                self._slot_of[id(p)] = slot
                self._steps.append(0)
                self._hooks.append(p.register_post_accumulate_grad_hook(self._marks.hook(slot)))
                if self.overlap:  # (after the mark: the bucket counts a marked parameter)
                    self._hooks.append(p.register_post_accumulate_grad_hook(_arrival(self, slot)))
        segment = _Segment(k, dtype, params, slots, offsets, padded, flat_param, flat_grad)
        if self._reduce_only:
            # (a buffer of its own, not the gradient's: the IR keeps a tensor's layout, so a
            # local gradient cannot be stored a replicated sum; and `.grad` stays local, as
            # without overlap)
            segment.reduced = torch.zeros(padded, dtype=dtype, device=self.device)
        return segment

    # -- gradients ---------------------------------------------------------------------------

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zeroes the gradient buffers in place (the gradients stay views of them, whatever
        `set_to_none` says: backward accumulates into them). `set_to_none=True` (torch's
        default) also forgets which parameters had a gradient, so a parameter backward does
        not reach next is left alone; `set_to_none=False` keeps it, as torch keeps a zero
        gradient then, which torch.optim applies (weight decay, momentum)."""
        self._refuse_in_flight("zero_grad()")
        with self._overlap_lock:
            self._arrivals = [set() for _ in self._buckets]
            if set_to_none:
                self._completed = []
        for s in self.segments:
            s.flat_grad.zero_()
        for p, view in zip(self._params, self._grad_views, strict=True):
            if p.grad is not view:
                p.grad = view
        if set_to_none:
            self._marks.marked[:] = bytes(len(self._marks.marked))

    def _local_gradients(self, launched: set[int] | None = None) -> tuple[list[int], int]:
        """Each trainable parameter's gradient in its buffer view (a replaced `p.grad` copied
        in, a missing one zero) and whether it received one on this rank (see the module
        docstring); and whether a frozen parameter has a gradient. The slots `launched`
        (overlap: their bucket's program has taken their gradients) count as received and
        are left as they are."""
        marked = self._marks.marked
        have = []
        unmarked: list[int] = []  # views no backward reached: written in place, if non-zero
        for slot, (p, view) in enumerate(zip(self._params, self._grad_views, strict=True)):
            grad = p.grad
            got = 1
            if launched and slot in launched:
                if grad is not view:  # (its bucket took the gradient at launch)
                    p.grad = view
                have.append(1)
                continue
            if grad is None:
                view.zero_()
                marked[slot] = 0
                got = 0
            elif grad is view or (grad.data_ptr() == view.data_ptr() and grad.shape == view.shape):
                if not marked[slot]:
                    unmarked.append(slot)
            else:
                view.copy_(grad)
                # A tensor no backward reached counts if non-zero: DDP with
                # gradient_as_bucket_view puts its zeroed bucket view in an unused parameter's
                # defined `.grad` (the view this optimizer keeps where torch's would be None).
                if not marked[slot]:
                    unmarked.append(slot)
            if grad is not view:
                p.grad = view
            have.append(got)
        if unmarked:  # (one look at the device for all of them)
            nonzero = torch.stack([self._grad_views[j].ne(0).any() for j in unmarked]).tolist()
            for slot, written in zip(unmarked, nonzero, strict=True):
                have[slot] = int(written)
        frozen = int(any(p.grad is not None for p in self._frozen))
        return have, frozen

    def _checksum(self, chosen: Iterable[tuple[int, int, int]] | None = None) -> int:
        """A sum of the bits of this rank's gradients in the (segment, begin, end) ranges
        `chosen` (None: all; identical on every rank: already reduced)."""
        total = 0
        if chosen is None:
            chosen = [(i, 0, s.numel) for i, s in enumerate(self.segments)]
        for i, begin, end in chosen:
            s = self.segments[i]
            grad = s.flat_grad[begin:end]
            bits = grad.view(torch.int16 if s.dtype == torch.bfloat16 else torch.int32)
            total += int(bits.sum(dtype=torch.int64))
        return total

    def _agree(
        self,
        have: list[int],
        frozen: int,
        extra: list[int] | None = None,
        unlaunched: list[tuple[int, int, int]] | None = None,
    ) -> tuple[list[int], int, list[int]]:
        """The marks of every rank combined (a parameter has a gradient if any rank gave it
        one), and `extra` (overlap: launched buckets, the launch order) by MAX, through one
        host all-reduce; in the first steps, also whether the gradients were identical on
        every rank before the programs reduced them (overlap: those of the ranges
        `unlaunched` now, and those the launched buckets had at their launch)."""
        extra = extra or []
        if self.world == 1:
            return have, frozen, extra
        check = self._ddp_checks_left > 0
        cs = self._checksum(unlaunched) + self._launch_checksum if check else 0
        n = len(have)
        out = self._meet(_STEP, [*have, frozen, cs, -cs, *extra])
        if check:
            hi, lo = out[n + 1], -out[n + 2]
            if hi != 0 or lo != 0:
                self._ddp_checks_left -= 1
                if hi == lo:
                    self._ddp_checks_left = 0
                    self._warn_once(
                        "ddp",
                        "coconet.torch: the local gradients are identical on every rank before "
                        f"{type(self).__name__}.step() averages them: they were already reduced "
                        "(a DistributedDataParallel model without coconet's hook all-reduces "
                        "every gradient in backward, and the step reduces it again: right, at "
                        "twice the communication), or every rank trained on the same data. With "
                        "DDP, register ddp.register_comm_hook(None, "
                        "coconet.torch.local_gradients_hook) or use ddp.no_sync().",
                    )
        return out[:n], out[n], out[n + 3 : n + 3 + len(extra)]

    def _group(self) -> Any:
        """The process group the programs communicate over (None: the default one)."""
        comm = getattr(next(iter(self._programs.values()), None), "comm", None)
        return getattr(comm, "group", None)

    def _meet(self, call: int, payload: list[int]) -> list[int]:
        """`payload` combined over the ranks by MAX, after checking that every rank is in the
        same `call` (refused on every rank otherwise). The vector has the same length in every
        call (step's: a mark per parameter, three more and, overlap, two per bucket) so mismatched
        calls still pair."""
        width = len(self._params) + 3 + 2 * len(self._buckets)
        assert len(payload) <= width
        vec = torch.tensor(
            [call, -call, *payload, *[0] * (width - len(payload))], dtype=torch.int64
        )
        self._meetings += 1
        arrivals = self._arrived(self._meetings)
        with torch.profiler.record_function(f"coconet agree ({_CALLS[call]})"):
            return self._wait_for_peers(call, vec, arrivals, len(payload))

    def _wait_for_peers(
        self, call: int, vec: torch.Tensor, arrivals: Callable[[], str], n: int
    ) -> list[int]:
        """`_meet`'s all-reduce of `vec` (`n` payload values), bounded by the step timeout."""
        # (overlap: a group of its own, as bucket programs may be using theirs on the worker)
        group = self._agree_group if self._agree_group is not None else self._group()
        work = dist.all_reduce(vec, op=dist.ReduceOp.MAX, group=group, async_op=True)
        assert work is not None  # (async_op=True returns the work)
        try:
            if self.step_timeout is None:
                work.wait()
            else:
                work.wait(timeout=datetime.timedelta(seconds=self.step_timeout))
        except RuntimeError as e:
            if "timed out" not in str(e).lower():
                raise
            raise CocoError(
                f"{_CALLS[call]} of the optimizer on rank {self.rank}: "
                f"{arrivals()} within the step timeout ({self.step_timeout:g} s): the ranks "
                "must call the optimizer's step() (and a sliced state_dict()) together; "
                "set it with step_timeout= or COCONET_STEP_TIMEOUT (0: off)"
            ) from None
        out = vec.tolist()
        highest, lowest = out[0], -out[1]
        if highest != lowest:
            other = _CALLS.get(highest if highest != call else lowest, "another call")
            raise CocoError(
                f"rank {self.rank} is in {_CALLS[call]} of the optimizer while another "
                f"rank is in {other}: the optimizer's state is sliced over the ranks, so "
                "state_dict() gathers from every rank and must be called on all of them. To "
                "save on one rank, call opt.consolidate_state_dict(to=0) on every rank, then "
                "opt.state_dict() on rank 0 alone (as torch's ZeroRedundancyOptimizer)"
            )
        return out[2 : 2 + n]

    def _arrived(self, meeting: int) -> Callable[[], str]:
        """Notes in the job's store that this rank has come to its `meeting`-th call, and
        returns what to say of the others when the call times out: which ranks did not come.
        (The store is torch.distributed's own key-value store; without it, no names.)"""
        try:
            store = dist.distributed_c10d._get_default_store()  # pyright: ignore[reportPrivateUsage]
        except Exception:  # (no store to ask: a message without names)
            return lambda: "some rank did not arrive"
        prefix = f"coconet/optimizer{self._uid}/rank"
        store.set(f"{prefix}{self.rank}", str(meeting))

        def missing() -> str:
            late = []
            for r in range(self.world):
                key = f"{prefix}{r}"
                if not store.check([key]) or int(store.get(key)) < meeting:
                    late.append(str(r))
            return f"rank(s) {', '.join(late) or '?'} did not arrive"

        return missing

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(message, UserWarning, stacklevel=3)

    def _warn_local_clipping(self, ids: set[int]) -> None:
        if self.overlap and any(i in self._slot_of for i in ids):
            raise CocoError(_OVERLAP_TORCH_CLIP)
        if self.world > 1 and any(i in self._slot_of for i in ids):
            self._warn_once(
                "clip",
                "coconet.torch: torch.nn.utils.clip_grad_norm_ on parameters a coconet optimizer "
                "owns clips each rank's LOCAL gradients by their own norm; the optimizer "
                "averages them over the ranks later, inside step(), so this is not the clipping "
                "DDP + clip_grad_norm_ computes. Clip the averaged gradients in the step: "
                f"opt.clip_grad_norm_(max_norm) before opt.step(), or {type(self).__name__}"
                "(..., max_grad_norm=max_norm).",
            )

    def clip_grad_norm_(
        self,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = False,
        foreach: bool | None = None,
    ) -> torch.Tensor:
        """`torch.nn.utils.clip_grad_norm_(params, max_norm)` on the gradients averaged over
        the ranks, done inside the next `step()` (call it before): the total 2-norm over every
        parameter's reduced gradient, and every gradient scaled by min(1, max_norm / (norm +
        1e-6)). Returns the total norm as a 0-d tensor that holds NaN until that `step()`
        computes it (then also `opt.last_grad_norm`). `foreach` is ignored."""
        if self.overlap and not self._reduce_only:
            raise CocoError(_OVERLAP_CLIP)
        if float(norm_type) != 2.0:
            raise CocoError(f"norm_type={norm_type}: coconet clips by the 2-norm only")
        if error_if_nonfinite:
            raise CocoError(
                "error_if_nonfinite=True: the norm is computed inside step(), after which the "
                "update has happened; check opt.last_grad_norm after the step instead"
            )
        if not float(max_norm) > 0:
            raise CocoError(f"max_norm={max_norm}: a positive number")
        self._clip_next = float(max_norm)
        self._norm_next = torch.full((), math.nan, dtype=torch.float32, device=self.device)
        return self._norm_next

    # -- the program -------------------------------------------------------------------------

    @property
    def compiled(self) -> Any:
        """The program of the common step (every parameter has a gradient; overlap with
        clipping: the step after backward's reductions)."""
        form = "reduced" if self._reduce_only else "step"
        return self._program(self._key(False, self.max_grad_norm is not None, form=form))

    @property
    def buckets(self) -> list[_Segment]:
        """The segments (the name of earlier versions)."""
        return self.segments

    def _key(
        self, masked: bool, clip: bool, bucket: int | None = None, form: str = "step"
    ) -> tuple[Any, ...]:
        """A variant of the step: over every segment (`bucket` None) or one bucket's; `form`
        "step" (reduce and update), "reduce" (overlap with clipping: a bucket's reduction
        only) or "reduced" (the update reading the reduced gradients, after those)."""
        keys = tuple(self.group_key(g) for g in self.param_groups)
        return (masked, clip, keys, bucket, form)

    def _adopt_buffers(self, compiled: Any) -> None:
        """Backward accumulates each segment's gradient straight into the buffer the common
        step reads it from where that is symmetric memory (a fused kernel's peers read the
        gradient there), and the parameters live in the step's symmetric parameter buffer
        (`{coco.symmetric}`: the fused all_gather assembles them there, pulled by the peers
        from it): the step then copies neither in nor out (CompiledProgram.input_buffer; the
        gradients and parameters stay views, now of those buffers). The cpu backend: on a
        GPU a tensor over the program's IPC memory would outlive it unseen -- left for the
        cuda backend."""
        if self.backend != "cpu":
            return
        for i, s in enumerate(self.segments):
            s.adopted = s.adopted or self._adopt(compiled, f"g{i}", s, self._regrad)
            s.params_adopted = s.params_adopted or self._adopt(compiled, f"w{i}", s, self._reparam)

    def _adopt(
        self,
        compiled: Any,
        name: str,
        s: _Segment,
        rebind: Callable[[_Segment, torch.Tensor], None],
    ) -> bool:
        """Argument `name` of segment `s` into `compiled`'s symmetric buffer, if it has one."""
        buf = compiled.plan.arguments.get(name)
        if buf is None or not buf.symmetric:
            return False
        array = compiled.input_buffer(name)
        if s.dtype == torch.bfloat16:
            t = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(array)
        rebind(s, t)
        self._inputs[name] = _handed_over(t)
        return True

    def _release_buffers(self) -> None:
        """Gradients and parameters back into memory of their own, before the programs
        owning the buffers they were views of close (_recompile then hands the programs the
        new ones)."""
        for s in self.segments:
            if s.adopted:
                self._regrad(s, torch.empty_like(s.flat_grad))
                s.adopted = False
            if s.params_adopted:
                self._reparam(s, torch.empty_like(s.flat_param))
                s.params_adopted = False

    def _regrad(self, s: _Segment, flat: torch.Tensor) -> None:
        """`flat` becomes segment `s`'s gradient buffer (its values copied in), its
        parameters' gradients views of it."""
        with torch.no_grad():
            flat.copy_(s.flat_grad)
        for p, o, slot in zip(s.params, s.offsets, s.slots, strict=True):
            old = self._grad_views[slot]
            view = flat[o : o + p.numel()].view_as(p)
            self._grad_views[slot] = view
            if p.grad is old:
                p.grad = view
        s.flat_grad = flat

    def _reparam(self, s: _Segment, flat: torch.Tensor) -> None:
        """`flat` becomes segment `s`'s parameter buffer (its values copied in), its
        parameters views of it (`.data`: the Parameter objects, which the model and the
        optimizer's groups hold, stay)."""
        with torch.no_grad():
            flat.copy_(s.flat_param)
            for p, o in zip(s.params, s.offsets, strict=True):
                p.data = flat[o : o + p.numel()].view_as(p)
        s.flat_param = flat

    def _recompile(self) -> None:
        """Drops every compiled variant (the segments changed) and compiles the common one."""
        self._release_buffers()
        for compiled in self._programs.values():
            compiled.close()
        self._programs = {}
        self._inputs = {}
        self._range_inputs = {}
        for i, s in enumerate(self.segments):
            self._inputs[f"g{i}"] = _handed_over(s.flat_grad)
            self._inputs[f"w{i}"] = _handed_over(s.flat_param)
            if s.reduced is not None:
                self._inputs[f"r{i}"] = _handed_over(s.reduced)
        if self._reduce_only:  # every bucket's reduction, and the step after them
            for b in range(len(self._buckets)):
                self._program(self._key(False, False, b, "reduce"))
            self._program(self._key(False, True, None, "reduced"))
        elif self.overlap:  # every bucket's common variant, before any backward launches one
            for b in range(len(self._buckets)):
                self._program(self._key(False, False, b))
        else:
            self._program(self._key(False, self.max_grad_norm is not None))

    def _program(self, key: tuple[Any, ...]) -> Any:
        compiled = self._programs.get(key)
        if compiled is not None:
            return compiled
        import coconet
        from coconet.compiled import CompiledProgram

        masked, clip, keys, bucket, form = key
        chosen = range(len(self.segments)) if bucket is None else self._buckets[bucket]
        if form == "reduce":
            assert bucket is not None
            ranges = self._bucket_ranges[bucket]
            program = self.build_reduction(ranges)
            self._range_inputs[bucket] = {}
            for k, (i, begin, end) in enumerate(ranges):
                s = self.segments[i]
                assert s.reduced is not None
                self._range_inputs[bucket][f"g{k}"] = _handed_over(s.flat_grad[begin:end])
                self._range_inputs[bucket][f"r{k}"] = _handed_over(s.reduced[begin:end])
        else:
            reduced = form == "reduced"
            sliced = reduced and self._sliced_step
            # the common step owns the parameters' memory (_adopt_buffers): symmetric, where
            # the fused all_gather assembles them with no staging copy
            owns = form == "step" and bucket is None and not masked and self.backend == "cpu"
            program = self.build_program(
                masked, clip, keys, list(chosen), reduced, sliced, symmetric_params=owns
            )
        compiled = coconet.compile(
            program,
            # Overlap with clipping: a bucket's all_reduce under the schedule (the fused forms
            # sum in rank order, as the step's fused reduce_scatter does), and a step with no
            # collective left for a schedule to split, written sliced or not as it would, whose
            # elementwise chains are fused into kernels as ar-c fuses them
            schedule={
                "step": self._concrete,
                "reduce": "fuse(rs-c-ag)" if self.schedule == "auto" else self.schedule,
                "reduced": FUSE_ELEMENTWISE,
            }[form],
            backend=self.backend,
            schedule_space="named",
            step_timeout=self.step_timeout or 0,
            # the state lives as each rank's piece (ZeRO's sliced m and v), bound zero-copy
            pieces=True,
        )
        if form == "step" and bucket is None and not masked:
            self._adopt_buffers(compiled)
        if self._concrete == "auto" and form == "step":
            # every variant after the first takes its schedule: one layout of the state
            name = (compiled.autotune or {}).get("name", "as-written")
            self._concrete = None if name == "as-written" else name
        assert isinstance(compiled, CompiledProgram)  # the cpu or cuda backend (never sim)
        shapes = compiled.input_shapes()
        for i in chosen if form != "reduce" else ():  # (a reduction holds no state)
            s = self.segments[i]
            for name in self.state_names:
                shape = shapes[f"{name}{i}"][0]
                piece = s.state.get(name)
                if piece is None:
                    piece = torch.zeros(shape, dtype=torch.float32, device=self.device)
                    s.state[name] = piece
                elif tuple(piece.shape) != tuple(shape):
                    raise CocoError(
                        f"internal: the variants of the step hold state {name}{i} as "
                        f"{tuple(piece.shape)} and {tuple(shape)}"
                    )
                self._inputs[f"{name}{i}"] = _handed_over(piece)
        self._programs[key] = compiled
        return compiled

    def build_reduction(self, ranges: list[tuple[int, int, int]]) -> Any:
        """Overlap with clipping: a bucket's program in backward, the sum over the ranks of
        the local gradients in the (segment, begin, end) `ranges` (argument `g<k>` for the
        k-th) stored into the same range of the segment's `reduced` buffer (`r<k>`,
        replicated), in the gradients' element type as the step's all_reduce computes it
        (bf16 rounded once), before any cast or scaling."""
        from coconet import frontend
        from coconet.frontend import BF16, F32, AllReduce, Local, Replicated, Tensor, Update

        params: list[tuple[str, Any]] = []
        for k, (i, begin, end) in enumerate(ranges):
            elt = BF16 if self.segments[i].dtype == torch.bfloat16 else F32
            params += [(f"g{k}", Tensor(elt, [end - begin], Local))]
            params += [(f"r{k}", Tensor(elt, [end - begin], Replicated))]
        names = [n for n, _t in params]

        def reduce(*args: Any) -> None:
            a = dict(zip(names, args, strict=True))
            for k in range(len(ranges)):
                Update(a[f"r{k}"], AllReduce("+", a[f"g{k}"]).named(f"gsum{k}"))

        reduce.__signature__ = _signature(params)  # type: ignore[attr-defined]
        return frontend.program(grid=[None], name=f"{self.algorithm or 'step'}_reduce")(reduce)

    def build_program(
        self,
        masked: bool,
        clip: bool,
        keys: tuple[Any, ...],
        chosen: list[int] | None = None,
        reduced: bool = False,
        sliced: bool = False,
        symmetric_params: bool = False,
    ) -> Any:
        """The step over the segments `chosen` (None: every one; the arguments keep each
        segment's index in the optimizer): per segment the sum of the local gradients over the
        ranks (`reduced`: the sum `build_reduction` stored, read as the argument `r<i>`),
        scaled to their mean; with `clip`, the global norm of those means and each scaled by
        min(1, max_norm / (norm + 1e-6)) (the norm is the program's result); then the
        algorithm's update (`rule`), under `masked` kept only where the keep mask is set.
        `sliced` (with `reduced`; not LAMB): written as rs-c-ag schedules the step, each rank
        computing its slice of every segment (its state sliced: ZeRO-1) and the norm from the
        slices' partial sums, then all-gathering the parameters -- so that it rounds as the
        step without overlap under rs-c-ag and fuse(rs-c-ag) does. `symmetric_params`: the
        parameters are `{coco.symmetric}` (kept in the program's symmetric memory)."""
        from coconet import frontend
        from coconet.frontend import (
            BF16,
            F32,
            AllGather,
            AllReduce,
            Cast,
            Ite,
            Local,
            Min,
            ReduceSum,
            Replicated,
            Scalar,
            Slice,
            Sliced,
            Sqrt,
            Tensor,
            Update,
        )

        assert not sliced or (reduced and not self.per_tensor)
        state_layout = Sliced(0) if sliced else Replicated
        indices = range(len(self.segments)) if chosen is None else chosen
        segs = [(i, self.segments[i]) for i in indices]
        groups = sorted({s.group for _i, s in segs})
        elementwise_bc = masked and not self.per_tensor
        params: list[tuple[str, Any]] = []
        for i, s in segs:
            elt = BF16 if s.dtype == torch.bfloat16 else F32
            n = s.numel
            grad = (
                (f"r{i}", Tensor(elt, [n], Replicated))
                if reduced
                else (f"g{i}", Tensor(elt, [n], Local))
            )
            w = Tensor(elt, [n], Replicated, symmetric=symmetric_params)
            params += [grad, (f"w{i}", w)]
            params += [(f"{name}{i}", Tensor(F32, [n], state_layout)) for name in self.state_names]
            if masked:
                keep = Scalar(F32) if self.per_tensor else Tensor(F32, [n], Replicated)
                params.append((f"keep{i}", keep))
            if self.bias_corrected:
                for bc in ("bc1", "bc2"):
                    t = Tensor(F32, [n], Replicated) if elementwise_bc else Scalar(F32)
                    params.append((f"{bc}s{i}", t))
        for k in groups:
            params += [(f"{name}_g{k}", Scalar(F32)) for name in self.option_scalars]
        params.append(("gscale", Scalar(F32)))
        if masked:
            params.append(("half", Scalar(F32)))
        if clip:
            params.append(("max_norm", Scalar(F32)))
        names = [n for n, _t in params]

        def store_into(a: dict[str, Any], i: int, keep: Any, name: str, value: Any) -> Any:
            # Right where the rule computes it (a fused LAMB keeps m and v stored before its
            # norms); the rule goes on with the value stored, so that the schedules see state
            # (a stored value read again) and slice it in every variant alike (where keep is 0
            # the rule's result is not kept anyway).
            old = a[f"{name}{i}"]
            if keep is not None:
                value = Ite(keep, value, old).named(f"{name}k{i}")
            Update(old, value)
            return value

        def step(*args: Any) -> Any:
            a = dict(zip(names, args, strict=True))
            grads = {}
            for i, s in segs:
                # (the same ops after the sum, in the same order: the same step bit for bit)
                if sliced:
                    gsum = Slice(a[f"r{i}"]).named(f"gsum{i}")
                elif reduced:
                    gsum = a[f"r{i}"]
                else:
                    gsum = AllReduce("+", a[f"g{i}"]).named(f"gsum{i}")
                if s.dtype == torch.bfloat16:
                    gsum = Cast(F32, gsum).named(f"gsumf{i}")
                grads[i] = (gsum * a["gscale"]).named(f"gavg{i}")
            total = None
            if clip:
                squares = None
                for i, g in grads.items():
                    part = ReduceSum((g * g).named(f"gsq{i}")).named(f"sumsq{i}")
                    if sliced:  # (this rank's partial sum)
                        part = AllReduce("+", part).named(f"sumsq_all{i}")
                    squares = part if squares is None else (squares + part).named(f"sumsq_to{i}")
                assert squares is not None
                total = Sqrt(squares).named("total_norm")
                coef = Min(1.0, a["max_norm"] / (total + 1e-6)).named("clip_coef")
                grads = {i: (g * coef).named(f"gclip{i}") for i, g in grads.items()}

            def mine(x: Any, name: str) -> Any:  # (sliced: this rank's slice of x)
                return Slice(x).named(name) if sliced else x

            for i, s in segs:
                bf16 = s.dtype == torch.bfloat16
                w_in = mine(a[f"w{i}"], f"ws{i}")
                w = Cast(F32, w_in).named(f"wf{i}") if bf16 else w_in
                opts = {name: a[f"{name}_g{s.group}"] for name in self.option_scalars}
                if self.bias_corrected:
                    bc1, bc2 = a[f"bc1s{i}"], a[f"bc2s{i}"]
                    if elementwise_bc:
                        bc1, bc2 = mine(bc1, f"bc1p{i}"), mine(bc2, f"bc2p{i}")
                    opts["bc1"], opts["bc2"] = bc1, bc2
                state = {name: a[f"{name}{i}"] for name in self.state_names}
                keep = None
                if masked:
                    keep = (mine(a[f"keep{i}"], f"keeps{i}") > a["half"]).named(f"keepb{i}")

                store = functools.partial(store_into, a, i, keep)
                new_w = self.rule(i, grads[i], w, state, opts, keys[s.group], store)
                if bf16:
                    new_w = Cast(BF16, new_w).named(f"wb{i}")
                if keep is not None:
                    new_w = Ite(keep, new_w, w_in).named(f"wk{i}")
                if sliced:
                    new_w = AllGather(new_w).named(f"wg{i}")
                Update(a[f"w{i}"], new_w)
            return total

        step.__signature__ = _signature(params)  # type: ignore[attr-defined]
        return frontend.program(grid=[None], name=self.algorithm or "step")(step)

    def rule(
        self,
        i: int,
        g: Any,
        w: Any,
        state: dict[str, Any],
        opts: dict[str, Any],
        key: tuple[Any, ...],
        store: Callable[[str, Any], Any],
    ) -> Any:
        """Segment i's update in the front end: the averaged (clipped) gradient `g`, the f32
        parameter `w`, its state, the group's scalars (and bias corrections), its structural
        options `key` -> the new f32 parameter; each new state tensor goes to `store(name,
        value)`, and the rule goes on with what that returns."""
        raise NotImplementedError

    # -- the step ----------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._check_group(group)
        clip = self._clip_next if self._clip_next is not None else self.max_grad_norm
        norm_out = self._norm_next
        self._clip_next = self._norm_next = None
        if self.overlap:
            return self._overlapped_step(loss, clip, norm_out)
        have, frozen, _ = self._agree(*self._local_gradients())
        if frozen:
            raise CocoError(_FROZEN_GRADIENT)
        return self._update(loss, have, clip, norm_out, "step")

    def _update(
        self,
        loss: Any,
        have: list[int],
        clip: float | None,
        norm_out: torch.Tensor | None,
        form: str,
    ) -> Any:
        """The program over every segment for the agreed marks `have` (`form`: the step, or
        the step after backward's reductions), the norm into `norm_out` where it clips."""
        if norm_out is None and clip is not None:
            norm_out = torch.full((), math.nan, dtype=torch.float32, device=self.device)
        if not any(have):
            if norm_out is not None:
                norm_out.fill_(0.0)
                self.last_grad_norm = norm_out
            return loss
        for slot, got in enumerate(have):
            self._steps[slot] += got
        self._version += 1
        every = list(range(len(self.segments)))
        masked = self._masked(every, have, self._steps)
        compiled = self._program(self._key(masked, clip is not None, None, form))
        inputs = self._inputs_for(compiled, every, masked, have, self._steps, clip)
        out = self._run(compiled, inputs)
        if norm_out is not None:
            total = out["total_norm"]
            total = total.get() if hasattr(total, "get") else total
            norm_out.fill_(float(np.asarray(total).reshape(-1)[0]))
            self.last_grad_norm = norm_out
        return loss

    # -- overlap with backward ---------------------------------------------------------------

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradient accumulation (DDP's `no_sync()`): backward inside launches no bucket, the
        gradients accumulate locally; the backward after it (or `step()`) launches them.
        Without overlap gradients stay local until `step()` anyway: it changes nothing."""
        before = self._syncing
        self._syncing = False
        try:
            yield
        finally:
            self._syncing = before

    def _arrive(self, slot: int) -> None:
        """overlap=True: backward accumulated the gradient of the parameter in `slot`. Before
        the launch order is known (the first step), the order buckets complete in is noted;
        after, a bucket every parameter of which arrived (outside `no_sync()`) is launched, as
        are the ones after it in the launch order that are complete: in that order only, so
        that every rank launches the same programs in the same order."""
        with self._overlap_lock:
            b = self._bucket_of[slot]
            if self._launched[b]:
                raise CocoError(
                    "overlap=True: backward reached a parameter whose bucket was already "
                    "reduced and updated in this step (a second backward before step()). "
                    "Accumulate the micro-batches' gradients inside opt.no_sync(), and call "
                    "backward outside it for the last one only"
                )
            if self._order is None:
                marked = self._marks.marked
                if b not in self._completed and all(marked[j] for j in self._bucket_slots[b]):
                    self._completed.append(b)
                return
            if not self._syncing:
                return
            self._arrivals[b].add(slot)
            order = self._order
            while self._next < len(order):
                ready = order[self._next]
                if len(self._arrivals[ready]) < len(self._bucket_slots[ready]):
                    break
                self._launch(ready)
                self._next += 1

    def _launch(self, b: int) -> None:
        """Bucket `b`'s program on the worker, from backward: every parameter of it has a
        gradient here (the same variant step() runs where some rank launched it)."""
        for k in sorted({self.segments[i].group for i in self._buckets[b]}):
            self._check_group(self.param_groups[k])
        slots = self._bucket_slots[b]
        for j in slots:  # a gradient in a tensor of its own (p.grad was None): into the view
            p, view = self._params[j], self._grad_views[j]
            grad = p.grad
            if grad is not None and grad is not view:
                view.copy_(grad)
                p.grad = view
        have = [1] * len(self._params)
        steps = list(self._steps)
        for j in slots:
            steps[j] += 1
        if self._ddp_checks_left > 0 and self.world > 1:
            self._launch_checksum += self._checksum(self._bucket_ranges[b])
        self._launched[b] = True
        self._submit(b, have, steps)

    def _submit(self, b: int, have: list[int], steps: list[int]) -> None:
        """Bucket `b`'s step for the marks `have` and step counts `steps` (after the step), on
        the worker thread: launches there run one at a time in the order submitted, and the
        variants a launch needs compile there too (compiling is collective over the programs'
        communicator, which only the worker uses while buckets are in flight)."""
        chosen = self._buckets[b]
        if self._reduce_only:  # (no update: nothing masked)
            masked, key = False, self._key(False, False, b, "reduce")
        else:
            masked = self._masked(chosen, have, steps)
            key = self._key(masked, False, b)
        ready = None
        if self._side is not None:  # the gradients' producer (backward's stream) first
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="coconet-overlap")
        job = functools.partial(self._run_bucket, key, chosen, masked, have, steps, ready)
        self._futures.append(self._worker.submit(job))

    def _run_bucket(
        self,
        key: tuple[Any, ...],
        chosen: list[int],
        masked: bool,
        have: list[int],
        steps: list[int],
        ready: Any,
    ) -> None:
        def run() -> None:
            compiled = self._program(key)
            if key[4] == "reduce":  # the gradients and their sums, nothing else
                inputs = self._range_inputs[key[3]]
            else:
                inputs = self._inputs_for(compiled, chosen, masked, have, steps, None)
            self._run(compiled, inputs)

        if ready is None:
            run()
            return
        # cuda: the side stream waits for the gradients, and the DLPack hand-over orders the
        # program's streams after it (PyTorch's current stream of this thread)
        with torch.cuda.device(self.device), torch.cuda.stream(self._side):
            self._side.wait_event(ready)
            run()

    def _overlapped_step(self, loss: Any, clip: float | None, norm_out: torch.Tensor | None) -> Any:
        """step() with overlap=True: the ranks agree on the marks and on which buckets some
        rank launched in backward; each rank launches, in the launch order, every bucket it
        has not (those launched elsewhere first: the same variant, every parameter having a
        gradient there), waits for all of them, and is ready for the next backward. With
        clipping the buckets only reduced: then the step over every segment runs."""
        nb = len(self._buckets)
        with self._overlap_lock:
            here = list(self._launched)
        launched = {j for b in range(nb) if here[b] for j in self._bucket_slots[b]}
        try:
            have, frozen = self._local_gradients(launched)
            learning = self._order is None
            extra = [int(x) for x in here]
            if learning:  # rank 0's: the order its buckets completed in, the rest from the end
                seen = self._completed + [
                    b for b in reversed(range(nb)) if b not in self._completed
                ]
                position = {b: k + 1 for k, b in enumerate(seen)}
                extra += [position[b] if self.rank == 0 else 0 for b in range(nb)]
            unlaunched = [r for b in range(nb) if not here[b] for r in self._bucket_ranges[b]]
            have, frozen, extra = self._agree(have, frozen, extra, unlaunched)
            if learning:
                self._order = sorted(range(nb), key=lambda b: extra[nb + b])
            order = self._order
            assert order is not None
            anywhere = extra[:nb]
            if frozen:  # finish what some rank began (the replicas stay alike), then refuse
                have = [int(anywhere[self._bucket_of[j]] and have[j]) for j in range(len(have))]
            if not self._reduce_only:  # (else counted by the step after the reductions)
                for slot, got in enumerate(have):
                    self._steps[slot] += got
                if any(have):
                    self._version += 1
            steps = list(self._steps)
            for b in order:
                if here[b]:
                    continue
                if not any(have[j] for j in self._bucket_slots[b]):
                    if self._reduce_only:
                        # zero on every rank (no rank gave it a gradient), so is its sum; the
                        # step reads it (the norm) and must not find the last step's
                        for i, begin, end in self._bucket_ranges[b]:
                            reduced = self.segments[i].reduced
                            assert reduced is not None
                            reduced[begin:end].zero_()
                    continue
                with self._overlap_lock:
                    self._submit(b, have, steps)
        finally:
            self._drain()
        if frozen:
            raise CocoError(_FROZEN_GRADIENT)
        if self._reduce_only:
            return self._update(loss, have, clip, norm_out, "reduced")
        return loss

    def _drain(self) -> None:
        """Waits for every launched bucket (raising the first failure), and resets the
        buckets for the next backward."""
        failure = None
        for future in self._futures:
            try:
                future.result()
            except BaseException as e:  # (every bucket waited for before raising)
                failure = failure or e
        if self._side is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._side)
        with self._overlap_lock:
            self._futures = []
            self._launched = [False] * len(self._buckets)
            self._arrivals = [set() for _ in self._buckets]
            self._next = 0
            self._launch_checksum = 0
        if failure is not None:
            raise failure

    def _refuse_in_flight(self, what: str) -> None:
        if any(self._launched):
            raise CocoError(
                f"{what} between a backward and step() with overlap=True: backward has already "
                "launched buckets (their parameters are being updated); call step() first"
            )

    def _masked(self, chosen: list[int], have: list[int], steps: list[int]) -> bool:
        """Whether the segments `chosen` take the masked variant: a parameter without a
        gradient, or (Adam) parameters of one segment at different step counts."""
        return not all(have[j] for i in chosen for j in self.segments[i].slots) or (
            self.bias_corrected
            and not self.per_tensor
            and any(len({steps[j] for j in self.segments[i].slots}) > 1 for i in chosen)
        )

    def _inputs_for(
        self,
        compiled: Any,
        chosen: list[int],
        masked: bool,
        have: list[int],
        steps: list[int],
        clip: float | None,
    ) -> dict[str, Any]:
        """The arguments of `compiled`, the step over the segments `chosen`, for the marks
        `have` and the step counts `steps` (after this step), by slot."""
        inputs = dict(self._inputs)
        for k, group in enumerate(self.param_groups):
            for name, value in self.group_scalars(group).items():
                inputs[f"{name}_g{k}"] = value
        inputs = {n: v for n, v in inputs.items() if n in compiled.plan.arguments}
        inputs["gscale"] = 1.0 / self.world
        if clip is not None:
            inputs["max_norm"] = clip
        if masked:
            inputs["half"] = 0.5
            inputs.update(self._masks(have, steps, compiled, chosen))
        elif self.bias_corrected:
            for i in chosen:
                s = self.segments[i]
                bc1, bc2 = self._bias_corrections(s.group, steps[s.slots[0]])
                inputs[f"bc1s{i}"], inputs[f"bc2s{i}"] = bc1, bc2
        return inputs

    def _run(self, compiled: Any, inputs: dict[str, Any]) -> Any:
        """`compiled(**inputs)`; under torch.profiler, each step of its plan (kernel, collective,
        copy) as a record_function range inside torch.optim's own `Optimizer.step#...` one."""
        if not torch.autograd.profiler._is_profiler_enabled:  # pyright: ignore[reportPrivateUsage]
            return compiled(**inputs)
        from coconet.runtime.trace import StepTracer

        compiled.runner.trace(StepTracer(self.rank, nvtx=_ProfilerRanges()))
        try:
            return compiled(**inputs)
        finally:
            compiled.runner.trace(None)

    def _bias_corrections(self, k: int, steps: int) -> tuple[float, float]:
        """The rule's two bias-correction scalars (`bc1`, `bc2`) of a parameter of group k
        after `steps` steps, computed in f64 on the host and rounded once, as torch computes
        them in Python: here 1 - beta^steps for both betas."""
        beta1, beta2 = self.param_groups[k]["betas"]
        return 1 - math.pow(float(beta1), steps), 1 - math.pow(float(beta2), steps)

    def _masks(
        self, have: list[int], steps: list[int], compiled: Any, chosen: list[int]
    ) -> dict[str, Any]:
        """The masked variant's arguments: which elements (LAMB: tensors) to update, and their
        bias corrections from each parameter's own step count (1 where none applies)."""
        shapes = compiled.input_shapes()
        rank = compiled.rank
        out: dict[str, Any] = {}
        for i in chosen:
            s = self.segments[i]
            if self.per_tensor:
                (slot,) = s.slots
                out[f"keep{i}"] = float(have[slot])
                if self.bias_corrected:
                    bc = self._bias_corrections(s.group, max(steps[slot], 1))
                    out[f"bc1s{i}"], out[f"bc2s{i}"] = bc
                continue
            names = ["keep", *(("bc1", "bc2") if self.bias_corrected else ())]
            for name in names:
                full = s.masks.get(name)
                if full is None:
                    full = torch.empty(s.numel, dtype=torch.float32, device=self.device)
                    s.masks[name] = full
                full.fill_(0.0 if name == "keep" else 1.0)
            for p, slot, o in zip(s.params, s.slots, s.offsets, strict=True):
                if not have[slot]:
                    continue
                span = slice(o, o + p.numel())
                s.masks["keep"][span] = 1.0
                if self.bias_corrected:
                    bc1, bc2 = self._bias_corrections(s.group, steps[slot])
                    s.masks["bc1"][span] = bc1
                    s.masks["bc2"][span] = bc2
            for name in names:
                arg = f"{name}{i}" if name == "keep" else f"{name}s{i}"
                full = s.masks[name]
                n = shapes[arg][0][0]
                piece = full if n == s.numel else full[rank * n : (rank + 1) * n]
                out[arg] = _handed_over(piece)
        return out

    # -- state -------------------------------------------------------------------------------

    def _sliced(self) -> bool:
        """Whether some rank holds only a slice of the state (gathering it is collective)."""
        return self.world > 1 and any(
            piece.numel() != s.numel for s in self.segments for piece in s.state.values()
        )

    def _fulls(self, to: int | None) -> list[dict[str, torch.Tensor]] | None:
        """Every segment's state as whole tensors, gathered from the ranks' slices: on every
        rank (`to` None, all_gather) or on rank `to` alone (gather; None elsewhere). The
        caller has met the other ranks."""
        rank, group = self.rank, self._group()
        out: list[dict[str, torch.Tensor]] = []
        for s in self.segments:
            fulls: dict[str, torch.Tensor] = {}
            for name, piece in s.state.items():
                if piece.numel() == s.numel:
                    fulls[name] = piece.clone()
                    continue
                parts = [torch.empty_like(piece) for _ in range(self.world)]
                if to is None:
                    dist.all_gather(parts, piece, group=group)
                else:
                    mine = parts if rank == to else None
                    dist.gather(piece, mine, group=group, group_dst=to)
                fulls[name] = torch.cat(parts)
            out.append(fulls)
        return out if to is None or rank == to else None

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gathers the whole state on rank `to` so that `state_dict()` can be called there
        alone, as torch's ZeroRedundancyOptimizer: collective (every rank calls it with the
        same `to`); good until the next step, load or new group."""
        if not 0 <= to < self.world:
            raise CocoError(f"consolidate_state_dict(to={to}): a rank, 0 to {self.world - 1}")
        self._refuse_in_flight("consolidate_state_dict()")
        if self._sliced():
            agreed = self._meet(_CONSOLIDATE, [to, -to])
            if agreed[0] != -agreed[1]:
                raise CocoError(
                    f"consolidate_state_dict(to=...): the ranks passed different ranks "
                    f"({-agreed[1]} to {agreed[0]}); pass the same one on every rank"
                )
            fulls = self._fulls(to)
        else:
            fulls = self._fulls(None) if self.rank == to else None
        mine = None if fulls is None else self._state_dict_of(fulls)
        self._consolidated = (self._version, to, mine)

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's layout: the groups with their options and parameter indices, and an
        entry per parameter that has state (one step applied to it), full tensors. Sliced
        state is gathered from every rank (collective) unless `consolidate_state_dict(to=r)`
        has gathered it on this rank since the state last changed."""
        self._refuse_in_flight("state_dict()")
        if not self._sliced():
            return self._state_dict_of(self._fulls(None) or [])
        if self._consolidated is not None and self._consolidated[0] == self._version:
            _version, to, consolidated = self._consolidated
            if consolidated is None:
                raise CocoError(
                    f"state_dict() on rank {self.rank}: consolidate_state_dict(to={to}) "
                    f"gathered the state on rank {to}; call state_dict() there"
                )
            return consolidated
        self._meet(_STATE_DICT, [])
        return self._state_dict_of(self._fulls(None) or [])

    def _indices(self) -> list[list[int]]:
        """Each group's parameters' indices in torch.optim's state_dict: in order over the
        groups."""
        out, index = [], 0
        for g in self.param_groups:
            out.append(list(range(index, index + len(g["params"]))))
            index += len(g["params"])
        return out

    def _has_state(self, slot: int, group: dict[str, Any]) -> bool:
        # Before the first step every parameter is listed with its zero state: the state
        # torch.optim has after torch.distributed.checkpoint's initializing step, so that
        # dcp.load into a fresh optimizer has every tensor to fill (none is silently skipped).
        return self._steps[slot] > 0 or not any(self._steps)

    def _state_entry(self, slot: int, values: dict[str, torch.Tensor]) -> dict[str, Any]:
        entry: dict[str, Any] = {}
        if self.bias_corrected:
            entry["step"] = torch.tensor(float(self._steps[slot]), dtype=torch.float32)
        for name in self.state_names:
            entry[self.torch_name(name)] = values[name]
        return entry

    def _state_dict_of(self, fulls_by_segment: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
        """torch.optim's layout of the state whose whole tensors are `fulls_by_segment`."""
        index_of: dict[int, int] = {}
        for g, indices in zip(self.param_groups, self._indices(), strict=True):
            for p, index in zip(g["params"], indices, strict=True):
                index_of[id(p)] = index
        state: dict[int, dict[str, Any]] = {}
        for s, fulls in zip(self.segments, fulls_by_segment, strict=True):
            for p, slot, o in zip(s.params, s.slots, s.offsets, strict=True):
                if not self._has_state(slot, self.param_groups[s.group]):
                    continue
                values = {
                    name: full[o : o + p.numel()].view(p.shape).clone()
                    for name, full in fulls.items()
                }
                state[index_of[id(p)]] = self._state_entry(slot, values)
        groups = []
        for g, indices in zip(self.param_groups, self._indices(), strict=True):
            saved = {k: v for k, v in g.items() if k != "params"}
            saved["params"] = indices
            groups.append(saved)
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A state_dict of this optimizer or of torch.optim's (the same groups, as torch
        requires): group options, step counts and state, scattered to the ranks' slices."""
        self._refuse_in_flight("load_state_dict()")
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
            len(saved["params"]) != len(mine["params"])
            for saved, mine in zip(groups, self.param_groups, strict=True)
        ):
            raise CocoError(
                "the state_dict's parameter groups do not match the optimizer's (their number "
                "or sizes)"
            )
        for saved, mine in zip(groups, self.param_groups, strict=True):
            mine.update({k: v for k, v in saved.items() if k not in ("params", "param_names")})
            self._check_group(mine)
        saved_index: dict[int, Any] = {}
        for saved, mine in zip(groups, self.param_groups, strict=True):
            for p, index in zip(mine["params"], saved["params"], strict=True):
                saved_index[id(p)] = index
        states = state_dict["state"]
        rank = self.rank
        self._version += 1
        for s in self.segments:
            fulls = {
                name: torch.zeros(s.numel, dtype=torch.float32, device=self.device)
                for name in s.state
            }
            for p, slot, o in zip(s.params, s.slots, s.offsets, strict=True):
                index = saved_index[id(p)]
                entry = states.get(index, states.get(str(index))) or {}
                if "step" in entry:
                    self._steps[slot] = int(float(entry["step"]))
                else:
                    self._steps[slot] = 1 if entry else 0
                for name, full in fulls.items():
                    saved = entry.get(self.torch_name(name))
                    if saved is not None:
                        full[o : o + p.numel()] = saved.reshape(-1).to(full)
            for name, full in fulls.items():
                piece = s.state[name]
                n = piece.numel()
                piece.copy_(full if n == s.numel else full[rank * n : (rank + 1) * n])

    @staticmethod
    def torch_name(name: str) -> str:
        return {"m": "exp_avg", "v": "exp_avg_sq", "buf": "momentum_buffer"}[name]


class _ProfilerRanges:
    """NVTX's push/pop interface (what runtime/trace.py's StepTracer names each plan step
    through) over torch.profiler's record_function ranges."""

    def __init__(self) -> None:
        self._open: list[Any] = []

    def RangePush(self, name: str) -> None:
        ranges = torch.profiler.record_function(f"coconet {name}")
        ranges.__enter__()
        self._open.append(ranges)

    def RangePop(self) -> None:
        self._open.pop().__exit__(None, None, None)


def _signature(params: list[tuple[str, Any]]) -> Any:
    import inspect

    return inspect.Signature(
        [
            inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=t)
            for n, t in params
        ]
    )
