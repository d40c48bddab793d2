"""The CoDL split planner's configuration: search space, thresholds and the planner modes.

Owns :class:`PlannerConfig` (the GPU shares and dimensions tried, chain search limits, the gain
margins, the implementation choices, calibrations), the modes
:func:`~codl_tvm.planner.split.search.plan_model` runs (:data:`MODES`: CoDL and its baselines)
and CoDL's ideal bound (:func:`ideal_latency`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from codl_tvm.core.errors import PlannerError
from codl_tvm.core.plan import PartitionDim
from codl_tvm.cost_model.measured import MeasuredModel

__all__ = ["DEFAULT_RATIOS", "MODES", "SPLIT_MARGINS", "PlannerConfig", "ideal_latency"]

DEFAULT_RATIOS: tuple[float, ...] = tuple(i / 10 for i in range(11))
MODES: tuple[str, ...] = (
    "codl",
    "codl_no_chain",
    "h_only",
    "oc_only",
    "ulayer_like",
    "cpu_only",
    "gpu_only",
)
#: ``PlannerConfig.split_margin``: ``novel`` holds the splits of operators outside the cost
#: model's data to its stored leave-one-model-out error, ``lomo`` every split, ``none`` chooses
#: them as CoDL does.
SPLIT_MARGINS: tuple[str, ...] = ("novel", "lomo", "none")


@dataclass(frozen=True)
class PlannerConfig:
    """Search space and thresholds of the planner.

    Parameters
    ----------
    ratios
        GPU shares tried (0 and 1, if present, are ignored for splits: they are the whole-op
        options, which are always considered).
    dims
        Partition dimensions tried (``"H"``, ``"OC"``).
    chains
        Search operator chains (CoDL Algorithm 1).
    chain_delta
        A chain's ``rho`` is searched within this distance of its head's ``rho`` (CoDL: 0.3).
    max_chain_len
        Longest chain tried.
    min_gain_ms
        A split (chain) must beat the best single processor (no-chain) by more than this.
    impls
        ``(op kind, processor, impl)`` triples naming the implementation the cost model should
        predict (op kinds of the cost model: ``conv2d``, ``dense``, ``pool``). Unlisted: the
        fastest predicted implementation the model covers for the operator, or ``direct``.
    dtype_bytes
        Bytes per element for the sharing costs.
    chain_min_gain
        A chain is kept only when its predicted gain exceeds this fraction of its operators'
        predicted latency planned one by one (besides ``min_gain_ms``). Predicted chain gains
        are small (0.6-12% per chain, 0.2-3.8% per model on the benchmark models) against the
        cost model's ~20% per-part error, and on the emulated SoC the unchained plan ran faster
        than the chained one on 4 of 5 models in one run and 5 of 5 in the next (0.87-0.92x).
        As the 1.08x fallback margin does for co-execution itself, the margin keeps only chains
        predicted to gain clearly; 0 is Algorithm 1 as published.
    switch_costs
        A whole operator placed away from the plan's home processor (the one predicted faster
        for the whole model, where the data of the kernels outside the plan lives) pays the
        sharing costs of its input and output, as a split's part would. Without them the
        planner scatters single operators to the other processor for gains smaller than the
        switch (Inception v1 on the H100: a quarter of its convs whole on the CPU, 3x slower
        than the GPU alone).
    processor_scale
        ``(cpu, gpu)`` factors on every predicted compute latency of that processor
        (:meth:`~codl_tvm.cost_model.CostModel.scaled`): a calibration to a whole model's
        measured single-processor latencies, which differ from the sum of its operators measured
        one by one (caches, the kernels outside the plan). ``compile --verify`` re-plans with
        ``measured / predicted`` of each processor alone. (1, 1): the cost model as fitted.
    weight_gbps
        ``(cpu, gpu)`` weight-streaming rates inside a model, GB/s
        (:meth:`~codl_tvm.cost_model.CostModel.streaming`): every part, and every operator
        run whole, is predicted no faster than its weights' bytes over its processor's rate.
        Measured from timelines (``scripts/plan_vs_timeline.py``); at k = 12 batch-1 dense
        parts ran a median 2.9x (CPU) and 1.6x (GPU) slower inside the models than profiled
        alone. None: off.
    cpu, gpu
        The schedule configs of the build (:class:`~codl_tvm.schedules.CPUConfig`,
        :class:`~codl_tvm.schedules.OpenCLConfig`, as :func:`~codl_tvm.schedules.cpu_config`
        returns them for the targets): the planner predicts the implementation they select
        (:func:`expected_impl`: Winograd, packed convs) where the cost model has data for it,
        and names in the report's notes the operators it could not. None: the direct and GEMM
        kernels of the presets.
    split_margin
        ``"lomo"``: an operator is split only where the split's predicted gain over its best
        whole placement exceeds the expected error of the comparison, read from the cost
        model's ``meta["lomo_error"]``
        (:func:`~codl_tvm.cost_model.uncertainty.split_margin`: the larger of the whole
        prediction's and the split's leave-one-model-out error times its predicted latency);
        otherwise it runs whole, the report saying so. ``"novel"`` (default): that margin for
        the operators outside the cost model's data only (a class, kernel or shape it was not
        fitted on); the others split by CoDL's rule. Held to every operator, the margin scored
        worse on the benchmark models' measured splits (docs/benchmarks.md): inside the data
        the predictions rank splits better than their error suggests. A model without stored
        errors splits without a margin, with a note. ``"none"``: CoDL's rule (any gain above
        ``min_gain_ms``).
    margin_quantiles
        ``(inside, novel)``: the quantile of the leave-one-model-out error taken as the margin
        for an operator inside the cost model's data and for a novel one (a class, kernel or
        shape outside it, :meth:`~codl_tvm.cost_model.uncertainty.DataRanges.novelty`); both
        must be among the quantiles the model stores (0.8 and 0.9).
    tuned_parts
        Parts of operators measured on the target (``compile --tune``,
        :func:`codl_tvm.objectives.tune.tune_operators`): each operator the table holds whole
        on both processors is planned on its measurements alone
        (:meth:`~codl_tvm.cost_model.CostModel.with_measurements`: whole, or split at a
        measured share, never in a chain), with no margin, its decision ``measured``. None:
        every operator predicted.
    gpu_channels
        OC cuts of dense convolutions (and OC chains holding one) give the GPU a multiple of
        this many channels where that costs little: 4 when the GPU's data type is images
        (``compile --gpu-data-type image|auto``), whose parts compute on images only with
        whole RGBA pixels (:class:`~codl_tvm.passes.texture_parts.PackGpuParts`). Each grid
        share is also tried rounded to the nearest such cut, and the best rounded split is
        taken where it is predicted within ``gpu_channels_slack`` of the best split. 1: off.
    gpu_channels_slack
        How much slower (a fraction of its predicted latency) a rounded split may be predicted
        than the best split and still be taken.
    gpu_images
        The GPU parts compute on images (CoDL's hybrid data type,
        :class:`~codl_tvm.passes.texture_parts.PackGpuParts`), so each pays the image
        conversions at its ends, in its sharing cost: a split's GPU part the pack of its input
        and the unpack of its output, a chain's only at its ends, and a
        whole operator moved to the GPU from a CPU home the conversions of its input and
        output (:meth:`~codl_tvm.planner.split.predict.Predictor.conversion_ms`; convs, the
        operators whose GPU parts go on images). The cost comes from the cost model's
        ``image_pack`` / ``image_unpack`` sharing kinds, or from the conversion fit of its
        ``meta["gpu_data_type"]`` record (``codl-tvm profile --data-type``); without either,
        it is 0 and the plan is the buffers' one. None (default): on exactly where
        ``gpu_channels > 1``, which a compile sets where its GPU parts go on images
        (:func:`codl_tvm.objectives.gpu_data.planner_channels`). :attr:`images` resolves it.
    """

    ratios: tuple[float, ...] = DEFAULT_RATIOS
    dims: tuple[str, ...] = ("H", "OC")
    chains: bool = True
    chain_delta: float = 0.3
    max_chain_len: int = 8
    min_gain_ms: float = 0.0
    chain_min_gain: float = 0.10
    impls: tuple[tuple[str, str, str], ...] = ()
    dtype_bytes: int = 4
    switch_costs: bool = True
    processor_scale: tuple[float, float] = (1.0, 1.0)
    weight_gbps: tuple[float, float] | None = None
    cpu: Any = None
    gpu: Any = None
    split_margin: str = "novel"
    margin_quantiles: tuple[float, float] = (0.8, 0.9)
    tuned_parts: MeasuredModel | None = None
    gpu_channels: int = 1
    gpu_channels_slack: float = 0.05
    gpu_images: bool | None = None

    def __post_init__(self) -> None:
        ratios = tuple(sorted({float(r) for r in self.ratios}))
        if not ratios or any(math.isnan(r) or not 0.0 <= r <= 1.0 for r in ratios):
            raise PlannerError(f"planner: ratios must be numbers in [0, 1], got {self.ratios!r}")
        object.__setattr__(self, "ratios", ratios)
        dims = tuple(PartitionDim.parse(d, "planner config").value for d in self.dims)
        object.__setattr__(self, "dims", dims)
        if not 0.0 <= self.chain_delta <= 1.0:
            raise PlannerError(f"planner: chain_delta must be in [0, 1], got {self.chain_delta!r}")
        if self.max_chain_len < 1:
            raise PlannerError(f"planner: max_chain_len must be >= 1, got {self.max_chain_len!r}")
        if self.min_gain_ms < 0:
            raise PlannerError(f"planner: min_gain_ms must be >= 0, got {self.min_gain_ms!r}")
        if not 0.0 <= self.chain_min_gain < 1.0:
            raise PlannerError(
                f"planner: chain_min_gain must be in [0, 1), got {self.chain_min_gain!r}"
            )
        if self.weight_gbps is not None:
            w = self.weight_gbps
            rates = tuple(w) if isinstance(w, (tuple, list)) else ()
            if len(rates) != 2 or not all(
                isinstance(r, (int, float)) and 0 < r < math.inf for r in rates
            ):
                raise PlannerError(
                    f"planner: weight_gbps must be two positive rates in GB/s (cpu, gpu), got {w!r}"
                )
            object.__setattr__(self, "weight_gbps", (float(rates[0]), float(rates[1])))
        if self.split_margin not in SPLIT_MARGINS:
            raise PlannerError(
                f"planner: split_margin must be one of {SPLIT_MARGINS}, got {self.split_margin!r}"
            )
        q = tuple(self.margin_quantiles)
        if len(q) != 2 or not all(isinstance(x, (int, float)) and 0.0 < x < 1.0 for x in q):
            raise PlannerError(
                "planner: margin_quantiles must be two quantiles in (0, 1) (inside the data, "
                f"novel), got {self.margin_quantiles!r}"
            )
        object.__setattr__(self, "margin_quantiles", (float(q[0]), float(q[1])))
        if int(self.gpu_channels) != self.gpu_channels or self.gpu_channels < 1:
            raise PlannerError(
                f"planner: gpu_channels must be a whole number >= 1, got {self.gpu_channels!r}"
            )
        if not 0.0 <= self.gpu_channels_slack < 1.0:
            raise PlannerError(
                f"planner: gpu_channels_slack must be in [0, 1), got {self.gpu_channels_slack!r}"
            )
        if self.gpu_images is not None and not isinstance(self.gpu_images, bool):
            raise PlannerError(
                f"planner: gpu_images must be True, False or None, got {self.gpu_images!r}"
            )
        for triple in self.impls:
            if len(triple) != 3 or triple[1] not in ("cpu", "gpu"):
                raise PlannerError(
                    f"planner: impls entries are (op kind, 'cpu'|'gpu', impl), got {triple!r}"
                )

    @property
    def images(self) -> bool:
        """Whether the GPU parts pay image conversions (``gpu_images``; None: where
        ``gpu_channels > 1``)."""
        return self.gpu_channels > 1 if self.gpu_images is None else self.gpu_images

    @property
    def split_ratios(self) -> tuple[float, ...]:
        """The GPU shares tried for splits: ``ratios`` strictly between 0 and 1."""
        return tuple(r for r in self.ratios if 0.0 < r < 1.0)


def ideal_latency(cpu_ms: float, gpu_ms: float) -> float:
    """CoDL's ideal co-execution bound ``T* = 1 / (1/Tcpu + 1/Tgpu)``."""
    if cpu_ms <= 0 or gpu_ms <= 0:
        return min(cpu_ms, gpu_ms)
    return 1.0 / (1.0 / cpu_ms + 1.0 / gpu_ms)
