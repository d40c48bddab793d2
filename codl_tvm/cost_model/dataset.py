"""Versioned latency datasets: one JSON object per line, small enough to commit.

File layout (``*.jsonl``), one JSON object per line::

    {"format": "codl-tvm-latency-dataset", "version": 1, "meta": {...}}        # header, line 1
    {"type": "device", "id": "d0", "desc": {"gpu": "PoCL 5.0, 8 CUs", ...}}    # before its use
    {"type": "op", "device": "d0", "op": "conv2d", "params": {...}, "partition": {...},
     "processor": "gpu", "impl": "direct", "dispatch": {...}, "latency_ms": 1.25,
     "repeats": 10, "number": 2, "min_ms": 1.21, "max_ms": 1.34, "name": "conv_3"}
    {"type": "sharing", "device": "d0", "kind": "map", "nbytes": 802816, "latency_ms": 0.21,
     "repeats": 20}

``part`` (the part's shape, ``features.PartShape``) is written only where it differs from
``features.part_shape``'s convention with unaligned matmul cuts (``RECORD_MATMUL_ALIGN``, the cut
of the first datasets; the build now aligns them, so new matmul parts store their shape),
``dispatch`` only where known, ``name`` only where given. Device descriptions are stored once
(``device`` lines) and referenced by id, so thousands of records stay small. Appending is
resumable: ``DatasetWriter`` reopens a file, checks its header, drops an incomplete last line (a
run killed mid-write), knows the keys already measured (``OpRecord.key``) and flushes every record
as it is written.

``latency_ms`` is the median of ``repeats`` samples (each the mean of a timed run of ``number``
calls). Records written since the profiler recorded its spread also carry ``number`` and the
fastest and slowest sample, ``min_ms`` and ``max_ms`` (optional: older files have neither; their
protocol is in the header's ``meta["timing"]`` when known). Every field is validated on load with
an error naming the file, the line and the field.

A dataset may be read gzip-compressed (``*.jsonl.gz``: the shipped datasets are, at about a
twentieth of their size); writing and resuming need the plain file.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import warnings
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from codl_tvm.core.errors import DatasetError
from codl_tvm.cost_model.features import (
    RECORD_MATMUL_ALIGN,
    DispatchFeatures,
    FeatureError,
    OpFeatures,
    OpParams,
    Partition,
    PartShape,
    impl_group,
    op_features,
    part_shape,
)

__all__ = [
    "DATASET_FORMAT",
    "DATASET_VERSION",
    "SHARING_KINDS",
    "Dataset",
    "DatasetError",
    "DatasetWriter",
    "OpRecord",
    "SharingRecord",
    "load_dataset",
    "save_dataset",
]

DATASET_FORMAT = "codl-tvm-latency-dataset"
DATASET_VERSION = 1
SHARING_KINDS: tuple[str, ...] = ("transform", "map", "unmap", "presync", "postsync")


def _latency(lat, what: str, zero_ok: bool) -> float:
    """A record's ``latency_ms`` as a float, checked: a finite number above 0 (or at least 0
    when ``zero_ok``)."""
    if (
        isinstance(lat, bool)
        or not isinstance(lat, int | float)
        or not math.isfinite(lat)
        or lat < 0
        or (lat == 0 and not zero_ok)
    ):
        bound = ">= 0" if zero_ok else "> 0"
        raise DatasetError(f"{what}: latency_ms must be a finite number {bound}, got {lat!r}")
    return float(lat)


def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, eq=True)
class OpRecord:
    """One latency measurement of one operator part on one processor.

    ``part`` defaults to the split convention of ``features.part_shape``; the profiler passes the
    shape it really built. ``device`` is the device description (any JSON dict). ``number``
    (calls per sample), ``min_ms`` and ``max_ms`` (fastest and slowest of the ``repeats``
    samples, ``min_ms <= latency_ms <= max_ms``) say how the median was taken and how far its
    samples spread; None where the record predates them.
    """

    params: OpParams
    partition: Partition
    processor: str
    impl: str
    latency_ms: float
    repeats: int
    part: PartShape | None = None
    dispatch: DispatchFeatures = field(default_factory=DispatchFeatures)
    device: Mapping = field(default_factory=dict, hash=False)
    name: str | None = None
    number: int | None = None
    min_ms: float | None = None
    max_ms: float | None = None

    def __post_init__(self) -> None:
        if self.part is None:
            object.__setattr__(
                self,
                "part",
                part_shape(self.params, self.partition, self.processor, RECORD_MATMUL_ALIGN),
            )
        what = f"record {self.params.describe()} on {self.processor}"
        object.__setattr__(self, "latency_ms", _latency(self.latency_ms, what, zero_ok=False))
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise DatasetError(f"{what}: repeats must be an integer >= 1, got {self.repeats!r}")
        if not isinstance(self.impl, str) or not self.impl:
            raise DatasetError(f"{what}: impl must be a non-empty string, got {self.impl!r}")
        object.__setattr__(self, "impl", impl_group(self.params.op, self.processor, self.impl))
        if not isinstance(self.device, Mapping):
            raise DatasetError(f"{what}: device must be a dict, got {type(self.device).__name__}")
        if self.part.empty:
            raise DatasetError(
                f"{what}: the part is empty ({self.part}); an empty part is not measured"
            )
        self._check_spread(what)

    def _check_spread(self, what: str) -> None:
        n = self.number
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise DatasetError(f"{what}: number must be an integer >= 1, got {n!r}")
        for name in ("min_ms", "max_ms"):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise DatasetError(f"{what}: {name} must be a finite number, got {v!r}")
            object.__setattr__(self, name, float(v))
        lo, hi = self.min_ms, self.max_ms
        if (lo is not None and not 0 < lo <= self.latency_ms) or (
            hi is not None and hi < self.latency_ms
        ):
            raise DatasetError(
                f"{what}: the samples' spread must hold the median: 0 < min_ms <= latency_ms "
                f"<= max_ms, got {lo!r} <= {self.latency_ms!r} <= {hi!r}"
            )

    @property
    def spread(self) -> float | None:
        """``(max_ms - min_ms) / latency_ms``: how far the samples of the median spread (None
        for records without ``min_ms``/``max_ms``)."""
        if self.min_ms is None or self.max_ms is None:
            return None
        return (self.max_ms - self.min_ms) / self.latency_ms

    @property
    def op(self) -> str:
        return self.params.op

    def features(self) -> OpFeatures:
        """The model input of this record (with the recorded part shape)."""
        return op_features(
            self.params,
            self.processor,
            self.impl,
            self.partition,
            self.dispatch,
            self.part,
            self.name,
        )

    def key(self) -> str:
        """Identity of the measurement (what a resumed profiling run skips)."""
        return _canonical(
            {
                "op": self.op,
                "params": self.params.to_json(),
                "partition": self.partition.to_json(),
                "processor": self.processor,
                "impl": self.impl,
                "device": dict(self.device),
            }
        )

    def to_json(self, device_id: str) -> dict:
        out = {
            "type": "op",
            "device": device_id,
            "op": self.op,
            "params": self.params.to_json(),
            "partition": self.partition.to_json(),
            "processor": self.processor,
            "impl": self.impl,
            "latency_ms": self.latency_ms,
            "repeats": self.repeats,
        }
        # The part is stored only where it differs from the split convention (smaller files).
        if self.part != part_shape(
            self.params, self.partition, self.processor, RECORD_MATMUL_ALIGN
        ):
            out["part"] = self.part.to_json()
        if self.dispatch != DispatchFeatures():
            out["dispatch"] = self.dispatch.to_json()
        if self.name is not None:
            out["name"] = self.name
        for k in ("number", "min_ms", "max_ms"):  # optional: only where measured
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out


@dataclass(frozen=True, eq=True)
class SharingRecord:
    """One data-sharing cost measurement: ``kind`` of ``nbytes`` took ``latency_ms``."""

    kind: str
    nbytes: int
    latency_ms: float
    repeats: int
    device: Mapping = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.kind not in SHARING_KINDS:
            raise DatasetError(f"sharing record: kind {self.kind!r} is not one of {SHARING_KINDS}")
        what = f"sharing record {self.kind} of {self.nbytes!r} bytes"
        if isinstance(self.nbytes, bool) or not isinstance(self.nbytes, int) or self.nbytes < 0:
            raise DatasetError(f"{what}: nbytes must be an integer >= 0")
        object.__setattr__(self, "latency_ms", _latency(self.latency_ms, what, zero_ok=True))
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise DatasetError(f"{what}: repeats must be an integer >= 1, got {self.repeats!r}")

    def key(self) -> str:
        return _canonical({"kind": self.kind, "nbytes": self.nbytes, "device": dict(self.device)})

    def to_json(self, device_id: str) -> dict:
        return {
            "type": "sharing",
            "device": device_id,
            "kind": self.kind,
            "nbytes": self.nbytes,
            "latency_ms": self.latency_ms,
            "repeats": self.repeats,
        }


Record = OpRecord | SharingRecord


@dataclass
class Dataset:
    """Records of one file plus the header's ``meta`` dict."""

    records: list[Record] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    @property
    def op_records(self) -> list[OpRecord]:
        return [r for r in self.records if isinstance(r, OpRecord)]

    @property
    def sharing_records(self) -> list[SharingRecord]:
        return [r for r in self.records if isinstance(r, SharingRecord)]

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)


