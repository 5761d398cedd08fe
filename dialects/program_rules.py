"""What a coconet module may hold: the program-level rules, checked before any op verifier.

Op verifiers (coco.py, comm.py, layout_rules.py) judge one op at a time and assume the op sits
in a well-formed program: a module of `func.func`s, each one block of coco/comm ops ending in
`func.return`, every value defined before it is used. The tools downstream (the sim, the
lowering) assume the same, so a program breaking it must be refused here, with a diagnostic,
rather than crash or hang there. Every violation raises a `VerifyException` whose message
starts with the rule's name in brackets, as in layout_rules.py:

* module-ops            a module is one block holding only `func.func`s (no op outside a
                        function), and the rewrite patterns and scripts xDSL's passes read
                        from it (`pdl`, `pdl_interp`, `transform`: apply-pdl,
                        transform-interpreter), which coconet's tools ignore.
* function-declaration  every function has a body: a declaration has nothing to run.
* function-blocks       a function body is one block (coco has no control flow).
* nested-function       a `func.func` sits at module level, never inside a function.
* foreign-op            a function holds coco and comm ops and its `func.return`, nothing from
                        another (or an unregistered) dialect: no tool could run it.
* unknown-attribute     attributes in the `coco.`/`comm.` namespaces are coconet's own: only
                        `coco.grid`, on a `func.func`, `coco.schedule` (a string), on the
                        module, `coco.numerics` (a `#coco<numerics ...>`), on either, and
                        the lowering's decisions (lowering/decisions.py): `comm.topology`
                        (a `#comm<topology ...>`) on a collective, `comm.deferral` (a
                        `#comm<deferral ...>`) on an elementwise op, constant or slice,
                        `comm.segment` and `comm.chain` (integers) on an op and
                        `comm.segments` (an integer) and `comm.table_ready` (a unit
                        attribute) on a `comm.fused` region (lowering/segments.py,
                        decisions.py);
                        `coco.symmetric` on a function argument; any other (a misspelt
                        `coco.gird`) would be silently ignored otherwise.
* symmetric-argument    `coco.symmetric` is a unit attribute on a tensor argument (not a
                        scalar): the caller keeps that argument in symmetric memory.
* dominance             a value is used only after its definition, by ops its block encloses:
                        no use before the def, no op using its own result, no value of another
                        function or of a region's inside used outside it.

xDSL 0.74 verifies none of these for us: it has no SSA dominance check (`irdl/dominance.py`
only orders the blocks of one region, and a coco function is a single block).
"""

from __future__ import annotations

import difflib
from typing import NoReturn

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DictionaryAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    UnitAttr,
    UnregisteredOp,
)
from xdsl.ir import Attribute, Block, BlockArgument, Operation, OpResult, SSAValue
from xdsl.utils.exceptions import VerifyException

from coconet.dialects.coco import (
    GRID_ATTR_NAME,
    NUMERICS_ATTR_NAME,
    SCHEDULE_ATTR_NAME,
    SYMMETRIC_ARG_ATTR,
    CocoOp,
    ConstantOp,
    ElementwiseOp,
    NumericsAttr,
    SliceOp,
    TensorType,
)
from coconet.dialects.comm import (
    CHAIN_ATTR_NAME,
    DEFERRAL_ATTR_NAME,
    SEGMENT_ATTR_NAME,
    SEGMENTS_ATTR_NAME,
    TABLE_READY_ATTR_NAME,
    TOPOLOGY_ATTR_NAME,
    CollectiveOp,
    DeferralAttr,
    FusedOp,
    TopologyAttr,
    YieldOp,
)
from coconet.dialects.layout_rules import check_signatures, value_name

# The coco/comm-namespaced attributes coconet reads, by the kind of op that may carry them.
KNOWN_FUNCTION_ATTRIBUTES = frozenset({GRID_ATTR_NAME, NUMERICS_ATTR_NAME})
KNOWN_MODULE_ATTRIBUTES = frozenset({SCHEDULE_ATTR_NAME, NUMERICS_ATTR_NAME})
# The lowering's decisions (lowering/decisions.py), by the ops that may carry them, with the
# attribute each must hold and how a message spells its values.
DECISION_ATTRIBUTES: tuple[tuple[tuple[type[Operation], ...], str, type[Attribute], str], ...] = (
    (
        (CollectiveOp,),
        TOPOLOGY_ATTR_NAME,
        TopologyAttr,
        "#comm<topology flat> or #comm<topology hierarchical>",
    ),
    (
        (ElementwiseOp, ConstantOp, SliceOp),
        DEFERRAL_ATTR_NAME,
        DeferralAttr,
        "#comm<deferral rematerialize> or #comm<deferral wire>",
    ),
    ((CocoOp,), SEGMENT_ATTR_NAME, IntegerAttr, "an integer: the segment of its region"),
    ((CocoOp,), CHAIN_ATTR_NAME, IntegerAttr, "an integer: the tensor chain of its segment"),
    ((FusedOp,), SEGMENTS_ATTR_NAME, IntegerAttr, "an integer: how many segments it has"),
    (
        (FusedOp,),
        TABLE_READY_ATTR_NAME,
        UnitAttr,
        "a unit attribute: its kernels are built to run as table launches",
    ),
)
COCONET_NAMESPACES = ("coco.", "comm.")
# Dialects whose ops may sit beside the functions: rewrites for xDSL passes, not program.
PATTERN_DIALECTS = frozenset({"pdl", "pdl_interp", "transform"})


