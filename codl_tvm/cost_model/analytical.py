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

Work-per-unit form (``CodlConfig.unit_model = "work"``, the presets of the measured devices).
On the measured data the form above is worse than FLOPs-linear (held-out MAPE 67% vs 36% on
the emulated SoC; the work form below: 26%; H100 pair 62% / 52% / 37%): our kernels'
work per work-item is not fixed (register tiles of 16 OC x 16 columns on PoCL, parallel blocks
of very different sizes on the CPU), so a ``t_unit`` linear in (H, W, IC, OC)
cannot follow ``steps * work``. The work form keeps Eq. 3's non-linearity but reads the block
structure from the dispatch features and makes ``t_unit`` linear in the work one step really
does::

    S = ceil(blocks / cores) * ceil(block / unit)           (GPU: blocks = wg_count,
                                                              block = wg_size; CPU: blocks =
                                                              parallel blocks, block = unit = 1)
    O = unit * ceil(Out / (blocks * block))                 outputs one step computes
    T = S * (t0 + t1 * O * K + t2 * O [+ t3 * O * K * [F == 1]])
        + c_k * kernels + c_in * In + c_out * Out + c_mac * MACs [+ per-F/stride MAC terms]
        [+ c_i * I * K + c_j * I]                           (item_terms; I = Out / items: one
                                                              item's work, the critical path
                                                              of a device that is not full)

(``Out``/``In`` the part's output/input elements, ``K`` the reduction length, ``MACs = Out * K``;
the last line is launch overhead, the padding/copy kernels and a throughput term). Coefficients
per implementation come from relative-error least squares, refined towards least absolute
relative error (``robust_fit``: iteratively reweighted least squares), refitted non-negative when
the fit predicts a non-positive latency on its own training data; predictions never fall below
half the fastest training record of their implementation. Without dispatch features the
configured blocking gives ``blocks = ceil(Out / block_size)``, with coefficient sets fitted on
the same records without their dispatch features (``blind_set``: the planner predicts parts it
has not built). ``filter_variants`` fits one set per filter size and stride where enough
records have it.

The model is a few hundred bytes per implementation; prediction is plain Python arithmetic.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from codl_tvm.cost_model.base import CostModel, records_by_kernel
from codl_tvm.cost_model.dataset import OpRecord
from codl_tvm.cost_model.features import OP_KINDS, PROCESSORS, DispatchFeatures, OpFeatures
from codl_tvm.cost_model.linalg import weighted_lstsq

__all__ = [
    "FORMULAS",
    "PRESETS",
    "UNIT_MODELS",
    "WORK_TERMS",
    "CodlConfig",
    "CodlModel",
    "ProcessorBlocking",
    "has_dispatch",
    "infer_preset",
    "kernel_steps",
    "unit_features",
    "variant_key",
    "work_terms",
]

# Formula -> its kernels, in order; the main kernel is the one dispatch features describe.
FORMULAS: dict[str, tuple[str, ...]] = {
    "direct": ("direct",),
    "gemm": ("packing", "mm"),
    "winograd": ("input_transform", "gemm", "output_transform"),
}
_MAIN_KERNEL = {"direct": "direct", "gemm": "mm", "winograd": "gemm"}
UNIT_MODELS: tuple[str, ...] = ("hwc", "work")
# Terms of the work-per-unit form (see the module docstring), in coefficient order.
WORK_TERMS: tuple[str, ...] = (
    "kernels",
    "steps",
    "steps_out_k",
    "steps_out",
    "in",
    "out",
    "macs",
    "macs_f1",
    "steps_out_k_f1",
    "macs_strided",
    "in_f1",
    "item_out_k",
    "item_out",
)

