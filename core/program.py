"""A coconet program: a module holding SPMD `func.func`s over coco/comm, plus loading it from
`.mlir` text or a Python file, and the one error type every user-facing tool reports."""

from __future__ import annotations

import contextlib
import math
import runpy
from collections.abc import Collection, Generator, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from xdsl.context import Context
from xdsl.dialects import builtin, func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Attribute, Block, BlockArgument, Operation, SSAValue
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import DiagnosticException, ParseError, VerifyException

from coconet.core.gc_pause import without_gc
from coconet.core.target_names import name_module_targets
from coconet.dialects import get_all_dialects
from coconet.dialects.coco import GridAttr, ScaleOp, TensorType, tensor_type_of
from coconet.dialects.comm import AllToAllOp, OverlapOp
from coconet.dialects.layout_rules import (
    check_all_to_all_blocks,
    check_block_cuts,
    check_bound_shapes,
)


class CocoError(Exception):
    """A user-facing error: the tools print its message (no traceback) and exit non-zero."""


@contextlib.contextmanager
def memory_for(what: str) -> Generator[None]:
    """Allocations for `what`: running out of memory (a tensor of 2^40 elements) is the
    user's program asking too much, said in one line, not a MemoryError from deep inside."""
    try:
        yield
    except MemoryError as e:
        raise CocoError(f"{what}: not enough memory ({e or 'an allocation failed'})") from None


def make_context() -> Context:
    ctx = Context()
    ctx.load_dialect(builtin.Builtin)
    ctx.load_dialect(func.Func)
    for name, factory in get_all_dialects().items():
        ctx.register_dialect(name, factory)
    return ctx


@without_gc
def parse_module(text: str, source: str = "<input>") -> ModuleOp:
    """Parse and verify `.mlir` text; any problem becomes one CocoError naming the source."""
    try:
        module = Parser(make_context(), text, source).parse_module()
    except ParseError as e:
        raise CocoError(f"{source}: cannot parse the program:\n{e}") from None
    except OverflowError as e:
        # xDSL builds a float attribute of a literal its type cannot hold by packing it.
        raise CocoError(f"{source}: a literal does not fit its type: {e}") from None
    except ValueError as e:
        # xDSL's dense literals check each integer against its type with a ValueError
        # (`Integer value 2 is out of range for type i1`); one raised in coconet's own code
        # while parsing is a defect and stays a traceback.
        if not _raised_in_xdsl(e):
            raise
        raise CocoError(f"{source}: a literal does not fit its type: {e}") from None
    except DiagnosticException as e:
        # Types and attributes verify as they are built, i.e. while parsing (`[grid-size]`).
        raise CocoError(f"{source}: invalid program: {e}") from None
    from coconet.dialects.program_rules import verify_program

    try:
        verify_program(module)
    except DiagnosticException as e:
        raise CocoError(f"{source}: invalid program: {e}") from None
    return module


def _raised_in_xdsl(e: BaseException) -> bool:
    """Whether `e` was raised inside the xdsl package (its innermost frame)."""
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_globals.get("__name__", "").startswith("xdsl.")


@dataclass
class Argument:
    name: str
    type: TensorType
    value: BlockArgument
    # `{coco.symmetric}`: the caller keeps it in symmetric memory (compiled.input_buffer)
    symmetric: bool = False


@dataclass
class Output:
    """A program output: a returned value, or the new content of an updated argument."""

    name: str
    type: TensorType
    updated_argument: str | None = None


def symmetric_arguments(fn: func.FuncOp) -> set[int]:
    """The indices of `fn`'s arguments marked `{coco.symmetric}`."""
    from coconet.dialects.coco import SYMMETRIC_ARG_ATTR

    dicts = fn.arg_attrs.data if fn.arg_attrs is not None else ()
    return {i for i, d in enumerate(dicts) if SYMMETRIC_ARG_ATTR in d.data}


