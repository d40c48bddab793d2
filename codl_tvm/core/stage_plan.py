"""Pipe-it's contract: what profiling measures for the stage search and what the search returns.

Owns the types that cross layers (profiling measures them, the planner reads them, the build
and the pipeline artifact take the plan), as :mod:`codl_tvm.core.plan` does for CoDL's splits:

- :class:`LayerShape` and :class:`PipeRecord`: a major layer's GEMM shape (Pipe-it Eq. 4) and
  one measured latency of it on a processor group;
- :class:`LatencyTable`: Pipe-it's time matrix, ms of every layer on every (group, core count),
  with optional measured stages; :class:`HandOff`: the stream executor's cost per stage, which
  no layer's latency holds;
- :class:`StageConfig`, :class:`PipelineStage` and :class:`PipelinePlan`: the pipeline the
  search returns (stages in order, each a contiguous run of layers on its processors).

Pure Python and numpy; the processor groups themselves are :mod:`codl_tvm.core.groups`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from codl_tvm.core.errors import DatasetError, PlannerError
from codl_tvm.core.groups import ProcessorGroup

__all__ = [
    "HandOff",
    "LatencyTable",
    "LayerShape",
    "PipeRecord",
    "PipelinePlan",
    "PipelineStage",
    "StageConfig",
]


@dataclass(frozen=True)
class LayerShape:
    """The GEMM shape of one major layer (Pipe-it Eq. 4).

    Parameters
    ----------
    name
        The layer's name (for messages and tables).
    layer_type
        The layer type its coefficients are fitted for (``"conv2d"``, ``"depthwise_conv2d"``,
        ``"dense"``, ...); each type has its own Eq. 5 and Eq. 8 coefficients.
    out_pixels
        ``N``: output height times width (1 for a fully-connected layer).
    filter_size
        ``K``: filter height times width times input depth (input features for a dense layer).
    out_maps
        ``M``: output feature maps (neurons for a dense layer).
    """

    name: str
    layer_type: str
    out_pixels: int
    filter_size: int
    out_maps: int

    def __post_init__(self) -> None:
        if not isinstance(self.layer_type, str) or not self.layer_type:
            raise DatasetError(f"layer {self.name!r}: layer_type must be a non-empty string")
        for field in ("out_pixels", "filter_size", "out_maps"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise DatasetError(
                    f"layer {self.name!r}: {field} must be a positive integer, got {value!r}"
                )


@dataclass(frozen=True)
class PipeRecord:
    """One measured latency: a layer on ``cores`` cores of processor group ``group``.

    Parameters
    ----------
    layer
        The layer's shape.
    group
        The processor group's name (``"big"``, ``"little"``, ``"gpu"``).
    cores
        How many of the group's cores ran the layer (1 for an accelerator).
    latency_ms
        The measured latency in milliseconds (finite, > 0).
    """

    layer: LayerShape
    group: str
    cores: int
    latency_ms: float

    def __post_init__(self) -> None:
        where = f"record of layer {self.layer.name!r} on {self.group!r}"
        if isinstance(self.cores, bool) or not isinstance(self.cores, int | np.integer):
            raise DatasetError(f"{where}: cores must be an integer, got {self.cores!r}")
        if self.cores < 1:
            raise DatasetError(f"{where}: cores must be >= 1, got {self.cores}")
        lat = self.latency_ms
        if not isinstance(lat, int | float | np.floating) or not math.isfinite(lat) or lat <= 0:
            raise DatasetError(f"{where} x{self.cores}: latency_ms must be > 0, got {lat!r}")


@dataclass(frozen=True)
class HandOff:
    """The executor's cost per stage, which no layer's latency holds.

    Parameters
    ----------
    stage_ms
        What one frame's hand-over costs a stage (queue get and put, thread wake-up); added to
        every stage's latency. The Python steps of every stage are serialised by the
        interpreter lock, so a pipeline of ``S`` stages also takes at least
        ``(S + 1) * stage_ms`` per frame (the ``+ 1``: the feeder).
    """

    stage_ms: float = 0.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.stage_ms) or self.stage_ms < 0:
            raise PlannerError(f"hand-off cost must be finite and >= 0 ms, got {self.stage_ms!r}")

    def min_cycle_ms(self, stages: int) -> float:
        """The shortest time per frame of a pipeline of ``stages`` stages."""
        return (stages + 1) * self.stage_ms if stages else 0.0


@dataclass(frozen=True)
class StageConfig:
    """One stage's processors: ``cores`` cores of group ``group`` (1 for a GPU)."""

    group: str
    cores: int


