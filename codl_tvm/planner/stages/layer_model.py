"""Pipe-it's layer performance model: one-core latency (Eq. 5) and multi-core scaling (Eq. 8).

Pipe-it (Wang et al., "High-Throughput CNN Inference on Embedded ARM big.LITTLE Multi-Core
Processors") predicts the latency of every major layer on every homogeneous core configuration
of a processor group from the layer's GEMM shape alone:

- a convolution is the GEMM of an image matrix ``[N x K]`` and a filter matrix ``[K x M]`` with
  ``N = O_w * O_h`` (output size), ``K = F_w * F_h * F_d`` (filter size), ``M = Ofm`` (output
  maps); a fully-connected layer is ``N = 1`` (one frame), ``K`` inputs, ``M`` neurons;
- **Eq. 5**, one core: ``T = b1 N + b2 K + b3 M + b4 NK + b5 KM + b6 NM + b7 NMK + b8``, fitted by
  least squares per (processor group, layer type) on one-core measurements (by default on
  relative errors with non-negative coefficients, see :meth:`PipeModel.fit`);
- **Eq. 8**, ``H`` cores: ``T_H = (T - a1) / H + a2 N / (ts H) + a3``, fitted per (group, layer
  type) on multi-core measurements, with ``T`` the layer's one-core latency. The tile size ``ts``
  is a constant of the kernel library, so it is folded into the fitted coefficient: this module
  stores ``a2 / ts`` as ``alpha[1]`` (per output row and core).

A processor group is any set of identical processors that one pipeline stage may use a part of:
a CPU cluster (its core count is the most a stage of it can use) or an accelerator counted as
one "core" (the GPU: Eq. 5 fits it like a one-core group and Eq. 8 is never used for it).

Records are :class:`PipeRecord` (one measured layer on one group with a core count); the model is
one JSON file (``format``/``version``/``kind`` like the project's cost models), and
:meth:`PipeModel.latency_table` gives the search (:mod:`codl_tvm.planner.stages.search`) its time
matrix: predicted milliseconds of every layer on every (group, core count).

:func:`amdahl_table` is the other predictor: no fit, two *measured* columns per CPU group (each
layer on one core and on every core) and ``T_H = serial + parallel / H`` through them per
layer. It needs those two columns of the model itself (``2`` timings per layer and group
instead of ``cores``), and on tables measured on a 16-core Xeon it was far closer than Eq. 5/8
fitted on other models: Eq. 8 is the same form with its coefficients shared by a layer type,
where this takes each layer's own.

:func:`on_demand_table` measures a column only where the search would use it: it plans on
:func:`piecewise_amdahl_table` (Amdahl's law between adjacent measured core counts), measures the
columns the chosen pipeline uses that are still predicted, and plans again until the choice
uses measured columns alone. The measured tables' errors against any smooth scaling law are
mostly per column (a whole (group, core count) column of one model 0.7-1.4x its interpolation,
with other models of the same run, or the same model measured again, off the other way), so
no fit on other columns or other models predicts them; the search then picks the columns it
underestimates. Measuring what the choice uses removes those underestimates from the choice
itself, at some 6-11 of a 16-column table's columns on the stored runs.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from codl_tvm.core.errors import DatasetError, ModelFileError, PlannerError
from codl_tvm.core.stage_plan import LayerShape, PipeRecord

__all__ = [
    "EQ5_TERMS",
    "FIT_LOSSES",
    "PIPE_MODEL_FORMAT",
    "PIPE_MODEL_VERSION",
    "GroupFit",
    "LayerShape",
    "OnDemandTable",
    "PipeModel",
    "PipeRecord",
    "amdahl_table",
    "eq5_features",
    "on_demand_table",
    "piecewise_amdahl_table",
]

PIPE_MODEL_FORMAT = "codl-tvm-pipe-model"
PIPE_MODEL_VERSION = 1
# The names of Eq. 5's terms, in the order of its coefficients b1..b8.
EQ5_TERMS = ("N", "K", "M", "NK", "KM", "NM", "NMK", "1")
# How fit() weighs its errors (see PipeModel.fit).
FIT_LOSSES = ("relative", "absolute")
# A linear model can predict <= 0 ms for a tiny layer; the search divides by stage latencies, so
# predictions are floored at this value (1 ns) instead.
MIN_LATENCY_MS = 1e-6


def eq5_features(
    out_pixels: np.ndarray, filter_size: np.ndarray, out_maps: np.ndarray
) -> np.ndarray:
    """Eq. 5's design matrix: one row per layer, columns in the order of :data:`EQ5_TERMS`."""
    n = np.asarray(out_pixels, dtype=np.float64)
    k = np.asarray(filter_size, dtype=np.float64)
    m = np.asarray(out_maps, dtype=np.float64)
    return np.stack([n, k, m, n * k, k * m, n * m, n * m * k, np.ones_like(n)], axis=-1)


