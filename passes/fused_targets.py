"""codl.RecordFusedTargets / codl.RestoreTargets: keep kernel placement through FuseTIR.

TVM 0.27's FuseTIR builds each fused PrimFunc without the ``target`` attribute of the kernels it
fuses, which would compile a CPU part as OpenCL. The two passes bracket FuseTIR:

- ``RecordFusedTargets`` (after FuseOps, before FuseTIR): for every fused Relax function, the
  target its ``call_tir`` callees share (set by :class:`~codl_tvm.passes.place.PlaceParts`) is
  recorded in ``main``'s ``"codl_fused_targets"`` attribute; a fused function whose kernels
  disagree raises (FuseOps fused across processors).
- ``RestoreTargets`` (after FuseTIR): sets each fused PrimFunc's target from the VDevice of the
  output of the ``call_tir`` that calls it (the placement :class:`~codl_tvm.passes.place.
  PlaceParts` wrote into the IR), checks it against the record, and removes the record.

The split a kernel computes (its ``codl.split`` attribute, :data:`SPLIT_ATTR`, set by
:class:`~codl_tvm.passes.place.PlaceParts`) goes through FuseTIR the same way
(``"codl_fused_splits"``); a timeline uses it to attribute each kernel to its split
(:func:`~codl_tvm.passes.kernel_splits.kernel_splits`).
"""

from __future__ import annotations

import json

import tvm
from tvm import relax

__all__ = ["FUSED_TARGETS_ATTR", "SPLIT_ATTR", "RecordFusedTargets", "RestoreTargets"]

FUSED_TARGETS_ATTR = "codl_fused_targets"
FUSED_SPLITS_ATTR = "codl_fused_splits"
#: PrimFunc attribute: the name of the split (``"codl_parts"`` record) the kernel computes.
SPLIT_ATTR = "codl.split"
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _call_tir_callees(func: relax.Function) -> list[tvm.ir.GlobalVar]:
    out = []

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(_CALL_TIR):
            out.append(expr.args[0])

    relax.analysis.post_order_visit(func.body, visit)
    return out


@tvm.transform.module_pass(opt_level=0, name="codl.RecordFusedTargets")
class RecordFusedTargets:
    """Record the target of every fused function (see the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        record: dict[str, tvm.target.Target] = {}
        splits: dict[str, str] = {}
        for gv, func in mod.functions.items():
            if not isinstance(func, relax.Function) or gv.name_hint == "main":
                continue
            if func.attrs is None or "Primitive" not in func.attrs:
                continue
            targets = []
            for callee in _call_tir_callees(func):
                target = mod[callee].attrs.get("target") if mod[callee].attrs else None
                if target is not None:
                    targets.append(target)
            kinds = {t.kind.name for t in targets}
            if len(kinds) > 1:
                raise ValueError(
                    f"fused function {gv.name_hint} mixes kernels for {sorted(kinds)}: FuseOps "
                    "fused across processors (codl.PlaceParts must run before FuseOps)"
                )
            if targets:
                record[gv.name_hint] = targets[0]
            found = {
                str(mod[c].attrs[SPLIT_ATTR])
                for c in _call_tir_callees(func)
                if mod[c].attrs is not None and SPLIT_ATTR in mod[c].attrs
            }
            if len(found) == 1:
                splits[gv.name_hint] = found.pop()
        if not record:
            return mod
        mod = mod.clone() if hasattr(mod, "clone") else tvm.IRModule(dict(mod.functions))
        main_gv = mod.get_global_var("main")
        main = mod[main_gv].with_attr(FUSED_TARGETS_ATTR, record)
        if splits:
            main = main.with_attr(FUSED_SPLITS_ATTR, json.dumps(splits))
        mod[main_gv] = main
        return mod


@tvm.transform.module_pass(opt_level=0, name="codl.RestoreTargets")
class RestoreTargets:
    """Put the recorded targets back on the fused PrimFuncs (see the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        main_gv = mod.get_global_var("main")
        main = mod[main_gv]
        if main.attrs is None or FUSED_TARGETS_ATTR not in main.attrs:
            return mod
        record = main.attrs[FUSED_TARGETS_ATTR]
        splits = {}
        if FUSED_SPLITS_ATTR in main.attrs:
            splits = json.loads(str(main.attrs[FUSED_SPLITS_ATTR]))
        mod = mod.clone() if hasattr(mod, "clone") else tvm.IRModule(dict(mod.functions))
        # The placement is the VDevice of each kernel's output (set by PlaceParts); the record
        # taken before FuseTIR must agree with it.
        by_vdevice: dict[str, tvm.target.Target] = {}
        for block in main.body.blocks:
            for b in block.bindings:
                call = b.value
                if not (isinstance(call, relax.Call) and call.op.same_as(_CALL_TIR)):
                    continue
                ty = call.ty_args[0] if len(call.ty_args) == 1 else None
                vdev = getattr(ty, "vdevice", None) if isinstance(ty, relax.TensorType) else None
                if vdev is not None and vdev.target is not None:
                    by_vdevice[call.args[0].name_hint] = vdev.target
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            target = by_vdevice.get(gv.name_hint)
            recorded = record.get(gv.name_hint) if gv.name_hint in record else None
            if (
                target is not None
                and recorded is not None
                and (target.kind.name != recorded.kind.name)
            ):
                raise ValueError(
                    f"kernel {gv.name_hint}: its output VDevice says {target.kind.name} but its "
                    f"fused kernels were placed on {recorded.kind.name}"
                )
            target = target or recorded
            if target is not None and (func.attrs is None or "target" not in func.attrs):
                func = func.with_attr("target", target)
                mod[gv] = func
            if gv.name_hint in splits:
                mod[gv] = func.with_attr(SPLIT_ATTR, splits[gv.name_hint])
        mod[main_gv] = main.without_attr(FUSED_TARGETS_ATTR).without_attr(FUSED_SPLITS_ATTR)
        return mod
