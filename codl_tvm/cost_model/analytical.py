"""CoDL's non-linearity-extracted latency model (CoDL section 5.2, Eq. 3 and Table 1).

For each (operator kind, processor, implementation) the latency of a part is a sum over the
kernels of the implementation's formula (Table 1)::

    T = sum_k  m_k * ceil(Size_k / (Size_block * cores)) * ceil(Size_block / Size_unit) * t_k

with ``t_k = c_k . (1, H, W, IC, OC, K)`` learned by (relative-error) linear least squares;
(H, W, IC, OC) are the part's output height/width and channels, as in CoDL, and ``K`` (the
reduction length per output, IC/groups * F^2) is added so one model covers several filter sizes
(``CodlConfig.reduction_feature``; CoDL's MACE had one kernel per filter size). When a fit makes
some ``t_k`` negative on its own training data, it is refitted with non-negative coefficients.

Formulas (``Size_k`` from the part shape; ``m`` = Winograd output tile, ``a = m + F - 1``):

- ``direct``: one kernel, Size = H * W * OC.
- ``gemm``: packing, Size = H * W * IC * F^2; matrix multiply, Size = H * W * IC/g * OC * F^2.
- ``winograd``: input transform, Size = IC * Psi * a^2 with Psi = ceil(H/m) * ceil(W/m);
  ``a^2`` GEMMs of Size = Psi * IC * OC; output transform, Size = OC * Psi * m^2.

Blocking (``Size_block``, ``Size_unit``, cores) comes from a per-device ``CodlConfig``; when a
record carries the real dispatch features of the main kernel (the direct kernel, the matrix
multiply, the Winograd GEMM), those replace the configured blocking for it:
GPU ``ceil(wg_count / cores) * ceil(wg_size / unit)`` (waves of work-groups times warps per
work-group), CPU ``ceil(blocks / threads) * ceil(ceil(Size / blocks) / vector_width)``.

The model is a few hundred bytes per implementation; prediction is plain Python arithmetic.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from codl_tvm.cost_model._linalg import weighted_lstsq
from codl_tvm.cost_model.base import CostModel
from codl_tvm.cost_model.dataset import OpRecord
from codl_tvm.cost_model.features import OP_KINDS, PROCESSORS, OpFeatures

__all__ = [
    "FORMULAS",
    "PRESETS",
    "CodlConfig",
    "CodlModel",
    "ProcessorBlocking",
    "kernel_steps",
    "unit_features",
]

# Formula -> its kernels, in order; the main kernel is the one dispatch features describe.
FORMULAS: dict[str, tuple[str, ...]] = {
    "direct": ("direct",),
    "gemm": ("packing", "mm"),
    "winograd": ("input_transform", "gemm", "output_transform"),
}
_MAIN_KERNEL = {"direct": "direct", "gemm": "mm", "winograd": "gemm"}

DEFAULT_IMPL_FORMULAS: tuple[tuple[str, str], ...] = (
    ("direct", "direct"),
    ("generic", "direct"),
    ("dlight", "direct"),
    ("depthwise", "direct"),
    ("pool", "direct"),
    ("gemm", "gemm"),
    ("im2col", "gemm"),
    ("im2col_gemm", "gemm"),
    ("matmul", "gemm"),
    ("winograd", "winograd"),
)


@dataclass(frozen=True)
class ProcessorBlocking:
    """Blocking of one processor (Table 1's Omega, Phi_c, phi_c).

    Parameters
    ----------
    cores : int
        Cores that run blocks in parallel (GPU compute units, CPU threads).
    block_size : int
        Elements (work items) per block: a work-group on the GPU, a parallel chunk on the CPU.
    unit_size : int
        Elements per basic execution unit: the warp/wavefront on the GPU, the SIMD width on
        the CPU.
    """

    cores: int
    block_size: int
    unit_size: int

    def __post_init__(self) -> None:
        for name in ("cores", "block_size", "unit_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ProcessorBlocking.{name} must be an integer >= 1, got {v!r}")


@dataclass(frozen=True)
class CodlConfig:
    """Per-device configuration of the analytical model.

    Parameters
    ----------
    cpu, gpu : ProcessorBlocking
        Blocking of each processor (used when a record has no dispatch features).
    winograd_tile : int
        Winograd output tile ``m`` (Phi_wt), e.g. 2 for F(2x2, 3x3).
    impl_formulas : tuple[tuple[str, str], ...]
        Implementation name -> formula (``direct``, ``gemm``, ``winograd``); unlisted names use
        ``direct`` (one kernel).
    reduction_feature : bool
        Add K = IC/groups * F^2 to the (1, H, W, IC, OC) features of ``t_unit``.
    relative_fit : bool
        Weight rows by 1 / latency (relative error) in the least squares.
    presync_quantile : float
        Quantile of the measured pre-sync times used as T_psync (1.0: the upper bound, CoDL).
    """

    cpu: ProcessorBlocking = ProcessorBlocking(cores=4, block_size=64, unit_size=8)
    gpu: ProcessorBlocking = ProcessorBlocking(cores=8, block_size=256, unit_size=64)
    winograd_tile: int = 2
    impl_formulas: tuple[tuple[str, str], ...] = DEFAULT_IMPL_FORMULAS
    reduction_feature: bool = True
    relative_fit: bool = True
    presync_quantile: float = 1.0
    _formula_map: dict = field(default=None, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.winograd_tile, int) or self.winograd_tile < 1:
            raise ValueError(
                f"CodlConfig.winograd_tile must be an integer >= 1, got {self.winograd_tile!r}"
            )
        for impl, formula in self.impl_formulas:
            if formula not in FORMULAS:
                raise ValueError(
                    f"CodlConfig.impl_formulas: formula {formula!r} of {impl!r} is "
                    f"not one of {sorted(FORMULAS)}"
                )
        if not 0.0 <= self.presync_quantile <= 1.0:
            raise ValueError(
                f"CodlConfig.presync_quantile must be in [0, 1], got {self.presync_quantile!r}"
            )
        object.__setattr__(self, "_formula_map", dict(self.impl_formulas))

    def formula(self, impl: str) -> str:
        return self._formula_map.get(impl, "direct")

    def blocking(self, processor: str) -> ProcessorBlocking:
        return self.gpu if processor == "gpu" else self.cpu

    def to_json(self) -> dict:
        return {
            "cpu": vars(self.cpu).copy(),
            "gpu": vars(self.gpu).copy(),
            "winograd_tile": self.winograd_tile,
            "impl_formulas": [list(p) for p in self.impl_formulas],
            "reduction_feature": self.reduction_feature,
            "relative_fit": self.relative_fit,
            "presync_quantile": self.presync_quantile,
        }

    @classmethod
    def from_json(cls, obj: dict) -> CodlConfig:
        return cls(
            cpu=ProcessorBlocking(**obj["cpu"]),
            gpu=ProcessorBlocking(**obj["gpu"]),
            winograd_tile=obj["winograd_tile"],
            impl_formulas=tuple((str(a), str(b)) for a, b in obj["impl_formulas"]),
            reduction_feature=bool(obj["reduction_feature"]),
            relative_fit=bool(obj["relative_fit"]),
            presync_quantile=float(obj["presync_quantile"]),
        )


PRESETS: dict[str, CodlConfig] = {
    # A phone-class SoC (CoDL's setting): 4 big cores with 128-bit NEON (4 fp32 lanes, 8x8
    # blocks as in TFLite); a GPU with a few compute units and 64-wide waves.
    "mobile": CodlConfig(cpu=ProcessorBlocking(4, 64, 8), gpu=ProcessorBlocking(4, 256, 64)),
    # This repository's local pair: PoCL on 2 vCPUs as the GPU stand-in, TVM's CPU path.
    "pocl-local": CodlConfig(cpu=ProcessorBlocking(1, 64, 8), gpu=ProcessorBlocking(1, 64, 8)),
    # The device machine's emulated SoC (DEVICE.md): PoCL on 8 cores, TVM on the other 8,
    # skylake-avx512 (16 fp32 lanes).
    "emulated-soc": CodlConfig(
        cpu=ProcessorBlocking(8, 256, 16), gpu=ProcessorBlocking(8, 256, 16)
    ),
    # The device machine's H100 through NVIDIA OpenCL: 132 SMs, 32-wide warps.
    "nvidia-h100": CodlConfig(
        cpu=ProcessorBlocking(8, 256, 16), gpu=ProcessorBlocking(132, 256, 32)
    ),
}


def _ceil_div(a: float, b: float) -> int:
    return -(-int(a) // int(b))


def unit_features(f: OpFeatures, reduction_feature: bool = True) -> list[float]:
    """Features of the linear ``t_unit`` model: (1, H, W, IC, OC[, K]) of the part."""
    q = f.part
    feats = [1.0, float(q.out_h), float(q.out_w), float(q.ic), float(q.oc)]
    if reduction_feature:
        k = f.params.kernel
        red = k * k if f.op == "pool" else (q.ic // max(q.groups, 1)) * k * k
        feats.append(float(red))
    return feats


def _work_sizes(formula: str, f: OpFeatures, tile: int) -> list[tuple[str, int, int]]:
    """(kernel, multiplicity, Size) per kernel of ``formula`` (Table 1)."""
    q, k = f.part, f.params.kernel
    hw = q.out_h * q.out_w
    cin = q.ic // max(q.groups, 1)
    if formula == "direct":
        return [("direct", 1, hw * q.oc)]
    if formula == "gemm":
        return [("packing", 1, hw * q.ic * k * k), ("mm", 1, hw * cin * q.oc * k * k)]
    alpha = tile + k - 1
    tiles = _ceil_div(q.out_h, tile) * _ceil_div(q.out_w, tile)
    return [
        ("input_transform", 1, q.ic * tiles * alpha * alpha),
        ("gemm", alpha * alpha, tiles * cin * q.oc),
        ("output_transform", 1, q.oc * tiles * tile * tile),
    ]


def kernel_steps(formula: str, f: OpFeatures, config: CodlConfig) -> list[tuple[str, int]]:
    """Eq. 3's non-linear factor per kernel: ``m * ceil(Size/(block*cores)) *
    ceil(block/unit)``, with the main kernel's real dispatch features when present."""
    blk = config.blocking(f.processor)
    d = f.dispatch
    out = []
    for name, mult, size in _work_sizes(formula, f, config.winograd_tile):
        steps = None
        if name == _MAIN_KERNEL[formula]:
            if f.processor == "gpu" and d.wg_count and d.wg_size:
                steps = _ceil_div(d.wg_count, blk.cores) * _ceil_div(d.wg_size, blk.unit_size)
            elif f.processor == "cpu" and d.cpu_parallel_blocks:
                blocks = d.cpu_parallel_blocks
                steps = _ceil_div(blocks, d.threads or blk.cores) * _ceil_div(
                    _ceil_div(size, blocks), d.vector_width or blk.unit_size
                )
        if steps is None:
            steps = mult * (
                _ceil_div(size, blk.block_size * blk.cores)
                * _ceil_div(blk.block_size, blk.unit_size)
            )
        out.append((name, steps))
    return out


@dataclass
class _Group:
    """Fitted coefficients of one (operator kind, processor, implementation)."""

    op: str
    processor: str
    impl: str
    formula: str
    coef: dict[str, list[float]]  # kernel -> coefficients of unit_features
    n: int
    nonneg: bool = False

    def to_json(self) -> dict:
        return {
            "op": self.op,
            "processor": self.processor,
            "impl": self.impl,
            "formula": self.formula,
            "n": self.n,
            "nonneg": self.nonneg,
            "coef": {k: list(v) for k, v in self.coef.items()},
        }

    @classmethod
    def from_json(cls, obj: dict, n_features: int) -> _Group:
        formula = obj["formula"]
        if formula not in FORMULAS:
            raise ValueError(f"unknown formula {formula!r}")
        if obj["op"] not in OP_KINDS or obj["processor"] not in PROCESSORS:
            raise ValueError(f"unknown operator kind/processor {obj['op']!r}/{obj['processor']!r}")
        coef = {}
        for kernel in FORMULAS[formula]:
            values = obj["coef"][kernel]
            if len(values) != n_features or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                for v in values
            ):
                raise ValueError(
                    f"coefficients of {obj['impl']!r}/{kernel} must be "
                    f"{n_features} finite numbers, got {values!r}"
                )
            coef[kernel] = [float(v) for v in values]
        return cls(
            obj["op"],
            obj["processor"],
            str(obj["impl"]),
            formula,
            coef,
            int(obj["n"]),
            bool(obj.get("nonneg", False)),
        )


