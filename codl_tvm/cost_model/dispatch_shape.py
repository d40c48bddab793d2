"""The work of an operator part and how its kernel spreads it over the processor: the
dispatch shape (:func:`dispatch_shape`) and the ``"dispatch"`` feature set of the GBDT
(:func:`shape_features`, named by :data:`SHAPE_FEATURE_NAMES`), from a part's shape and its
recorded dispatch features. The GBDT's wave base (``gbdt.WaveBase``) prices the same shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from codl_tvm.cost_model.features import OpFeatures, weight_bytes

__all__ = [
    "SHAPE_FEATURE_NAMES",
    "THREADS_PER_CU",
    "DispatchShape",
    "dispatch_shape",
    "shape_features",
]

#: Dispatch-shape features of the ``"dispatch"`` feature set (:func:`shape_features`), after
#: :data:`FEATURE_NAMES`.
SHAPE_FEATURE_NAMES: tuple[str, ...] = (
    "tz_oc",
    "tz_out_h",
    "tz_out_w",
    "tz_ic",
    "tz_out_hw",
    "oc_mod16",
    "oc_mod8",
    "out_w_odd",
    "waves",
    "waves_ceil",
    "wave_tail",
    "wg_per_cu",
    "outputs_per_item_ceil",
    "in_bytes",
    "weight_bytes",
    "out_bytes",
    "bytes",
    "intensity",
    "log_macs",
    "macs_per_cu",
)

#: Work-items one compute unit keeps resident (an NVIDIA SM: 2048 threads): a GPU wave is
#: ``compute_units * THREADS_PER_CU`` work-items. Occupancy limits (registers, local memory)
#: are not visible in the dispatch features; the fitted coefficients and the trees absorb them.
THREADS_PER_CU = 2048


def _trailing_zeros(n: int, cap: int = 8) -> float:
    """Times 2 divides ``n`` (at most ``cap``; 0 for 0): whether a tile divides the extent."""
    return float(min((n & -n).bit_length() - 1, cap)) if n > 0 else 0.0


@dataclass(frozen=True)
class DispatchShape:
    """Work of one part and how its kernel spreads it over the processor (see
    :func:`dispatch_shape`)."""

    outputs: int
    reduction: int
    units: int  # parallel units: GPU work-items, CPU parallel blocks
    slots: int  # units the processor runs at once
    in_bytes: int
    weight_bytes: int
    out_bytes: int

    @property
    def macs(self) -> float:
        return float(self.outputs) * self.reduction

    @property
    def waves(self) -> float:
        return self.units / self.slots

    @property
    def per_unit_macs(self) -> float:
        """Multiply-adds of the busiest unit: outputs per unit (ceil) x reduction."""
        return float(-(-self.outputs // self.units)) * self.reduction


def dispatch_shape(f: OpFeatures, compute_units: int) -> DispatchShape:
    """The part's work and dispatch shape: parallel units are the GPU's work-items (work-group
    size x count) or the CPU's parallel blocks; a processor runs ``compute_units x``
    :data:`THREADS_PER_CU` work-items (GPU) or ``threads`` blocks (CPU; ``compute_units`` when
    unknown) at once. Without dispatch features (a part nobody built yet) every unit computes
    one output, as many as the processor runs at once."""
    q, p, d = f.part, f.params, f.dispatch
    out = q.out_h * q.out_w * q.oc
    red = p.kernel * p.kernel if f.op == "pool" else (q.ic // max(q.groups, 1)) * p.kernel**2
    cu = max(1, compute_units)
    if f.processor == "gpu":
        slots = cu * THREADS_PER_CU
        units = d.wg_size * d.wg_count if d.wg_size and d.wg_count else None
    else:
        slots = d.threads or cu
        units = d.cpu_parallel_blocks
    if units is None:
        units = max(1, min(out, slots))
    return DispatchShape(
        out,
        red,
        units,
        slots,
        4 * q.in_h * q.in_w * q.ic,
        weight_bytes(f.op, q, p.kernel),
        4 * out,
    )


def shape_features(f: OpFeatures, compute_units: int) -> list[float]:
    """The :data:`SHAPE_FEATURE_NAMES` of a part: powers of two dividing its extents (a tile
    that divides an extent needs no bounds checks, one that does not runs idle lanes), waves
    of its parallel units over the processor (:func:`dispatch_shape`; whole waves and the
    last wave's fill, the tail), work-groups per compute unit (GPU; NaN elsewhere or unknown),
    outputs per unit (ceil), bytes read and written, multiply-adds per byte, log multiply-adds
    and multiply-adds per compute unit."""
    q, d = f.part, f.dispatch
    s = dispatch_shape(f, compute_units)
    nan = float("nan")
    known = (d.wg_size and d.wg_count) if f.processor == "gpu" else d.cpu_parallel_blocks
    waves = s.waves
    nbytes = s.in_bytes + s.weight_bytes + s.out_bytes
    wg_per_cu = d.wg_count / max(1, compute_units) if f.processor == "gpu" and known else nan
    return [
        _trailing_zeros(q.oc),
        _trailing_zeros(q.out_h),
        _trailing_zeros(q.out_w),
        _trailing_zeros(q.ic),
        _trailing_zeros(q.out_h * q.out_w),
        float(q.oc % 16),
        float(q.oc % 8),
        float(q.out_w % 2),
        waves if known else nan,
        float(math.ceil(waves)) if known else nan,
        waves - math.floor(waves) if known else nan,
        wg_per_cu,
        float(-(-s.outputs // s.units)) if known else nan,
        float(s.in_bytes),
        float(s.weight_bytes),
        float(s.out_bytes),
        float(nbytes),
        s.macs / max(1, nbytes),
        math.log(s.macs + 1.0),
        s.macs / max(1, compute_units),
    ]