def _lstsq(
    x: np.ndarray, y: np.ndarray, what: str, *, relative: bool = False, nonneg: bool = False
) -> np.ndarray:
    """Least squares with column scaling: Eq. 5's terms span ~10 orders of magnitude.

    ``relative`` minimises the squared *relative* error (each row divided by its ``y``), so a
    0.1 ms layer weighs as much as a 20 ms one; ``nonneg`` constrains every coefficient to
    ``>= 0`` (solved exactly by trying every set of free coefficients: Eq. 5 has 8).
    """
    if relative:
        x, y = x / y[:, None], np.ones_like(y)
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale
    rank = np.linalg.matrix_rank(xs)
    if rank < x.shape[1]:
        raise DatasetError(
            f"{what}: {x.shape[0]} records determine only {rank} of {x.shape[1]} coefficients "
            "(measure layers of more varied shapes)"
        )
    coef, *_ = np.linalg.lstsq(xs, y, rcond=None)
    if nonneg and np.any(coef < 0):
        # the non-negative optimum is the unconstrained optimum on its own positive set
        best, best_err = np.zeros(x.shape[1]), float(np.sum(y * y))
        for free in itertools.product((False, True), repeat=x.shape[1]):
            cols = np.flatnonzero(free)
            if cols.size == 0:
                continue
            sub, *_ = np.linalg.lstsq(xs[:, cols], y, rcond=None)
            if np.any(sub < 0):
                continue
            err = float(np.sum((xs[:, cols] @ sub - y) ** 2))
            if err < best_err:
                best, best_err = np.zeros(x.shape[1]), err
                best[cols] = sub
        coef = best
    return coef / scale


@dataclass(frozen=True)
class GroupFit:
    """Fitted coefficients of one (processor group, layer type).

    Parameters
    ----------
    group, layer_type
        What the coefficients describe.
    beta
        Eq. 5's ``b1..b8`` (milliseconds per unit of each term of :data:`EQ5_TERMS`).
    alpha
        Eq. 8's ``(a1, a2 / ts, a3)`` in milliseconds, or None where no multi-core records were
        given (the group then predicts one core only).
    n_single, n_multi
        How many one-core and multi-core records the coefficients were fitted on.
    """

    group: str
    layer_type: str
    beta: tuple[float, ...]
    alpha: tuple[float, float, float] | None
    n_single: int
    n_multi: int

    def to_json(self) -> dict:
        return {
            "group": self.group,
            "layer_type": self.layer_type,
            "beta": list(self.beta),
            "alpha": None if self.alpha is None else list(self.alpha),
            "n_single": self.n_single,
            "n_multi": self.n_multi,
        }

    @classmethod
    def from_json(cls, obj: Mapping) -> GroupFit:
        beta = tuple(float(b) for b in obj["beta"])
        if len(beta) != len(EQ5_TERMS):
            raise ValueError(f"beta has {len(beta)} coefficients, Eq. 5 has {len(EQ5_TERMS)}")
        alpha = obj["alpha"]
        if alpha is not None:
            alpha = tuple(float(a) for a in alpha)
            if len(alpha) != 3:
                raise ValueError(f"alpha has {len(alpha)} coefficients, Eq. 8 has 3")
        return cls(
            group=str(obj["group"]),
            layer_type=str(obj["layer_type"]),
            beta=beta,
            alpha=alpha,
            n_single=int(obj["n_single"]),
            n_multi=int(obj["n_multi"]),
        )


