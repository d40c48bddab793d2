"""Shared machinery of codl-tvm's schedule rules: the rule base class and dispatch features.

Every rule subclasses :class:`CodlRule`. ``apply`` works on a fresh :class:`tvm.s_tir.Schedule`,
and either returns it with the kernel's algorithm and dispatch features attached as PrimFunc
attributes, or returns None and keeps the reason in :meth:`CodlRule.explain`. Features are read
back from the scheduled TIR (parallel, vectorised and thread-bound loops), so they describe what
was built, not what was intended:

``codl.algorithm`` (str)
    ``direct``, ``gemm``, ``depthwise``, ``winograd``, ``packed`` (channel-packed CPU conv),
    ``pool``, ``matmul``, ``reduction`` or ``injective``. Kernels of dlight's GPU rules record
    ``matmul``, ``gemv``, ``reduction`` or ``fallback``.
``codl.config`` (str)
    Name of the :mod:`codl_tvm.schedules.config` preset used (``dlight`` for dlight's rules).
``codl.parallel_extent`` (int, CPU)
    Iterations of the outermost parallel loop (0 when the kernel runs serially).
``codl.vector_width`` (int, CPU)
    Largest vectorised loop extent (1 when nothing is vectorised).
``codl.workgroup_size`` / ``codl.workgroup_count`` (int, GPU)
    Work-items per workgroup and workgroups of the largest launch of the kernel.
"""

from __future__ import annotations

import math
from typing import Any

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.s_tir.transform import LowerCrossThreadReduction
from tvm.target import Target

from .settings import ScheduleSettings, current_settings

__all__ = [
    "CodlRule",
    "ConfiguredRule",
    "RecordedRule",
    "choose_row_width",
    "kernel_features",
    "padded_row_width",
]