# ---------------------------------------------------------------------------------------------
# Parsing with errors that name file, line and field.


class _Ctx:
    def __init__(self, path: Path, line: int) -> None:
        self.where = f"{path}:{line}"

    def fail(self, fieldname: str, problem: str) -> DatasetError:
        return DatasetError(f"{self.where}: field {fieldname!r}: {problem}")

    def get(self, obj: dict, key: str, kind, prefix: str = "", optional: bool = False):
        name = f"{prefix}{key}"
        if key not in obj:
            if optional:
                return None
            raise self.fail(name, "missing")
        value = obj[key]
        if value is None and optional:
            return None
        ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
        if not ok:
            raise self.fail(
                name,
                f"expected {getattr(kind, '__name__', kind)}, got {type(value).__name__} {value!r}",
            )
        return value


def _parse_params(ctx: _Ctx, op: str, obj) -> OpParams:
    if not isinstance(obj, dict):
        raise ctx.fail("params", "expected an object")
    kw = {k: ctx.get(obj, k, int, "params.") for k in ("h", "w", "ic", "oc")}
    for k, default in (("kernel", 1), ("stride", 1), ("dilation", 1), ("groups", 1)):
        value = ctx.get(obj, k, int, "params.", optional=True)
        kw[k] = default if value is None else value
    pad = obj.get("padding", [0, 0, 0, 0])
    if isinstance(pad, int) and not isinstance(pad, bool):
        pad = [pad] * 4
    if not (
        isinstance(pad, list)
        and len(pad) == 4
        and all(isinstance(p, int) and not isinstance(p, bool) for p in pad)
    ):
        raise ctx.fail("params.padding", f"expected 4 integers, got {pad!r}")
    kw["ceil_mode"] = ctx.get(obj, "ceil_mode", bool, "params.", optional=True) or False
    known = {"h", "w", "ic", "oc", "kernel", "stride", "dilation", "groups", "padding", "ceil_mode"}
    unknown = set(obj) - known
    if unknown:
        raise ctx.fail("params", f"unknown keys {sorted(unknown)}")
    try:
        return OpParams(op, padding=tuple(pad), **kw)
    except FeatureError as exc:
        raise ctx.fail("params", str(exc)) from None


