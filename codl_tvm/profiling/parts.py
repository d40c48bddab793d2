"""Measure the parts of a partitioned operator, each on its own processor, and sharing costs.

An operator ``OpParams`` split by a ``Partition`` (dim, GPU ratio) has a GPU part and a CPU part
(``features.part_shape``, the convention ``PartitionOperators`` follows). Each part is built alone
as a one-op Relax module of the part's shape (an H part reads its input rows plus the halo, with
the padding that remains at the borders it touches) for its processor (OpenCL or LLVM), with
codl-tvm's single-device pipeline. The implementation (``codl.algorithm``) and the dispatch
features are read from the scheduled PrimFuncs, never guessed. Latency is the median of
``time_evaluator`` samples after a warm-up run (on OpenCL through the runtime plugin's marker-event
timer); each sample runs the part enough times to last ``TimingConfig.min_repeat_ms``, and the
record keeps the fastest and slowest sample beside the median (:func:`time_samples`).

Compiling and running are separate steps (:func:`compile_part` writes a shared library,
:func:`measure_op` loads and times it through a :class:`Session`), so the same code path runs
locally, on a prepared directory copied to another machine, and through a TVM RPC session.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm import runtime
from codl_tvm.build.runner import default_target
from codl_tvm.build.targets import export_library, get_preset
from codl_tvm.core.errors import ProfileError
from codl_tvm.core.plan import uniform_plan
from codl_tvm.cost_model.dataset import OpRecord, SharingRecord
from codl_tvm.cost_model.dispatch import dispatch_features
from codl_tvm.cost_model.features import (
    DispatchFeatures,
    FeatureError,
    OpParams,
    Partition,
    PartShape,
    part_shape,
)

if TYPE_CHECKING:
    from codl_tvm.passes.winograd import ConvRewrite
    from codl_tvm.schedules import CPUConfig, OpenCLConfig

__all__ = [
    "LEGACY_TIMING",
    "CompiledPart",
    "LocalSession",
    "PartTiming",
    "ProfileError",
    "RPCSession",
    "TimingConfig",
    "algorithm_switches",
    "check_part",
    "compile_part",
    "device_description",
    "measure_op",
    "measure_sharing",
    "part_module",
    "part_padding",
    "passes_parts",
    "runs_per_sample",
    "schedule_part",
    "time_samples",
]

PROCESSOR_DEVICE = {"gpu": "opencl", "cpu": "cpu"}


@dataclass(frozen=True)
class TimingConfig:
    """How latencies are measured: ``warmup`` untimed runs, then ``repeats`` timed samples, each
    the mean of ``number`` runs or more: with ``min_repeat_ms`` > 0, a probe run picks enough runs
    that a sample lasts at least that long (TVM's ``time_evaluator`` knob of that name; the
    record keeps the count in ``number``). The record keeps the median sample and the fastest
    and slowest one.

    The defaults come from ``scripts/noise_analysis.py`` (see docs/benchmarks.md): identical
    parts measured twice disagree by > 1.5x in 6-9% of the pairs on the emulated SoC (a whole
    record's samples disturbed), which a median of 10 samples withstands better than one of
    3-5, and a sample of a sub-0.1 ms part (a third of the SoC records) is a few runs of
    microseconds unless it is made to last ``min_repeat_ms``. At 2 ms that costs about what
    ``--repeats 5 --number 3`` did per part on the SoC's records (more only for parts under
    0.13 ms, at most 10 x 2 ms). Measured on the device machine (``scripts/device/noise_ab.sh``, on
    two machines), two profiling runs of the same 71 parts agree within
    +-10% for 39-49% (CPU) and 53-63% (GPU) of them with these defaults, 51% and 21% with the old
    ones, 26% and 33% with 20 ms samples: the machine's run-to-run noise dominates either way.

    ``flush_weights``: CPU parts are timed one run per sample, the weight (every input but the
    data) flushed from the caches before each (TVM's ``cache_flush_cpu_non_first_arg``), as it
    arrives inside a whole model, where every operator's weight was evicted by the others;
    ``min_repeat_ms`` does not apply to them (``repeats * number`` samples of one run)."""

    warmup: int = 1
    repeats: int = 10
    number: int = 1
    flush_weights: bool = False
    min_repeat_ms: float = 2.0

    def __post_init__(self) -> None:
        for name in ("repeats", "number"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"TimingConfig.{name} must be an integer >= 1, got {v!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"TimingConfig.warmup must be an integer >= 0, got {self.warmup!r}")
        m = self.min_repeat_ms
        if isinstance(m, bool) or not isinstance(m, int | float) or not 0 <= m < math.inf:
            raise ValueError(f"TimingConfig.min_repeat_ms must be a number >= 0, got {m!r}")

    def to_meta(self) -> dict:
        """The protocol as a dataset header records it (``meta["timing"]``; a resumed run must
        use the same)."""
        return {
            "warmup": self.warmup,
            "repeats": self.repeats,
            "number": self.number,
            "min_repeat_ms": float(self.min_repeat_ms),
        }


#: The protocol of datasets written before their header recorded one (the defaults then).
LEGACY_TIMING: dict = {"warmup": 1, "repeats": 5, "number": 3, "min_repeat_ms": 0.0}

#: Most runs a sample may take (a part timed at ~0 by a coarse timer would otherwise loop).
MAX_RUNS_PER_SAMPLE = 10_000


def runs_per_sample(probe_ms: float, timing: TimingConfig) -> int:
    """Runs per sample so that one lasts ``timing.min_repeat_ms``, from a probe run's time per
    run ``probe_ms``: at least ``timing.number``, at most ``MAX_RUNS_PER_SAMPLE``.

    Parameters
    ----------
    probe_ms : float
        Time of one run of the part (ms), measured just before.
    timing : TimingConfig
        The protocol (``min_repeat_ms`` 0: always ``number``).

    Returns
    -------
    int
        The runs each timed sample averages.
    """
    if timing.min_repeat_ms <= 0 or not math.isfinite(probe_ms):  # NaN/inf: nothing to size
        return timing.number
    if probe_ms <= 0:  # below the timer's resolution
        return max(timing.number, MAX_RUNS_PER_SAMPLE)
    need = math.ceil(timing.min_repeat_ms / probe_ms)
    return max(timing.number, min(need, MAX_RUNS_PER_SAMPLE))


@dataclass(frozen=True)
class PartTiming:
    """What :func:`time_samples` measured: the median, fastest and slowest sample (ms per run),
    the number of samples and the runs each sample averages."""

    median_ms: float
    min_ms: float
    max_ms: float
    samples: int
    number: int


# ---------------------------------------------------------------------------------------------
# One-op modules of a part's shape.


def part_padding(params: OpParams, part: PartShape) -> tuple[int, int, int, int]:
    """Padding (top, left, bottom, right) of a part built alone.

    An H part keeps the top padding only if it starts at output row 0 and the bottom padding
    it needs to reach its last row's window; other parts keep the operator's padding.
    """
    pt, pl, pb, pr = params.padding
    if part.out_h == params.out_h:
        return (pt, pl, pb, pr)
    first = part.row0 * params.stride - pt
    last = (part.row0 + part.out_h - 1) * params.stride - pt + params.span - 1
    top = max(0, -first)
    bottom = max(0, last - (params.h - 1))
    return (top, pl, bottom, pr)


def algorithm_switches() -> dict[str, list[str]]:
    """The algorithm switches on here: ``{"winograd": presets, "packed": presets}`` of
    :func:`~codl_tvm.schedules.winograd_enabled` / :func:`~codl_tvm.schedules.packed_enabled`
    blocks, empty entries left out (``{}``: direct kernels only).

    Inside :func:`~codl_tvm.schedules.cpu_alone_settings` with an algorithm on, ``"cpu_alone"``
    names the presets whose Winograd/packed kernels then take the settings of builds for the CPU
    alone (:data:`~codl_tvm.schedules.config.CPU_ALONE_SETTINGS`): other kernels than the
    preset's, so a dataset of them is another dataset."""
    # deferred: building parts needs TVM's compiler; this module also measures on devices whose
    # TVM is runtime-only (`codl-tvm profile --run-dir`)
    from codl_tvm.schedules.config import (
        CPU_ALONE_SETTINGS,
        cpu_alone_on,
        packed_presets,
        winograd_presets,
    )

    switches = {"winograd": sorted(winograd_presets()), "packed": sorted(packed_presets())}
    switches = {k: v for k, v in switches.items() if v}
    if switches and cpu_alone_on():
        switches["cpu_alone"] = sorted(CPU_ALONE_SETTINGS)
    return switches


def part_rewrite(
    params: OpParams, part: PartShape, algorithm_config: CPUConfig | OpenCLConfig | None = None
) -> ConvRewrite | None:
    """The Winograd or packed conv (``passes.winograd.ConvRewrite``) that ``codl.Conv2DWinograd``
    makes of the conv ``part`` of ``params`` under ``algorithm_config``; None where the part
    keeps its direct/GEMM kernel (no config, not a conv, or the rules decline)."""
    if algorithm_config is None or params.op != "conv2d":
        return None
    # deferred: building parts needs TVM's compiler; this module also measures on devices whose
    # TVM is runtime-only (`codl-tvm profile --run-dir`)
    from codl_tvm.passes.winograd import conv2d_rewrite
    from codl_tvm.schedules import conv2d_shape_info

    pad = part_padding(params, part)
    info = conv2d_shape_info(
        (1, part.ic, part.in_h, part.in_w),
        (part.oc, part.ic // part.groups, params.kernel, params.kernel),
        (params.stride, params.stride),
        pad,
        (params.dilation, params.dilation),
        part.groups,
    )
    rewrite = conv2d_rewrite(info, algorithm_config, pad)
    return None if isinstance(rewrite, str) else rewrite


def part_module(params: OpParams, part: PartShape, algorithm_config=None):
    """A Relax module whose ``main`` computes one part of ``params`` (inputs: data, weight).

    ``algorithm_config`` (a schedule config with Winograd or packed convs on): a conv part
    that ``codl.Conv2DWinograd`` would rewrite under it is built as that Winograd/packed conv,
    its weight an input in the transformed layout.
    """
    from tvm import relax  # deferred: needs TVM's compiler (see algorithm_switches)

    if part.empty:
        raise ProfileError(f"{params.describe()}: the part {part} is empty")
    bb = relax.BlockBuilder()
    pad = part_padding(params, part)
    h_split = part.out_h != params.out_h
    if params.op == "dense":
        x = relax.Var("x", relax.TensorType((part.out_h, part.ic), "float32"))
        w = relax.Var("w", relax.TensorType((part.ic, part.oc), "float32"))
        args = [x, w]
        with bb.function("main", args):
            with bb.dataflow():
                out = bb.emit_output(relax.op.matmul(x, w))
            bb.emit_func_output(out)
    elif params.op == "conv2d":
        x = relax.Var("x", relax.TensorType((1, part.ic, part.in_h, part.in_w), "float32"))
        wshape = (part.oc, part.ic // part.groups, params.kernel, params.kernel)
        rewrite = part_rewrite(params, part, algorithm_config)
        if rewrite is not None:
            wshape = rewrite.weight_shape
        w = relax.Var("w", relax.TensorType(wshape, "float32"))
        with bb.function("main", [x, w]):
            with bb.dataflow():
                if rewrite is not None:
                    out = bb.emit_output(bb.call_te(rewrite.compute, x, w, **rewrite.attrs))
                else:
                    out = bb.emit_output(
                        relax.op.nn.conv2d(
                            x,
                            w,
                            strides=params.stride,
                            padding=pad,
                            dilation=params.dilation,
                            groups=part.groups,
                        )
                    )
            bb.emit_func_output(out)
    else:  # pool
        x = relax.Var("x", relax.TensorType((1, part.ic, part.in_h, part.in_w), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(
                    relax.op.nn.max_pool2d(
                        x,
                        pool_size=params.kernel,
                        strides=params.stride,
                        padding=pad,
                        dilation=params.dilation,
                        ceil_mode=params.ceil_mode and not h_split,
                    )
                )
            bb.emit_func_output(out)
    mod = bb.get()
    shape = [int(v) for v in mod["main"].ret_ty.shape.values]
    want = [part.out_h, part.oc] if params.op == "dense" else [1, part.oc, part.out_h, part.out_w]
    if shape != want:
        raise ProfileError(
            f"{params.describe()}: the part module outputs {shape}, expected {want} "
            f"(part {part.to_json()}, padding {list(pad)})"
        )
    return mod


def passes_parts(params: OpParams, partition: Partition) -> dict[str, dict]:
    """The parts ``PartitionOperators`` makes of a one-op module of ``params`` under
    ``partition``: ``{processor: {"region": (a, b), "input_region": (c, d), "axis": k}}``."""
    # deferred: the passes need TVM's compiler (see algorithm_switches)
    from codl_tvm.passes import PartitionOperators
    from codl_tvm.passes.parts import collect_parts

    full = part_shape(params, Partition(), "gpu")
    mod = part_module(params, full)
    if partition.dim == "none":  # not split: the whole operator on either processor
        whole = {"region": (0, full.out_h), "input_region": (0, full.in_h), "axis": 2}
        return {"gpu": whole, "cpu": dict(whole)}
    mod = PartitionOperators(uniform_plan(mod, partition.dim, partition.ratio))(mod)
    splits = collect_parts(mod)
    if len(splits) != 1:
        raise ProfileError(
            f"{params.describe()}: PartitionOperators made {len(splits)} splits, expected 1"
        )
    return {
        str(getattr(p.processor, "value", p.processor)): {
            "region": tuple(p.region),
            "input_region": tuple(p.input_region),
            "axis": splits[0].axis,
        }
        for p in splits[0].parts
    }


def check_part(params: OpParams, partition: Partition, processor: str, part: PartShape) -> None:
    """Raise ``ProfileError`` unless ``part`` is the part ``PartitionOperators`` produces."""
    parts = passes_parts(params, partition)
    got = parts.get(processor)
    if got is None:
        if not part.empty:
            raise ProfileError(
                f"{params.describe()}: PartitionOperators makes no {processor} part for "
                f"{partition.dim}:{partition.ratio:g}, the profiler expected {part.to_json()}"
            )
        return
    a, b = got["region"]
    c, d = got["input_region"]
    if partition.dim == "H" or partition.dim == "none":
        want = ((part.row0, part.row0 + part.out_h), None if params.op == "dense" else part.in_h)
        have = ((a, b), None if params.op == "dense" else d - c)
    else:
        want = ((part.oc0, part.oc0 + part.oc), None)
        have = ((a, b), None)
    if want != have:
        raise ProfileError(
            f"{params.describe()}: the {processor} part of {partition.dim}:{partition.ratio:g} "
            f"is (region, input rows) {have} in PartitionOperators but {want} in the profiler"
        )


# ---------------------------------------------------------------------------------------------
# Compiling.


@dataclass(frozen=True)
class CompiledPart:
    """One part compiled to a shared library (what a run directory's manifest lists)."""

    library: str  # file name, relative to the directory it lives in
    params: OpParams
    partition: Partition
    processor: str
    part: PartShape
    impl: str
    dispatch: DispatchFeatures
    inputs: tuple[tuple[int, ...], ...]
    name: str | None = None

    def to_json(self) -> dict:
        return {
            "library": self.library,
            "op": self.params.op,
            "params": self.params.to_json(),
            "partition": self.partition.to_json(),
            "processor": self.processor,
            "part": self.part.to_json(),
            "impl": self.impl,
            "dispatch": self.dispatch.to_json(),
            "inputs": [list(s) for s in self.inputs],
            "name": self.name,
        }

    @classmethod
    def from_json(cls, obj: dict) -> CompiledPart:
        p = dict(obj["params"])
        p["padding"] = tuple(p["padding"])
        return cls(
            library=obj["library"],
            params=OpParams(obj["op"], **p),
            partition=Partition(**obj["partition"]),
            processor=obj["processor"],
            part=PartShape(**obj["part"]),
            impl=obj["impl"],
            dispatch=DispatchFeatures(**obj["dispatch"]),
            inputs=tuple(tuple(s) for s in obj["inputs"]),
            name=obj.get("name"),
        )


def _target(processor: str, target=None):
    if target is not None:
        return target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    return default_target(PROCESSOR_DEVICE[processor])


def _target_str(processor: str, target=None) -> str:
    """The target as its JSON text (kept verbatim when already a string, e.g. from a manifest
    read on a machine whose TVM is runtime-only)."""
    return target if isinstance(target, str) else str(_target(processor, target))


def _implementation(funcs) -> str:
    algos = []
    for f in funcs:
        attrs = f.attrs or {}
        if "codl.algorithm" in attrs:
            a = str(attrs["codl.algorithm"])
            if a not in algos:
                algos.append(a)
    # Kernels no codl rule scheduled (dlight / default schedule) are named as such.
    return "+".join(algos) if algos else "default"


def _threads() -> int:
    env = os.environ.get("TVM_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
    return int(env) if env else (os.cpu_count() or 1)


def schedule_part(params: OpParams, part: PartShape, processor: str, target=None):
    """The one-op module of ``part`` (:func:`part_module`, under the algorithm switches on here)
    and that module legalized and scheduled for ``processor``'s ``target``, as
    :func:`compile_part` builds it: ``(module, scheduled)``. The cost model reads its kernels'
    TIR (``cost_model.kernel_counts``)."""
    # deferred: building parts needs TVM's compiler (see algorithm_switches)
    from codl_tvm.build.pipeline import legalize_passes, schedule_passes

    tgt = _target(processor, target)
    config = None
    if algorithm_switches() and params.op == "conv2d":
        from codl_tvm.schedules import cpu_config, opencl_config  # deferred: as above

        kind = tgt.kind.name
        if kind in ("llvm", "opencl"):
            config = cpu_config(tgt) if kind == "llvm" else opencl_config(tgt)
    mod = part_module(params, part, algorithm_config=config)
    if processor == "gpu":
        runtime.load()
    with tgt:
        scheduled = tvm.transform.Sequential(legalize_passes(tgt) + schedule_passes(tgt))(mod)
    return mod, scheduled


def compile_part(
    params: OpParams,
    partition: Partition,
    processor: str,
    out_dir: str | Path,
    target=None,
    name: str | None = None,
    threads: int | None = None,
    verify: bool = True,
    preset: str | None = None,
) -> CompiledPart:
    """Build the ``processor`` part of ``params`` under ``partition`` into ``out_dir``.

    ``target`` overrides the default target of the processor (``runner.default_target``);
    ``threads`` is the CPU thread-pool size recorded in the dispatch features (default: this
    machine's ``TVM_NUM_THREADS`` or CPU count; pass the remote's when cross-compiling).
    ``verify`` checks the part against the one ``PartitionOperators`` makes (:func:`check_part`).
    ``preset`` (a ``codl_tvm.build.targets`` preset name) picks both targets unless ``target`` is
    given
    and exports with the preset's (cross-)toolchain, for a device machine.
    Inside :func:`~codl_tvm.schedules.winograd_enabled` / :func:`~codl_tvm.schedules.packed_enabled`
    (``codl-tvm profile --winograd/--packed``) a conv part is built with the algorithm an
    imported model's conv gets under those switches (:func:`part_module`), so its record
    names it (``winograd``, ``packed``, or ``direct``/``gemm`` below their thresholds).
    """
    # deferred: building parts needs TVM's compiler; this module also measures on devices whose
    # TVM is runtime-only (`codl-tvm profile --run-dir`)
    from tvm import tirx

    from codl_tvm.build.pipeline import dataflow_lower_passes, finalize_passes

    if processor not in PROCESSOR_DEVICE:
        raise ProfileError(f"{params.describe()}: processor {processor!r} is not 'gpu' or 'cpu'")
    try:
        part = part_shape(params, partition, processor)
    except FeatureError as exc:
        raise ProfileError(str(exc)) from None
    if part.empty:
        raise ProfileError(
            f"{params.describe()}: the {processor} part of partition "
            f"{partition.dim}:{partition.ratio:g} is empty"
        )
    if verify:
        check_part(params, partition, processor, part)
    switches = algorithm_switches()
    if preset is not None and target is None:
        target = get_preset(preset).target(processor)
    tgt = _target(processor, target)
    mod, scheduled = schedule_part(params, part, processor, tgt)
    funcs = [f for _, f in scheduled.functions.items() if isinstance(f, tirx.PrimFunc)]
    impl = _implementation(funcs)
    cpu_threads = None if processor == "gpu" else (threads or _threads())
    dispatch = dispatch_features(funcs, cpu_threads) if funcs else DispatchFeatures()

    @tvm.transform.module_pass(opt_level=0, name="codl.profiling.Lower")
    def _lower(m, _ctx):
        with tgt:
            return tvm.transform.Sequential(dataflow_lower_passes(tgt) + finalize_passes(tgt))(m)

    ex = tvm.compile(scheduled, target=tgt, relax_pipeline=_lower)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ident = json.dumps(
        [params.op, params.to_json(), partition.to_json(), processor, str(tgt), switches],
        sort_keys=True,
    )
    lib = f"{params.op}_{processor}_{hashlib.sha1(ident.encode()).hexdigest()[:12]}.so"
    if preset is not None:
        export_library(ex, out / lib, preset)
    else:
        ex.export_library(str(out / lib))
    inputs = tuple(tuple(int(v) for v in p.ty.shape.values) for p in mod["main"].params)
    return CompiledPart(lib, params, partition, processor, part, impl, dispatch, inputs, name)


# ---------------------------------------------------------------------------------------------
# Sessions: local, or a TVM RPC session (same calls).


class LocalSession:
    """Runs libraries in this process (OpenCL through the codl-tvm runtime plugin)."""

    remote = False

    def __init__(self) -> None:
        self._plugin = False

    def device(self, processor: str):
        if processor == "gpu":
            self._load_plugin()
            return tvm.opencl(0)
        return tvm.cpu(0)

    def _load_plugin(self) -> None:
        if not self._plugin:
            runtime.load()
            self._plugin = True

    def load_module(self, path: str | Path):
        return tvm.runtime.load_module(str(path))

    def get_function(self, name: str):
        self._load_plugin()
        func = tvm.get_global_func(name, allow_missing=True)
        if func is None:
            raise ProfileError(f"the codl-tvm runtime plugin has no function {name!r}")
        return func


class RPCSession:
    """Runs libraries on a TVM RPC server (``tvm.rpc.connect`` or ``rpc_utils.request_remote``'s
    ``.session``); the server must have loaded the codl-tvm runtime plugin for OpenCL."""

    remote = True

    def __init__(self, session) -> None:
        self.session = session

    def device(self, processor: str):
        return self.session.cl(0) if processor == "gpu" else self.session.cpu(0)

    def load_module(self, path: str | Path):
        path = Path(path)
        self.session.upload(str(path))
        return self.session.load_module(path.name)

    def get_function(self, name: str):
        try:
            return self.session.get_function(name)
        except Exception as exc:
            raise ProfileError(
                f"the RPC server has no function {name!r} (is the codl-tvm runtime plugin "
                f"loaded there?): {exc}"
            ) from None


# ---------------------------------------------------------------------------------------------
# Measuring.


def time_samples(
    session, compiled: CompiledPart, directory: str | Path, timing: TimingConfig = TimingConfig()
) -> PartTiming:
    """Time ``compiled`` on its processor with ``timing`` (see :class:`TimingConfig`)."""
    dev = session.device(compiled.processor)
    lib = session.load_module(Path(directory) / compiled.library)
    vm = VirtualMachine(lib, dev)
    # Latency does not depend on the values; tiling a short ramp costs a memcpy, where random
    # normals for a sampled operator's GB-sized weights dominated the whole profiling run.
    ramp = np.linspace(-1.0, 1.0, 4099, dtype=np.float32)
    args = [tvm.runtime.tensor(np.resize(ramp, s), dev) for s in compiled.inputs]
    for _ in range(timing.warmup):
        vm["main"](*args)
    dev.sync()
    number = timing.number
    if timing.flush_weights and compiled.processor == "cpu":
        number = 1
        res = vm.time_evaluator(
            "main",
            dev,
            number=1,
            repeat=timing.repeats * timing.number,
            f_preproc="cache_flush_cpu_non_first_arg",
        )(*args)
    else:
        if timing.min_repeat_ms > 0:
            # One sample of `number` runs sizes the others (and warms up once more); through
            # RPC the same call runs on the remote, so the count is the remote's.
            probe = vm.time_evaluator("main", dev, number=timing.number, repeat=1)(*args)
            number = runs_per_sample(float(probe.results[0]) * 1e3, timing)
        res = vm.time_evaluator("main", dev, number=number, repeat=timing.repeats)(*args)
    samples = [float(r) * 1e3 for r in res.results]
    median = float(statistics.median(samples))
    if not median > 0 or not min(samples) > 0:
        raise ProfileError(
            f"{compiled.params.describe()}: {compiled.processor} part measured {median} ms "
            f"(fastest sample {min(samples)} ms; timer resolution too coarse?)"
        )
    return PartTiming(median, min(samples), max(samples), len(samples), number)


def device_description(session, gpu_target=None, cpu_target=None) -> dict:
    """What the records were measured on (stable across runs, so resuming matches keys)."""
    desc: dict = {
        "gpu_target": _target_str("gpu", gpu_target),
        "cpu_target": _target_str("cpu", cpu_target),
        "remote": bool(session.remote),
    }
    try:
        info = json.loads(session.get_function("codl.opencl.info")())
        dev0 = (info.get("devices") or [{}])[0]
        desc["gpu"] = dev0.get("name", "?")
        desc["platform"] = f"{info.get('platform', '?')} ({info.get('platform_version', '?')})"
        desc["compute_units"] = dev0.get("compute_units")
        desc["svm_mode"] = info.get("svm_mode", "?")
    except ProfileError:
        desc["gpu"] = "unavailable"
    if not session.remote:
        desc["cpu_threads"] = _threads()
    return desc


def measure_op(
    session,
    compiled: CompiledPart,
    directory: str | Path,
    device: dict,
    timing: TimingConfig = TimingConfig(),
) -> OpRecord:
    """Time one compiled part and return its record (with its samples' spread)."""
    t = time_samples(session, compiled, directory, timing)
    return OpRecord(
        compiled.params,
        compiled.partition,
        compiled.processor,
        compiled.impl,
        t.median_ms,
        t.samples,
        compiled.part,
        compiled.dispatch,
        device,
        compiled.name,
        t.number,
        t.min_ms,
        t.max_ms,
    )


def _host_median_ms(func, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        func()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        func()
        samples.append((time.perf_counter() - t0) * 1e3)
    return float(statistics.median(samples))


def _copy_ms(session, src, dst, repeats: int) -> float:
    """Host time of copying ``src`` (CPU) into ``dst`` (OpenCL) and waiting for it. Through RPC
    the copy runs on the server (its ``runtime.TVMTensorCopyFromTo``) and the round trips of the
    two calls, measured with sync-only calls, are subtracted (clipped at 0)."""
    gpu = dst.device
    if not session.remote:

        def copy():
            dst.copyfrom(src)
            gpu.sync()

        return _host_median_ms(copy, repeats)
    copy_fn = session.get_function("runtime.TVMTensorCopyFromTo")

    def remote_copy():
        copy_fn(src, dst)
        gpu.sync()

    def round_trips():
        gpu.sync()
        gpu.sync()

    return max(0.0, _host_median_ms(remote_copy, repeats) - _host_median_ms(round_trips, repeats))


def measure_sharing(
    session,
    device: dict,
    sizes: tuple[int, ...] = (4096, 65536, 1 << 20),
    repeats: int = 10,
    sync_repeats: int = 200,
) -> list[SharingRecord]:
    """Data-sharing costs as functions of bytes.

    - ``presync`` / ``postsync``: one mark + wait with the device's sync mode (``"auto"``
      resolves it by measurement, so it is not part of the device description), from the
      plugin's ``measure_us`` (median of ``sync_repeats``); it does not depend on bytes, so it
      is measured once per size as independent samples.
    - ``map`` / ``unmap``: host time of mapping / unmapping an OpenCL tensor of ``nbytes`` when
      the SVM mode is ``coarse`` or ``buffer`` (no SVM: co-execution maps buffers for the CPU);
      with fine-grained SVM there is nothing to map and the cost is 0 (``device["svm_mode"]``
      says which).
    - ``transform``: host time of copying ``nbytes`` from a CPU tensor into an OpenCL tensor and
      waiting for it (through RPC: on the server, round trips subtracted).
    """
    for n in sizes:
        if isinstance(n, bool) or not isinstance(n, int) or n < 4 or n % 4:
            raise ProfileError(f"sharing size {n!r} must be a positive multiple of 4 bytes")
    records: list[SharingRecord] = []
    gpu = session.device("gpu")
    cpu = session.device("cpu")
    mode = str(session.get_function("codl.coexec.sync_mode")(0))
    measure_us = session.get_function("codl.coexec.measure_us")
    coarse = device.get("svm_mode") in ("coarse", "buffer")  # modes that map for the host
    smap = session.get_function("codl.opencl.svm_map") if coarse else None
    sunmap = session.get_function("codl.opencl.svm_unmap") if coarse else None
    for n in sizes:
        # Sync has no pattern in bytes (CoDL Fig. 14b): measured once per size, after a copy of
        # that size, so the model's upper bound sees several samples.
        for kind in ("presync", "postsync"):
            sync_ms = max(float(measure_us(0, mode, sync_repeats)), 0.0) / 1e3
            records.append(SharingRecord(kind, n, sync_ms, sync_repeats, device))
        host = np.zeros(n // 4, dtype="float32")
        src = tvm.runtime.tensor(host, cpu)
        dst = tvm.runtime.empty((n // 4,), "float32", gpu)

        records.append(
            SharingRecord("transform", n, _copy_ms(session, src, dst, repeats), repeats, device)
        )
        if coarse:
            map_ms = []
            unmap_ms = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                smap(dst, True)
                t1 = time.perf_counter()
                sunmap(dst)
                t2 = time.perf_counter()
                map_ms.append((t1 - t0) * 1e3)
                unmap_ms.append((t2 - t1) * 1e3)
            records.append(
                SharingRecord("map", n, float(statistics.median(map_ms)), repeats, device)
            )
            records.append(
                SharingRecord("unmap", n, float(statistics.median(unmap_ms)), repeats, device)
            )
        else:
            records.append(SharingRecord("map", n, 0.0, 1, device))
            records.append(SharingRecord("unmap", n, 0.0, 1, device))
    return records