class CodlModel(CostModel):
    """CoDL's predictor: Eq. 3 per implementation, Eq. 2 composition (see module docstring).

    Parameters
    ----------
    config : CodlConfig | str
        Blocking of the device pair, or the name of a preset in ``PRESETS``.
    """

    kind = "codl"

    def __init__(self, config: CodlConfig | str = "mobile") -> None:
        super().__init__()
        if isinstance(config, str):
            if config not in PRESETS:
                raise ValueError(f"unknown CodlConfig preset {config!r} (known: {sorted(PRESETS)})")
            config = PRESETS[config]
        self.config = config
        self.presync_quantile = config.presync_quantile
        self.groups: dict[tuple[str, str, str], _Group] = {}

    @property
    def feature_names(self) -> tuple[str, ...]:
        base = ("const", "h", "w", "ic", "oc")
        return (*base, "k") if self.config.reduction_feature else base

    def _design_row(self, formula: str, f: OpFeatures) -> tuple[list[float], list[float]]:
        u = unit_features(f, self.config.reduction_feature)
        steps = kernel_steps(formula, f, self.config)
        return [s * x for _, s in steps for x in u], u

    def _fit_ops(self, records: list[OpRecord]) -> None:
        by_key: dict[tuple[str, str, str], list[OpRecord]] = {}
        for r in records:
            by_key.setdefault((r.op, r.processor, r.impl), []).append(r)
        self.groups = {}
        n_feat = len(self.feature_names)
        for key, recs in sorted(by_key.items()):
            formula = self.config.formula(key[2])
            kernels = FORMULAS[formula]
            n_coef = n_feat * len(kernels)
            if len(recs) < n_coef:
                warnings.warn(
                    f"codl cost model: only {len(recs)} records for {key} (needs "
                    f">= {n_coef}); those operators will use the FLOPs fallback",
                    stacklevel=3,
                )
                continue
            feats = [r.features() for r in recs]
            rows = [self._design_row(formula, f) for f in feats]
            a = np.array([r[0] for r in rows])
            u = np.array([r[1] for r in rows])
            y = np.array([r.latency_ms for r in recs])
            w = 1.0 / y if self.config.relative_fit else None
            coef = weighted_lstsq(a, y, w).reshape(len(kernels), n_feat)
            nonneg = False
            t_unit = u @ coef.T  # (records, kernels)
            if np.any(t_unit < -1e-9 * np.abs(t_unit).max(initial=1.0)):
                coef = weighted_lstsq(a, y, w, nonneg=True).reshape(len(kernels), n_feat)
                nonneg = True
            self.groups[key] = _Group(
                *key,
                formula,
                {k: [float(c) for c in coef[i]] for i, k in enumerate(kernels)},
                len(recs),
                nonneg,
            )

    def covers(self, features: OpFeatures) -> bool:
        return (features.op, features.processor, features.impl) in self.groups

    def t_unit(self, features: OpFeatures) -> dict[str, float]:
        """Predicted time of one basic unit per kernel (ms), for inspection."""
        g = self.groups[(features.op, features.processor, features.impl)]
        u = unit_features(features, self.config.reduction_feature)
        return {k: sum(c * x for c, x in zip(v, u)) for k, v in g.coef.items()}

    def _predict_one(self, f: OpFeatures) -> float:
        g = self.groups[(f.op, f.processor, f.impl)]
        u = unit_features(f, self.config.reduction_feature)
        total = 0.0
        for name, steps in kernel_steps(g.formula, f, self.config):
            t = sum(c * x for c, x in zip(g.coef[name], u))
            total += steps * max(t, 0.0)
        return max(total, 1e-6)

    def _predict_covered(self, features: Sequence[OpFeatures]) -> np.ndarray:
        return np.array([self._predict_one(f) for f in features])

    def _body_json(self) -> dict:
        return {
            "config": self.config.to_json(),
            "features": list(self.feature_names),
            "groups": [g.to_json() for _, g in sorted(self.groups.items())],
        }

    def _load_body(self, body: dict) -> None:
        self.config = CodlConfig.from_json(body["config"])
        self.presync_quantile = self.config.presync_quantile
        if list(body["features"]) != list(self.feature_names):
            raise ValueError(
                f"feature names {body['features']!r} do not match the config "
                f"({list(self.feature_names)!r})"
            )
        n_feat = len(self.feature_names)
        self.groups = {}
        for obj in body["groups"]:
            g = _Group.from_json(obj, n_feat)
            self.groups[(g.op, g.processor, g.impl)] = g