class PipeModel:
    """Pipe-it's per-layer latency model over named processor groups.

    Parameters
    ----------
    groups
        Processor group name -> the most cores a stage of it can use (1 for an accelerator).

    Examples
    --------
    >>> model = PipeModel({"big": 4, "little": 4, "gpu": 1})  # doctest: +SKIP
    >>> model.fit(records)  # doctest: +SKIP
    >>> table = model.latency_table(layers)  # {("big", 1): ms per layer, ...}  # doctest: +SKIP
    """

    kind = "pipe-it"

    def __init__(self, groups: Mapping[str, int]) -> None:
        if not groups:
            raise PlannerError("a Pipe-it model needs at least one processor group")
        for name, cores in groups.items():
            if not isinstance(name, str) or not name:
                raise PlannerError(f"processor group names must be non-empty strings: {name!r}")
            if isinstance(cores, bool) or not isinstance(cores, int | np.integer) or cores < 1:
                raise PlannerError(f"processor group {name!r}: cores must be >= 1, got {cores!r}")
        self.groups: dict[str, int] = {name: int(c) for name, c in groups.items()}
        self.fits: dict[tuple[str, str], GroupFit] = {}

    # fit ------------------------------------------------------------------------------------
    def check_record(self, record: PipeRecord) -> None:
        """Refuse a record this model's groups cannot hold (unknown group, too many cores)."""
        if record.group not in self.groups:
            raise DatasetError(
                f"record of layer {record.layer.name!r}: unknown processor group "
                f"{record.group!r} (groups: {', '.join(sorted(self.groups))})"
            )
        if record.cores > self.groups[record.group]:
            raise DatasetError(
                f"record of layer {record.layer.name!r}: {record.cores} cores on group "
                f"{record.group!r}, which has {self.groups[record.group]}"
            )

    def fit(self, records: Iterable[PipeRecord], *, loss: str = "relative") -> PipeModel:
        """Fit Eq. 5 and Eq. 8 for every (group, layer type) the records cover.

        Every record is checked before anything is fitted. Eq. 5 needs at least 8 one-core
        records of varied shapes per (group, layer type); Eq. 8 is fitted where multi-core
        records exist (at least 3, with varied core counts or sizes), each against the layer's
        measured one-core latency when one was recorded, else against Eq. 5's prediction.

        Parameters
        ----------
        records
            The measured layers.
        loss
            ``"absolute"``: ordinary least squares on milliseconds (the paper's fit).
            ``"relative"`` (default): least squares on relative errors, with Eq. 5's
            coefficients ``>= 0``. On a real time matrix the layers span three orders of
            magnitude: an absolute fit is decided by the few largest layers and predicts
            small ones badly, often <= 0 (floored to 1 ns, which a search then piles layers
            onto); with every term of Eq. 5 positive, non-negative coefficients never
            predict <= 0.

        Raises
        ------
        DatasetError
            A bad record, a (group, layer type) with no one-core records, or records that do
            not determine the coefficients.
        """
        if loss not in FIT_LOSSES:
            raise DatasetError(f"unknown loss {loss!r} (choose from {', '.join(FIT_LOSSES)})")
        relative = loss == "relative"
        records = list(records)
        if not records:
            raise DatasetError("no records to fit the Pipe-it model on")
        for r in records:
            if not isinstance(r, PipeRecord):
                raise DatasetError(f"not a PipeRecord: {r!r}")
            self.check_record(r)
        by_key: dict[tuple[str, str], list[PipeRecord]] = {}
        for r in records:
            by_key.setdefault((r.group, r.layer.layer_type), []).append(r)
        fits: dict[tuple[str, str], GroupFit] = {}
        for (group, ltype), recs in sorted(by_key.items()):
            single = [r for r in recs if r.cores == 1]
            multi = [r for r in recs if r.cores > 1]
            what = f"group {group!r}, layer type {ltype!r}"
            if not single:
                raise DatasetError(f"{what}: no one-core records (Eq. 5 needs them)")
            beta = _lstsq(
                _design(single),
                _latencies(single),
                f"{what}, Eq. 5",
                relative=relative,
                nonneg=relative,
            )
            alpha = None
            if multi:
                # The layer's own one-core measurement isolates Eq. 8's error from Eq. 5's.
                measured = {}
                for r in single:
                    measured.setdefault(_shape_key(r.layer), []).append(r.latency_ms)
                t1 = np.array(
                    [
                        float(np.mean(measured[_shape_key(r.layer)]))
                        if _shape_key(r.layer) in measured
                        else _eq5(beta, r.layer)
                        for r in multi
                    ]
                )
                h = np.array([float(r.cores) for r in multi])
                n = np.array([float(r.layer.out_pixels) for r in multi])
                # T_H - T/H = a1 * (-1/H) + (a2/ts) * (N/H) + a3
                x = np.stack([-1.0 / h, n / h, np.ones_like(h)], axis=-1)
                t_h = _latencies(multi)
                if relative:
                    # relative to T_H: (x @ a) / T_H = 1 - T / (H T_H)
                    x, y = x / t_h[:, None], 1.0 - t1 / (h * t_h)
                else:
                    y = t_h - t1 / h
                alpha = tuple(float(a) for a in _lstsq(x, y, f"{what}, Eq. 8"))
            fits[(group, ltype)] = GroupFit(
                group=group,
                layer_type=ltype,
                beta=tuple(float(b) for b in beta),
                alpha=alpha,
                n_single=len(single),
                n_multi=len(multi),
            )
        self.fits = fits
        return self

    # predict --------------------------------------------------------------------------------
    def predict(self, layer: LayerShape, group: str, cores: int = 1) -> float:
        """Predicted latency in milliseconds of ``layer`` on ``cores`` cores of ``group``.

        Raises
        ------
        PlannerError
            An unknown group, more cores than the group has, or a (group, layer type) the model
            was not fitted for (or fitted on one core only and asked for several).
        """
        if group not in self.groups:
            raise PlannerError(
                f"unknown processor group {group!r} (groups: {', '.join(sorted(self.groups))})"
            )
        if isinstance(cores, bool) or not isinstance(cores, int | np.integer) or cores < 1:
            raise PlannerError(f"cores must be a positive integer, got {cores!r}")
        if cores > self.groups[group]:
            raise PlannerError(f"group {group!r} has {self.groups[group]} cores, not {cores}")
        fit = self.fits.get((group, layer.layer_type))
        if fit is None:
            raise PlannerError(
                f"the Pipe-it model has no fit for layer type {layer.layer_type!r} on group "
                f"{group!r} (layer {layer.name!r})"
            )
        t1 = _eq5(np.asarray(fit.beta), layer)
        if cores == 1:
            return max(t1, MIN_LATENCY_MS)
        if fit.alpha is None:
            raise PlannerError(
                f"the Pipe-it model has no multi-core fit for layer type {layer.layer_type!r} "
                f"on group {group!r} (layer {layer.name!r} on {cores} cores)"
            )
        a1, a2_ts, a3 = fit.alpha
        t_multi = (t1 - a1) / cores + a2_ts * layer.out_pixels / cores + a3
        return max(t_multi, MIN_LATENCY_MS)

    def latency_table(
        self, layers: Sequence[LayerShape], groups: Mapping[str, int] | None = None
    ) -> dict[tuple[str, int], np.ndarray]:
        """Pipe-it's time matrix: predicted ms of every layer on every (group, core count).

        Parameters
        ----------
        layers
            The model's major layers in execution order.
        groups
            Group -> most cores a stage may use (default: the model's groups); every count
            from 1 to that number gets a column.
        """
        groups = self.groups if groups is None else groups
        return {
            (g, c): np.array([self.predict(layer, g, c) for layer in layers])
            for g, most in groups.items()
            for c in range(1, int(most) + 1)
        }

    # files ----------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "format": PIPE_MODEL_FORMAT,
            "version": PIPE_MODEL_VERSION,
            "kind": self.kind,
            "groups": dict(self.groups),
            "fits": [f.to_json() for _, f in sorted(self.fits.items())],
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write the model as one JSON file (through a temporary file, so a failed write never
        leaves half a model behind)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> PipeModel:
        """Read a model written by :meth:`save`.

        Raises
        ------
        ModelFileError
            The file is unreadable, not JSON, not a Pipe-it model, of another version, or has a
            malformed entry; the message names the file.
        """
        path = Path(path)
        try:
            obj = json.loads(path.read_text())
        except OSError as e:
            raise ModelFileError(f"{path}: cannot read the Pipe-it model: {e.strerror}") from e
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelFileError(f"{path}: not a JSON file ({e})") from e
        if not isinstance(obj, dict) or obj.get("format") != PIPE_MODEL_FORMAT:
            raise ModelFileError(f"{path}: not a Pipe-it model (format != {PIPE_MODEL_FORMAT!r})")
        if obj.get("version") != PIPE_MODEL_VERSION:
            raise ModelFileError(
                f"{path}: Pipe-it model version {obj.get('version')!r}, this codl-tvm reads "
                f"version {PIPE_MODEL_VERSION}"
            )
        try:
            model = cls(obj["groups"])
            fits = [GroupFit.from_json(f) for f in obj["fits"]]
        except (KeyError, TypeError, ValueError, PlannerError) as e:
            raise ModelFileError(f"{path}: malformed Pipe-it model: {e}") from e
        for f in fits:
            if f.group not in model.groups:
                raise ModelFileError(f"{path}: a fit names unknown group {f.group!r}")
            model.fits[(f.group, f.layer_type)] = f
        return model


