"""Declaring tensors (`Tensor`, `Scalar`) and building programs (`@program`, `build_program`):
parameters declared by annotation or default, the body run once under a builder, its values
named after the variables holding them when it returns."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from xdsl.dialects import func
from xdsl.ir import Attribute
from xdsl.utils.exceptions import DiagnosticException, VerifyException

from coconet.core.gc_pause import gc_paused
from coconet.core.program import CocoError, Program, mark_symmetric
from coconet.core.target_names import name_schedule_targets
from coconet.dialects.coco import (
    DYNAMIC,
    NUMERICS_ATTR_NAME,
    REPLICATED,
    GridAttr,
    LayoutAttr,
    Numerics,
    NumericsAttr,
    enum_member,
)
from coconet.frontend.dtypes import elt_name
from coconet.frontend.naming import caller_scope, capture_locals, check_name, user_location
from coconet.frontend.specs import TensorSpec, as_layouts, as_shape, tensor_type
from coconet.frontend.values import Value, _Builder, _operand, _stack, _token


def Tensor(
    dtype: Attribute,
    shape: Sequence[int] | int,
    layout: LayoutAttr | Sequence[LayoutAttr] = REPLICATED,
    name: str | None = None,
    *,
    symmetric: bool = False,
) -> Value:
    """Declare a program argument: `Tensor(F16, [B, S, H], Sliced(2), "x")`.

    Inside a @program body it becomes the next argument at once; as a parameter's annotation
    or default it is a declaration that each build turns into an argument. `symmetric=True`
    marks it `{coco.symmetric}`: the caller keeps it in symmetric memory (writing into
    `compiled.input_buffer(name)`), so a fused all_gather assembles in it with no staging
    copy."""
    elt_name(dtype)
    if name is not None:
        check_name(name, "a tensor")
    spec = TensorSpec(dtype, as_shape(shape), as_layouts(layout), name, bool(symmetric))
    if spec.symmetric and not spec.shape:
        raise CocoError(
            "Tensor(..., symmetric=True) of shape []: only a tensor lives in symmetric memory"
        )
    tensor_type(spec)  # reject e.g. sliced<3> of a rank-2 tensor where it is written
    stack = _stack()
    if stack:
        return stack[-1].declare(spec, user_location())
    return Value(None, None, spec)


def Scalar(dtype: Attribute, name: str | None = None) -> Value:
    """Declare a scalar argument (a replicated rank-0 tensor): `Scalar(F32, "lr")`."""
    return Tensor(dtype, [], REPLICATED, name)


Variable = Scalar  # CoCoNet's name


def _as_grid(grid: object) -> GridAttr:
    if isinstance(grid, GridAttr):
        return grid
    if isinstance(grid, int | str) or grid is None:
        grid = [grid]
    sizes = []
    for s in grid:  # type: ignore[union-attr]
        if s is None or s == "?":
            sizes.append(DYNAMIC)
        elif isinstance(s, int) and not isinstance(s, bool) and s > 0:
            sizes.append(s)
        else:
            raise CocoError(
                f"grid sizes are positive ints or None (sized at launch), got {s!r} in {grid!r}"
            )
    try:
        return GridAttr(sizes)
    except VerifyException as e:
        raise CocoError(f"grid {grid!r}: {e}") from None


def _declaration_of(
    fn: Callable[..., Any], param: inspect.Parameter, scope: dict[str, Any]
) -> Value | None:
    for candidate in (param.default, param.annotation):
        if isinstance(candidate, str) and candidate:
            # `from __future__ import annotations` leaves annotations as text: evaluate it
            # where the function was defined
            try:
                candidate = eval(candidate, fn.__globals__, scope)
            except Exception as e:
                raise CocoError(
                    f"parameter '{param.name}' of {fn.__name__}: cannot evaluate its annotation "
                    f"{candidate!r}: {type(e).__name__}: {e}"
                ) from None
        if isinstance(candidate, Value):
            if candidate._spec is None:
                raise CocoError(
                    f"parameter '{param.name}' of {fn.__name__} is declared with a value of "
                    "another program; declare it with Tensor(...) or Scalar(...)"
                )
            return candidate
    return None


def _parameter_specs(fn: Callable[..., Any], fname: str, where: str) -> list[TensorSpec]:
    """The declarations of `fn`'s parameters, each named (by default) after its parameter."""
    specs = []
    # Text annotations may name variables of the scope that defines `fn` (a builder's
    # arguments): the decorator runs there, so that is the first frame outside this module.
    scope = caller_scope()
    scope.update(inspect.getclosurevars(fn).nonlocals)
    stack = _stack()
    saved = stack[:]
    stack.clear()  # text annotations evaluate to declarations, not to an outer program's args
    try:
        for param in inspect.signature(fn).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.KEYWORD_ONLY):
                raise CocoError(
                    f"{where}: parameter '{param.name}' of {fname}: program parameters are "
                    "plain positional names, each declared as a tensor"
                )
            decl = _declaration_of(fn, param, scope)
            if decl is None:
                raise CocoError(
                    f"{where}: parameter '{param.name}' of {fname} is not a declared tensor: "
                    f"write `{param.name}: Tensor(F32, [N], Local)` (or Scalar(F32)) or "
                    "declare it inside the body"
                )
            spec = decl._spec
            assert spec is not None
            specs.append(
                TensorSpec(
                    spec.dtype, spec.shape, spec.layouts, spec.name or param.name, spec.symmetric
                )
            )
    finally:
        stack[:] = saved
    return specs