class LatencyTable:
    """Pipe-it's time matrix: ms of every layer on every (group, core count).

    Parameters
    ----------
    latency_ms
        ``(group, cores) -> per-layer latencies in ms`` (one value per layer, in layer order,
        finite and >= 0).
    layer_names
        Optional names of the layers (for plans and messages).
    stage_ms
        Optional measured stages, ``(group, cores, first layer, stop layer) -> ms``: the time
        of layers ``[first, stop)`` run as one stage, which the search takes instead of the sum
        of their latencies (:meth:`with_stages`). A stage of many layers runs slower than its
        layers timed one at a time, each repeated with its weights warm in the caches.
    """

    def __init__(
        self,
        latency_ms: Mapping[tuple[str, int], Sequence[float] | np.ndarray],
        layer_names: Sequence[str] | None = None,
        stage_ms: Mapping[tuple[str, int, int, int], float] | None = None,
    ) -> None:
        if not latency_ms:
            raise PlannerError("the latency table is empty")
        self._ms: dict[tuple[str, int], np.ndarray] = {}
        n_layers = None
        for key, values in latency_ms.items():
            arr = np.asarray(values, dtype=np.float64)
            if arr.ndim != 1 or arr.size == 0:
                raise PlannerError(f"latency table {key}: expected one value per layer")
            if n_layers is None:
                n_layers = arr.size
            elif arr.size != n_layers:
                raise PlannerError(
                    f"latency table {key}: {arr.size} layers, other entries have {n_layers}"
                )
            if not np.all(np.isfinite(arr)) or np.any(arr < 0):
                bad = int(np.flatnonzero(~np.isfinite(arr) | (arr < 0))[0])
                raise PlannerError(
                    f"latency table {key}: layer {bad} has latency {float(arr[bad])!r} ms (must be "
                    "finite and >= 0)"
                )
            self._ms[(str(key[0]), int(key[1]))] = arr
        self.n_layers: int = int(n_layers)
        if layer_names is not None and len(layer_names) != self.n_layers:
            raise PlannerError(
                f"{len(layer_names)} layer names for a table of {self.n_layers} layers"
            )
        self.layer_names = None if layer_names is None else tuple(layer_names)
        # prefix sums: the latency of layers [a, b) on a config is one subtraction
        self._prefix = {k: np.concatenate([[0.0], np.cumsum(v)]) for k, v in self._ms.items()}
        self.stage_ms: dict[tuple[str, int, int, int], float] = {}
        for key, ms in (stage_ms or {}).items():
            group, cores, first, stop = str(key[0]), int(key[1]), int(key[2]), int(key[3])
            if (group, cores) not in self._ms:
                raise PlannerError(
                    f"measured stage {key}: the table has no entry for {cores} core(s) of {group!r}"
                )
            if not 0 <= first < stop <= self.n_layers:
                raise PlannerError(
                    f"measured stage {key}: layers [{first}, {stop}) outside the table's "
                    f"{self.n_layers} layers"
                )
            if not math.isfinite(ms) or ms < 0:
                raise PlannerError(f"measured stage {key}: {ms!r} ms (must be finite and >= 0)")
            self.stage_ms[(group, cores, first, stop)] = float(ms)

    def __getitem__(self, key: tuple[str, int]) -> np.ndarray:
        return self._ms[key]

    def __contains__(self, key: object) -> bool:
        return key in self._ms

    def keys(self) -> list[tuple[str, int]]:
        """The ``(group, cores)`` entries of the table."""
        return list(self._ms)

    def prefix(self, config: StageConfig) -> np.ndarray:
        """Prefix sums of ``config``'s per-layer latencies (length ``n_layers + 1``)."""
        return self._prefix[(config.group, config.cores)]

    def measured(self, config: StageConfig) -> Iterator[tuple[int, int, float]]:
        """``(first, stop, ms)`` of every measured stage on ``config``."""
        for (group, cores, first, stop), ms in self.stage_ms.items():
            if group == config.group and cores == config.cores:
                yield first, stop, ms

    def with_stages(self, stage_ms: Mapping[tuple[str, int, int, int], float]) -> LatencyTable:
        """This table with ``stage_ms`` measured stages added (replacing any of the same key)."""
        return LatencyTable(self._ms, self.layer_names, {**self.stage_ms, **stage_ms})

    def check(self, groups: Sequence[ProcessorGroup]) -> None:
        """Refuse a table that lacks an entry the search needs for ``groups``."""
        for g in groups:
            for c in range(1, g.most_stage_cores + 1):
                if (g.name, c) not in self:
                    raise PlannerError(
                        f"the latency table has no entry for {c} core(s) of group {g.name!r}"
                    )