DEFAULT_IMPL_FORMULAS: tuple[tuple[str, str], ...] = (
    ("direct", "direct"),
    ("generic", "direct"),
    ("dlight", "direct"),
    ("depthwise", "direct"),
    ("packed", "direct"),
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
    unit_model : str
        ``"hwc"``: CoDL's ``t_unit`` linear in (1, H, W, IC, OC[, K]) per kernel of the formula;
        ``"work"``: the work-per-unit form of the module docstring (one term set per
        implementation, block structure from the dispatch features).
    robust_fit : bool
        Refine the relative least squares towards least absolute relative error (IRLS).
    item_terms : bool
        Work form: add one work-item's (or parallel block's) MACs and outputs, the critical
        path of a device that is not full (``item_out_k``, ``item_out``).
    filter_variants : int
        Work form: fit a separate coefficient set per filter size and stride (``F3S1``...;
        the generated code differs, as MACE had one kernel per filter size) where at least
        this many records have it (0: one set per implementation).
    blind_set : bool
        Work form: also fit the coefficient sets without the dispatch features (key
        ``"blind"``), used for features that have none (the planner's: it predicts parts it
        has not built).
    """

    cpu: ProcessorBlocking = ProcessorBlocking(cores=4, block_size=64, unit_size=8)
    gpu: ProcessorBlocking = ProcessorBlocking(cores=8, block_size=256, unit_size=64)
    winograd_tile: int = 2
    impl_formulas: tuple[tuple[str, str], ...] = DEFAULT_IMPL_FORMULAS
    reduction_feature: bool = True
    relative_fit: bool = True
    presync_quantile: float = 1.0
    unit_model: str = "hwc"
    robust_fit: bool = False
    item_terms: bool = True
    filter_variants: int = 0
    blind_set: bool = True
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
        if self.unit_model not in UNIT_MODELS:
            raise ValueError(
                f"CodlConfig.unit_model must be one of {UNIT_MODELS}, got {self.unit_model!r}"
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
            "unit_model": self.unit_model,
            "robust_fit": self.robust_fit,
            "item_terms": self.item_terms,
            "filter_variants": self.filter_variants,
            "blind_set": self.blind_set,
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
            unit_model=str(obj.get("unit_model", "hwc")),
            robust_fit=bool(obj.get("robust_fit", False)),
            item_terms=bool(obj.get("item_terms", True)),
            filter_variants=int(obj.get("filter_variants", 0)),
            blind_set=bool(obj.get("blind_set", False)),
        )


PRESETS: dict[str, CodlConfig] = {
    # A phone-class SoC (CoDL's setting): 4 big cores with 128-bit NEON (4 fp32 lanes, 8x8
    # blocks as in TFLite); a GPU with a few compute units and 64-wide waves.
    "mobile": CodlConfig(cpu=ProcessorBlocking(4, 64, 8), gpu=ProcessorBlocking(4, 256, 64)),
    # This repository's local pair: PoCL on 2 vCPUs as the GPU stand-in, TVM's CPU path.
    "pocl-local": CodlConfig(cpu=ProcessorBlocking(1, 64, 8), gpu=ProcessorBlocking(1, 64, 8)),
    # The emulated SoC of a 16-core Xeon (docs/benchmarks.md): PoCL on 8 cores, TVM on the
    # other 8, skylake-avx512 (16 fp32 lanes).
    # Work-per-unit form: PoCL runs one work-group per core (8) and vectorises 16 fp32 lanes.
    "emulated-soc": CodlConfig(
        cpu=ProcessorBlocking(8, 256, 16),
        gpu=ProcessorBlocking(8, 256, 16),
        unit_model="work",
        robust_fit=True,
        item_terms=False,
        filter_variants=30,
    ),
    # An H100 through NVIDIA OpenCL: 132 SMs, 32-wide warps; its host's 16 Xeon threads.
    "nvidia-h100": CodlConfig(
        cpu=ProcessorBlocking(16, 256, 16),
        gpu=ProcessorBlocking(132, 256, 32),
        unit_model="work",
        robust_fit=True,
        item_terms=True,
        filter_variants=30,
    ),
}


def infer_preset(records: Iterable) -> str:
    """The codl blocking preset for the device a dataset was measured on: ``nvidia-h100`` for an
    NVIDIA OpenCL device, ``emulated-soc`` for PoCL (the CPU OpenCL stand-in for a phone's GPU),
    ``mobile`` (CoDL's phone setting) otherwise."""
    for r in records:
        if isinstance(r, OpRecord) and r.device:
            text = json.dumps(dict(r.device)).lower()
            if "nvidia" in text:
                return "nvidia-h100"
            if "pocl" in text or "portable computing language" in text:
                return "emulated-soc"
            break
    return "mobile"


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


def work_terms(f: OpFeatures, config: CodlConfig) -> list[float]:
    """Terms of the work-per-unit Eq. 3 (``WORK_TERMS``, see the module docstring), from the
    part shape and the real dispatch features (the configured blocking where they are missing).
    """
    q, p, d = f.part, f.params, f.dispatch
    blk = config.blocking(f.processor)
    out = q.out_h * q.out_w * q.oc
    red = p.kernel * p.kernel if f.op == "pool" else (q.ic // max(q.groups, 1)) * p.kernel**2
    macs = float(out) * red
    n_in = float(q.in_h * q.in_w * q.ic)
    if f.processor == "gpu":
        if d.wg_count and d.wg_size:
            blocks, block = d.wg_count, d.wg_size
        else:
            block = blk.block_size
            blocks = _ceil_div(out, block)
        unit = min(blk.unit_size, block)
        steps = _ceil_div(blocks, blk.cores) * _ceil_div(block, unit)
    else:
        blocks = d.cpu_parallel_blocks or _ceil_div(out, blk.block_size)
        block = unit = 1
        steps = _ceil_div(blocks, d.threads or blk.cores)
    item = _ceil_div(out, blocks * block)  # outputs of one work-item / parallel block
    per_step = unit * item  # outputs one step computes
    sok = float(steps) * per_step * red
    f1 = 1.0 if p.kernel == 1 and f.op != "pool" else 0.0
    strided = 1.0 if p.stride > 1 else 0.0
    return [
        float(d.num_kernels or 1),
        float(steps),
        sok,
        float(steps) * per_step,
        n_in,
        float(out),
        macs,
        macs * f1,
        sok * f1,
        macs * strided,
        n_in * f1,
        float(item) * red,
        float(item),
    ]


BLIND = "blind"  # variants key of the coefficient set fitted without dispatch features


def has_dispatch(f: OpFeatures) -> bool:
    """Whether any dispatch feature of ``f`` is known."""
    return any(v is not None for v in vars(f.dispatch).values())


def _without_dispatch(f: OpFeatures) -> OpFeatures:
    return dataclasses.replace(f, dispatch=DispatchFeatures())


def variant_key(f: OpFeatures) -> str:
    """Filter-size/stride variant of an operator (``"F3S1"``), for ``filter_variants``."""
    return f"F{f.params.kernel}S{f.params.stride}"


def _irls_relative(a: np.ndarray, y: np.ndarray, iters: int = 30) -> np.ndarray:
    """Least absolute relative error by iteratively reweighted least squares (started from the
    relative least squares; residuals floored at 1% so rows never get unbounded weight)."""
    w = 1.0 / y
    coef = weighted_lstsq(a, y, w)
    for _ in range(iters):
        rel = np.abs(a @ coef - y) / y
        coef = weighted_lstsq(a, y, w / np.sqrt(np.maximum(rel, 0.01)))
    return coef


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
    variants: dict[str, list[float]] = field(default_factory=dict)  # "F3S1" -> work coefs
    floor_ms: float = 0.0  # work form: no prediction below half the fastest training record

    def to_json(self) -> dict:
        out = {
            "op": self.op,
            "processor": self.processor,
            "impl": self.impl,
            "formula": self.formula,
            "n": self.n,
            "nonneg": self.nonneg,
            "coef": {k: list(v) for k, v in self.coef.items()},
        }
        if self.variants:
            out["variants"] = {k: list(v) for k, v in sorted(self.variants.items())}
        if self.floor_ms:
            out["floor_ms"] = self.floor_ms
        return out

    @classmethod
    def from_json(
        cls, obj: dict, n_features: int, kernels: tuple[str, ...] | None = None
    ) -> _Group:
        formula = obj["formula"]
        if formula not in FORMULAS:
            raise ValueError(f"unknown formula {formula!r}")
        if obj["op"] not in OP_KINDS or obj["processor"] not in PROCESSORS:
            raise ValueError(f"unknown operator kind/processor {obj['op']!r}/{obj['processor']!r}")
        coef = {}
        for kernel in kernels or FORMULAS[formula]:
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
        variants = {}
        for vk, values in obj.get("variants", {}).items():
            if len(values) != n_features or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                for v in values
            ):
                raise ValueError(
                    f"coefficients of {obj['impl']!r} variant {vk!r} must be "
                    f"{n_features} finite numbers, got {values!r}"
                )
            variants[str(vk)] = [float(v) for v in values]
        return cls(
            obj["op"],
            obj["processor"],
            str(obj["impl"]),
            formula,
            coef,
            int(obj["n"]),
            bool(obj.get("nonneg", False)),
            variants,
            float(obj.get("floor_ms", 0.0)),
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
        if self.config.unit_model == "work":
            return WORK_TERMS if self.config.item_terms else WORK_TERMS[:11]
        base = ("const", "h", "w", "ic", "oc")
        return (*base, "k") if self.config.reduction_feature else base

    def _kernels(self, formula: str) -> tuple[str, ...]:
        return ("eq3",) if self.config.unit_model == "work" else FORMULAS.get(formula, ())

    def _design_row(self, formula: str, f: OpFeatures) -> tuple[list[float], list[float]]:
        if self.config.unit_model == "work":
            row = work_terms(f, self.config)[: len(self.feature_names)]
            return row, row
        u = unit_features(f, self.config.reduction_feature)
        steps = kernel_steps(formula, f, self.config)
        return [s * x for _, s in steps for x in u], u

    def _fit_ops(self, records: list[OpRecord]) -> None:
        by_key = records_by_kernel(records)
        self.groups = {}
        n_feat = len(self.feature_names)
        for key, recs in sorted(by_key.items()):
            formula = self.config.formula(key[2])
            kernels = self._kernels(formula)
            n_coef = n_feat * len(kernels)
            if len(recs) < n_coef:
                warnings.warn(
                    f"codl cost model: only {len(recs)} records for {key} (needs "
                    f">= {n_coef}); those operators will use the FLOPs fallback",
                    stacklevel=3,
                )
                continue
            feats = [r.features() for r in recs]
            coef, nonneg = self._fit_rows(formula, feats, recs, kernels)
            variants = {}
            if self.config.unit_model == "work":
                variants = self._fit_variants(formula, feats, recs, kernels, n_coef, "")
                if self.config.blind_set and any(has_dispatch(f) for f in feats):
                    # The planner predicts parts it has not built: no dispatch features. A set
                    # fitted on the same records without them serves those predictions.
                    blind = [_without_dispatch(f) for f in feats]
                    bc, _ = self._fit_rows(formula, blind, recs, kernels)
                    variants[BLIND] = [float(c) for c in bc[0]]
                    variants.update(
                        self._fit_variants(formula, blind, recs, kernels, n_coef, BLIND + "/")
                    )
            self.groups[key] = _Group(
                *key,
                formula,
                {k: [float(c) for c in coef[i]] for i, k in enumerate(kernels)},
                len(recs),
                nonneg,
                variants,
                0.5 * min(r.latency_ms for r in recs) if self.config.unit_model == "work" else 0.0,
            )

    def _fit_variants(self, formula, feats, recs, kernels, n_coef, prefix) -> dict:
        variants = {}
        if not self.config.filter_variants:
            return variants
        by_variant: dict[str, list[int]] = {}
        for i, f in enumerate(feats):
            by_variant.setdefault(variant_key(f), []).append(i)
        for vk, idx in sorted(by_variant.items()):
            if len(idx) >= max(self.config.filter_variants, 2 * n_coef):
                vc, _ = self._fit_rows(
                    formula, [feats[i] for i in idx], [recs[i] for i in idx], kernels
                )
                variants[prefix + vk] = [float(c) for c in vc[0]]
        return variants

    def _work_coef(self, g: _Group, f: OpFeatures) -> list[float]:
        """The coefficient set for ``f``: its filter variant, else the group's, each fitted
        with or without dispatch features as ``f`` has them (sets fitted without them serve
        features without them, where fitted)."""
        vk = variant_key(f)
        if not has_dispatch(f) and BLIND in g.variants:
            return g.variants.get(BLIND + "/" + vk, g.variants[BLIND])
        return g.variants.get(vk, g.coef["eq3"])

    def _fit_rows(
        self, formula: str, feats: list[OpFeatures], recs: list[OpRecord], kernels
    ) -> tuple[np.ndarray, bool]:
        n_feat = len(self.feature_names)
        rows = [self._design_row(formula, f) for f in feats]
        a = np.array([r[0] for r in rows])
        u = np.array([r[1] for r in rows])
        y = np.array([r.latency_ms for r in recs])
        w = 1.0 / y if self.config.relative_fit else None
        if self.config.robust_fit:
            coef = _irls_relative(a, y).reshape(len(kernels), n_feat)
        else:
            coef = weighted_lstsq(a, y, w).reshape(len(kernels), n_feat)
        if self.config.unit_model == "work":
            # Terms may trade off against each other; what must stay positive is T itself.
            negative = np.any(a @ coef[0] <= 0.0)
        else:
            t_unit = u @ coef.T  # (records, kernels)
            negative = np.any(t_unit < -1e-9 * np.abs(t_unit).max(initial=1.0))
        if negative:
            return weighted_lstsq(a, y, w, nonneg=True).reshape(len(kernels), n_feat), True
        return coef, False

    def covers(self, features: OpFeatures) -> bool:
        return (features.op, features.processor, features.impl) in self.groups

    def t_unit(self, features: OpFeatures) -> dict[str, float]:
        """Predicted time of one basic unit per kernel (ms), for inspection."""
        g = self.groups[(features.op, features.processor, features.impl)]
        if self.config.unit_model == "work":
            terms = work_terms(features, self.config)
            steps = terms[1]
            c = self._work_coef(g, features)
            per_step = c[1] + c[2] * terms[2] / steps + c[3] * terms[3] / steps
            per_step += c[8] * terms[8] / steps
            return {"eq3": per_step}
        u = unit_features(features, self.config.reduction_feature)
        return {k: sum(c * x for c, x in zip(v, u)) for k, v in g.coef.items()}

    def _predict_one(self, f: OpFeatures) -> float:
        g = self.groups[(f.op, f.processor, f.impl)]
        if self.config.unit_model == "work":
            coef = self._work_coef(g, f)
            total = sum(c * x for c, x in zip(coef, work_terms(f, self.config)))  # zip: 11 or 13
            # A linear fit can cross zero far outside its data; no kernel beats the fastest
            # measured one by more than 2x.
            return max(total, g.floor_ms, 1e-6)
        u = unit_features(f, self.config.reduction_feature)
        total = 0.0
        for name, steps in kernel_steps(g.formula, f, self.config):
            t = sum(c * x for c, x in zip(g.coef[name], u))
            total += steps * max(t, 0.0)
        return max(total, 1e-6)

    def _predict_covered(self, features: Sequence[OpFeatures]) -> np.ndarray:
        return np.array([self._predict_one(f) for f in features])

    def body_json(self) -> dict:
        return {
            "config": self.config.to_json(),
            "features": list(self.feature_names),
            "groups": [g.to_json() for _, g in sorted(self.groups.items())],
        }

    def load_body(self, body: dict) -> None:
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
            g = _Group.from_json(obj, n_feat, self._kernels(obj.get("formula", "direct")))
            self.groups[(g.op, g.processor, g.impl)] = g
