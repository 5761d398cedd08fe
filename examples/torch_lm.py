"""A small transformer language model trained data-parallel with a coconet optimizer, next to
the same training with DDP + torch.optim.AdamW -- the PyTorch workflow, on CPUs:

    torchrun --standalone --nproc-per-node 2 examples/torch_lm.py --steps 20
    torchrun --standalone --nproc-per-node 2 examples/torch_lm.py --schedule rs-c-ag --json

Every rank builds the model from one seed, takes its own shard of each synthetic batch
(sequences that follow a fixed random bigram table, so the loss falls), runs backward locally
and calls `opt.step()`: coconet's program averages the gradients over the ranks and applies
AdamW, under the chosen schedule. The reference run uses DDP (which all-reduces in backward)
and torch.optim.AdamW. Both print the mean loss over the ranks at every step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

VOCAB, SEQ, DIM, HEADS, LAYERS = 64, 16, 32, 4, 2


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.zeros(SEQ, DIM))
        layer = nn.TransformerEncoderLayer(
            DIM, HEADS, dim_feedforward=4 * DIM, dropout=0.0, batch_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos
        return self.head(self.blocks(x, mask=self.mask, is_causal=True))


def batches(steps: int, batch: int, rank: int, world: int):
    """This rank's shard of each global batch of sequences from a fixed bigram table."""
    gen = torch.Generator().manual_seed(1234)
    table = torch.randint(0, VOCAB, (VOCAB,), generator=gen)
    for _ in range(steps):
        start = torch.randint(0, VOCAB, (batch, 1), generator=gen)
        noise = torch.rand(batch, SEQ, generator=gen) < 0.1
        seq = [start[:, 0]]
        for t in range(1, SEQ + 1):
            nxt = table[seq[-1]]
            rnd = torch.randint(0, VOCAB, (batch,), generator=gen)
            seq.append(torch.where(noise[:, t - 1], rnd, nxt))
        tokens = torch.stack(seq, 1)
        shard = tokens[rank * batch // world : (rank + 1) * batch // world]
        yield shard[:, :-1], shard[:, 1:]


def mean_over_ranks(x: torch.Tensor) -> float:
    x = x.detach().clone()
    dist.all_reduce(x)
    return float(x) / dist.get_world_size()


def train(optimizer: str, schedule: str, steps: int, batch: int, lr: float) -> list[float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = TinyLM()
    if optimizer == "torch":
        net: nn.Module = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    else:
        import coconet.torch

        net = model
        opt = coconet.torch.AdamW(model.parameters(), lr=lr, weight_decay=0.1, schedule=schedule)
    losses = []
    for x, y in batches(steps, batch, rank, world):
        loss = nn.functional.cross_entropy(net(x).reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(mean_over_ranks(loss))
    return losses


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8, help="global batch (split over the ranks)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--schedule", action="append", help="coconet schedule(s) (default: all)")
    p.add_argument("--json", action="store_true", help="print one JSON line of every curve")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    schedules = args.schedule or ["ar-c", "rs-c-ag", "fuse(rs-c-ag)"]
    curves = {"torch AdamW + DDP": train("torch", "", args.steps, args.batch, args.lr)}
    for s in schedules:
        curves[f"coconet AdamW {s}"] = train("coconet", s, args.steps, args.batch, args.lr)
    if dist.get_rank() == 0:
        if args.json:
            print("CURVES " + json.dumps(curves), flush=True)
        else:
            names = list(curves)
            print("step  " + "  ".join(f"{n:>26}" for n in names))
            for i in range(args.steps):
                print(f"{i:>4}  " + "  ".join(f"{curves[n][i]:>26.6f}" for n in names))
    dist.barrier()  # destroying is local: leave together, or a peer's gloo thread aborts
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