def _parse_op(ctx: _Ctx, obj: dict, device: Mapping) -> OpRecord:
    op = ctx.get(obj, "op", str)
    try:
        params = _parse_params(ctx, op, obj.get("params"))
    except DatasetError:
        raise
    pobj = ctx.get(obj, "partition", dict)
    ratio = pobj.get("ratio", 1.0)
    try:
        partition = Partition(ctx.get(pobj, "dim", str, "partition."), ratio)
    except FeatureError as exc:
        raise ctx.fail("partition", str(exc)) from None
    processor = ctx.get(obj, "processor", str)
    part = None
    if obj.get("part") is not None:
        qobj = ctx.get(obj, "part", dict)
        try:
            part = PartShape(**{k: ctx.get(qobj, k, int, "part.") for k in qobj})
        except TypeError as exc:
            raise ctx.fail("part", str(exc)) from None
        for k, v in part.to_json().items():
            if v < 0:
                raise ctx.fail(f"part.{k}", f"must be >= 0, got {v}")
    dobj = obj.get("dispatch") or {}
    if not isinstance(dobj, dict):
        raise ctx.fail("dispatch", "expected an object")
    try:
        dispatch = DispatchFeatures(**dobj)
    except (TypeError, FeatureError) as exc:
        raise ctx.fail("dispatch", str(exc)) from None
    latency = ctx.get(obj, "latency_ms", int | float)
    repeats = ctx.get(obj, "repeats", int)
    name = ctx.get(obj, "name", str, optional=True)
    number = ctx.get(obj, "number", int, optional=True)
    min_ms = ctx.get(obj, "min_ms", int | float, optional=True)
    max_ms = ctx.get(obj, "max_ms", int | float, optional=True)
    try:
        return OpRecord(
            params,
            partition,
            processor,
            ctx.get(obj, "impl", str),
            latency,
            repeats,
            part,
            dispatch,
            device,
            name,
            number,
            min_ms,
            max_ms,
        )
    except (DatasetError, FeatureError) as exc:
        raise DatasetError(f"{ctx.where}: {exc}") from None


