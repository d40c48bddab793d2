"""codl.MergePartsInPlace: the parts of a split write disjoint regions of one shared tensor.

Preconditions
-------------
- Runs after :class:`~codl_tvm.passes.place.PlaceParts`, FuseOps/FuseTIR,
  :class:`~codl_tvm.passes.fused_targets.RestoreTargets` and scheduling, before the dataflow
  lowering (``main`` is still in dataflow form). Merge kernels carry ``codl.merge`` (axis, regions).

What it does
------------
For every merge ``y = concat(y_0, ..., y_k)`` whose inputs are each produced by one ``call_tir``
used nowhere else, the producing kernels are rewritten to write straight into the shared
output: their output buffer keeps the part's shape but takes the full tensor's strides and any
element offset, and each part is called in place on ``codl.coexec.region_view`` (rows
``region`` of the shared tensor, no copy)::

    y     = R.builtin.alloc_tensor(full_shape, dtype, 0)           # on the GPU device (SVM)
    v0    = region_view(y, axis, 0, n);    r0 = call_tir_inplace(gpu_part, (..., v0))
    v1    = region_view(y, axis, n, E);    r1 = call_tir_inplace(cpu_part, (..., v1))
    y_out = codl.coexec.join(y, r0, r1)                              # y, after both parts

The concat disappears. ``join`` returns ``y``; it exists so the in-place calls stay ordered
before every use of the merged tensor. A merge whose parts do not fit this shape keeps its
concat (a copy on the GPU) and is reported in ``main``'s ``"codl_merge_report"`` attribute.
"""

from __future__ import annotations

import json
import re

import tvm
import tvm_ffi
from tvm import relax

from .kernel_calls import CALL_TIR, dtype_expr

__all__ = ["MergePartsInPlace", "site_id", "strided_output"]


def _compact_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for extent in reversed(shape):
        strides.append(acc)
        acc *= extent
    return tuple(reversed(strides))


def strided_output(func: tvm.tirx.PrimFunc, full_shape: tuple[int, ...]) -> tvm.tirx.PrimFunc:
    """``func`` with its last (output) buffer declared with ``full_shape``'s strides and an
    arbitrary element offset, so it writes into a region view of a ``full_shape`` tensor.

    Raises ValueError when the output parameter is not a plain ``T.Buffer`` in the signature.
    """
    text = func.script()
    head_end = text.find("):\n", text.find("\ndef "))
    if head_end < 0:
        raise ValueError("cannot find the PrimFunc signature")
    head = text[:head_end]
    decl = head.rfind(": T.Buffer((")
    if decl < 0:
        raise ValueError("the output is not a plain T.Buffer parameter")
    # The declaration runs to the end of the signature: T.Buffer((shape...), "dtype")
    tail = head[decl + len(": T.Buffer(") :]
    match = re.fullmatch(r"(\(.*\)), \"(\w+)\"\)", tail)
    if match is None:
        raise ValueError(f"unexpected output declaration T.Buffer({tail}")
    wide = "T.int64(" in match.group(1)
    strides = ", ".join(f"T.int64({s})" if wide else str(s) for s in _compact_strides(full_shape))
    if len(full_shape) == 1:
        strides += ","
    new_decl = (
        f': T.Buffer({match.group(1)}, "{match.group(2)}", strides=({strides}), offset_factor=1)'
    )
    new_text = head[:decl] + new_decl + text[head_end:]
    return tvm.script.from_source(new_text)


def site_id(func, tag: str, index: int) -> int:
    """A call-site id, stable for a given function, unique across modules in a process."""
    return hash((int(tvm_ffi.structural_hash(func)), tag, index)) & ((1 << 62) - 1)


def _tensor_shape(ty) -> tuple[int, ...] | None:
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    try:
        return tuple(int(v) for v in ty.shape.values)
    except (TypeError, AttributeError):
        return None


