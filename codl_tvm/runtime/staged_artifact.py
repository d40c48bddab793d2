"""Pipeline artifacts at run time: load one, run it per frame or as a stream.

A pipeline artifact (written by :func:`codl_tvm.objectives.stage_build.build_pipeline`, ``codl-tvm
compile MODEL --objective throughput``) is a directory with one library per stage
(``stage_K.so``), ``pipeline.json`` (the manifest: format and version, the codl-tvm and TVM
versions that built it, the model's file, SHA-256, inputs and outputs, the processor groups, the
plan and every stage's group, cores, instruction set and layers, with each file's SHA-256) and,
unless compiled without it, ``reference.npz``: seeded inputs and the unpartitioned model's
outputs on the host CPU, which ``codl-tvm run PIPELINE/`` compares the pipeline's outputs with
(:meth:`Pipeline.reference`).

Nothing here needs TVM's compiler (a runtime-only TVM runs pipeline artifacts).
:func:`load_pipeline` checks the artifact and its groups' cores against this machine before
anything runs; :class:`Pipeline` runs the stages one after another in the caller's thread
(``pipeline(inputs)``, single inferences) or as a stream (:meth:`Pipeline.stream`, on
:func:`codl_tvm.runtime.stream.run_stream`): one thread per stage, pinned to its stage's cores,
with TVM's CPU thread pool (a per-thread pool) configured in that thread with one worker per
core (:func:`pin_thread_pool`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm import runtime
from codl_tvm.core.errors import ArtifactError, ModelError
from codl_tvm.core.groups import ProcessorGroup, check_groups
from codl_tvm.core.tensors import TensorSpec
from codl_tvm.runtime.artifact import REFERENCE, file_sha256, read_manifest
from codl_tvm.runtime.stream import Stream, StreamStage, run_stream
from codl_tvm.runtime.vm import Latency, flatten_outputs

__all__ = [
    "PIPELINE_FORMAT",
    "PIPELINE_MANIFEST",
    "PIPELINE_VERSION",
    "Pipeline",
    "group_device",
    "is_pipeline",
    "load_pipeline",
    "pin_thread_pool",
]

PIPELINE_FORMAT = "codl-tvm-pipeline"
PIPELINE_VERSION = 1
PIPELINE_MANIFEST = "pipeline.json"


# Serialises the set-up of threads' TVM pools: each reads TVM_NUM_THREADS when it is created.
_POOL_LOCK = threading.Lock()


def pin_thread_pool(cores: Sequence[int]) -> None:
    """Pin the calling thread to ``cores`` and give its TVM CPU thread pool one worker per
    core there (TVM's pool belongs to the thread that launches kernels).

    A pool is created with ``TVM_NUM_THREADS`` workers (else one per core of the machine), and
    configuring it later only uses fewer of them, the rest staying pinned among the cores in
    use (measured 1.2-1.5x slower); so the pool is created here, with that variable set to this
    stage's core count for the moment of its creation.
    """
    cores = [int(c) for c in cores]
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    with _POOL_LOCK:
        before = os.environ.get("TVM_NUM_THREADS")
        os.environ["TVM_NUM_THREADS"] = str(len(cores))
        try:
            # -2: one worker per listed core (kSpecifyOneCorePerThread)
            tvm.get_global_func("runtime.config_threadpool")(
                -2, len(cores), [str(c) for c in cores]
            )
        finally:
            if before is None:
                del os.environ["TVM_NUM_THREADS"]
            else:
                os.environ["TVM_NUM_THREADS"] = before


def group_device(kind: str) -> tvm.runtime.Device:
    """The TVM device a processor group of ``kind`` (``"cpu"``, ``"gpu"``) runs on: the first
    OpenCL device for a GPU group, the host CPU for a CPU group."""
    return tvm.opencl(0) if kind == "gpu" else tvm.cpu(0)


def is_pipeline(path: str | Path) -> bool:
    """Whether ``path`` is a pipeline artifact directory."""
    return (Path(path) / PIPELINE_MANIFEST).is_file()


@dataclass
class _LoadedStage:
    index: int
    group: str
    kind: str
    cores: tuple[int, ...]
    vm: Any
    device: Any


class Pipeline:
    """A loaded pipeline artifact: ``pipeline(inputs)`` runs one inference stage after stage;
    :meth:`stream` runs a stream of frames with one thread per stage.

    Made by :func:`load_pipeline`.
    """

    def __init__(self, path: Path, manifest: dict, stages: list[_LoadedStage]) -> None:
        self.path = path
        self.manifest = manifest
        self._stages = stages
        m = manifest["model"]
        self.inputs = tuple(
            TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in m["inputs"]
        )
        self.outputs = tuple(
            TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in m["outputs"]
        )

    @property
    def model(self) -> Any:
        """Input/output specs in the shape :mod:`codl_tvm.frontend.importer`'s helpers expect."""
        return SimpleNamespace(
            path=self.manifest["model"]["file"], inputs=self.inputs, outputs=self.outputs
        )

    def describe(self) -> str:
        """The stages on one line: ``big4[0:35] - little2[35:44] - gpu1[44:54]``."""
        return self.manifest["plan"]["describe"]

    def reference(self) -> tuple[dict[str, np.ndarray], list[np.ndarray]] | None:
        """``(inputs, outputs)`` stored at compile time (seeded inputs, the unpartitioned
        model's outputs on the host CPU, in graph order), or None for an artifact compiled
        without them."""
        ref = self.path / REFERENCE
        if not ref.is_file():
            return None
        with np.load(ref, allow_pickle=False) as data:
            inputs = {k[6:]: data[k] for k in data.files if k.startswith("input:")}
            outs = {k[7:]: data[k] for k in data.files if k.startswith("output:")}
        return inputs, [outs[s.name] for s in self.outputs]

    def _stage_fn(self, k: int) -> Callable[[Any], Any]:
        stage = self._stages[k]
        last = k == len(self._stages) - 1
        fn = stage.vm["main"]
        dev = stage.device

        # tvm_ffi releases the interpreter lock around a call by default (its
        # TVM_FFI_RELEASE_GIL_BY_DEFAULT); set here so that the other stages' threads run
        # while this one's kernels do, whatever the environment says
        if hasattr(fn, "release_gil"):
            fn.release_gil = True

        def run(args: Sequence[Any]) -> Any:
            # a tensor from a stage on another device is copied device to device (one copy,
            # not two through numpy); same-device tensors pass as they are
            placed = [
                (a if a.device == dev else a.copyto(dev))
                if isinstance(a, tvm.runtime.Tensor)
                else tvm.runtime.tensor(np.asarray(a), dev)
                for a in args
            ]
            result = fn(*placed)
            if last:
                return flatten_outputs(result)
            return list(result)

        return run

    def _frame_args(self, frame: Any) -> list[np.ndarray]:
        if isinstance(frame, Mapping):
            return [np.asarray(frame[s.name]) for s in self.inputs]
        if isinstance(frame, np.ndarray):
            return [frame]
        return [np.asarray(a) for a in frame]

    def _check_frame(self, args: Sequence[np.ndarray], where: str) -> None:
        if len(args) != len(self.inputs):
            raise ModelError(f"{where}: {len(args)} inputs, the model takes {len(self.inputs)}")
        for a, s in zip(args, self.inputs, strict=True):
            if tuple(a.shape) != s.shape or str(a.dtype) != s.dtype:
                raise ModelError(
                    f"{where}: input {s.name!r} has shape {tuple(a.shape)} {a.dtype}, the model "
                    f"takes {s.shape} {s.dtype}"
                )

    def __call__(self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """One inference: the stages in turn in this thread; numpy outputs in graph order."""
        args: Any = self._frame_args(inputs)
        self._check_frame(args, "inputs")
        for k in range(len(self._stages)):
            args = self._stage_fn(k)(args)
        return args

    def time(
        self,
        inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
        number: int = 5,
        repeat: int = 3,
    ) -> Latency:
        """Latency of one inference run stage after stage in this thread (host timer, one
        warm-up run first): what the pipeline costs a single frame, queues aside."""
        self(inputs)
        ms = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(number):
                self(inputs)
            ms.append((time.perf_counter() - t0) * 1e3 / number)
        return Latency.of(ms)

    def _checked(self, frames: Iterable[Any]) -> Iterator[list[np.ndarray]]:
        # frames from an iterator are checked as the stream reads them
        for i, f in enumerate(frames):
            args = self._frame_args(f)
            self._check_frame(args, f"stream frame {i}")
            yield args

    def stream_stages(self, pin: bool = True) -> list[StreamStage]:
        """The stages as :class:`~codl_tvm.runtime.stream.StreamStage`: CPU stages pinned to their
        cores with TVM's thread pool there; a GPU stage's thread on its group's host cores."""
        out = []
        for k, s in enumerate(self._stages):
            cores = s.cores if pin and s.cores else None
            setup = None
            if pin and s.kind == "cpu" and s.cores:
                setup = _pool_setup(s.cores)
            out.append(
                StreamStage(
                    self._stage_fn(k),
                    f"{Path(self.manifest['stages'][k]['library']).stem}:{s.group}",
                    cores,
                    setup,
                )
            )
        return out

    def stream(
        self,
        frames: Iterable[Any],
        *,
        queue_size: int = 2,
        timeline: bool = False,
        pin: bool = True,
    ) -> Stream:
        """Stream ``frames`` (each the model's inputs: a list in graph order, a ``{name:
        array}`` mapping, or one array for a one-input model) through the stages; iterate the
        result for the outputs in order, then ask it for
        :meth:`~codl_tvm.runtime.stream.Stream.stats`.

        Raises
        ------
        ModelError
            An empty stream, or a frame whose inputs differ from the model's (frames given as
            a sequence are all checked before the first runs).
        PlannerError
            A stage pinned to cores this process cannot use.
        """
        if isinstance(frames, Sequence) and not isinstance(frames, str | bytes):
            frames = [self._frame_args(f) for f in frames]
            for i, f in enumerate(frames):
                self._check_frame(f, f"stream frame {i}")
        else:
            frames = self._checked(frames)
        return run_stream(
            self.stream_stages(pin),
            frames,
            queue_size=queue_size,
            input_shape=tuple(s.shape for s in self.inputs),
            timeline=timeline,
        )


def _pool_setup(cores: Sequence[int]) -> Callable[[], None]:
    def setup() -> None:
        pin_thread_pool(cores)

    return setup


def load_pipeline(path: str | Path, available: Iterable[int] | None = None) -> Pipeline:
    """Load a pipeline artifact and check its groups against this machine's cores.

    Raises
    ------
    ArtifactError
        Not a pipeline artifact, another version, or a file missing or altered.
    PlannerError
        A group names cores this machine (this process) does not have.
    """
    path = Path(path)
    mpath = path / PIPELINE_MANIFEST
    manifest = read_manifest(mpath, PIPELINE_FORMAT, PIPELINE_VERSION, "pipeline")
    check_groups(
        [ProcessorGroup(g["name"], g["kind"], tuple(g["cores"])) for g in manifest["groups"]],
        available,
    )
    for name, digest in manifest["files"].items():
        f = path / name
        if not f.is_file():
            raise ArtifactError(f"{path}: {name} is missing")
        if file_sha256(f) != digest:
            raise ArtifactError(f"{path}: {name} does not match its SHA-256 in {PIPELINE_MANIFEST}")
    stages = []
    for k, s in enumerate(manifest["stages"]):
        if s["kind"] == "gpu":
            runtime.load()
        dev = group_device(s["kind"])
        lib = tvm.runtime.load_module(str(path / s["library"]))
        stages.append(
            _LoadedStage(k, s["group"], s["kind"], tuple(s["cores"]), VirtualMachine(lib, dev), dev)
        )
    return Pipeline(path, manifest, stages)