def verify_program(module: ModuleOp) -> None:
    """Verify a whole coconet module: the program-level rules, then every op's verifier, then
    the function signatures against their grids. Raises a `DiagnosticException` (the first
    violation) whose message starts with the rule's name."""
    check_structure(module)
    module.verify()
    check_signatures(module)


def check_structure(module: ModuleOp) -> None:
    """The program-level rules of this module's docstring (not the op verifiers)."""
    _check_attributes(module, "builtin.module", KNOWN_MODULE_ATTRIBUTES)
    script = module.attributes.get(SCHEDULE_ATTR_NAME)
    if script is not None and not isinstance(script, StringAttr):
        _refuse(
            module,
            "unknown-attribute",
            f"builtin.module has '{SCHEDULE_ATTR_NAME}' = {script}: a schedule is a string, "
            "the pass pipeline or schedule name coco-schedule applies "
            '(coco.schedule = "coco-reorder{ops=x}")',
        )
    _check_numerics(module, "builtin.module")
    if len(module.body.blocks) != 1:
        _refuse(
            module,
            "module-ops",
            f"builtin.module holds {len(module.body.blocks)} blocks: a module is one block of "
            "func.funcs",
        )
    for op in module.ops:
        if not isinstance(op, func.FuncOp):
            if _op_name(op).split(".", 1)[0] in PATTERN_DIALECTS:
                continue
            _refuse(
                op,
                "module-ops",
                f"{_op_name(op)} at module level, outside any function: a coconet module "
                "holds only func.func",
            )
        _check_function(op)


def _check_function(fn: func.FuncOp) -> None:
    where = f"@{fn.sym_name.data}"
    _check_attributes(fn, where, KNOWN_FUNCTION_ATTRIBUTES)
    _check_numerics(fn, where)
    _check_argument_attributes(fn)
    if not fn.body.blocks:
        _refuse(
            fn,
            "function-declaration",
            f"{where} is a declaration without a body: every function of a coconet program "
            "needs one (there is nothing to link a declaration against)",
        )
    if len(fn.body.blocks) > 1:
        _refuse(
            fn,
            "function-blocks",
            f"{where} has {len(fn.body.blocks)} blocks: a coconet function is one block of "
            "ops (coco has no control flow)",
        )
    # Each op's position in its block, so dominance is one lookup per operand.
    position: dict[Operation, int] = {}
    for block in fn.walk_blocks():
        for i, op in enumerate(block.ops):
            position[op] = i
    for op in fn.body.walk():
        if isinstance(op, func.FuncOp):
            _refuse(
                op,
                "nested-function",
                f"func.func @{op.sym_name.data} is nested in {where}: functions live at "
                "module level",
            )
        if not isinstance(op, CocoOp | YieldOp | func.ReturnOp):
            _refuse(
                op,
                "foreign-op",
                f"{_op_name(op)} in {where} is not a coco or comm op: a coconet function "
                "holds coco and comm ops and ends in func.return",
            )
        _check_attributes(op, f"{_op_name(op)} in {where}", _decisions_known(op))
        for v in op.operands:
            if (problem := _dominance_problem(v, op, position)) is not None:
                _refuse(op, "dominance", f"{_op_name(op)} in {where} {problem}")


def _dominance_problem(v: SSAValue, user: Operation, position: dict[Operation, int]) -> str | None:
    """Why `user` may not read `v` (None if it may): as in MLIR, a value is visible to the ops
    after its definition in its block and to everything nested in them."""
    if isinstance(v, BlockArgument):
        if _encloses(v.block, user):
            return None
        owner = v.block.parent_op()
        if isinstance(owner, func.FuncOp):
            return f"uses {_name(v)}, an argument of @{owner.sym_name.data}"
        return f"uses {_name(v)}, a block argument that does not enclose it"
    if not isinstance(v, OpResult):
        return f"uses {_name(v)}, which no op defines"
    definer = v.op
    block = definer.parent_block()
    anchor = block.find_ancestor_op_in_block(user) if block is not None else None
    if anchor is None:
        where = _function_of(definer)
        if where is not None and where is not _function_of(user):
            return f"uses {_name(v)}, a value of @{where.sym_name.data}"
        container = definer.parent_op()
        inside = f" inside {_op_name(container)}" if container is not None else ""
        return f"uses {_name(v)}, defined{inside} where it cannot see it"
    if anchor is definer:
        if user is definer:
            return "uses its own result" + (f" %{v.name_hint}" if v.name_hint else "")
        return f"uses {_name(v)}, a result of the {_op_name(definer)} it is nested in"
    if definer not in position:
        # an op at module level (refused on its own once the module's ops are reached)
        return f"uses {_name(v)}, defined outside any function"
    if position[definer] > position[anchor]:
        return (
            f"uses {_name(v)} before its definition: a value is used only after the op defining it"
        )
    return None


