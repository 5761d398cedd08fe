"""CoCoNet's DSL embedded in Python: build coco/comm programs with operators and functions.

    from coconet.frontend import *

    @program(grid=[None])                    # a 1-D world, sized at launch
    def sgd(g: Tensor(F32, [4096], Local), w: Tensor(F32, [4096], Replicated), lr: Scalar(F32)):
        g1 = AllReduce("+", g)
        w1 = w - lr * g1
        Update(w, w1)

`sgd` is then a `coconet.core.program.Program` holding the same IR as the `.mlir` form:

    func.func @sgd(%g: !coco.tensor<4096xf32, local>, %w: ..., %lr: ...) attributes {...} {
      %g1 = comm.all_reduce sum %g : ...
      %0 = coco.mul %lr, %g1 : ...
      %w1 = coco.sub %w, %0 : ...
      coco.update %w, %w1 : ...
      func.return
    }

Tensors are declared as a parameter's annotation or default (named after the parameter unless
the declaration names itself), or inside the body (`g = Tensor(F16, [N], Local, "g")`); they
become the function's arguments in that order. Layouts are `Replicated`, `Local`, `Sliced(d)`,
or one per grid axis on an N-D grid (`[Local, Sliced(2)]`).

Python names become SSA names (`name_hint`): a declared tensor's name, else the local variable
an intermediate value was first assigned to (read from the function's frames while it runs and
when it returns), else `.named("x")`. Python numbers become `coco.constant`s of the other
operand's element type (each distinct literal is one constant per program). A layout (or any
other) rule violation raises `CocoError` at the line that commits it, naming the rule and the
Python values involved.

In a file that `coconet.load()` reads, `program` is the name load() looks up, so use the
decorator as `@frontend.program(...)` (`from coconet import frontend`) and end the file with
`program = sgd`, or define `build()` returning the Program; see examples/*.py.

One concern a module: `dtypes` (element types, layouts), `specs` (declared tensors), `naming`
(names and locations read from frames), `values` (`Value` and the builder it belongs to),
`compute` and `collectives` (the ops), `programs` (`Tensor`, `@program`).
"""

from coconet.core.program import CocoError
from coconet.frontend.collectives import (
    GROUP,
    RANK,
    AllGather,
    AllReduce,
    AllToAll,
    Broadcast,
    GroupRank,
    Reduce,
    ReduceScatter,
    Send,
)
from coconet.frontend.compute import (
    Abs,
    AMax,
    AMin,
    Cast,
    Const,
    Constant,
    Dequantize,
    Dropout,
    Eq,
    Exp,
    Gelu,
    Ite,
    LayerNorm,
    Log,
    Max,
    Mean,
    Min,
    Ne,
    Neg,
    Norm,
    Pow,
    Quantize,
    ReduceMax,
    ReduceMin,
    ReduceSum,
    Relu,
    Reshape,
    RMSNorm,
    Rsqrt,
    Scatter,
    Sigmoid,
    Slice,
    Softmax,
    Sqrt,
    Sum,
    Tanh,
    Update,
)
from coconet.frontend.dtypes import (
    BF16,
    F8E4M3FN,
    F8E5M2,
    F16,
    F32,
    F64,
    FP16,
    FP32,
    FP64,
    I1,
    I32,
    I64,
    Bool,
    Float16,
    Float32,
    Float64,
    Int32,
    Int64,
    Local,
    Replicated,
    Sliced,
)
from coconet.frontend.programs import Scalar, Tensor, Variable, build_program, program
from coconet.frontend.values import (
    MatMul,
    Value,
    _Builder as _Builder,  # its work count, for the scaling test
)

__all__ = [
    "BF16",
    "F8E4M3FN",
    "F8E5M2",
    # element types
    "F16",
    "F32",
    "F64",
    "FP16",
    "FP32",
    "FP64",
    "GROUP",
    "I1",
    "I32",
    "I64",
    "RANK",
    "AMax",
    "AMin",
    "Abs",
    "AllGather",
    # communication
    "AllReduce",
    "AllToAll",
    "Bool",
    "Broadcast",
    "Cast",
    "CocoError",
    "Const",
    "Constant",
    "Dequantize",
    "Dropout",
    "Eq",
    "Exp",
    "Float16",
    "Float32",
    "Float64",
    "Gelu",
    "GroupRank",
    "Int32",
    "Int64",
    "Ite",
    "LayerNorm",
    "Local",
    "Log",
    "MatMul",
    "Max",
    "Mean",
    "Min",
    "Ne",
    "Neg",
    "Norm",
    "Pow",
    "Quantize",
    "RMSNorm",
    "Reduce",
    "ReduceMax",
    "ReduceMin",
    "ReduceScatter",
    "ReduceSum",
    "Relu",
    # layouts
    "Replicated",
    "Reshape",
    "Rsqrt",
    "Scalar",
    "Scatter",
    "Send",
    "Sigmoid",
    "Slice",
    "Sliced",
    "Softmax",
    "Sqrt",
    "Sum",
    "Tanh",
    # declarations and programs
    "Tensor",
    # computation
    "Update",
    "Value",
    "Variable",
    "build_program",
    "program",
]  # fmt: skip
