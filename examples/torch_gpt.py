"""A GPT-style training recipe, data parallel under torchrun on CPUs (gloo), with torch.optim's
AdamW + DDP or coconet's AdamW -- the same script, the optimizer line swapped:

    torchrun --standalone --nproc-per-node 2 examples/torch_gpt.py --steps 20
    torchrun --standalone --nproc-per-node 2 examples/torch_gpt.py --optimizer coconet \\
        --schedule rs-c-ag --steps 8 --save-at 4 --ckpt /tmp/gpt
    torchrun --standalone --nproc-per-node 1 examples/torch_gpt.py --optimizer coconet \\
        --schedule rs-c-ag --steps 8 --resume /tmp/gpt          # at another world size

The recipe: token + position embedding (an odd vocabulary; the position embedding frozen,
requires_grad=False, yet listed in a param group as a recipe that groups `named_parameters()`
does), transformer blocks (LayerNorm, causal attention, GELU MLP), two param groups (weight
decay on the matrices, none on biases, LayerNorm and embeddings), warmup + cosine LR
(LambdaLR), gradient clipping at 1.0, gradient accumulation over micro-batches (DDP's
`no_sync()` on all but the last), a deterministic LayerDrop (the last block skipped every
`--drop-every` steps: its parameters get no gradient then, and AdamW must leave them alone),
and a checkpoint saved on rank 0 (`consolidate_state_dict` first where the optimizer has one,
as with torch's ZeroRedundancyOptimizer) that resumes at any world size.

What coconet changes (everything else is the torch recipe, line for line):

    opt = coconet.torch.AdamW(groups, lr=..., betas=..., schedule="fuse(rs-c-ag)")  # the line
    ddp.register_comm_hook(None, coconet.torch.local_gradients_hook)  # DDP leaves grads local
    clip_grad_norm_ = opt.clip_grad_norm_   # the norm of the reduced gradients, in the step

With the hook DDP only buckets: every micro-batch's gradients accumulate locally (with or
without `no_sync()`) and `opt.step()` averages them over the ranks, clips and updates in one
compiled program. Several `--optimizer`/`--schedule` runs go one after another in one job;
rank 0 prints a table of the mean loss over the ranks at every step, or writes JSON (`--json`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq: int, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, dim)
        self.pos_emb = nn.Embedding(seq, dim)
        self.pos_emb.weight.requires_grad_(False)  # frozen
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor, drop_last: bool = False) -> torch.Tensor:
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1]))
        for block in self.blocks[:-1] if drop_last else self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def global_batch(step: int, batch: int, seq: int, vocab: int) -> torch.Tensor:
    """Step `step`'s global batch [batch, seq + 1]: sequences that follow a fixed random bigram
    table with 10% noise (so the loss falls), the same for any world size."""
    table = torch.randint(0, vocab, (vocab,), generator=torch.Generator().manual_seed(1234))
    gen = torch.Generator().manual_seed(10_000 + step)
    seqs = [torch.randint(0, vocab, (batch,), generator=gen)]
    noise = torch.rand(batch, seq, generator=gen) < 0.1
    for t in range(seq):
        rnd = torch.randint(0, vocab, (batch,), generator=gen)
        seqs.append(torch.where(noise[:, t], rnd, table[seqs[-1]]))
    return torch.stack(seqs, 1)


def micro_batches(step: int, args: argparse.Namespace, rank: int, world: int):
    """This rank's shard of the global batch, cut into `--accum` micro-batches."""
    tokens = global_batch(step, args.batch, args.seq, args.vocab)
    shard = tokens[rank * args.batch // world : (rank + 1) * args.batch // world]
    for micro in shard.chunk(args.accum):
        yield micro[:, :-1], micro[:, 1:]


def lr_lambda(args: argparse.Namespace):
    def factor(step: int) -> float:  # linear warmup, then cosine down to 10%
        if step < args.warmup:
            return (step + 1) / args.warmup
        progress = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def coconet_schedules() -> tuple[str, ...]:
    import coconet.torch

    return coconet.torch.SCHEDULES


def train(optimizer: str, schedule: str, args: argparse.Namespace) -> dict:
    """One training run of the recipe; returns what rank 0 reports."""
    rank, world = dist.get_rank(), dist.get_world_size()
    began = time.perf_counter()
    name = optimizer.replace("-", " ")
    if optimizer.startswith("coconet"):
        name = f"{name} {schedule}"
    ckpt_file = f"{name.replace(' ', '_').replace('(', '_').replace(')', '')}.pt"
    torch.manual_seed(args.seed)
    model = GPT(args.vocab, args.seq, args.dim, args.heads, args.layers)
    ckpt = None
    if args.resume:
        ckpt = torch.load(Path(args.resume) / ckpt_file, weights_only=True)
        model.load_state_dict(ckpt["model"])
    frozen = model.pos_emb.weight.detach().clone()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "emb" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "emb" not in n)]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]
    hp = {"lr": args.lr, "betas": (0.9, 0.95), "eps": 1e-8}
    # ---- the optimizer line: the one place the recipes differ ----------------------------
    if optimizer.startswith("torch"):  # torch (its default: a for-loop on CPU), foreach, fused
        impl = {"torch-foreach": {"foreach": True}, "torch-fused": {"fused": True}}
        opt = torch.optim.AdamW(groups, **hp, **impl.get(optimizer, {}))
    else:
        import coconet.torch

        # coconet-overlap: each bucket's reduce + update launched from backward; clipped, each
        # bucket's reduce only (the norm needs them all), declared here with max_grad_norm=
        overlap = {"overlap": True, "bucket_cap_mb": args.bucket_cap_mb}
        if args.clip > 0:
            overlap["max_grad_norm"] = args.clip
        opt = coconet.torch.AdamW(
            groups, **hp, schedule=schedule, **(overlap if optimizer == "coconet-overlap" else {})
        )
    if args.no_ddp:  # coconet reduces the gradients itself; accumulate under its no_sync()
        ddp, no_sync = model, opt.no_sync
    else:
        # (find_unused_parameters: LayerDrop leaves a block unused on some steps)
        ddp = DDP(model, find_unused_parameters=True, gradient_as_bucket_view=args.bucket_view)
        no_sync = ddp.no_sync
    if args.clip <= 0:

        def clip_grad_norm_(max_norm: float) -> torch.Tensor:
            return torch.tensor(math.nan)  # (no clipping)

    elif optimizer.startswith("coconet"):
        clip_grad_norm_ = opt.clip_grad_norm_
    else:

        def clip_grad_norm_(max_norm: float) -> torch.Tensor:
            return nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    if optimizer == "coconet" and not args.no_ddp:
        ddp.register_comm_hook(None, coconet.torch.local_gradients_hook)

    # ---------------------------------------------------------------------------------------
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(args))
    start = 0
    if ckpt is not None:
        opt.load_state_dict(ckpt["optim"])
        sched.load_state_dict(ckpt["sched"])
        start = ckpt["step"]
    losses, norms, lrs, step_s, opt_s = [], [], [], [], []
    dropped_untouched: list[bool] = []
    dropped_moved: list[bool] = []
    last = model.blocks[-1]
    for step in range(start, args.steps):
        drop = args.drop_every > 0 and step % args.drop_every == args.drop_every - 1
        before = [p.detach().clone() for p in last.parameters()]
        t0 = time.perf_counter()
        total = torch.zeros(())
        for i, (x, y) in enumerate(micro_batches(step, args, rank, world)):
            sync = i == args.accum - 1
            with contextlib.nullcontext() if sync else no_sync():
                logits = ddp(x, drop_last=drop)
                loss = F.cross_entropy(logits.reshape(-1, args.vocab), y.reshape(-1))
                (loss / args.accum).backward()
            total += loss.detach() / args.accum
        t1 = time.perf_counter()
        norm = clip_grad_norm_(args.clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        step_s.append(t2 - t0)
        opt_s.append(t2 - t1)
        moved = any(not torch.equal(a, b) for a, b in zip(before, last.parameters(), strict=True))
        (dropped_untouched.append(not moved) if drop else dropped_moved.append(moved))
        dist.all_reduce(total)
        losses.append(float(total) / world)
        norms.append(float(norm))
        lrs.append(sched.get_last_lr()[0])
        if step + 1 == args.save_at and args.ckpt:
            if hasattr(opt, "consolidate_state_dict"):  # ZeRO-style optimizers gather first
                opt.consolidate_state_dict(to=0)
            if rank == 0:
                Path(args.ckpt).mkdir(parents=True, exist_ok=True)
                state = {"model": model.state_dict(), "optim": opt.state_dict()}
                state |= {"sched": sched.state_dict(), "step": step + 1}
                torch.save(state, Path(args.ckpt) / ckpt_file)
            dist.barrier()
    skip = min(args.warmup_steps, max(0, len(step_s) - 1))  # the first steps compile/warm up
    return {
        "name": name,
        "start": start,
        "losses": losses,
        "norms": norms,
        "lrs": lrs,
        "frozen_unchanged": torch.equal(frozen, model.pos_emb.weight),
        "dropped_untouched": dropped_untouched,
        "dropped_moved": dropped_moved,
        "step_ms": 1e3 * statistics.median(step_s[skip:]) if step_s else None,
        "opt_ms": 1e3 * statistics.median(opt_s[skip:]) if opt_s else None,
        "step_min_ms": 1e3 * min(step_s[skip:]) if step_s else None,
        "opt_min_ms": 1e3 * min(opt_s[skip:]) if opt_s else None,
        "run_s": time.perf_counter() - began,  # with the compilation
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--optimizer",
        action="append",
        choices=["torch", "torch-foreach", "torch-fused", "coconet", "coconet-overlap"],
        help="torch.optim.AdamW (default, foreach=True or fused=True) or coconet's (default: "
        "torch and coconet; coconet-overlap: overlap=True, which needs --no-ddp)",
    )
    p.add_argument(
        "--no-ddp",
        action="store_true",
        help="coconet runs only: the model without DDP, micro-batches under opt.no_sync()",
    )
    p.add_argument("--bucket-cap-mb", type=float, default=1.0, help="coconet-overlap's buckets")
    p.add_argument("--schedule", action="append", help="coconet schedule(s) (default: all)")
    p.add_argument("--bucket-view", action="store_true", help="DDP(gradient_as_bucket_view=True)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=8, help="global batch (split over the ranks)")
    p.add_argument("--accum", type=int, default=2, help="micro-batches per rank and step")
    p.add_argument("--vocab", type=int, default=97)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=3, help="LR warmup steps")
    p.add_argument("--clip", type=float, default=1.0, help="max gradient norm (0: none)")
    p.add_argument("--drop-every", type=int, default=3, help="skip the last block every N steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-at", type=int, default=0, help="save a checkpoint after this step")
    p.add_argument("--ckpt", help="directory for --save-at's checkpoints (one per run)")
    p.add_argument("--resume", help="directory of checkpoints to resume each run from")
    p.add_argument("--warmup-steps", type=int, default=2, help="steps left out of the times")
    p.add_argument("--json", help="rank 0 writes every run's record to this file")
    args = p.parse_args(argv)
    if args.no_ddp and any(o.startswith("torch") for o in args.optimizer or ["torch"]):
        p.error("--no-ddp: torch.optim's runs need DDP to reduce their gradients")
    if "coconet-overlap" in (args.optimizer or []) and not args.no_ddp:
        p.error("coconet-overlap needs --no-ddp (see coconet.torch: overlap)")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    runs = [
        (o, s)
        for o in args.optimizer or ["torch", "coconet"]
        for s in (
            [""] if not o.startswith("coconet") else args.schedule or list(coconet_schedules())
        )
    ]
    records = [train(o, s, args) for o, s in runs]
    if dist.get_rank() == 0:
        if args.json:
            Path(args.json).write_text(json.dumps(records))
        names = [r["name"] for r in records]
        print(f"world {dist.get_world_size()}: mean loss over the ranks (grad norm before clip)")
        print("step  " + "  ".join(f"{n:>30}" for n in names))
        for i in range(len(records[0]["losses"])):
            cells = [f"{r['losses'][i]:.6f} ({r['norms'][i]:6.3f})" for r in records]
            print(f"{records[0]['start'] + i:>4}  " + "  ".join(f"{c:>30}" for c in cells))
        print(
            "ms    " + "  ".join(f"{r['step_ms']:>19.2f} step/{r['opt_ms']:>5.2f}" for r in records)
        )
    dist.barrier()  # destroying is local: leave together, or a peer's gloo thread aborts
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