@tvm.transform.module_pass(opt_level=0, name="codl.MergePartsInPlace")
class MergePartsInPlace:
    """Replace each merge concat by in-place region writes (see the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        main_gv = mod.get_global_var("main")
        func = mod[main_gv]
        bindings = [b for block in func.body.blocks for b in block.bindings]
        producer = {b.var: b for b in bindings}
        uses: dict = {}
        for b in bindings:
            for v in relax.analysis.free_vars(b.value):
                uses[v] = uses.get(v, 0) + 1
        for v in relax.analysis.free_vars(func.body.body):
            uses[v] = uses.get(v, 0) + 1

        plans = {}  # merge var -> (info, [part bindings])
        report = {}
        for b in bindings:
            call = b.value
            if not (isinstance(call, relax.Call) and call.op.same_as(CALL_TIR)):
                continue
            callee = mod[call.args[0]]
            if not isinstance(callee, tvm.tirx.PrimFunc) or callee.attrs is None:
                continue
            if "codl.merge" not in callee.attrs:
                continue
            info = json.loads(str(callee.attrs["codl.merge"]))
            why = self._check(call, producer, uses, mod)
            if why:
                report[b.var.name] = why
                continue
            parts = [producer[v] for v in call.args[1].fields]
            plans[b.var] = (info, parts)
        if not plans:
            if report:
                func = func.with_attr("codl_merge_report", json.dumps(report))
                mod = mod.clone() if hasattr(mod, "clone") else tvm.IRModule(dict(mod.functions))
                mod[main_gv] = func
            return mod

        rewriter = _Rewriter(mod, plans, func)
        new_main = rewriter.visit_expr(func)
        if report:
            new_main = new_main.with_attr("codl_merge_report", json.dumps(report))
        rewriter.builder_.update_func(main_gv, new_main)
        out = relax.transform.DeadCodeElimination(["main"])(rewriter.builder_.get())
        # DCE keeps public functions, and PlaceParts gives every merge kernel a global_symbol:
        # drop the merge kernels no longer called, or they are compiled into the library.
        merged = {b.value.args[0].name_hint for b in bindings if b.var in plans}
        return _drop_uncalled(out, merged)

    @staticmethod
    def _check(call, producer, uses, mod) -> str:
        args = call.args[1]
        if not isinstance(args, relax.Tuple):
            return "merge inputs are not a tuple of part outputs"
        for v in args.fields:
            b = producer.get(v)
            if b is None:
                return f"part output {v.name} is not bound in main"
            if uses.get(v, 0) != 1:
                return f"part output {v.name} has other uses"
            value = b.value
            if not (isinstance(value, relax.Call) and value.op.same_as(CALL_TIR)):
                return f"part output {v.name} is not produced by a kernel call"
            if len(value.ty_args) != 1 or _tensor_shape(value.ty_args[0]) is None:
                return f"part output {v.name} is not a single static tensor"
        return ""


def _drop_uncalled(mod: tvm.IRModule, names: set[str]) -> tvm.IRModule:
    """``mod`` without the functions named in ``names`` that no Relax function refers to."""
    called: set[str] = set()

    def visit(expr) -> None:
        if isinstance(expr, tvm.ir.GlobalVar):
            called.add(expr.name_hint)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    for gv in list(mod.get_global_vars()):
        if gv.name_hint in names and gv.name_hint not in called:
            del mod[gv]
    return mod


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, plans, func) -> None:
        super().__init__(mod)
        self.mod_ = mod
        self.plans = plans
        self.func = func
        self.returned = set(relax.analysis.free_vars(func.body.body))
        self.sites: dict = {}
        self.part_of = {}  # part binding var -> (merge var, index)
        for merge_var, (_, parts) in plans.items():
            for k, b in enumerate(parts):
                self.part_of[b.var] = (merge_var, k)
        self.shared = {}  # merge var -> shared tensor var
        self.results = {}  # merge var -> list of in-place results
        self.kernels = {}  # (gv) -> rewritten gv

    def site(self, var) -> int:
        if var not in self.sites:
            self.sites[var] = site_id(self.func, "merge", len(self.sites))
        return self.sites[var]

    def _kernel(self, gv, full_shape):
        key = (gv, full_shape)
        if key not in self.kernels:
            prim = strided_output(self.mod_[gv], full_shape)
            prim = prim.with_attrs({k: self.mod_[gv].attrs[k] for k in self.mod_[gv].attrs.keys()})
            prim = prim.with_attr("codl.shared_output", True)
            name = f"{gv.name_hint}_inplace"
            prim = prim.with_attr("global_symbol", name)
            self.kernels[key] = self.builder_.add_func(prim, name)
        return self.kernels[key]

    def visit_var_binding_(self, binding) -> None:
        if binding.var in self.part_of:
            merge_var, k = self.part_of[binding.var]
            info, _ = self.plans[merge_var]
            full_ty = merge_var.ty
            full_shape = _tensor_shape(full_ty)
            if merge_var not in self.shared:
                # Outside the VM's memory plan: the CPU writes it (see codl.coexec.alloc).
                alloc = relax.call_pure_packed(
                    "codl.coexec.alloc",
                    relax.prim_value(self.site(merge_var)),
                    relax.ShapeExpr(list(full_shape)),
                    dtype_expr(str(full_ty.dtype)),
                    relax.prim_value(0),
                    relax.prim_value(merge_var not in self.returned),
                    ty_args=[full_ty],
                )
                self.shared[merge_var] = self.builder_.emit(
                    alloc, name_hint=f"{merge_var.name}_shared"
                )
                self.results[merge_var] = []
            shared = self.shared[merge_var]
            start, stop = info["regions"][k]
            call = binding.value
            part_ty = call.ty_args[0]
            view = self.builder_.emit(
                relax.call_pure_packed(
                    "codl.coexec.region_view",
                    shared,
                    relax.prim_value(info["axis"]),
                    relax.prim_value(start),
                    relax.prim_value(stop),
                    ty_args=[part_ty],
                ),
                name_hint=f"{binding.var.name}_view",
            )
            args = [self.visit_expr(a) for a in call.args[1].fields]
            gv = self._kernel(call.args[0], full_shape)
            result = self.builder_.emit(
                relax.op.call_tir_inplace(gv, relax.Tuple([*args, view]), [len(args)], part_ty),
                name_hint=binding.var.name,
            )
            self.results[merge_var].append(result)
            return
        if binding.var in self.plans:
            join = relax.call_pure_packed(
                "codl.coexec.join",
                self.shared[binding.var],
                *self.results[binding.var],
                ty_args=[binding.var.ty],
            )
            # a merge that leaves the dataflow block (main returns it) stays an output var
            if isinstance(binding.var, relax.DataflowVar):
                new_var = self.builder_.emit(join, name_hint=binding.var.name)
            else:
                new_var = self.builder_.emit_output(join, name_hint=binding.var.name)
            self.set_var_remap(binding.var, new_var)
            return
        super().visit_var_binding_(binding)
