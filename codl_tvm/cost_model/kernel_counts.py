"""Static counts read from a part's scheduled GPU kernel, the ``"tir"`` feature set of the GBDT.

Parts of one dispatch shape run up to 1.7x apart on the H100 because of what is inside the
kernel (bounds checks, padding selects, how much of the reduction the rule unrolled), which the
part shape and the work-group size and count do not show. :func:`kernel_counts` reads it from the
kernel itself, as MetaSchedule's per-store features do: per thread, the loads and stores by
memory scope, the float arithmetic, the block executions under a bounds-check predicate and
the comparisons in those predicates, the padding selects, the serial loop iterations and the
largest unrolled extent, plus the launch (threads, work-groups) and the shared and local bytes
allocated.

Why not ``tvm.s_tir.meta_schedule.feature_extractor.PerStoreFeature`` itself: in the pinned TVM
0.27 its ``extract_from`` ends the process with a segmentation fault inside ``libtvm_ffi``
(called from ``parallel_for_dynamic``) on any PrimFunc, a plain TE matmul on ``llvm`` included.

:func:`part_kernel_counts` regenerates a part's kernel from its shapes with codl's schedule rules
exactly as the profiler builds it (``profiling.runner.schedule_part``) under the records' GPU
target, and caches the counts per distinct kernel: a fit and its leave-one-model-out refits
schedule each kernel once per process. A record whose recorded work-group size and count differ
from the regenerated kernel's (it was built with other rule settings) gets NaN counts: its
kernel is not the one measured.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping

import tvm
from tvm import s_tir, tirx

from codl_tvm.cost_model.dispatch import _children, dispatch_features
from codl_tvm.cost_model.features import OpFeatures, OpParams, PartShape
from codl_tvm.cost_model.gbdt import KERNEL_FEATURE_NAMES
from codl_tvm.errors import CodlError
from codl_tvm.profiling.runner import schedule_part
from codl_tvm.schedules.config import opencl_overrides

__all__ = ["kernel_counts", "part_kernel_counts"]

_ARITH = ("Add", "Sub", "Mul", "Div", "Min", "Max")
_COMPARE = ("LT", "LE", "GT", "GE", "EQ", "NE")
_SCOPES = ("global", "shared", "local")


def _scope(buffer) -> str:
    s = str(buffer.scope())
    return next((k for k in _SCOPES if s.startswith(k)), "global")


def _const(expr) -> int | None:
    value = getattr(expr, "value", None)
    return int(value) if isinstance(value, int) else None


class _Counter:
    """One walk over a PrimFunc's statements with the executions per thread so far."""

    def __init__(self) -> None:
        self.c = dict.fromkeys(KERNEL_FEATURE_NAMES, 0.0)
        self.threads: dict[str, int] = {}

    def expr(self, e, mult: float) -> None:
        """Loads, float arithmetic and selects of one expression, ``mult`` times."""
        # TVM 0.27 keeps its expression classes in tvm.ir (a load is ``ir.expr.TensorLoad``,
        # its buffer ``.source``): matched by class name, every field an expression or absent
        stack = [e]
        while stack:
            e = stack.pop()
            name = type(e).__name__
            if name in ("TensorLoad", "BufferLoad"):
                buf = getattr(e, "source", None)
                self.c[f"k_{_scope(e.buffer if buf is None else buf)}_loads"] += mult
                continue  # index arithmetic is not the kernel's work
            if name in _ARITH and "float" in str(e.ty):
                self.c["k_flops"] += mult
            if name == "Select" or (
                name == "Call" and str(getattr(e.op, "name", "")).endswith("if_then_else")
            ):
                self.c["k_selects"] += mult
            for field in ("a", "b", "value", "condition", "true_value", "false_value"):
                child = getattr(e, field, None)
                if child is not None and not isinstance(child, int | float | str):
                    stack.append(child)
            if name == "Call":
                stack.extend(e.args)

    @staticmethod
    def comparisons(e) -> int:
        n, stack = 0, [e]
        while stack:
            e = stack.pop()
            n += type(e).__name__ in _COMPARE
            stack.extend(c for c in (getattr(e, "a", None), getattr(e, "b", None)) if c is not None)
        return n

    def stmt(self, s, mult: float, unroll: float, serial: float) -> None:
        if isinstance(s, tirx.For):
            ext = _const(s.extent)
            if s.kind == tirx.ForKind.THREAD_BINDING:
                tag = s.thread_binding.thread_tag
                if ext is not None:
                    self.threads[tag] = max(self.threads.get(tag, 0), ext)
                self.stmt(s.body, mult, unroll, serial)
                return
            ext = 1 if ext is None else ext
            self.stmt(
                s.body,
                mult * ext,
                unroll * ext if s.kind == tirx.ForKind.UNROLLED else unroll,
                serial * ext if s.kind == tirx.ForKind.SERIAL else serial,
            )
            return
        if isinstance(s, s_tir.SBlockRealize):
            pred = s.predicate
            terms = 0 if _const(pred) == 1 else self.comparisons(pred)
            if terms:
                self.c["k_guarded"] += mult
                self.c["k_guard_terms"] += mult * terms
            block = s.block
            if any(iv.iter_type == tirx.IterVar.CommReduce for iv in block.iter_vars):
                self.c["k_compute_guard_terms"] = max(self.c["k_compute_guard_terms"], float(terms))
                self.c["k_serial_iters"] = max(self.c["k_serial_iters"], serial)
            if block.init is not None:
                self.stmt(block.init, mult, unroll, serial)
            self.stmt(block.body, mult, unroll, serial)
            return
        if isinstance(s, tirx.BufferStore):
            self.c[f"k_{_scope(s.buffer)}_stores"] += mult
            self.c["k_unroll"] = max(self.c["k_unroll"], unroll)
            self.expr(s.value, mult)
            return
        if isinstance(s, tirx.IfThenElse):
            self.c["k_guarded"] += mult
            self.c["k_guard_terms"] += mult * self.comparisons(s.condition)
        for child in _children(s):
            if isinstance(child, tirx.Stmt):
                self.stmt(child, mult, unroll, serial)


