"""OpenCL schedule rule for dense layers: a tiled GEMM, or a GEMV for few rows.

Matches the PrimFuncs that ``LegalizeOps`` + ``FuseTIR`` make of relax ``matmul`` / ``linear``
(ONNX ``Gemm``, ``MatMul``): one reduction block
``C[b.., i, j] += A[b.., i, k] * W[k, j]`` (or ``W[j, k]``, transposed weights), any leading
batch axes of the input folded into the rows, injective prologues (a weight transpose or slice of
a co-execution part) and elementwise epilogues (bias add, relu) fused. The output-feature (OC)
parts of a co-executed dense are such functions too, with their own sliced weights.
Parameters come from :class:`~codl_tvm.schedules.config.OpenCLConfig` (``dense_*`` fields).

``gemm`` (rows >= ``dense_gemm_min_m``)
    A workgroup computes ``threads_m * reg_m`` rows x ``threads_n * reg_n`` output features; each
    work-item a ``reg_m x reg_n`` register tile, accumulating over K in steps of ``k_chunk``
    (staged in local memory, cooperatively, with ``dense_use_local_memory``). With
    ``dense_vector_lanes`` the register tile's features are an OpenCL vector (CPU OpenCL).
``gemv`` (fewer rows, the usual inference case)
    One workgroup per ``dense_gemv_rows`` output features of one row; each output's reduction is
    split over ``dense_gemv_threads_k`` work-items (strided, so neighbouring work-items read
    neighbouring elements) and combined by a cross-thread reduction.

Both record the launch of the main kernel (``codl.workgroup_size``, ``codl.workgroup_count``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad
from tvm.target import Target

from .analysis import buffer_loads, classify_blocks, match_reduction, strip_cast
from .opencl_common import (
    OpenCLRule,
    finish_register_tile,
    inline_epilogue,
    inline_prologue,
    local_limit,
    opencl_vector_width,
)

__all__ = ["DenseInfo", "OpenCLDense", "match_dense"]


@dataclass(frozen=True)
class DenseInfo:
    """A recognised dense block: ``rows`` (batch axes x M) x ``k`` -> ``rows`` x ``n``."""

    rows: int
    k: int
    n: int
    batch_axes: int
    weight_transposed: bool
    dtype_bits: int


def _is_var(expr, var) -> bool:
    return isinstance(expr, tirx.Var) and expr.same_as(var)


def match_dense(sch: s_tir.Schedule, block) -> DenseInfo | str:
    """Describe ``block`` as a dense layer, or say why it is not one."""
    info = match_reduction(sch, block)
    if isinstance(info, str):
        return info
    if info.kinds.count("R") != 1 or len(info.kinds) < 3:
        return f"iteration kinds {info.kinds}: a dense has spatial (.., i, j) and one reduction k"
    stmt = sch.get(block)
    ivs = [iv.var for iv in stmt.iter_vars]
    i, j, k = ivs[-3], ivs[-2], ivs[-1]
    batch = ivs[:-3]
    value = stmt.body.value
    if not isinstance(value, tirx.Add):
        return "update is not an accumulation (acc + a * b)"
    prod = strip_cast(value.b)
    if not isinstance(prod, tirx.Mul):
        return "update is not acc + a * b"
    loads = [strip_cast(prod.a), strip_cast(prod.b)]
    if not all(isinstance(x, TensorLoad) for x in loads):
        return "operands of the product are not buffer loads"
    acc = [x for x in buffer_loads(value) if x.source.same_as(stmt.body.buffer)]
    if not acc:
        return "update does not read its output"
    data = weight = None
    transposed = False
    for load in loads:
        idx = list(load.indices)
        if (
            len(idx) >= 2
            and _is_var(idx[-2], i)
            and _is_var(idx[-1], k)
            and len(idx) - 2 <= len(batch)
            and all(_is_var(x, v) for x, v in zip(idx[:-2], batch[len(batch) - len(idx) + 2 :]))
        ):
            data = load
        elif len(idx) == 2 and _is_var(idx[0], k) and _is_var(idx[1], j):
            weight = load
        elif len(idx) == 2 and _is_var(idx[0], j) and _is_var(idx[1], k):
            weight, transposed = load, True
    if data is None or weight is None:
        return "operands are not data[.., i, k] and a 2-D weight [k, j] or [j, k]"
    if len(data.indices) - 2 != len(batch):
        return "data does not have the output's batch axes"
    ext = info.extents
    return DenseInfo(
        rows=math.prod(ext[:-2]),
        k=ext[-1],
        n=ext[-2],
        batch_axes=len(batch),
        weight_transposed=transposed,
        dtype_bits=info.dtype_bits,
    )


def _divisor_at_most(extent: int, limit: int) -> int:
    return max(d for d in range(1, max(1, min(extent, limit)) + 1) if extent % d == 0)


def _pow2_at_most(value: int) -> int:
    return 1 << (max(1, value).bit_length() - 1)


class OpenCLDense(OpenCLRule):
    """Dense / matmul with a 2-D weight: tiled GEMM, or GEMV with a split reduction."""

    def schedule(self, sch: s_tir.Schedule, target: Target):
        cfg = self._config(target)
        if not cfg.dense:
            return f"off in preset {cfg.name!r} (codl_tvm.schedules.dense_enabled switches it on)"
        blocks = classify_blocks(sch)
        if isinstance(blocks, str):
            return blocks
        if blocks.main is None:
            return "no reduction block"
        info = match_dense(sch, blocks.main)
        if isinstance(info, str):
            return f"not a dense: {info}"
        inline_prologue(sch, blocks, cfg.pool_threads)
        main = blocks.main
        loops = sch.get_loops(main)
        m = sch.fuse(*loops[:-2]) if len(loops) > 3 else loops[0]
        j, k = loops[-2], loops[-1]
        if info.rows >= cfg.dense_gemm_min_m:
            return self._gemm(sch, cfg, target, blocks, info, m, j, k)
        return self._gemv(sch, cfg, blocks, info, m, j, k)

    def _gemm(self, sch, cfg, target, blocks, info: DenseInfo, m, j, k):
        main = blocks.main
        vector = cfg.dense_vector_lanes > 1
        if vector:
            reg_n = opencl_vector_width(info.n, min(cfg.dense_vector_lanes, cfg.dense_reg_n))
        else:
            reg_n = min(cfg.dense_reg_n, info.n)
        reg_m = min(cfg.dense_reg_m, info.rows)
        t_m = max(1, min(cfg.dense_threads_m, math.ceil(info.rows / reg_m)))
        t_n = max(1, min(cfg.dense_threads_n, math.ceil(info.n / reg_n)))
        while t_m * t_n > cfg.max_workgroup_size:
            if t_m >= t_n:
                t_m = max(1, t_m // 2)
            else:
                t_n = max(1, t_n // 2)
        chunk = _divisor_at_most(info.k, cfg.dense_k_chunk)
        bm, tm, rm = sch.split(m, [None, t_m, reg_m])
        bn, tn, rn = sch.split(j, [None, t_n, reg_n])
        ko, ki = sch.split(k, [None, chunk])
        sch.reorder(bm, bn, tm, tn, ko, ki, rm, rn)
        sch.bind(bm, "blockIdx.y")
        sch.bind(bn, "blockIdx.x")
        t = sch.fuse(tm, tn)
        sch.bind(t, "threadIdx.x")
        threads = t_m * t_n
        if cfg.dense_use_local_memory:
            nbytes = info.dtype_bits // 8
            staged = (t_m * reg_m + t_n * reg_n) * chunk * nbytes
            if staged <= local_limit(cfg, target):
                for index in self._operand_reads(sch, main):
                    shared = sch.cache_read(main, index, "shared")
                    sch.compute_at(shared, ko, preserve_unit_loops=True)
                    inner = sch.get_loops(shared)[4:]
                    fused = sch.fuse(*inner) if len(inner) > 1 else inner[0]
                    _, tx = sch.split(fused, [None, threads])
                    sch.bind(tx, "threadIdx.x")
        writeback = sch.cache_write(main, 0, "local")
        inline_epilogue(sch, blocks, cfg.pool_threads)
        finish_register_tile(sch, main, writeback, t, rm, rn, ko, bool(vector and reg_n > 1))
        groups = math.ceil(info.rows / (t_m * reg_m)) * math.ceil(info.n / (t_n * reg_n))
        return "gemm", cfg.name, {"codl.workgroup_size": threads, "codl.workgroup_count": groups}

    @staticmethod
    def _operand_reads(sch, main) -> list[int]:
        stmt = sch.get(main)
        return [
            i for i, region in enumerate(stmt.reads) if not region.source.same_as(stmt.body.buffer)
        ]

    def _gemv(self, sch, cfg, blocks, info: DenseInfo, m, j, k):
        main = blocks.main
        t_k = _pow2_at_most(min(cfg.dense_gemv_threads_k, info.k))
        rows = max(1, min(cfg.dense_gemv_rows, info.n, cfg.max_workgroup_size // t_k))
        bn, tn = sch.split(j, [None, rows])
        sch.bind(m, "blockIdx.y")
        sch.bind(bn, "blockIdx.x")
        sch.bind(tn, "threadIdx.y")
        if t_k > 1:
            ko, tk = sch.split(k, [None, t_k])
            sch.reorder(tk, ko)
            sch.bind(tk, "threadIdx.x")
        writeback = sch.cache_write(main, 0, "local")
        inline_epilogue(sch, blocks, cfg.pool_threads)
        sch.reverse_compute_at(writeback, tn, preserve_unit_loops=True)
        if t_k == 1:
            sch.decompose_reduction(main, k)
        groups = info.rows * math.ceil(info.n / rows)
        return "gemv", cfg.name, {"codl.workgroup_size": rows * t_k, "codl.workgroup_count": groups}