def mark_symmetric(fn: func.FuncOp, indices: Collection[int]) -> None:
    """Mark `fn`'s arguments at `indices` `{coco.symmetric}` (others keep their attributes)."""
    from coconet.dialects.coco import SYMMETRIC_ARG_ATTR

    if not indices:
        return
    n = len(fn.body.block.args)
    old = list(fn.arg_attrs.data) if fn.arg_attrs is not None else []
    old += [builtin.DictionaryAttr({})] * (n - len(old))
    fn.arg_attrs = builtin.ArrayAttr(
        [
            builtin.DictionaryAttr({**d.data, SYMMETRIC_ARG_ATTR: builtin.UnitAttr()})
            if i in indices
            else d
            for i, d in enumerate(old)
        ]
    )


class Program:
    """One SPMD function of a module (the first, unless `entry` names another)."""

    def __init__(self, module: ModuleOp, entry: str | None = None):
        self.module = module
        funcs = [op for op in module.ops if isinstance(op, func.FuncOp)]
        if not funcs:
            raise CocoError("the module holds no func.func to run")
        if entry is None:
            self.func = funcs[0]
        else:
            named = [f for f in funcs if f.sym_name.data == entry]
            if not named:
                raise CocoError(
                    f"no function @{entry} in the module (it has "
                    + ", ".join("@" + f.sym_name.data for f in funcs)
                    + ")"
                )
            self.func = named[0]

    @property
    def name(self) -> str:
        return self.func.sym_name.data

    @property
    def grid(self) -> GridAttr:
        from coconet.dialects.layout_rules import grid_of

        return grid_of(self.func)

    @property
    def arguments(self) -> list[Argument]:
        args: list[Argument] = []
        symmetric = symmetric_arguments(self.func)
        for i, a in enumerate(self.func.body.block.args):
            if not isinstance(a.type, TensorType):
                raise CocoError(
                    f"@{self.name}: argument #{i} has type {a.type}; program arguments must be "
                    "!coco.tensor values"
                )
            args.append(Argument(a.name_hint or f"arg{i}", a.type, a, i in symmetric))
        return args

    @property
    def outputs(self) -> list[Output]:
        from coconet.dialects.coco import UpdateOp

        outs: list[Output] = []
        for op in self.func.walk():
            if isinstance(op, UpdateOp):
                # [update-target]: the verifier has checked the target is a function argument
                target = cast(BlockArgument, op.target)
                name = target.name_hint or f"arg{target.index}"
                outs.append(Output(name, op.target.type, updated_argument=name))
        ret = self.func.body.block.last_op
        if isinstance(ret, func.ReturnOp):
            for i, v in enumerate(ret.arguments):
                outs.append(Output(output_name(v, i), tensor_type_of(v)))
        return outs

    def clone(self) -> Program:
        module = self.module.clone()
        return Program(module, self.name)

    def verify(self) -> None:
        """Every rule a program must keep (coconet.dialects.program_rules.verify_program);
        a violation is a CocoError naming the rule."""
        from coconet.dialects.program_rules import verify_program

        try:
            verify_program(self.module)
        except DiagnosticException as e:
            raise CocoError(f"invalid program: {e}") from None

    def structure(self) -> Hashable:
        """The module as a value: equal for two programs exactly when their printed texts
        are (ops, operands by definition, names, types, attributes, nesting), at a fraction
        of printing's cost -- what the schedule enumerator compares its candidates by."""
        ids: dict[SSAValue, int] = {}

        def attrs(d: Mapping[str, Attribute]) -> tuple[Any, ...]:
            return tuple(sorted(d.items(), key=lambda kv: kv[0]))

        def block(b: Block) -> tuple[Any, ...]:
            for a in b.args:
                ids[a] = len(ids)
            args = tuple((a.name_hint, a.type) for a in b.args)
            return (args, tuple(operation(op) for op in b.ops))

        def operation(op: Operation) -> tuple[Any, ...]:
            operands = tuple(ids.get(v, -1) for v in op.operands)
            regions = tuple(tuple(block(b) for b in r.blocks) for r in op.regions)
            for r in op.results:
                ids[r] = len(ids)
            results = tuple((r.name_hint, r.type) for r in op.results)
            return (op.name, operands, attrs(op.attributes), attrs(op.properties), regions, results)

        return operation(self.module)

    def __str__(self) -> str:
        return str(self.module)

    def print(self, generic: bool = False) -> str:
        import io

        out = io.StringIO()
        Printer(stream=out, print_generic_format=generic).print_op(self.module)
        return out.getvalue() + "\n"