def _shape_key(layer: LayerShape) -> tuple[str, str, int, int, int]:
    return (layer.name, layer.layer_type, layer.out_pixels, layer.filter_size, layer.out_maps)


def _design(records: Sequence[PipeRecord]) -> np.ndarray:
    return eq5_features(
        np.array([r.layer.out_pixels for r in records]),
        np.array([r.layer.filter_size for r in records]),
        np.array([r.layer.out_maps for r in records]),
    )


def _latencies(records: Sequence[PipeRecord]) -> np.ndarray:
    return np.array([float(r.latency_ms) for r in records])


def _eq5(beta: np.ndarray, layer: LayerShape) -> float:
    x = eq5_features(
        np.array(layer.out_pixels), np.array(layer.filter_size), np.array(layer.out_maps)
    )
    return float(x @ np.asarray(beta))


def _anchored_columns(
    measured: Mapping[tuple[str, int], Sequence[float] | np.ndarray],
    groups: Mapping[str, int],
) -> dict[tuple[str, int], np.ndarray]:
    """``measured`` as float arrays, checked to be of one length and to hold every group's
    one-core and all-core columns (the anchors both Amdahl tables predict from)."""
    out = {(str(g), int(c)): np.asarray(v, dtype=np.float64) for (g, c), v in measured.items()}
    lengths = {v.shape for v in out.values()}
    if len(lengths) > 1:
        raise PlannerError(f"measured columns of different lengths: {sorted(lengths)}")
    for g, most in groups.items():
        for anchor in {1, most}:
            if (g, anchor) not in out:
                raise PlannerError(
                    f"group {g!r}: no measured latencies on {anchor} core(s) to predict from"
                )
    return out


