"""codl.StreamWeights: fetch large constants through ``codl.weights.get`` right before their
first use, so a library's weights can be stored beside it and loaded while the model runs.

Preconditions
-------------
Runs last, after TVM's finalisation phase (:func:`codl_tvm.build.pipeline.finalize_passes`): every
constant folding and weight layout change has happened, so the constants left are exactly the
VM's constant pool, and ``main`` has left dataflow form (the fetch is an impure packed call).

Why
---
The Relax VM uploads every constant of its executable to ``devices[0]`` when it is created,
before the first operator runs: a cold start reads the whole library, then uploads every
weight, then computes (NNV12, MobiSys 2022). A weight fetched by a packed call instead is read
by a loader thread (:mod:`codl_tvm.weights`) while earlier operators already run, and the call
waits only for its own weight.

What it does
------------
In every Relax function, each distinct constant of at least ``min_bytes`` becomes a binding
``w = R.call_packed("codl.weights.get", R.str(key), R.prim_value(i), ty_args=...)`` placed
right before the binding that first uses it; every use refers to ``w``. A constant used by
several functions is one weight, fetched in each of them. ``i`` numbers the
constants in first-use order (the order the loader reads them), ``key`` names the weights of
this library (a digest of their bytes, shapes and dtypes, and the device they go to), and
the key and arrays, in the same order, go to the ``sink`` dictionary given to the pass.
Smaller constants (scalars, shapes) stay in the library. A function without such constants is
returned as it was.
"""

from __future__ import annotations

import hashlib

import numpy as np
import tvm
from tvm import relax

__all__ = ["GET", "MIN_BYTES", "StreamWeights", "stream_weights", "weights_key"]

#: The packed function a streamed weight is fetched through (:mod:`codl_tvm.weights`).
GET = "codl.weights.get"
#: Constants smaller than this stay in the library: a fetch costs more than reading them.
MIN_BYTES = 1024


def weights_key(arrays: list[np.ndarray]) -> str:
    """A digest naming a list of weights (bytes, shapes and dtypes), as the fetches carry it."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(f"{a.dtype.str}{a.shape};".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:32]


def _nbytes(t: tvm.runtime.Tensor) -> int:
    dtype = tvm.DataType(str(t.dtype))
    return int(np.prod(t.shape, dtype=np.int64)) * dtype.bits * dtype.lanes // 8


def _constants_in(expr: relax.Expr, found: list[tvm.ir.Constant]) -> None:
    """Constants in ``expr`` in evaluation order (arguments left to right, depth first)."""

    def visit(e):
        # tensors only: a constant also holds PrimValues and strings
        if isinstance(e, tvm.ir.Constant) and isinstance(e.value, tvm.runtime.Tensor):
            found.append(e)

    relax.analysis.post_order_visit(expr, visit)


def stream_weights(
    mod: tvm.IRModule, device: str, min_bytes: int = MIN_BYTES
) -> tuple[tvm.IRModule, str | None, list[np.ndarray]]:
    """``mod`` with its constants of at least ``min_bytes`` fetched by ``codl.weights.get``
    (see the module docstring), the key the fetches carry (None when nothing is fetched) and
    the arrays in fetch-index order. ``device`` (``"cpu"``, ``"opencl"``: the VM's first
    device, where the weights go) is part of the key, so one process never hands a library
    the tensors it loaded for another device."""
    order: list[tvm.ir.Constant] = []  # distinct constants, first use first
    index: dict[tvm.ir.Constant, int] = {}
    plans: dict[tvm.ir.GlobalVar, list] = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        blocks, changed = [], False
        here: set[tvm.ir.Constant] = set()  # fetched in this function: variables are local
        for block in func.body.blocks:
            if isinstance(block, relax.DataflowBlock):
                # a packed call is impure: dataflow blocks must have been left (run last)
                raise ValueError(
                    f"codl.StreamWeights: {gv.name_hint} still has dataflow blocks; run it "
                    "after the finalisation phase"
                )
            bindings = []
            for binding in block.bindings:
                found: list[tvm.ir.Constant] = []
                _constants_in(binding.value, found)
                for c in found:
                    if c in here or _nbytes(c.value) < min_bytes:
                        continue
                    here.add(c)
                    if c not in index:  # a constant of several functions: one weight
                        index[c] = len(order)
                        order.append(c)
                    bindings.append(c)  # fetched before this binding
                    changed = True
                bindings.append(binding)
            blocks.append(bindings)
        if changed:
            plans[gv] = blocks
    if not order:
        return mod, None, []
    arrays = [c.value.numpy() for c in order]
    key_text = f"{weights_key(arrays)}@{device}"
    key = tvm.ir.StringImm(key_text)
    normalize = relax.BlockBuilder().normalize  # gives the call its type (from ty_args)
    new_funcs = {}
    for gv, blocks in plans.items():
        func = mod[gv]
        fetched: dict[tvm.ir.Constant, relax.Var] = {}
        new_blocks = []
        for bindings in blocks:
            out = []
            for item in bindings:
                if isinstance(item, tvm.ir.Constant):
                    i = index[item]
                    var = relax.Var(f"weight{i}", item.ty)
                    call = relax.Call(
                        relax.ExternFunc(GET),
                        [key, tvm.ir.prim.IntImm("int64", i)],
                        ty_args=[item.ty],
                    )
                    out.append(relax.VarBinding(var, normalize(call)))
                    fetched[item] = var
                else:
                    value = _replace(item.value, fetched)
                    if isinstance(item, relax.MatchCast):
                        out.append(relax.MatchCast(item.var, value, item.ty))
                    else:
                        out.append(relax.VarBinding(item.var, value))
            new_blocks.append(relax.BindingBlock(out))
        body = relax.SeqExpr(new_blocks, _replace(func.body.body, fetched))
        new_funcs[gv] = normalize(
            relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)
        )
    mod = mod.clone()
    for gv, func in new_funcs.items():
        mod[gv] = func
    return mod, key_text, arrays


def _replace(expr: relax.Expr, fetched: dict[tvm.ir.Constant, relax.Var]) -> relax.Expr:
    """``expr`` with every fetched constant replaced by the variable it was bound to."""
    if not fetched:
        return expr

    @relax.expr_functor.mutator
    class _Rewriter(relax.PyExprMutator):
        def visit_generic_const_(self, op: tvm.ir.Constant) -> relax.Expr:
            return fetched.get(op, op)

    return _Rewriter().visit_expr(expr)


@tvm.transform.module_pass(opt_level=0, name="codl.StreamWeights")
class StreamWeights:
    """Fetch the constants of at least ``min_bytes`` through ``codl.weights.get`` (weights for
    ``device``); ``sink`` receives ``"key"`` and ``"arrays"`` (in fetch order)."""

    def __init__(self, sink: dict, device: str, min_bytes: int = MIN_BYTES) -> None:
        self.sink, self.device, self.min_bytes = sink, device, min_bytes

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        mod, key, arrays = stream_weights(mod, self.device, self.min_bytes)
        self.sink["key"], self.sink["arrays"] = key, arrays
        return mod