def build_program(
    fn: Callable[..., Any],
    grid: object = (None,),
    name: str | None = None,
    numerics: str | None = None,
) -> Program:
    """Build the Program that `fn` describes (see `program`)."""
    grid_attr = _as_grid(grid)
    policy = _as_numerics(numerics)
    fname = name or fn.__name__
    where = f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno}"
    specs = _parameter_specs(fn, fname, where)
    # (the collector paused as in every phase: core/gc_pause.py; not as a decorator, whose
    # frame would stand between the annotations and the caller's scope they are read in)
    with gc_paused():
        builder = _Builder(fname, grid_attr, fn.__code__)
        if policy is not None:
            builder.module.attributes[NUMERICS_ATTR_NAME] = policy
        stack = _stack()
        stack.append(builder)
        try:
            args = [builder.declare(spec, where) for spec in specs]
            result, local_vars = capture_locals(fn, args)
            builder.name_from_locals(local_vars)
            returned = _returned_values(result, fname)
            values = [_operand(v, f"returning {_token(v)}").ssa for v in returned]
            returned_op = func.ReturnOp(*values)
            builder.block.insert_op_before(returned_op, builder.terminator)
            builder.block.erase_op(builder.terminator)
        finally:
            stack.pop()
        builder.func.update_function_type()
        mark_symmetric(builder.func, builder.symmetric)
        try:
            # Every op verified as it was inserted (`_Builder.insert`; nothing changes an op
            # after): what is left is the module, the function against its return, and the
            # return, not every op again (a quarter of building a deep model).
            builder.module.verify(verify_nested_ops=False)
            builder.func.verify(verify_nested_ops=False)
            returned_op.verify()
        except (VerifyException, DiagnosticException) as e:
            raise CocoError(f"{where}: program @{fname} is invalid: {e}") from None
        # the ops a schedule targets carry names in the printed program, Python names or
        # not, so the pipelines printed for its schedules replay on its text
        name_schedule_targets(builder.func)
    return Program(builder.module)


def _as_numerics(numerics: object) -> NumericsAttr | None:
    """`numerics=` of @program as the module's default policy (None: none, which is exact)."""
    if numerics is None:
        return None
    try:
        return NumericsAttr(enum_member(Numerics, str(numerics), "numerics policy"))
    except ValueError as e:
        raise CocoError(f"@program(numerics={numerics!r}): {e}") from None


def _returned_values(result: object, fname: str) -> list[Value]:
    if result is None:
        return []
    items: list[object] = list(result) if isinstance(result, tuple | list) else [result]
    values: list[Value] = []
    for item in items:
        if not isinstance(item, Value):
            raise CocoError(
                f"@{fname} returns {item!r}: a program returns tensors (or nothing, when its "
                "outputs are Updates)"
            )
        values.append(item)
    return values


def program(
    fn: Callable[..., Any] | None = None,
    *,
    grid: object = (None,),
    name: str | None = None,
    numerics: str | None = None,
) -> Any:
    """Decorator: `@program(grid=[None])` turns a function into a `coconet.core.program.Program`.

    `grid` lists the process grid's axis sizes, None for the one sized at launch: `[None]` is
    a 1-D world, `[2, None]` two pipeline stages of launch-sized tensor-parallel groups.
    `name` names the func (default: the function's name). `numerics` ("exact", the default, or
    "fast") is the numerics policy of its transcendental ops that name none of their own (the
    module's `coco.numerics`; docs/usage.md). Bare `@program` means grid [None]."""
    if fn is not None:
        if not callable(fn):
            raise CocoError("use @program or @program(grid=[...], name=...)")
        return build_program(fn, grid, name, numerics)

    def decorate(f: Callable[..., Any]) -> Program:
        return build_program(f, grid, name, numerics)

    return decorate