def _parse_sharing(ctx: _Ctx, obj: dict, device: Mapping) -> SharingRecord:
    try:
        return SharingRecord(
            ctx.get(obj, "kind", str),
            ctx.get(obj, "nbytes", int),
            ctx.get(obj, "latency_ms", int | float),
            ctx.get(obj, "repeats", int),
            device,
        )
    except DatasetError as exc:
        if str(exc).startswith(ctx.where):
            raise
        raise DatasetError(f"{ctx.where}: {exc}") from None


def _check_header(path: Path, header) -> dict:
    if not isinstance(header, dict) or header.get("format") != DATASET_FORMAT:
        raise DatasetError(
            f"{path}:1: not a codl-tvm latency dataset (the first line must be a "
            f'header with "format": "{DATASET_FORMAT}")'
        )
    version = header.get("version")
    if version != DATASET_VERSION:
        raise DatasetError(
            f"{path}:1: dataset format version {version!r} is not supported "
            f"(this codl-tvm reads version {DATASET_VERSION})"
        )
    meta = header.get("meta", {})
    if not isinstance(meta, dict):
        raise DatasetError(f"{path}:1: field 'meta': expected an object")
    return meta


def _iter_lines(path: Path) -> Iterator[tuple[int, dict]]:
    try:
        yield from _parse_lines(path)
    except (OSError, EOFError, zlib.error) as exc:
        if path.suffix != ".gz":
            raise
        # a truncated or corrupt .gz file
        raise DatasetError(f"{path}: not a readable gzip file ({exc})") from None


def _parse_lines(path: Path) -> Iterator[tuple[int, dict]]:
    if path.suffix == ".gz":
        opened = gzip.open(path, "rt", encoding="utf-8")
    else:
        opened = open(path, encoding="utf-8")
    with opened as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            if not line.endswith("\n"):
                raise DatasetError(
                    f"{path}:{lineno}: incomplete last line (a run stopped while "
                    "writing?); reopen the file with DatasetWriter to drop it"
                )
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise DatasetError(f"{path}:{lineno}: expected a JSON object")
            yield lineno, obj