@dataclass(frozen=True)
class PipelineStage:
    """One stage of a pipeline.

    Parameters
    ----------
    group
        The processor group's name.
    core_count
        Cores of the group the stage uses (1 for a GPU).
    cores
        The host core ids the stage runs on (consecutive slices of its group's cores in stage
        order; a GPU stage carries its group's host cores).
    first_layer, stop_layer
        The stage runs layers ``first_layer .. stop_layer - 1``.
    latency_ms
        Its layers' latency plus the transfer of its output to the next stage and the
        executor's hand-off (:attr:`HandOff.stage_ms`).
    """

    group: str
    core_count: int
    cores: tuple[int, ...]
    first_layer: int
    stop_layer: int
    latency_ms: float


@dataclass(frozen=True)
class PipelinePlan:
    """A pipeline: stages in order, each a contiguous run of layers on its processors.

    ``min_cycle_ms`` is the executor's floor on the time per frame for this many stages
    (:meth:`HandOff.min_cycle_ms`; 0 without a hand-off cost).
    """

    stages: tuple[PipelineStage, ...]
    method: str
    min_cycle_ms: float = 0.0

    @property
    def bottleneck_ms(self) -> float:
        """The slowest stage's latency, or the executor's floor where that is higher: one frame
        leaves the pipeline this often."""
        return max(self.min_cycle_ms, *(s.latency_ms for s in self.stages))

    @property
    def throughput_fps(self) -> float:
        """Frames per second at steady state (Pipe-it Eq. 11)."""
        return 1000.0 / self.bottleneck_ms if self.bottleneck_ms > 0 else math.inf

    def describe(self) -> str:
        """A one-line summary: ``big4[0:35] - little2[35:44] - gpu1[44:54]``."""
        return " - ".join(
            f"{s.group}{s.core_count}[{s.first_layer}:{s.stop_layer}]" for s in self.stages
        )

    def to_json(self) -> dict:
        """The plan as JSON-ready data (what the pipeline artifact's manifest records)."""
        return {
            "method": self.method,
            "throughput_fps": self.throughput_fps,
            "min_cycle_ms": self.min_cycle_ms,
            "stages": [
                {
                    "group": s.group,
                    "core_count": s.core_count,
                    "cores": list(s.cores),
                    "layers": [s.first_layer, s.stop_layer],
                    "latency_ms": s.latency_ms,
                }
                for s in self.stages
            ],
        }
