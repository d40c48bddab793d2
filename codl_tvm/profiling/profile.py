"""Profiling runs: which parts to measure, and measuring them resumably into a dataset.

A run is a list of :class:`ProfileJob` (operator, partition, processor), from sampled shapes
(:func:`sampled_ops`, CoDL's or the SVM paper's scheme) or from a model's partitionable operators
(:func:`model_ops`), expanded over partition dims and ratios by :func:`make_jobs`. Then either

- :func:`profile` compiles and measures each job here (locally or through an RPC session), or
- :func:`compile_jobs` writes libraries and a ``manifest.json`` into a directory and
  :func:`run_compiled` measures them on the machine the directory was copied to.

Both append to a dataset with ``DatasetWriter`` and skip jobs whose record is already there (the
key is the operator, partition, processor and device description), so a killed run resumes.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from codl_tvm.build.targets import get_preset
from codl_tvm.core.errors import ProfileError
from codl_tvm.core.plan import partitionable_ops
from codl_tvm.cost_model.dataset import DatasetWriter, OpRecord, load_dataset
from codl_tvm.cost_model.features import FeatureError, OpParams, Partition, part_shape
from codl_tvm.cost_model.part_ir import algorithm_switches, target_str
from codl_tvm.cost_model.sampling import CODL_SPACE, POW2_SPACE, sample_conv2d, sample_dense
from codl_tvm.profiling.part_build import CompiledPart, compile_part
from codl_tvm.profiling.sessions import LocalSession, device_description
from codl_tvm.profiling.sharing import measure_sharing
from codl_tvm.profiling.timing import LEGACY_TIMING, TimingConfig, measure_op
from codl_tvm.runtime.warm_up import default_shards, warm_up_libraries, worth_warming

__all__ = [
    "MANIFEST",
    "ProfileJob",
    "Progress",
    "append_sharing",
    "compile_jobs",
    "job_key",
    "job_label",
    "make_jobs",
    "model_ops",
    "open_dataset",
    "profile",
    "run_compiled",
    "sampled_ops",
]

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "codl-tvm-profile-manifest"


@dataclass(frozen=True)
class ProfileJob:
    """One part to measure: ``processor``'s part of ``params`` under ``partition``."""

    params: OpParams
    partition: Partition
    processor: str
    name: str | None = None


