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
exactly as the profiler builds it (``cost_model.part_ir.schedule_part``) under the records' GPU
target, and caches the counts per distinct kernel: a fit and its leave-one-model-out refits
schedule each kernel once per process. A record whose recorded work-group size and count differ
from the regenerated kernel's (it was built with other rule settings) gets NaN counts: its
kernel is not the one measured.

What the counts cannot show is what NVIDIA's compiler makes of the kernel (registers, spills,
the occupancy they leave): kernels with identical dispatch and nearly identical code still run up
to 1.7x apart on the H100. :func:`kernel_key` names each distinct kernel, :func:`kernel_source`
gives its OpenCL C for ``scripts/nv_kernel_info.py`` to compile on the NVIDIA GPU, and
:func:`nv_kernel_reader` joins what that measured (the ``"tir-nv"`` feature set):
:func:`nv_features`, with the occupancy of :func:`occupancy`.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx

from codl_tvm.core.errors import CodlError
from codl_tvm.cost_model.dispatch import dispatch_features, stmt_children
from codl_tvm.cost_model.features import OpFeatures, OpParams, PartShape
from codl_tvm.cost_model.gbdt import KERNEL_FEATURE_NAMES, NV_FEATURE_NAMES, KernelReader
from codl_tvm.cost_model.part_ir import compile_scheduled, schedule_part
from codl_tvm.schedules.settings import opencl_overrides