def _allocated_bytes(func) -> dict[str, float]:
    """Shared and local bytes ``func`` allocates once its buffers are compacted to what each
    work-group / work-item touches (the scheduled function allocates whole tensors)."""
    passes = [
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.CompactBufferAllocation(),
    ]
    compacted = tvm.transform.Sequential(passes)(tvm.IRModule({"main": func}))["main"]
    out = {"shared": 0.0, "local": 0.0}
    stack = [compacted.body]
    while stack:
        s = stack.pop()
        bufs = list(s.block.alloc_buffers) if isinstance(s, s_tir.SBlockRealize) else []
        for buf in bufs:
            scope = _scope(buf)
            if scope in out:
                out[scope] += math.prod(_const(d) or 1 for d in buf.shape) * buf.dtype.bits // 8
        stack.extend(_children(s))
    return out


def kernel_counts(funcs: Iterable) -> list[float]:
    """The :data:`KERNEL_FEATURE_NAMES` of an operator's scheduled PrimFuncs (block-level TIR,
    as the schedule rules leave it): counts summed over the PrimFuncs, the launch (threads per
    work-group, work-groups) and the unrolled and serial extents of the largest."""
    total = dict.fromkeys(KERNEL_FEATURE_NAMES, 0.0)
    n = 0
    for func in funcs:
        n += 1
        w = _Counter()
        w.stmt(func.body, 1.0, 1.0, 1.0)
        threads = math.prod(v for k, v in w.threads.items() if k.startswith("threadIdx."))
        groups = math.prod(v for k, v in w.threads.items() if k.startswith("blockIdx."))
        w.c["k_threads"], w.c["k_groups"] = float(threads), float(groups)
        nbytes = _allocated_bytes(func)
        w.c["k_shared_bytes"], w.c["k_local_bytes"] = nbytes["shared"], nbytes["local"]
        for k, v in w.c.items():
            maxed = k in ("k_threads", "k_groups", "k_unroll", "k_serial_iters")
            total[k] = max(total[k], v) if maxed or k == "k_compute_guard_terms" else total[k] + v
    total["k_kernels"] = float(n)
    return [total[k] for k in KERNEL_FEATURE_NAMES]


@functools.lru_cache(maxsize=1 << 16)
def _cached(
    params: OpParams, part: PartShape, target: str, settings: tuple[tuple[str, object], ...]
) -> tuple[tuple[float, ...], tuple]:
    """Counts and ``(wg_size, wg_count)`` of the part's kernel built under ``settings`` (per
    process, per distinct kernel: scheduling one takes ~0.1 s)."""
    with opencl_overrides(**dict(settings)):
        _, scheduled = schedule_part(params, part, "gpu", tvm.target.Target(target))
    funcs = [f for _, f in scheduled.functions.items() if isinstance(f, tirx.PrimFunc)]
    d = dispatch_features(funcs)
    return tuple(kernel_counts(funcs)), (d.wg_size, d.wg_count)


def part_kernel_counts(
    f: OpFeatures, target: str, settings: Mapping[str, object] | None = None
) -> list[float]:
    """The :data:`KERNEL_FEATURE_NAMES` of the GPU part ``f`` built for ``target`` (a target's
    JSON text, the records' ``gpu_target``) with the OpenCL preset's ``settings`` replaced
    (``schedules.config.opencl_overrides``: the campaign's settings where they were others);
    NaN for CPU parts, without a target, for a part the rules cannot schedule, for a record
    whose work-group size and count differ from the kernel built, and for a part without
    recorded dispatch (the planner's: scheduling a kernel takes ~0.1 s, too slow for the
    hundreds of candidate parts of one plan; the trees also train on every record without its
    dispatch, ``GbdtConfig.augment_blind``)."""
    nan = [math.nan] * len(KERNEL_FEATURE_NAMES)
    d = f.dispatch
    if f.processor != "gpu" or not target or not (d.wg_size and d.wg_count):
        return nan
    try:
        counts, launch = _cached(f.params, f.part, target, tuple(sorted((settings or {}).items())))
    except (CodlError, RuntimeError):  # a part the rules or TVM refuse (TVM raises RuntimeError)
        return nan
    if (d.wg_size, d.wg_count) != launch:
        return nan
    return list(counts)