def output_name(v: SSAValue, index: int) -> str:
    return v.name_hint or f"result{index}"


def argument_name(target: SSAValue) -> str:
    """An (updated) argument's name: its name in the source, else its position."""
    if target.name_hint:
        return target.name_hint
    return f"arg{target.index}" if isinstance(target, BlockArgument) else "?"


def read_text(path: Path) -> str:
    """A program file's text; a file that cannot be read, or is not UTF-8, is a CocoError
    naming the file (and the line and column of the first byte that is not UTF-8)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CocoError(f"{path}: cannot read the program: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise CocoError(
            f"{path}:{line}:{column}: the program is not UTF-8 text "
            f"(byte 0x{data[e.start]:02x}: {e.reason})"
        ) from None


def load(path: str | Path, entry: str | None = None) -> Program:
    """Load a program from `.mlir` text or a Python file defining `program` (a Program or
    a front-end function) or `build()` returning one."""
    path = Path(path)
    if not path.exists():
        raise CocoError(f"no such file: {path}")
    if path.suffix == ".mlir":
        module = parse_module(read_text(path), str(path))
        name_module_targets(module)  # as the front end names them: see core/target_names.py
        return Program(module, entry)
    if path.suffix == ".py":
        try:
            namespace = runpy.run_path(str(path), run_name="coconet_program")
        except CocoError:
            raise
        except Exception as e:
            raise CocoError(
                f"{path}: running the program file failed: {type(e).__name__}: {e}"
            ) from None
        candidate = namespace.get("program")
        # `program` may also be the front end's decorator, imported by name: then `build()`.
        if not isinstance(candidate, Program) and callable(namespace.get("build")):
            try:
                candidate = namespace["build"]()
            except CocoError:
                raise
            except Exception as e:
                raise CocoError(f"{path}: build() failed: {type(e).__name__}: {e}") from None
        if candidate is None:
            raise CocoError(
                f"{path}: define `program` (a coconet Program) or `build()` returning one"
            )
        if hasattr(candidate, "program") and not isinstance(candidate, Program):
            candidate = candidate.program
        if not isinstance(candidate, Program):
            raise CocoError(
                f"{path}: `program` is a {type(candidate).__name__}, not a coconet Program"
            )
        return candidate
    raise CocoError(
        f"{path}: expected a .mlir or .py program, got '{path.suffix or 'no extension'}'"
    )


def check_program_on_grid(program: Program, grid_shape: Sequence[int]) -> None:
    """Every rank holds at least one element of every sliced dim on the concrete grid
    ([empty-slice]); dims that do not divide are cut unevenly (core/values.py); an overlap's
    chunks each get rows of every rank's piece ([overlap-chunks]); a block scale sliced on
    a `?` axis is cut on block boundaries ([quantize-block-slices])."""
    try:
        for a in program.arguments:
            check_bound_shapes(a.type, grid_shape, f"argument %{a.name}")
        for op in program.func.walk():
            if isinstance(op, AllToAllOp) and set(op.span()) <= set(op.input.type.local_axes()):
                # the dispatch form's blocks, once `?` axes have their sizes
                parts = math.prod(grid_shape[a] for a in op.span())
                check_all_to_all_blocks(op.input.type, parts, "comm.all_to_all")
            if isinstance(op, OverlapOp):
                op.check_rows_on_grid(grid_shape)
            if isinstance(op, ScaleOp):
                scale = op.scale.type
                check_block_cuts(scale, op.result.type, grid_shape, f"{op.name} by {scale}")
            for i, res in enumerate(op.results):
                if isinstance(res.type, TensorType):
                    what = f"%{res.name_hint}" if res.name_hint else f"result #{i} of {op.name}"
                    check_bound_shapes(res.type, grid_shape, what)
    except VerifyException as e:
        raise CocoError(
            f"@{program.name} cannot run on {math.prod(grid_shape)} rank(s): {e}"
        ) from None