__all__ = [
    "H100",
    "SmLimits",
    "kernel_counts",
    "kernel_key",
    "kernel_source",
    "load_kernel_info",
    "nv_features",
    "nv_kernel_reader",
    "occupancy",
    "part_kernel_counts",
]

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
        for child in stmt_children(s):
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
        stack.extend(stmt_children(s))
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
    (``schedules.settings.opencl_overrides``: the campaign's settings where they were others);
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


def kernel_key(f: OpFeatures, target: str, settings: Mapping[str, object] | None = None) -> str:
    """The name of the kernel :func:`part_kernel_counts` rebuilds for ``f`` (what its cache is
    keyed by: the operator, the part, the target and the preset settings), stable across
    processes and machines: the key ``scripts/nv_kernel_info.py`` stores each kernel under."""
    ident = json.dumps(
        [f.params.to_json(), f.part.to_json(), target, sorted((settings or {}).items())],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha1(ident.encode()).hexdigest()[:20]


def kernel_source(
    f: OpFeatures, target: str, settings: Mapping[str, object] | None = None
) -> tuple[str, tuple[int, int]]:
    """The OpenCL C of the kernel(s) of GPU part ``f`` built as :func:`part_kernel_counts`
    rebuilds it, and its ``(wg_size, wg_count)``; raises ``CodlError``/``RuntimeError`` where
    the rules or TVM refuse the part."""
    tgt = tvm.target.Target(target)
    with opencl_overrides(**dict(settings or {})):
        _, scheduled = schedule_part(f.params, f.part, "gpu", tgt)
    funcs = [g for _, g in scheduled.functions.items() if isinstance(g, tirx.PrimFunc)]
    d = dispatch_features(funcs)
    ex = compile_scheduled(scheduled, tgt)
    stack, sources = [ex.mod], []
    while stack:
        m = stack.pop()
        stack.extend(m.imports)
        if m.kind == "opencl":
            sources.append(m.inspect_source())
    if not sources:
        raise RuntimeError(f"{f.params.describe()}: the build holds no OpenCL module")
    return "\n".join(sources), (d.wg_size, d.wg_count)


@dataclass(frozen=True)
class SmLimits:
    """What one streaming multiprocessor holds (the inputs of CUDA's occupancy calculator)."""

    registers: int
    threads: int
    blocks: int
    smem_bytes: int
    warp: int = 32
    reg_unit: int = 256  # registers are allocated per warp in units of this many
    smem_unit: int = 128  # shared memory is allocated per block in units of this many bytes
    smem_reserved: int = 1024  # bytes the driver reserves per block (compute capability >= 8.0)


#: The H100 (compute capability 9.0): 64K registers, 2048 threads, 32 blocks and 228 KB of
#: shared memory per SM.
H100 = SmLimits(registers=65536, threads=2048, blocks=32, smem_bytes=228 * 1024)


def occupancy(
    registers: float, threads: float, smem_bytes: float = 0.0, sm: SmLimits = H100
) -> tuple[float, float]:
    """``(blocks, occupancy)``: work-groups of ``threads`` work-items using ``registers`` per
    work-item and ``smem_bytes`` of shared memory that one SM holds at once, and their warps
    over the SM's (``sm.threads / sm.warp``); NaN where an input is unknown or ``threads`` not
    positive."""
    if not all(math.isfinite(v) for v in (registers, threads, smem_bytes)) or threads <= 0:
        return math.nan, math.nan
    warps = math.ceil(threads / sm.warp)
    limits = [sm.blocks, (sm.threads // sm.warp) // warps]
    if registers > 0:
        per_warp = math.ceil(registers * sm.warp / sm.reg_unit) * sm.reg_unit
        limits.append((sm.registers // per_warp) // warps)
    if smem_bytes > 0:
        per_block = math.ceil(smem_bytes / sm.smem_unit) * sm.smem_unit + sm.smem_reserved
        limits.append(sm.smem_bytes // per_block)
    blocks = float(min(limits))
    return blocks, blocks * warps / (sm.threads // sm.warp)


def _num(v) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan


def nv_features(entry: Mapping | None, wg_size: float, sm: SmLimits = H100) -> list[float]:
    """The :data:`NV_FEATURE_NAMES` of one kernel key's entry of ``nv_kernel_info.py
    measure``'s JSON (``{"kernels": {name: {...}}}``) for a part launched with ``wg_size``
    work-items per work-group; NaN for what it lacks (no entry, a build error, a platform whose
    log has no ``ptxas`` lines)."""
    kernels = list(((entry or {}).get("kernels") or {}).values())

    def agg(field: str, fn) -> float:
        vals = [v for v in (_num(k.get(field)) for k in kernels) if math.isfinite(v)]
        return float(fn(vals)) if vals else math.nan

    occ = [
        occupancy(_num(k.get("registers")), wg_size, _num(k.get("smem_bytes")), sm) for k in kernels
    ]
    occ = [o for o in occ if math.isfinite(o[1])]
    spills = [_num(k.get("spill_stores")) + _num(k.get("spill_loads")) for k in kernels]
    spills = [v for v in spills if math.isfinite(v)]
    out = {
        "nv_registers": agg("registers", max),
        "nv_spill_bytes": float(sum(spills)) if spills else math.nan,
        "nv_stack_bytes": agg("stack_bytes", max),
        "nv_smem_bytes": agg("smem_bytes", max),
        "nv_private_bytes": agg("private_mem_size", max),
        "nv_max_wg": agg("work_group_size", min),
        "nv_blocks_per_sm": min(o[0] for o in occ) if occ else math.nan,
        "nv_occupancy": min(o[1] for o in occ) if occ else math.nan,
    }
    return [out[k] for k in NV_FEATURE_NAMES]


def nv_kernel_reader(info: Mapping[str, Mapping], sm: SmLimits = H100) -> KernelReader:
    """The ``"tir-nv"`` feature set's reader: :func:`part_kernel_counts` and the
    :func:`nv_features` of the part's kernel in ``info`` (the ``"kernels"`` of
    ``nv_kernel_info.py measure``'s JSON, by :func:`kernel_key`); NaN where the counts are (the
    kernel rebuilt is not the one measured) or ``info`` has no entry."""

    def read(f: OpFeatures, target: str, settings: Mapping[str, object]) -> list[float]:
        counts = part_kernel_counts(f, target, settings)
        if math.isnan(counts[0]):
            return counts + [math.nan] * len(NV_FEATURE_NAMES)
        entry = info.get(kernel_key(f, target, settings))
        return counts + nv_features(entry, float(f.dispatch.wg_size), sm)

    return read


#: The ``meta.format`` of ``scripts/nv_kernel_info.py measure``'s JSON.
KERNEL_INFO_FORMAT = "codl-nv-kernel-info"


def load_kernel_info(path) -> dict[str, dict]:
    """The ``"kernels"`` of a ``nv_kernel_info.py measure`` JSON file (gzipped where its name
    ends in ``.gz``), by :func:`kernel_key`; ``ValueError`` naming the file and what is wrong
    when it is not one."""
    with gzip.open(path, "rt") if str(path).endswith(".gz") else open(path) as fh:
        try:
            obj = json.load(fh)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from None
    fmt = obj.get("meta", {}).get("format") if isinstance(obj, dict) else None
    if fmt != KERNEL_INFO_FORMAT or not isinstance(obj.get("kernels"), dict):
        raise ValueError(
            f"{path}: meta.format is {fmt!r}, not {KERNEL_INFO_FORMAT!r} "
            "(the JSON of `scripts/nv_kernel_info.py measure`)"
        )
    return obj["kernels"]
