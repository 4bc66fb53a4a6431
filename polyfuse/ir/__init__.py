"""The loop-scalar IR: nodes, dtypes, the builder, the tensor-expression layer,
the printer and the NumPy interpreter.

The tensor-expression layer lives in ``polyfuse.ir.te``.

``from polyfuse.ir import *`` brings in what a program text needs (the printer's
output starts with it).
"""

from polyfuse.ir.builder import NO_INIT, IterSpec, ProgramBuilder, make_reducer, reduce, spatial
from polyfuse.ir.interpreter import interpret
from polyfuse.ir.dtypes import DType, bf16, bool_, f16, f32, f64, fp8e4m3, i32, i64
from polyfuse.ir.expr import (
    INF, BinOp, Call, Cast, Const, Expr, Load, Select, Var, cast, ceil, const, eq, exp, exp2, floor, log, log2,
    logical_and, logical_not, logical_or, maximum, minimum, ne, power, select, sigmoid, sqrt, tanh,
)
from polyfuse.ir.stmt import Block, IterVar, Loop, Program, Reducer, Seq, Stmt, Store, Tensor, builtin_reducer

NAN = float("nan")

__all__ = [
    "INF", "NAN", "NO_INIT", "BinOp", "Block", "Call", "Cast", "Const", "DType", "Expr", "IterSpec", "IterVar",
    "Load", "Loop", "Program", "ProgramBuilder", "Reducer", "Select", "Seq", "Stmt", "Store", "Tensor", "Var",
    "bf16", "bool_", "builtin_reducer", "cast", "ceil", "const", "eq", "exp", "exp2", "f16", "f32", "f64", "floor",
    "fp8e4m3",
    "i32", "i64", "interpret", "log", "log2", "logical_and", "logical_not", "logical_or", "make_reducer", "maximum",
    "minimum", "ne",
    "power", "reduce", "select", "sigmoid", "spatial", "sqrt", "tanh",
]
