"""Which split each kernel call of a co-executed ``main`` computes, in the order the VM runs them.

A timeline (:func:`codl_tvm.profiling.trace.trace_inference`) sees kernels by their function names;
:func:`codl_tvm.planner.split.refine.refine_plan` needs each split's time on each processor. This
module bridges the two: :func:`kernel_splits` walks ``main`` once, after
:class:`~codl_tvm.passes.sync.InsertCoexecSync` and before ``CallTIRRewrite`` (no kernel call
is added, removed or reordered after it), and lists every kernel call with the split it belongs
to: the callee's ``codl.split`` attribute (:class:`~codl_tvm.passes.place.PlaceParts` gives
each split its own kernels, :class:`~codl_tvm.passes.fused_targets.RestoreTargets` carries the
attribute through FuseTIR). :class:`~codl_tvm.passes.share_kernels.ShareIdenticalKernels`
runs after it, merges copies of identical code and renames the record's calls to match.

:class:`RecordKernelSplits` is the pass form: it changes no function and records the result as
the module attribute ``"codl_kernel_splits"`` (:data:`KERNEL_SPLITS_ATTR`, JSON), which
:func:`recorded_kernel_splits` reads back; the build pipeline reads it at the end and hands it to
the artifact.
"""

from __future__ import annotations

import json

import tvm
from tvm import relax

from .fused_targets import SPLIT_ATTR
from .kernel_calls import is_kernel_call, kernel_processor
from .parts import PARTS_ATTR

__all__ = [
    "KERNEL_SPLITS_ATTR",
    "RecordKernelSplits",
    "kernel_splits",
    "kernel_symbol",
    "recorded_kernel_splits",
    "with_kernel_splits",
]

#: Module attribute holding the kernel record (JSON of :func:`kernel_splits`).
KERNEL_SPLITS_ATTR = "codl_kernel_splits"


def _splits_of(main: relax.Function) -> dict[str, dict]:
    """Each split's operators, dimension and measured GPU share of its output."""
    if main.attrs is None or PARTS_ATTR not in main.attrs:
        return {}
    out = {}
    for rec in json.loads(str(main.attrs[PARTS_ATTR])):
        extent = {p["processor"]: p["region"][1] - p["region"][0] for p in rec["parts"]}
        total = sum(extent.values())
        out[rec["name"]] = {
            "ops": list(rec["ops"]),
            "dim": rec["dim"],
            "ratio": float(rec["ratio"]),
            "extent": total,
            # the share the rounding to whole rows/channels gave the GPU
            "gpu_share": extent.get("gpu", 0) / total if total else float(rec["ratio"]),
        }
    return out


def kernel_symbol(gv: tvm.ir.GlobalVar, func: tvm.tirx.PrimFunc) -> str:
    """The name the VM calls ``func`` by: its ``global_symbol``, else its global var's name."""
    attrs = func.attrs
    if attrs is not None and "global_symbol" in attrs:
        return str(attrs["global_symbol"])
    return gv.name_hint


def kernel_splits(mod: tvm.IRModule) -> dict:
    """The kernel calls of ``mod["main"]`` in order, each with its split and processor.

    Returns
    -------
    dict
        ``{"splits": {name: {"ops", "dim", "ratio", "extent", "gpu_share"}}, "calls": [[symbol,
        split or None, "cpu" | "gpu"], ...]}``; ``extent`` is the split axis' length, ``symbol``
        the kernel function the VM calls.
    """
    main = mod["main"]
    calls = []
    for block in main.body.blocks:
        for b in block.bindings:
            value = b.value
            if not is_kernel_call(value):
                continue
            gv = value.args[0]
            callee = mod[gv]
            if not isinstance(callee, tvm.tirx.PrimFunc):
                continue
            attrs = callee.attrs
            split = str(attrs[SPLIT_ATTR]) if attrs is not None and SPLIT_ATTR in attrs else None
            calls.append([kernel_symbol(gv, callee), split, kernel_processor(mod, value)])
    return {"splits": _splits_of(main), "calls": calls}


def with_kernel_splits(mod: tvm.IRModule, record: dict) -> tvm.IRModule:
    """``mod`` with ``record`` as its :data:`KERNEL_SPLITS_ATTR` attribute."""
    return mod.with_attr(KERNEL_SPLITS_ATTR, json.dumps(record))


def recorded_kernel_splits(mod: tvm.IRModule) -> dict | None:
    """The kernel record :class:`RecordKernelSplits` left on ``mod`` (None: no record)."""
    text = mod.get_attr(KERNEL_SPLITS_ATTR)
    return None if text is None else json.loads(str(text))


@tvm.transform.module_pass(opt_level=0, name="codl.RecordKernelSplits")
class RecordKernelSplits:
    """Record :func:`kernel_splits` of the module as its :data:`KERNEL_SPLITS_ATTR` attribute
    (replacing an earlier record); every function stays as it is."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return with_kernel_splits(mod, kernel_splits(mod))