def amdahl_table(
    measured: Mapping[tuple[str, int], Sequence[float] | np.ndarray],
    groups: Mapping[str, int],
) -> dict[tuple[str, int], np.ndarray]:
    """A full time matrix from two measured columns per group, by Amdahl's law per layer.

    Parameters
    ----------
    measured
        ``(group, cores) -> ms per layer``; must hold ``(g, 1)`` and ``(g, groups[g])`` for
        every group (a group of one core, e.g. the GPU, needs ``(g, 1)`` alone). Other measured
        entries are kept as they are.
    groups
        Group name -> the most cores one stage of it may use.

    Returns
    -------
    dict
        ``(group, cores) -> ms per layer`` for every group and 1..``groups[g]`` cores: the
        measured columns, and between them ``T_H = T_1 - p + p / H`` with the parallel part
        ``p = (T_1 - T_n) * n / (n - 1)`` through the two anchors (floored at
        :data:`MIN_LATENCY_MS`; a layer slower on ``n`` cores than on one gets ``p < 0`` and
        grows with ``H``, as measured).

    Raises
    ------
    PlannerError
        An anchor column missing, or columns of different lengths.
    """
    out = _anchored_columns(measured, groups)
    anchors = {(g, c): out[(g, c)] for g, most in groups.items() for c in {1, most}}
    # the other measured columns are kept, not interpolated through
    return {**piecewise_amdahl_table(anchors, groups), **out}