def job_key(params: OpParams, partition: Partition, processor: str, device: dict) -> str:
    """Identity of a measurement before it is built (``OpRecord.key`` without the impl)."""
    return json.dumps(
        {
            "op": params.op,
            "params": params.to_json(),
            "partition": partition.to_json(),
            "processor": processor,
            "device": dict(device),
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def _record_job_key(r: OpRecord) -> str:
    return job_key(r.params, r.partition, r.processor, dict(r.device))


class Progress:
    """A plain-text progress bar on stderr (one line per step when stderr is not a terminal)."""

    def __init__(self, total: int, label: str = "profile", stream=None) -> None:
        self.total, self.done, self.label = total, 0, label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def step(self, what: str) -> None:
        self.done += 1
        width = 24
        fill = int(width * self.done / max(self.total, 1))
        line = f"{self.label} [{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} {what}"
        if self.tty:
            self.stream.write("\r\x1b[K" + line + ("\n" if self.done >= self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


# ---------------------------------------------------------------------------------------------
# What to measure.


def sampled_ops(
    n: int,
    seed: int = 0,
    method: str = "codl",
    max_gflops: float | None = 2.0,
    dense_fraction: float = 0.0,
) -> list[tuple[str | None, OpParams]]:
    """``n`` sampled operators (conv2d, and dense for ``dense_fraction`` of them)."""
    if method not in ("codl", "pow2"):
        raise ValueError(f"sampling method {method!r} is not 'codl' or 'pow2'")
    space = CODL_SPACE if method == "codl" else POW2_SPACE
    rng = np.random.default_rng(seed)
    n_dense = round(n * dense_fraction)
    ops = sample_conv2d(rng, n - n_dense, space, max_gflops=max_gflops)
    if n_dense:
        ops += sample_dense(rng, n_dense, space, max_gflops=max_gflops)
    return [(None, p) for p in ops]


def _square(values, what: str, name: str) -> int:
    values = list(values)
    if len(set(values)) != 1:
        raise ProfileError(f"{name}: {what} {values} is not square (OpParams describes one value)")
    return int(values[0])


def model_ops(model) -> list[tuple[str, OpParams]]:
    """The partitionable operators of an ONNX model (path, proto or ``OnnxModel``) as
    ``(name, OpParams)``; operators ``OpParams`` cannot describe are skipped with a warning."""
    # deferred: importing an ONNX model needs TVM's compiler, and this module also serves
    # `codl-tvm profile --run-dir` on devices whose TVM is runtime-only
    from codl_tvm.frontend.importer import load_onnx

    if not hasattr(model, "mod"):
        model = load_onnx(model)
    out: list[tuple[str, OpParams]] = []
    for info in partitionable_ops(model.mod):
        try:
            out.append((info.name, _op_params(info)))
        except (ProfileError, FeatureError, TypeError, IndexError) as exc:
            warnings.warn(f"{info.name}: not profiled ({exc})", stacklevel=2)
    return out


def _op_params(info) -> OpParams:
    a, ins = info.attrs, info.input_shape
    if info.reason and not info.dims:
        raise ProfileError(info.reason)
    if info.kind == "matmul":
        rows = int(np.prod(ins[:-1])) if len(ins) > 1 else 1
        k, n = info.weight_shape[-2], info.weight_shape[-1]
        return OpParams("dense", rows, 1, int(k), int(n))
    if len(ins) != 4 or ins[0] != 1:
        raise ProfileError(f"input shape {list(ins)} is not NCHW with batch 1")
    stride = _square(a["strides"], "stride", info.name)
    dil = _square(a["dilation"], "dilation", info.name)
    pad = tuple(int(p) for p in a["padding"])
    if len(pad) == 2:
        pad = (pad[0], pad[1], pad[0], pad[1])
    if info.kind == "conv2d":
        w = info.weight_shape
        k = _square(w[2:], "kernel", info.name)
        return OpParams(
            "conv2d", ins[2], ins[3], ins[1], w[0], k, stride, pad, dil, int(a["groups"])
        )
    if info.kind == "avg_pool2d":
        raise ProfileError("average pooling is not profiled (the pool records are max pooling)")
    k = _square(a["pool_size"], "pool size", info.name)
    return OpParams(
        "pool", ins[2], ins[3], ins[1], ins[1], k, stride, pad, dil, ceil_mode=a["ceil_mode"]
    )


def make_jobs(
    ops: Iterable[tuple[str | None, OpParams]],
    dims: Sequence[str] = ("H", "OC"),
    ratios: Sequence[float] = (0.0, 0.5, 1.0),
    processors: Sequence[str] = ("gpu", "cpu"),
) -> list[ProfileJob]:
    """Every non-empty part of every op for each dim and ratio (dense: OC only, as the
    partitioning passes split it; dim ``"none"``: the whole op on each processor, recorded at
    ratio 1 (GPU) and 0 (CPU)). Duplicate parts are listed once."""
    jobs: list[ProfileJob] = []
    seen = set()
    for name, p in ops:
        for dim in dims:
            if p.op == "dense" and dim == "H":
                continue
            for ratio in ratios:
                part = Partition(dim, float(ratio))
                for proc in processors:
                    if dim == "none":  # the whole operator: GPU at ratio 1, CPU at ratio 0
                        part = Partition("none", 1.0 if proc == "gpu" else 0.0)
                    if part_shape(p, part, proc).empty:
                        continue
                    key = (p, part, proc)
                    if key not in seen:
                        seen.add(key)
                        jobs.append(ProfileJob(p, part, proc, name))
    return jobs


# ---------------------------------------------------------------------------------------------
# Running.


def _describe_timing(t: dict) -> str:
    return (
        f"timing --warmup {t.get('warmup')} --repeats {t.get('repeats')} --number "
        f"{t.get('number')} --min-repeat-ms {t.get('min_repeat_ms'):g}"
    )


#: Dataset settings a resume must match: (meta key, value when absent, how to name a value).
#: A dataset without a recorded timing predates it and used the defaults of then.
_ONE_SETTING = (
    ("algorithms", {}, lambda v: f"algorithm switches {v or 'none (direct)'}"),
    ("flush_weights", False, lambda v: "--flush-weights" if v else "no --flush-weights"),
    ("timing", LEGACY_TIMING, _describe_timing),
)


def open_dataset(
    output: str | Path, meta: dict | None, timing: TimingConfig
) -> tuple[DatasetWriter, set[str]]:
    """A writer appending to the dataset ``output`` (created with ``meta`` and the timing
    protocol if new), and the job keys (:func:`job_key`) already measured in it.

    Raises
    ------
    ProfileError
        The dataset was profiled with other algorithm switches, weight flushing or timing.
    """
    # The protocol is part of the dataset: medians taken another way are not mixed into it.
    meta = {**(meta or {}), "timing": timing.to_meta()}
    # drops a partial last line first; a new file's header is written and flushed at once
    writer = DatasetWriter(output, meta=meta)
    data = load_dataset(output)
    # A dataset holds one algorithm setting and one way of timing: a resumed job is skipped by
    # its shape alone.
    for key, default, describe in _ONE_SETTING:
        have, want = data.meta.get(key, default), (meta or {}).get(key, default)
        if have != want:
            writer.close()
            raise ProfileError(
                f"{output} was profiled with {describe(have)}, this run has "
                f"{describe(want)}; write it to another dataset (`codl-tvm cost-model fit` "
                "takes several)"
            )
    done = {_record_job_key(r) for r in data.op_records}
    return writer, done


def append_sharing(
    session, writer: DatasetWriter, device: dict, sizes: Sequence[int], progress: Progress | None
) -> int:
    """Measure the data-sharing costs of ``sizes`` bytes on ``session`` and append the records
    not yet in ``writer``; returns how many were appended."""
    if not sizes:
        return 0
    added = 0
    recs = measure_sharing(session, device, tuple(sizes))
    for r in recs:
        if r.key() not in writer:
            writer.append(r)
            added += 1
    if progress is not None:
        progress.step(f"sharing costs ({len(sizes)} sizes)")
    return added


def profile(
    jobs: Sequence[ProfileJob],
    output: str | Path,
    session=None,
    work_dir: str | Path | None = None,
    timing: TimingConfig = TimingConfig(),
    sharing_sizes: Sequence[int] = (4096, 65536, 1 << 20),
    gpu_target=None,
    cpu_target=None,
    meta: dict | None = None,
    progress: bool = True,
) -> dict[str, int]:
    """Compile and measure ``jobs`` (skipping those already in ``output``); append the records.

    ``session`` is a :class:`LocalSession` (default) or an ``RPCSession``; ``work_dir`` keeps the
    built libraries (a temporary directory by default). Returns counts of measured, skipped
    and sharing records.
    """
    session = session or LocalSession()
    device = device_description(session, gpu_target, cpu_target)
    writer, done = open_dataset(output, meta, timing)
    todo = [j for j in jobs if job_key(j.params, j.partition, j.processor, device) not in done]
    bar = Progress(len(todo) + (1 if sharing_sizes else 0)) if progress else None
    measured = 0
    with writer, tempfile.TemporaryDirectory(prefix="codl-profile-") as tmp:
        directory = Path(work_dir) if work_dir else Path(tmp)
        for job in todo:
            target = gpu_target if job.processor == "gpu" else cpu_target
            compiled = compile_part(
                job.params, job.partition, job.processor, directory, target, job.name
            )
            writer.append(measure_op(session, compiled, directory, device, timing))
            measured += 1
            if bar is not None:
                bar.step(job_label(job))
        n_sharing = append_sharing(session, writer, device, sharing_sizes, bar)
    return {"measured": measured, "skipped": len(jobs) - len(todo), "sharing": n_sharing}


def job_label(job: ProfileJob) -> str:
    """One line naming ``job``'s operator, shape, partition and processor (for logs)."""
    p = job.params
    return (
        f"{job.name or p.op} {p.h}x{p.w} {p.ic}->{p.oc} F{p.kernel} S{p.stride} "
        f"{job.partition.dim}:{job.partition.ratio:g} {job.processor}"
    )


def compile_jobs(
    jobs: Sequence[ProfileJob],
    directory: str | Path,
    gpu_target=None,
    cpu_target=None,
    threads: int | None = None,
    progress: bool = True,
    preset: str | None = None,
) -> Path:
    """Build every job into ``directory`` (with ``manifest.json``) to be run by
    :func:`run_compiled` elsewhere; jobs already in the manifest are not rebuilt.

    ``preset`` (``codl_tvm.build.targets``) picks the targets and the (cross-)toolchain of a device
    machine; ``threads`` is its CPU thread count, recorded in the CPU dispatch features."""
    if preset is not None:
        p = get_preset(preset)
        gpu_target = gpu_target or p.target("gpu")
        cpu_target = cpu_target or p.target("cpu")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / MANIFEST
    entries: list[dict] = []
    if path.exists():
        entries = _read_manifest(path)
        have_switches = json.loads(path.read_text()).get("algorithms", {})
        if entries and have_switches != algorithm_switches():
            raise ProfileError(
                f"{directory} holds parts built with algorithm switches "
                f"{have_switches or 'none (direct)'}, this run has "
                f"{algorithm_switches() or 'none (direct)'}; compile into another directory"
            )
    have = {
        (
            json.dumps(e["params"], sort_keys=True),
            json.dumps(e["partition"], sort_keys=True),
            e["op"],
            e["processor"],
        )
        for e in entries
        if (directory / e["library"]).exists()
    }
    bar = Progress(len(jobs), "compile") if progress else None
    for job in jobs:
        ident = (
            json.dumps(job.params.to_json(), sort_keys=True),
            json.dumps(job.partition.to_json(), sort_keys=True),
            job.params.op,
            job.processor,
        )
        if ident not in have:
            target = gpu_target if job.processor == "gpu" else cpu_target
            c = compile_part(
                job.params,
                job.partition,
                job.processor,
                directory,
                target,
                job.name,
                threads,
                preset=preset,
            )
            entries.append(c.to_json())
            have.add(ident)
            _write_manifest(path, entries, gpu_target, cpu_target)
        if bar is not None:
            bar.step(job_label(job))
    _write_manifest(path, entries, gpu_target, cpu_target)
    return path


def _write_manifest(path: Path, entries, gpu_target, cpu_target) -> None:
    obj = {
        "format": MANIFEST_FORMAT,
        "version": 1,
        "algorithms": algorithm_switches(),
        "gpu_target": target_str("gpu", gpu_target),
        "cpu_target": target_str("cpu", cpu_target),
        "parts": entries,
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(path)


def _read_manifest(path: Path) -> list[dict]:
    try:
        obj = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{path}: not a readable profiling manifest ({exc})") from None
    if not isinstance(obj, dict) or obj.get("format") != MANIFEST_FORMAT or obj.get("version") != 1:
        raise ProfileError(
            f"{path}: not a version-1 {MANIFEST_FORMAT} file (made by `codl-tvm profile "
            "--compile-dir`?)"
        )
    return list(obj["parts"])


def _warm_gpu_parts(directory: Path, parts: Sequence[CompiledPart]) -> None:
    """Compile the GPU parts' kernels in parallel processes first where that pays (PoCL with
    cores to spare, :func:`~codl_tvm.runtime.warm_up.worth_warming`): PoCL compiles a kernel
    at its first run, one at a time within a process, which is most of a part's profiling;
    the timing then finds them in its caches. The timed runs are the same either way."""
    gpu = [c for c in parts if c.processor == "gpu"]
    if len(gpu) < 2:
        return
    # --tvm-cpus pins this thread to the CPU's cores for the timing; the warm-up, before any
    # timing, takes every core (its processes inherit this thread's cores)
    pinned = os.sched_getaffinity(0) if hasattr(os, "sched_setaffinity") else None
    if pinned is not None:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    try:
        if worth_warming():
            libraries = [
                (directory / c.library, ("opencl",), [(s, "float32") for s in c.inputs])
                for c in gpu
            ]
            # nothing else runs beside a profiling run: one process a core but one
            warm_up_libraries(libraries, f"{len(gpu)} GPU parts", default_shards(most=None))
    finally:
        if pinned is not None:
            os.sched_setaffinity(0, pinned)


def run_compiled(
    directory: str | Path,
    output: str | Path,
    session=None,
    timing: TimingConfig = TimingConfig(),
    sharing_sizes: Sequence[int] = (4096, 65536, 1 << 20),
    meta: dict | None = None,
    progress: bool = True,
) -> dict[str, int]:
    """Measure the parts :func:`compile_jobs` wrote into ``directory``; append to ``output``."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.exists():
        raise ProfileError(f"{directory}: no {MANIFEST} (build it with --compile-dir first)")
    obj = json.loads(path.read_text())
    entries = _read_manifest(path)
    session = session or LocalSession()
    device = device_description(session, obj["gpu_target"], obj["cpu_target"])
    meta = dict(meta or {})
    meta.pop("algorithms", None)  # the directory's switches, not the caller's
    if obj.get("algorithms"):
        meta["algorithms"] = obj["algorithms"]
    writer, done = open_dataset(output, meta, timing)
    parts = [CompiledPart.from_json(e) for e in entries]
    todo = [c for c in parts if job_key(c.params, c.partition, c.processor, device) not in done]
    if not session.remote:
        _warm_gpu_parts(directory, todo)
    bar = Progress(len(todo) + (1 if sharing_sizes else 0), "run") if progress else None
    failed = 0
    with writer:
        for c in todo:
            label = job_label(ProfileJob(c.params, c.partition, c.processor, c.name))
            try:
                writer.append(measure_op(session, c, directory, device, timing))
            except (ProfileError, RuntimeError) as exc:
                if session.remote:  # a remote that fails is the caller's to retry or report
                    raise
                # A kernel the device cannot build or run (e.g. a schedule asking for more
                # local memory than it has) is reported and skipped, not fatal to the run.
                failed += 1
                lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
                why = next((ln for ln in reversed(lines) if "error" in ln.lower()), lines[-1])
                logger.warning("skipped %s: %s", label, why[:300])
            if bar is not None:
                bar.step(label)
        n_sharing = append_sharing(session, writer, device, sharing_sizes, bar)
    return {
        "measured": len(todo) - failed,
        "failed": failed,
        "skipped": len(parts) - len(todo),
        "sharing": n_sharing,
    }
