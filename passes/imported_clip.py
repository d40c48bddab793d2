"""Turn the kernels TVM's ONNX importer makes of ``Clip`` into Relax operators.

TVM 0.27's ONNX frontend imports ``Clip`` with min/max inputs (opset 11 and later: MobileNet's
and PoseNet's ReLU6) as two TIR kernels of its own (``emit_te(topi.maximum)`` then
``topi.minimum``), each bound first made unbounded where it is NaN, as ONNX defines. Relax sees
two opaque ``call_tir``: the texture layout cannot compute through them (each ReLU6 cost a
pair of layout conversions), and ``ToMixedPrecision`` rejects them. Before (``main`` as
imported)::

    lv = R.isnan(R.const(0.0))
    lv1 = R.where(lv, R.const(-inf), R.const(0.0))
    lv3 = R.call_tir(cls.maximum, (lv2, lv1), out_ty=R.Tensor((1, 4, 5, 5), "float32"))
    lv4 = R.isnan(R.const(6.0))
    lv5 = R.where(lv4, R.const(inf), R.const(6.0))
    lv6 = R.call_tir(cls.minimum, (lv3, lv5), out_ty=R.Tensor((1, 4, 5, 5), "float32"))

after::

    lv6 = R.clip(lv2, 0.0, 6.0)

A kernel is recognised by its code, not its name: it must equal, structurally, the kernel the
importer emits for those shapes and dtypes (regenerated here with ``emit_te``), and its bound
must be a scalar constant or the importer's NaN guard of one (``where(isnan(c), inf, c)``,
evaluated here). A maximum followed by a minimum that only it reads, both bounds finite and
``min <= max``, becomes one ``R.clip`` (whose lowering, ``max(min(x, hi), lo)``, then agrees
with ONNX's ``min(max(x, lo), hi)``); any other such kernel becomes ``R.maximum`` /
``R.minimum`` with the bound as a constant (Clip with one bound, or ``min > max``). The guard's
bindings and kernels nothing calls any more are dropped. Partitionable operators are not
touched (plans, which name only those, still apply). With ``clip=False`` a pair becomes
``R.maximum`` then ``R.minimum``: TVM 0.27's ``ToMixedPrecision`` rejects ``R.clip`` (no
policy for it, and its bounds are PrimValues), so float16 builds ask for that. NaN inputs:
``codl.PropagateNaN`` covers the legalized ``clip`` as it did the kernels. Not covered: Clip
of opset 6 (bounds as attributes, compiled into the kernel's code), rare in exported models.

Run right after import, before ``ToMixedPrecision`` and the texture layout (first among
codl-tvm's inference passes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx, topi

from .rewrite import Bindings, op_name, rebuild

__all__ = ["ImportedClip", "imported_clips"]

_CALL_TIR = "relax.call_tir"
#: The importer's kernels of Clip's bounds: the TOPI compute, the Relax operator replacing it.
_KERNELS = {
    "maximum": (topi.maximum, relax.op.maximum),
    "minimum": (topi.minimum, relax.op.minimum),
}


@dataclass(frozen=True)
class _Bound:
    """One importer kernel of a Clip bound: ``kind(data, value)``."""

    kind: str
    data: relax.Expr
    value: float


def _importer_kernel(kind: str, data_ty: relax.TensorType, bound_ty: relax.TensorType):
    """The PrimFunc TVM's ONNX importer emits for Clip's ``kind`` bound on these types."""
    bb = relax.BlockBuilder()
    x, b = relax.Var("x", data_ty), relax.Var("b", bound_ty)
    with bb.function("f", [x, b]):
        bb.emit_func_output(bb.emit_te(_KERNELS[kind][0], x, b))
    return next(f for _, f in bb.get().functions_items() if isinstance(f, tirx.PrimFunc))


def _scalar(
    expr: relax.Expr, value_of: dict[relax.Var, relax.Expr], seen: set[relax.Var]
) -> float | None:
    """The value of a one-element float constant, or of the importer's NaN guard of one (``where``
    of ``isnan`` over constants); the variables it read are added to ``seen``."""
    while isinstance(expr, relax.Var) and expr in value_of:
        seen.add(expr)
        expr = value_of[expr]
    if isinstance(expr, tvm.ir.Constant):
        # ONNX's bounds are scalars; the importer may carry them as (1,) tensors
        data = expr.value.numpy()
        return float(data.item()) if data.size == 1 and data.dtype.kind == "f" else None
    if op_name(expr) == "relax.where":
        cond = expr.args[0]
        while isinstance(cond, relax.Var) and cond in value_of:
            seen.add(cond)
            cond = value_of[cond]
        if op_name(cond) != "relax.isnan":
            return None
        checked = _scalar(cond.args[0], value_of, seen)
        if checked is None:
            return None
        return _scalar(expr.args[1] if math.isnan(checked) else expr.args[2], value_of, seen)
    return None


class _Finder:
    """Recognises the importer's Clip kernels of one module (each kernel's code compared once
    per type signature)."""

    def __init__(self, mod: tvm.IRModule):
        self.mod = mod
        self._refs: dict[tuple, tirx.PrimFunc] = {}
        self.kernels: set[tvm.ir.GlobalVar] = set()

    def bound(
        self, value: relax.Expr, value_of: dict[relax.Var, relax.Expr], seen: set[relax.Var]
    ) -> _Bound | None:
        """The Clip bound ``value`` computes, if it calls one of the importer's kernels."""
        if op_name(value) != _CALL_TIR or len(value.args) != 2:
            return None
        gv, args = value.args[0], value.args[1]
        if not isinstance(args, relax.Tuple) or len(args.fields) != 2:
            return None
        data, bound = args.fields
        func = self.mod.functions.get(gv)
        if not isinstance(func, tirx.PrimFunc) or not all(
            isinstance(a.ty, relax.TensorType) and a.ty.shape is not None for a in args.fields
        ):
            return None
        # The bound first: a Clip's is a one-element constant, and the reference kernels are
        # built only for such pairs (a matmul's operands do not even broadcast).
        read: set[relax.Var] = set()
        scalar = _scalar(bound, value_of, read)
        if scalar is None:
            return None
        for kind in _KERNELS:
            key = (kind, str(data.ty), str(bound.ty))
            if key not in self._refs:
                self._refs[key] = _importer_kernel(kind, data.ty, bound.ty)
            if tvm_ffi.structural_equal(func, self._refs[key], map_free_vars=True):
                seen |= read
                self.kernels.add(gv)
                return _Bound(kind, data, scalar)
        return None


