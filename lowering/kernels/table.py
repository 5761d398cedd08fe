"""The table form of a kernel: one launch over many tensors (lower_to_plan.py folds the fused
collective kernels of one text, up to names, into it)."""

from __future__ import annotations

from coconet.lowering.kernel_ir import (
    BLOCK_IDX,
    GRID_DIM,
    Assign,
    Cast,
    Decl,
    Expr,
    Index,
    Kernel,
    Lit,
    Param,
    Stmt,
    Unused,
    Var,
    While,
    all_of,
    binary,
    rewrite,
)
from coconet.lowering.signature import I32, I64, U32, U64, ParamKind


def table_form(kernel: Kernel, name: str) -> Kernel:
    """The TABLE form of a kernel: one launch running the same computation over many tensors
    of different sizes (CoCoNet's scattered tensors: an optimizer step over every parameter
    tensor of a model) instead of one launch per tensor, with no flattening copy.

    Every parameter becomes a per-tensor table (pointers travel as 64-bit addresses);
    `blocks` holds the prefix sums of the blocks each tensor gets, so block b serves tensor t
    with blocks[t] <= b < blocks[t + 1], as block b - blocks[t] of a grid of
    blocks[t + 1] - blocks[t]. The body is the single-tensor body, reading its block index
    and grid size from there (a fused collective's blocks meet the same block of the same
    tensor on their peers, through that tensor's flags)."""
    tensor = Var(I32, None, "t_")
    tables: list[Param] = []
    loads: list[Stmt] = []
    for p in kernel.params:
        if p.ctype.pointer:
            tab_t = U64.ptr(const=True, restrict=True)
        else:
            # Integers travel as 64-bit entries (the executor's tables hold i64 or u64):
            # a collective's rank and group size are read back as their own type.
            tab_t = I64.ptr(const=True, restrict=True)
        tab = Param(
            tab_t,
            f"{p.hint}_tab" if p.hint else None,
            f"{p.fallback}_tab",
            kind=p.kind,
            value=p.value,
            dim=p.dim,
            table=True,
            span=p.span,
        )
        tables.append(tab)
        entry: Expr = Index(tab, tensor)
        if p.ctype.pointer:
            entry = Cast(p.ctype.unrestricted(), entry)
        elif p.ctype != I64:
            entry = Cast(p.ctype, entry)
        loads.append(Decl(p, entry))
    blocks = Param(I64.ptr(const=True, restrict=True), None, "blocks", kind=ParamKind.BLOCKS)
    ntensors = Param(I32, None, "ntensors", kind=ParamKind.NTENSORS)
    block, grid = Var(U32, None, "tb_"), Var(U32, None, "tg_")
    next_start = Index(blocks, tensor + 1)
    head: list[Stmt] = [
        Decl(tensor, Lit("0"), const=False),
        While(
            all_of(
                [binary("<", tensor + 1, ntensors), binary("<=", next_start, Cast(I64, BLOCK_IDX))]
            ),
            (Assign(tensor, Lit("1"), op="+="),),
        ),
        *loads,
        Decl(block, Cast(U32, BLOCK_IDX - Index(blocks, tensor))),
        Decl(grid, Cast(U32, next_start - Index(blocks, tensor))),
        Unused((block, grid)),
    ]

    def per_tensor(node: object) -> Expr | None:
        if node == BLOCK_IDX:
            return block
        if node == GRID_DIM:
            return grid
        return None

    body = rewrite(kernel.body, per_tensor)
    return Kernel(name, (*tables, blocks, ntensors), (*head, *body))