def choose_row_width(extent: int, lanes: int, max_vectors: int, partial: bool = True) -> int:
    """Pick the vectorised tile width along a row of ``extent`` elements.

    The width is either at most one register (``<= lanes``) or a whole number of registers: LLVM
    turns wider vectors of odd length (26, 28 floats on AVX-512) into shuffle sequences that
    were measured 10x slower. A width that divides ``extent`` avoids a predicated tail, which
    TVM's vectoriser would turn into scalar code for the whole loop; when no divisor is at
    least 50% efficient, a row of at most ``max_vectors`` registers is one tile, a longer one
    takes its widest divisor below ``lanes`` and only a prime-like row ``lanes`` with a tail.

    Parameters
    ----------
    extent : int
        Elements in the row (e.g. output width).
    lanes : int
        Elements per SIMD register.
    max_vectors : int
        Registers one tile may span.
    partial : bool
        Allow widths below ``lanes`` that are not powers of two (e.g. 13 or 14 of 16 lanes,
        which LLVM assembles with shuffles); False keeps to ``lanes / 2**k`` when a divisor is
        needed.

    Returns
    -------
    int
        The tile width (1 <= width <= max(extent, lanes)).
    """
    if extent <= 0 or lanes <= 0:
        raise ValueError(f"choose_row_width: extent={extent}, lanes={lanes} must be positive")
    if extent <= lanes:
        return extent
    if partial:
        candidates = list(range(max(1, lanes // 2), lanes + 1))
    else:
        candidates = [lanes >> k for k in range(lanes.bit_length()) if lanes >> k >= 1]
    candidates += [lanes * k for k in range(2, max(1, max_vectors) + 1)]
    best, best_eff = 0, 0.0
    for width in candidates:
        if extent % width:
            continue
        eff = width / (math.ceil(width / lanes) * lanes)
        if eff > best_eff + 1e-9 or (abs(eff - best_eff) < 1e-9 and width > best):
            best, best_eff = width, eff
    if best and best_eff >= 0.5:
        return best
    if not partial:
        pow2 = [w for w in candidates if 4 <= w <= lanes and extent % w == 0]
        if pow2:
            return max(pow2)  # e.g. 28 -> 4 rather than a 14- or 28-lane vector
    if extent <= lanes * max(1, max_vectors):
        return extent  # a short odd row: one odd-length vector beats a scalarised tail
    # a narrow divisor still beats a tail, which scalarises the whole loop (e.g. 49 -> 7)
    narrow = [w for w in range(lanes, 1, -1) if extent % w == 0]
    return narrow[0] if narrow else lanes


def padded_row_width(
    extent: int, lanes: int, max_vectors: int, partial: bool = True
) -> tuple[int, int] | None:
    """Whole-register tile width for a row padded to a multiple of it, where padding pays.

    :func:`choose_row_width` only picks divisors of the row. A row with no usable divisor gets
    either a tile with a predicated tail (a 17x17 image flattened to 289 pixels on AVX-512),
    which TVM turns into scalar code for the whole loop, or one odd vector of several registers
    (assembled with shuffles). Where the kernel can compute a padded row (the 1x1 GEMM: extra
    pixels are computed into a padded buffer and dropped at write-back), a tile of whole
    registers over ``ceil(extent / width) * width`` columns avoids both. A divisor that fills
    part of one register (13 of 16 lanes) stays: measured on AVX-512 (masked vector ops),
    padding SqueezeNet's 13x13, 27x27 and 55x55 rows instead made the model 5-11% slower,
    while padding PoseNet's 17x17 rows made it 8-10x faster (whole models on a skylake-avx512 Xeon).

    Parameters
    ----------
    extent : int
        Elements in the row.
    lanes : int
        Elements per SIMD register.
    max_vectors : int
        Registers one tile may span.
    partial : bool
        As in :func:`choose_row_width` (the unpadded alternative).

    Returns
    -------
    tuple[int, int] or None
        ``(width, padded_extent)`` with the least padding (the wider tile on a tie), or None
        when the unpadded tile has no tail and spans at most one register or whole registers.
    """
    if extent <= 0 or lanes <= 0:
        raise ValueError(f"padded_row_width: extent={extent}, lanes={lanes} must be positive")
    width = choose_row_width(extent, lanes, max_vectors, partial)
    tail = extent % width != 0
    odd_multi = width > lanes and width % lanes != 0
    if extent <= lanes or not (tail or odd_multi):
        return None
    best = None
    for width in (lanes * k for k in range(1, max(1, max_vectors) + 1)):
        padded = math.ceil(extent / width) * width
        if best is None or padded < best[1] or (padded == best[1] and width > best[0]):
            best = (width, padded)
    return best


def kernel_features(func: tirx.PrimFunc) -> dict[str, int]:
    """Dispatch features of a scheduled PrimFunc, read from its loops.

    Returns
    -------
    dict[str, int]
        ``parallel_extent``, ``vector_width``, ``workgroup_size``, ``workgroup_count``.
    """
    parallel: list[int] = []
    vector: list[int] = []
    threads: dict[str, int] = {}
    blocks: dict[str, int] = {}

    def visit(node):
        ext = node.extent.value if isinstance(node.extent, tirx.IntImm) else 0
        if node.kind == tirx.ForKind.PARALLEL:
            parallel.append(ext)
        elif node.kind == tirx.ForKind.VECTORIZED:
            vector.append(ext)
        elif node.kind == tirx.ForKind.THREAD_BINDING and node.thread_binding is not None:
            tag = str(node.thread_binding.thread_tag)
            table = threads if tag.startswith("threadIdx") else blocks
            table[tag] = max(table.get(tag, 1), ext)

    tvm_ffi.structural_walk(func.body, [(tirx.For, visit)])
    return {
        "parallel_extent": max(parallel, default=0),
        "vector_width": max(vector, default=1),
        "workgroup_size": math.prod(threads.values()) if threads else 0,
        "workgroup_count": math.prod(blocks.values()) if blocks else 0,
    }


def _with_record(
    sch: s_tir.Schedule,
    algorithm: str,
    config: str,
    gpu: bool,
    overrides: dict[str, int] | None = None,
) -> s_tir.Schedule:
    func = sch.mod["main"]
    feats = kernel_features(func)
    attrs = {"codl.algorithm": algorithm, "codl.config": config}
    if gpu:
        attrs["codl.workgroup_size"] = feats["workgroup_size"]
        attrs["codl.workgroup_count"] = feats["workgroup_count"]
    else:
        attrs["codl.parallel_extent"] = feats["parallel_extent"]
        attrs["codl.vector_width"] = feats["vector_width"]
    attrs.update(overrides or {})
    return s_tir.Schedule(func.with_attrs(attrs))


class CodlRule(ScheduleRule):
    """Base of codl-tvm's rules: target gating, decline reasons and recorded features.

    Subclasses set ``target_kind`` and implement :meth:`schedule`, which either schedules ``sch``
    in place and returns ``(algorithm, config_name)`` (optionally a third item: ``codl.*``
    attributes that replace the ones read from the loops, e.g. the main loop nest's parallel
    extent when a padding copy has a longer parallel loop) or returns a reason string.
    """

    target_kind: str = ""

    def __init__(self) -> None:
        self._last_reason: str | None = None

    def is_target_available(self, target: Target) -> bool:
        return target is not None and target.kind.name == self.target_kind

    def schedule(self, sch: s_tir.Schedule, target: Target) -> tuple[str, str] | str:
        raise NotImplementedError

    def explain(self, func: tirx.PrimFunc, target: Target) -> str | None:
        """Why this rule declines ``func`` on ``target`` (None if it applies)."""
        self.apply(func, target, False)
        return self._last_reason

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        self._last_reason = None
        if not isinstance(func, tirx.PrimFunc):
            self._last_reason = "not a PrimFunc"
            return None
        if not self.is_target_available(target):
            kind = None if target is None else target.kind.name
            self._last_reason = f"target kind {kind!r}, rule needs {self.target_kind!r}"
            return None
        sch = s_tir.Schedule(func)
        try:
            result = self.schedule(sch, target)
        except s_tir.ScheduleError as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            self._last_reason = f"schedule primitive failed: {first}"
            return None
        if isinstance(result, str):
            self._last_reason = result
            return None
        algorithm, config, *rest = result
        overrides = rest[0] if rest else None
        return _with_record(sch, algorithm, config, self.target_kind != "llvm", overrides)


class ConfiguredRule(CodlRule):
    """A rule with tunables: the config it was given, else :meth:`default_config` of the target
    (its :mod:`codl_tvm.schedules.presets` preset under the rule's settings).

    Parameters
    ----------
    config : CPUConfig | OpenCLConfig | None
        A fixed config for every target; None: the target's preset under ``settings``.
    settings : ScheduleSettings | None
        The build's switches (:class:`~codl_tvm.schedules.settings.ScheduleSettings`); None:
        those in effect where the rule is constructed (``current_settings()``), read once.
    """

    def __init__(self, config: Any = None, settings: ScheduleSettings | None = None) -> None:
        super().__init__()
        self.config = config
        self.settings = current_settings() if settings is None else settings

    def default_config(self, target: Target) -> Any:
        raise NotImplementedError

    def _config(self, target: Target) -> Any:
        return self.config if self.config is not None else self.default_config(target)


class RecordedRule(ScheduleRule):
    """Wrap a dlight rule so its kernels carry ``codl.*`` attributes too.

    With ``check_lowering``, a schedule that TVM cannot lower is declined instead (dlight's GPU
    reduction rules turn some grouped convs into cross-thread reductions that TVM 0.27 fails to
    lower), so the next rule gets the function.
    """

    def __init__(
        self,
        rule: ScheduleRule,
        algorithm: str,
        config: str = "dlight",
        check_lowering: bool = False,
    ) -> None:
        self.rule = rule
        self.algorithm = algorithm
        self.config = config
        self.check_lowering = check_lowering

    def is_target_available(self, target: Target) -> bool:
        return self.rule.is_target_available(target)

    def apply(self, func, target, tunable):
        result = self.rule.apply(func, target, tunable)
        if result is None:
            return None
        if isinstance(result, list):
            if len(result) != 1:
                return result
            result = result[0]
        if self.check_lowering:
            try:
                LowerCrossThreadReduction()(result.mod)
            except Exception:  # TVM raises ValueError, TVMError or InternalError here
                return None
        gpu = target is not None and "gpu" in target.keys
        return _with_record(result, self.algorithm, self.config, gpu=gpu)