def _replace(var: relax.Var, call: relax.Expr) -> list[relax.Binding]:
    return [relax.VarBinding(var, relax.BlockBuilder().normalize(call))]


def _rewrite(func: relax.Function, finder: _Finder, clip: bool) -> tuple[relax.Function, int]:
    """``func`` with the importer's Clip kernels as Relax operators, and how many."""
    if not isinstance(func.body, relax.SeqExpr):
        return func, 0
    scan = Bindings(func)
    guards: set[relax.Var] = set()
    bounds = {}
    for var, value in scan.value_of.items():
        seen: set[relax.Var] = set()
        found = finder.bound(value, scan.value_of, seen)
        if found is not None:
            bounds[var] = found
            guards |= seen
    if not bounds:
        return func, 0
    replace: dict[relax.Var, list[relax.Binding]] = {}
    drop: set[relax.Var] = set()
    for var, b in bounds.items():
        low = bounds.get(b.data) if isinstance(b.data, relax.Var) else None
        if (
            clip
            and b.kind == "minimum"
            and low is not None
            and low.kind == "maximum"
            and scan.uses.get(b.data, 0) == 1
            and math.isfinite(low.value)
            and math.isfinite(b.value)
            and low.value <= b.value
        ):
            drop.add(b.data)
            replace.pop(b.data, None)
            replace[var] = _replace(var, relax.op.clip(low.data, low.value, b.value))
        elif var not in drop:
            dtype = str(b.data.ty.dtype)
            value = relax.const(np.array(b.value, dtype=dtype))
            replace[var] = _replace(var, _KERNELS[b.kind][1](b.data, value))
    new = rebuild(func, drop, replace)
    # the NaN guards of the bounds, where nothing else reads them (a guard before its isnan)
    while True:
        uses = Bindings(new).uses
        unused = {g for g in guards if not uses.get(g, 0)}
        if not unused:
            return new, len(bounds)
        new = rebuild(new, unused, {})
        guards -= unused


def _called(mod: tvm.IRModule) -> set[tvm.ir.GlobalVar]:
    called: set[tvm.ir.GlobalVar] = set()
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            called.update(relax.analysis.all_global_vars(func))
    return called


def imported_clips(mod: tvm.IRModule, clip: bool = True) -> tuple[tvm.IRModule, int]:
    """``mod`` with the importer's Clip kernels as Relax operators in every Relax function and
    the kernels nothing calls any more removed (see the module docstring), and how many calls
    were replaced. ``clip=False``: each kernel becomes ``R.maximum`` / ``R.minimum``, never
    ``R.clip`` (which TVM 0.27's ``ToMixedPrecision`` rejects: its bounds are PrimValues).
    The caller's module is never changed in place."""
    finder = _Finder(mod)
    updates, total = {}, 0
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            new, count = _rewrite(func, finder, clip)
            if count:
                updates[gv], total = new, total + count
    if not updates:
        return mod, 0
    mod = mod.clone()
    for gv, func in updates.items():
        mod.update_func(gv, func)
    for gv in finder.kernels - _called(mod):
        del mod[gv]
    return mod, total


@tvm.transform.module_pass(opt_level=0, name="codl.ImportedClip")
class ImportedClip:
    """Replace TVM's ONNX importer's Clip kernels by ``R.clip`` (or ``R.maximum`` /
    ``R.minimum``) in every Relax function; see the module docstring.

    Parameters
    ----------
    clip
        Whether a Clip with both bounds becomes one ``R.clip``; False (builds that run
        ``ToMixedPrecision`` next): ``R.maximum`` then ``R.minimum``.
    """

    def __init__(self, clip: bool = True):
        self.clip = clip

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return imported_clips(mod, self.clip)[0]