def piecewise_amdahl_table(
    measured: Mapping[tuple[str, int], Sequence[float] | np.ndarray],
    groups: Mapping[str, int],
) -> dict[tuple[str, int], np.ndarray]:
    """A full time matrix through every measured column, by Amdahl's law between adjacent ones.

    Parameters
    ----------
    measured
        ``(group, cores) -> ms per layer``; must hold ``(g, 1)`` and ``(g, groups[g])`` for
        every group, and may hold any core counts between them.
    groups
        Group name -> the most cores one stage of it may use.

    Returns
    -------
    dict
        ``(group, cores) -> ms per layer`` for every group and 1..``groups[g]`` cores: the
        measured columns as given, and between two adjacent measured counts ``a < b`` each
        layer's ``T_H = s + p / H`` through ``T_a`` and ``T_b`` (``p = (T_a - T_b) / (1/a -
        1/b)``, floored at :data:`MIN_LATENCY_MS`). With the anchors 1 and ``groups[g]`` alone
        this is :func:`amdahl_table`.

    Raises
    ------
    PlannerError
        An anchor column missing, a column of a group not in ``groups`` or beyond its cores,
        or columns of different lengths.
    """
    out = _anchored_columns(measured, groups)
    for g, c in out:
        if g not in groups or not 1 <= c <= groups[g]:
            raise PlannerError(
                f"measured column {g}:{c} is not a core count of the groups "
                f"({', '.join(f'{n}:1-{m}' for n, m in groups.items())})"
            )
    for g in groups:
        anchors = sorted(c for name, c in out if name == g)
        for lo, hi in itertools.pairwise(anchors):
            t_lo, t_hi = out[(g, lo)], out[(g, hi)]
            parallel = (t_lo - t_hi) / (1.0 / lo - 1.0 / hi)
            serial = t_lo - parallel / lo
            for h in range(lo + 1, hi):
                out[(g, h)] = np.maximum(serial + parallel / h, MIN_LATENCY_MS)
    return out


@dataclass(frozen=True)
class OnDemandTable:
    """What :func:`on_demand_table` returns.

    Parameters
    ----------
    table
        ``(group, cores) -> ms per layer`` for every column: measured where ``measured`` says,
        predicted by :func:`piecewise_amdahl_table` elsewhere.
    measured
        The columns measured, in the order they were measured (the anchors first).
    rounds
        How many times the chosen pipeline asked for columns not yet measured.
    """

    table: dict[tuple[str, int], np.ndarray]
    measured: tuple[tuple[str, int], ...]
    rounds: int


def on_demand_table(
    measure: Callable[[str, int], Sequence[float] | np.ndarray],
    groups: Mapping[str, int],
    used: Callable[[Mapping[tuple[str, int], np.ndarray]], Iterable[tuple[str, int]]],
) -> OnDemandTable:
    """A time matrix measured where the pipeline chosen from it runs, predicted elsewhere.

    Starts from each group's one-core and all-core columns, predicts the others with
    :func:`piecewise_amdahl_table`, asks ``used`` which columns the pipeline chosen on that
    table runs on, measures those not yet measured and repeats until the choice runs on
    measured columns alone. Each round measures at least one more column, so it ends after at
    most as many rounds as the table has columns; the chosen pipeline's latencies are then
    measured ones, which a search cannot underestimate.

    Parameters
    ----------
    measure
        ``(group, cores) -> ms per layer`` of the model on that many cores of the group (for
        example :func:`codl_tvm.profiling.layers.measure_layers` with ``core_counts``).
    groups
        Group name -> the most cores one stage of it may use (1 for an accelerator).
    used
        A predicted table -> the ``(group, cores)`` of every stage of the pipeline the search
        chooses on it (the search is the caller's: this module does not plan).

    Raises
    ------
    PlannerError
        ``used`` names a column outside ``groups``, or ``measure`` returns columns of
        different lengths.
    """
    measured: dict[tuple[str, int], np.ndarray] = {}
    for g, most in groups.items():
        for c in sorted({1, int(most)}):
            measured[(g, c)] = np.asarray(measure(g, c), dtype=np.float64)
    rounds = 0
    while True:
        table = piecewise_amdahl_table(measured, groups)
        wanted = sorted({(str(g), int(c)) for g, c in used(table)} - set(measured))
        if not wanted:
            return OnDemandTable(table, tuple(measured), rounds)
        for g, c in wanted:
            if g not in groups or not 1 <= c <= groups[g]:
                raise PlannerError(
                    f"the chosen pipeline runs on {g}:{c}, not a column of the groups"
                )
            measured[(g, c)] = np.asarray(measure(g, c), dtype=np.float64)
        rounds += 1