def _read(path: Path) -> tuple[dict, dict[str, dict], list[Record]]:
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such dataset file")
    lines = _iter_lines(path)
    first = next(lines, None)
    if first is None:
        raise DatasetError(f"{path}: empty file (no dataset header)")
    meta = _check_header(path, first[1])
    devices: dict[str, dict] = {}
    records: list[Record] = []
    for lineno, obj in lines:
        ctx = _Ctx(path, lineno)
        kind = obj.get("type")
        if kind == "device":
            dev_id = ctx.get(obj, "id", str)
            devices[dev_id] = ctx.get(obj, "desc", dict)
            continue
        if kind not in ("op", "sharing"):
            raise ctx.fail("type", f"expected 'op', 'sharing' or 'device', got {kind!r}")
        dev_id = ctx.get(obj, "device", str)
        if dev_id not in devices:
            raise ctx.fail(
                "device", f"device id {dev_id!r} is not defined by an earlier 'device' line"
            )
        parse = _parse_op if kind == "op" else _parse_sharing
        records.append(parse(ctx, obj, devices[dev_id]))
    return meta, devices, records


def load_dataset(path: str | os.PathLike) -> Dataset:
    """Read and validate a dataset file (raises ``DatasetError`` naming file, line, field)."""
    meta, _, records = _read(Path(path))
    return Dataset(records, meta)


class DatasetWriter:
    """Appends records to a dataset file, creating it with a header if needed (resumable).

    Examples
    --------
    >>> with DatasetWriter("conv.jsonl", meta={"sampler": "codl"}) as out:  # doctest: +SKIP
    ...     for rec in measure(...):
    ...         if rec.key() not in out:
    ...             out.append(rec)
    """

    def __init__(self, path: str | os.PathLike, meta: dict | None = None) -> None:
        self.path = Path(path)
        if self.path.suffix == ".gz":
            raise DatasetError(
                f"{self.path}: a compressed dataset is read-only; write a .jsonl file "
                "(gzip it afterwards to ship it)"
            )
        self._devices: dict[str, str] = {}  # canonical desc -> id
        self._keys: set[str] = set()
        if self.path.exists() and self.path.stat().st_size > 0:
            self._drop_partial_line()
            _, devices, records = _read(self.path)
            self._devices = {_canonical(d): i for i, d in devices.items()}
            self._keys = {r.key() for r in records}
            self._file = open(self.path, "a", encoding="utf-8")
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "w", encoding="utf-8")
            header = {"format": DATASET_FORMAT, "version": DATASET_VERSION, "meta": meta or {}}
            self._write(header)

    def _drop_partial_line(self) -> None:
        data = self.path.read_bytes()
        if data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        warnings.warn(
            f"{self.path}: dropping an incomplete last line ({len(data) - cut} bytes) "
            "left by an interrupted run",
            stacklevel=3,
        )
        with open(self.path, "r+b") as f:
            f.truncate(cut)

    def _write(self, obj: dict) -> None:
        self._file.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self._file.flush()  # a run killed by a time limit keeps every finished record

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def _device_id(self, desc: Mapping) -> str:
        canon = _canonical(dict(desc))
        if canon not in self._devices:
            dev_id = f"d{len(self._devices)}"
            while dev_id in self._devices.values():
                dev_id += "_"
            self._devices[canon] = dev_id
            self._write({"type": "device", "id": dev_id, "desc": dict(desc)})
        return self._devices[canon]

    def append(self, record: Record) -> None:
        """Write one record and flush it (so an interrupted run keeps what it measured)."""
        if not isinstance(record, OpRecord | SharingRecord):
            raise DatasetError(
                f"cannot append a {type(record).__name__}; expected OpRecord or SharingRecord"
            )
        self._write(record.to_json(self._device_id(record.device)))
        self._keys.add(record.key())
        self._file.flush()

    def extend(self, records: Iterable[Record]) -> None:
        for r in records:
            self.append(r)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def save_dataset(
    records: Dataset | Iterable[Record], path: str | os.PathLike, meta: dict | None = None
) -> None:
    """Write a whole dataset file (replacing it atomically)."""
    if isinstance(records, Dataset):
        meta = meta if meta is not None else records.meta
        records = records.records
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        tmp.unlink()
    with DatasetWriter(tmp, meta=meta) as out:
        out.extend(records)
    os.replace(tmp, path)