def _encloses(block: Block, op: Operation) -> bool:
    """Whether `op` sits in `block`, directly or nested in one of its ops."""
    cur: Operation | None = op
    while cur is not None:
        if cur.parent_block() is block:
            return True
        cur = cur.parent_op()
    return False


def _function_of(op: Operation) -> func.FuncOp | None:
    cur = op.parent_op()
    while cur is not None and not isinstance(cur, func.FuncOp):
        cur = cur.parent_op()
    return cur


def _check_numerics(op: Operation, owner: str) -> None:
    default = op.attributes.get(NUMERICS_ATTR_NAME)
    if default is not None and not isinstance(default, NumericsAttr):
        _refuse(
            op,
            "unknown-attribute",
            f"{owner} has '{NUMERICS_ATTR_NAME}' = {default}: a numerics policy is "
            "#coco<numerics exact> or #coco<numerics fast>",
        )


def _decisions_known(op: Operation) -> frozenset[str]:
    """The decision attributes `op` may carry (checked for their values' kind here)."""
    if not op.attributes:
        return frozenset()
    known: set[str] = set()
    for kinds, name, attr_type, values in DECISION_ATTRIBUTES:
        if not isinstance(op, kinds):
            continue
        known.add(name)
        value = op.attributes.get(name)
        if value is not None and not isinstance(value, attr_type):
            _refuse(
                op,
                "unknown-attribute",
                f"{_op_name(op)} has '{name}' = {value}: it is {values}",
            )
    return frozenset(known)


def _check_attributes(op: Operation, owner: str, known: frozenset[str]) -> None:
    """`owner`: how the message names `op`."""
    for name in op.attributes:
        if name.startswith(COCONET_NAMESPACES) and name not in known:
            _refuse(op, "unknown-attribute", _unknown_attribute(owner, name, known))


def _check_argument_attributes(fn: func.FuncOp) -> None:
    """Argument and result attributes: coconet reads `coco.symmetric` (a unit attribute) on
    a tensor argument, and nothing else in its namespaces."""
    for what, dicts in (("argument", fn.arg_attrs), ("result", fn.res_attrs)):
        known: frozenset[str] = frozenset({SYMMETRIC_ARG_ATTR} if what == "argument" else ())
        for i, attrs in enumerate(dicts.data if dicts is not None else ()):
            assert isinstance(attrs, DictionaryAttr)
            owner = f"{what} #{i} of @{fn.sym_name.data}"
            for name, value in attrs.data.items():
                if name.startswith(COCONET_NAMESPACES) and name not in known:
                    _refuse(fn, "unknown-attribute", _unknown_attribute(owner, name, known))
                if name == SYMMETRIC_ARG_ATTR:
                    _check_symmetric(fn, i, owner, value)


def _check_symmetric(fn: func.FuncOp, i: int, owner: str, value: Attribute) -> None:
    if not isinstance(value, UnitAttr):
        _refuse(
            fn,
            "symmetric-argument",
            f"{owner} has '{SYMMETRIC_ARG_ATTR}' = {value}: it is a unit attribute "
            f"(write {{{SYMMETRIC_ARG_ATTR}}})",
        )
    # (the signature's type: the body may be missing or hold several blocks, refused later)
    inputs = fn.function_type.inputs.data
    t = inputs[i] if i < len(inputs) else None
    if isinstance(t, TensorType) and not t.get_shape():
        _refuse(
            fn,
            "symmetric-argument",
            f"{owner} is a scalar: '{SYMMETRIC_ARG_ATTR}' places a tensor in symmetric memory",
        )


def _unknown_attribute(owner: str, name: str, known: frozenset[str]) -> str:
    message = f"{owner} has attribute '{name}', which coconet does not know"
    if name == GRID_ATTR_NAME:
        return message + f": '{GRID_ATTR_NAME}' belongs on a func.func"
    if name == SCHEDULE_ATTR_NAME:
        return message + f": '{SCHEDULE_ATTR_NAME}' belongs on the module"
    if close := difflib.get_close_matches(name, sorted(known), n=1):
        return message + f" (did you mean '{close[0]}'?)"
    if known:
        return message + " (known: " + ", ".join(f"'{k}'" for k in sorted(known)) + ")"
    return message


def _op_name(op: Operation) -> str:
    return op.op_name.data if isinstance(op, UnregisteredOp) else op.name


def _name(v: SSAValue) -> str:
    return value_name(v)


def _refuse(op: Operation, rule: str, message: str) -> NoReturn:
    """Raise `[rule] message`, annotating `op` in the printed IR as op verifiers do."""
    error = VerifyException(f"[{rule}] {message}")
    op.emit_error(f"Operation does not verify: {error}", error)


__all__ = ["check_structure", "verify_program"]
