"""The libraries one compile builds, and the build cache that reuses them across compiles.

A library is described by one frozen :class:`BuildSpec`: the model, the targets, the plan and
every build setting. The cache's key is the spec's digest, and the builds of
:class:`Libraries` read their settings from the spec they are stored under, so the key cannot
drift from what was built (a hand-kept list of key fields could miss a new setting and hand
out a stale library).

Every build is :func:`build_library` of a spec, its schedule switches taken from the spec
(:func:`spec_settings`), so a worker process (:mod:`codl_tvm.build.parallel`) builds the same
library as the compile's own process would. Building needs TVM's compiler (imported when a
build starts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tvm

from codl_tvm.build.parallel import BackgroundBuilds, BuildJob, default_workers, vm_devices
from codl_tvm.build.targets import TargetPreset, export_library
from codl_tvm.core.errors import BuildError
from codl_tvm.core.plan import PartitionPlan
from codl_tvm.runtime import build_error
from codl_tvm.runtime.artifact import PROCESSOR_NAMES, Manifest, replace_file
from codl_tvm.runtime.images import image_caps
from codl_tvm.runtime.warm_up import WarmUpProcesses
from codl_tvm.runtime.weights import write_weights

__all__ = [
    "BuildSpec",
    "Libraries",
    "build_library",
    "code_digest",
    "gpu_data_type_for",
    "source_files",
    "spec_settings",
    "switch_on",
]

logger = logging.getLogger(__name__)

#: A build's device in the words of its error: the processor it was built for.
_BUILT_FOR = {
    **{device: f"the {name} alone" for device, name in PROCESSOR_NAMES.items()},
    "coexec": "co-execution",
}


_CODE_DIGEST: str | None = None


def switch_on(
    stack: contextlib.ExitStack, algos: tuple[str, ...] | list[str], preset_obj: TargetPreset
) -> None:
    """Switch ``algos`` (``"winograd"``, ``"packed"``) on for the preset's CPU, on top of any
    switch already on, until ``stack`` closes."""
    # deferred: the schedules need TVM's compiler (see _build_coexec)
    from codl_tvm.schedules import cpu_config, packed_enabled, winograd_enabled
    from codl_tvm.schedules.settings import packed_presets, winograd_presets

    name = cpu_config(preset_obj.target("cpu")).name
    if "winograd" in algos:
        stack.enter_context(winograd_enabled(winograd_presets() | {name}))
    if "packed" in algos:
        stack.enter_context(packed_enabled(packed_presets() | {name}))


def source_files() -> list[tuple[str, Path]]:
    """codl-tvm's Python sources as ``(name, path)``: the package, its passes, its schedules."""
    files = []
    for package in ("codl_tvm", "codl_tvm.passes", "codl_tvm.schedules"):
        spec = importlib.util.find_spec(package)  # found, not imported
        for root in map(Path, spec.submodule_search_locations or ()):
            files += [(f"{package}/{p.relative_to(root)}", p) for p in sorted(root.rglob("*.py"))]
    return files


def code_digest() -> str:
    """A digest of codl-tvm's Python sources (:func:`source_files`): a library built by other
    code is never reused."""
    global _CODE_DIGEST
    if _CODE_DIGEST is None:
        h = hashlib.sha256()
        for name, path in source_files():
            h.update(name.encode())
            h.update(path.read_bytes())
        _CODE_DIGEST = h.hexdigest()
    return _CODE_DIGEST


def _tvm_version() -> str:
    return tvm.__version__


@dataclass(frozen=True)
class BuildSpec:
    """Everything an exported library depends on; :meth:`key` is its build-cache key.

    Attributes
    ----------
    device
        ``"coexec"``, ``"cpu"`` or ``"opencl"``.
    plan
        The plan's JSON (co-executed builds), else None.
    model_sha256
        The ONNX model file's SHA-256.
    preset, cpu_target, gpu_target
        The target preset and its targets (``str`` of each ``Target``).
    winograd, packed
        Whether Winograd / packed convs were switched on for every preset.
    cpu_alone_winograd, cpu_alone_packed
        A build for the CPU alone with the preset's CPU-alone Winograd / packed convs.
    coexec_cpu_algorithms, coexec_cpu_alone
        A co-executed build's CPU functions: the algorithms switched on for them, and whether
        they get the CPU-alone settings.
    channel_blocks, row_blocks
        A co-executed build's channel and row blocks.
    issue_ahead
        A co-executed build's GPU kernels enqueued as early as their inputs allow.
    weights
        ``"embedded"`` (constants in the library) or ``"beside"`` (large constants fetched from
        a weights file beside it, :mod:`codl_tvm.runtime.weights`).
    gpu_data_type
        A build for the GPU alone or a co-executed build (its GPU parts): its GPU tensors in
        buffers (``"buffer"``) or, where covered, in OpenCL images (``"image"``,
        :func:`codl_tvm.build.texture.build_texture_gpu`,
        :mod:`codl_tvm.build.texture_coexec`); decided before the spec is made
        (:meth:`Libraries.spec`), never ``"auto"`` here.
    gpu_dtype
        A build for the GPU alone: ``"float32"`` or ``"float16"`` GPU tensors (inputs and
        outputs stay float32); a co-executed build on images: what its GPU parts compute in
        (``"float16"``: half images; the CPU parts and the shared tensors stay float32).
    code, tvm_version
        codl-tvm's sources (:func:`code_digest`) and TVM's version.
    """

    device: str
    plan: str | None
    model_sha256: str
    preset: str
    cpu_target: str
    gpu_target: str | None
    winograd: bool = False
    packed: bool = False
    cpu_alone_winograd: bool = False
    cpu_alone_packed: bool = False
    coexec_cpu_algorithms: tuple[str, ...] = ()
    coexec_cpu_alone: bool = False
    channel_blocks: bool = False
    row_blocks: bool = False
    issue_ahead: bool = True
    weights: str = "embedded"
    gpu_data_type: str = "buffer"
    gpu_dtype: str = "float32"
    code: str = field(default_factory=code_digest)
    tvm_version: str = field(default_factory=_tvm_version)

    def key(self) -> str:
        """The cache key: a digest of every field."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def spec_settings(spec: BuildSpec, preset_obj: TargetPreset):
    """The schedule switches (a :class:`~codl_tvm.schedules.ScheduleSettings`) the build of
    ``spec`` runs under, from the spec alone: a build in a worker process, where the compile's
    switches are not on, and one in the compile's process build the same library, the one the
    key names.

    Winograd / packed convs for every preset (``spec.winograd``, ``spec.packed``), the preset
    CPU's CPU-alone kernels (a build for the CPU alone), and a co-executed build's CPU-part
    algorithms and CPU-alone settings."""
    # deferred: the schedules need TVM's compiler (see Libraries._build)
    from codl_tvm.schedules import ScheduleSettings, cpu_config
    from codl_tvm.schedules.presets import PACKED_CPU_ALONE, WINOGRAD_CPU_ALONE

    winograd: set[str] = set()
    packed: set[str] = set()
    if spec.cpu_alone_winograd:
        winograd |= set(WINOGRAD_CPU_ALONE)
    if spec.cpu_alone_packed:
        packed |= set(PACKED_CPU_ALONE)
    if spec.coexec_cpu_algorithms:
        name = cpu_config(preset_obj.target("cpu")).name
        if "winograd" in spec.coexec_cpu_algorithms:
            winograd.add(name)
        if "packed" in spec.coexec_cpu_algorithms:
            packed.add(name)
    return ScheduleSettings(
        winograd="all" if spec.winograd else frozenset(winograd),
        packed="all" if spec.packed else frozenset(packed),
        # a build for the CPU alone gets the CPU-alone settings with its packed convs
        cpu_alone=spec.cpu_alone_packed if spec.device == "cpu" else spec.coexec_cpu_alone,
    )


def build_library(
    path: Path, spec: BuildSpec, mod: tvm.IRModule, preset_obj: TargetPreset
) -> tuple[dict | None, dict | None]:
    """Build ``mod`` as ``spec`` describes and export it to ``path`` (its weights, when
    ``spec.weights`` is ``"beside"``, to ``<path>.weights``).

    Every setting comes from ``spec`` and ``preset_obj`` (:func:`spec_settings`), so a worker
    process rebuilds from them alone (:mod:`codl_tvm.build.parallel`).

    Returns
    -------
    tuple
        A co-executed build's kernel splits (else None) and, weights beside, the weights
        file's record (else None).
    """
    # deferred: building needs TVM's compiler, and this package is imported where TVM is
    # runtime-only (artifacts on a device)
    from codl_tvm.build.pipeline import coexec_pipeline, single_device_pipeline
    from codl_tvm.build.texture import inference_passes
    from codl_tvm.schedules import use_settings

    splits: dict | None = {} if spec.device == "coexec" else None
    weights: dict | None = {} if spec.weights == "beside" else None
    if spec.device == "opencl" and spec.gpu_data_type == "image":
        _build_texture(path, spec, mod, preset_obj, weights)
        return splits, _weights_record(path, weights)
    if spec.device == "opencl" and spec.gpu_dtype == "float16":
        # half on the GPU: TVM's mixed precision ahead of the single-device pipeline, whose
        # inference passes see the cast graph (texture builds do this in their own pipeline)
        mod = tvm.transform.Sequential(inference_passes("float16"))(mod)
    if spec.device == "coexec" and spec.gpu_data_type == "image":
        _build_coexec_images(path, spec, mod, preset_obj, splits, weights)
        return splits, _weights_record(path, weights)
    if spec.device == "coexec":
        gpu, cpu = preset_obj.target("gpu"), preset_obj.target("cpu")
        logger.info("building %s for co-execution (preset %s)", Path(path).stem, spec.preset)
        pipeline = coexec_pipeline(
            PartitionPlan.from_json(spec.plan),
            gpu,
            cpu,
            channel_blocks=spec.channel_blocks,
            row_blocks=spec.row_blocks,
            issue_ahead=spec.issue_ahead,
            kernel_splits=splits,
            weights=weights,
        )
        target = gpu
    else:
        target = preset_obj.target("cpu" if spec.device == "cpu" else "gpu")
        logger.info(
            "building for the %s alone (preset %s)", PROCESSOR_NAMES[spec.device], spec.preset
        )
        pipeline = single_device_pipeline(target, weights=weights)
    with use_settings(spec_settings(spec, preset_obj)):
        executable = tvm.compile(mod, target=target, relax_pipeline=pipeline)
    export_library(executable, path, preset_obj)
    return splits, _weights_record(path, weights)


def _weights_record(path: Path, weights: dict | None) -> dict | None:
    """Write the weights a build put beside its library (``weights``, None: embedded) and
    return their record."""
    if weights is None:
        return None
    return write_weights(
        Path(path).with_suffix(".weights"), weights.get("arrays") or [], weights.get("key")
    )


def _build_texture(
    path: Path, spec: BuildSpec, mod: tvm.IRModule, preset_obj: TargetPreset, weights
) -> None:
    """The GPU-alone build of ``spec`` with its covered operators on images, exported to
    ``path``; within this machine's device's image limits unless the preset cross-compiles."""
    from codl_tvm.build import texture  # deferred, as in build_library

    caps = None if preset_obj.is_cross else image_caps()
    logger.info("building for the GPU alone on images, %s (preset %s)", spec.gpu_dtype, spec.preset)
    built = texture.build_texture_gpu(
        mod, preset_obj.target("gpu"), caps=caps, dtype=spec.gpu_dtype, weights=weights
    )
    export_library(built.executable, path, preset_obj)


def _build_coexec_images(
    path: Path, spec: BuildSpec, mod: tvm.IRModule, preset_obj: TargetPreset, splits, weights
) -> None:
    """The co-executed build of ``spec`` with its GPU parts on images, exported to ``path``;
    ``splits`` receives the kernel record and ``gpu_parts`` (each GPU part's data type)."""
    from codl_tvm.build.texture_coexec import compile_coexec_images  # deferred (build_library)
    from codl_tvm.schedules import use_settings

    caps = None if preset_obj.is_cross else image_caps()
    logger.info(
        "building %s for co-execution, GPU parts on %s images", Path(path).stem, spec.gpu_dtype
    )
    with use_settings(spec_settings(spec, preset_obj)):
        executable, record = compile_coexec_images(
            mod,
            PartitionPlan.from_json(spec.plan),
            preset_obj.target("gpu"),
            preset_obj.target("cpu"),
            caps,
            channel_blocks=spec.channel_blocks,
            row_blocks=spec.row_blocks,
            issue_ahead=spec.issue_ahead,
            kernel_splits=splits,
            weights=weights,
            dtype=spec.gpu_dtype,
        )
    splits["gpu_parts"] = record["gpu_parts"]
    export_library(executable, path, preset_obj)


def gpu_data_type_for(
    mod: tvm.IRModule, preset_obj: TargetPreset, data_type: str, dtype: str
) -> tuple[str, str]:
    """The GPU data type (``"image"`` or ``"buffer"``) a GPU-alone build of ``mod`` gets when
    ``data_type`` (``"buffer"``, ``"image"``, ``"auto"``) and ``dtype`` are asked, and why
    ``auto`` chose buffers (else ``""``).

    A preset of this machine is checked against its OpenCL device
    (:func:`codl_tvm.build.texture.check_device`): images and their limits, ``cl_khr_fp16``. A
    cross-compiling preset is built as asked (its device cannot be asked here).

    Raises
    ------
    DeviceSupportError
        The device cannot do what was asked (``"image"`` or float16).
    """
    from codl_tvm.build.texture import check_device  # deferred, as in build_library

    if data_type == "buffer" and dtype == "float32":
        return "buffer", ""  # nothing to ask the device
    if preset_obj.is_cross:
        return ("buffer" if data_type == "buffer" else "image"), ""
    return check_device(mod, image_caps(), data_type, dtype)


class Libraries:
    """The exported libraries of one compile, in its work directory, reused from and stored in
    a build cache where one is given (keyed by :class:`BuildSpec`), or built in worker
    processes started early (:meth:`start_single`).

    The settings that differ between the builds of one compile are attributes set by the
    compile (:attr:`coexec_cpu_algorithms`, :attr:`coexec_cpu_alone`, :attr:`channel_blocks`,
    :attr:`row_blocks`); :meth:`spec` turns them into the spec of one library. :attr:`builds`
    records how each library came (``{"source": "cache" | "worker" | "here", "s": seconds}``).
    """

    def __init__(
        self,
        work: Path,
        cache: Path | None,
        model,
        manifest: Manifest,
        preset_obj: TargetPreset,
    ) -> None:
        self.work, self.cache, self.preset = work, cache, preset_obj
        self.model = model
        self._model = manifest.model.sha256
        self._winograd = manifest.winograd
        self._cpu_alone_winograd = manifest.winograd_cpu_alone
        self._packed = manifest.packed
        self._cpu_alone_packed = manifest.packed_cpu_alone
        self.coexec_cpu_algorithms: tuple[str, ...] = ()
        self.coexec_cpu_alone = False
        self.channel_blocks = True
        self.row_blocks = False
        self.issue_ahead = True
        # where the libraries built from here on store their weights
        self.weights_placement = "embedded"
        # the GPU-alone build's tensors (set_gpu_data)
        self.gpu_data: dict[str, str] = {
            "asked": "buffer",
            "data_type": "buffer",
            "dtype": "float32",
        }
        # the builds gpu_data describes: "opencl" (the GPU alone) or "coexec" (the GPU parts)
        self.gpu_data_device = "opencl"
        # a co-executed compile's measured auto: the primary plan is also built with its GPU
        # parts on images (image_variant), the other co-executed builds keep buffers
        self.measure_images = False
        # a compile timing here on PoCL: each worker warms its OpenCL library up (parallel.py)
        self.warm_up = False
        self.warm_ahead: WarmUpProcesses | None = None  # started as a build here began
        # library name -> its kernel calls and their splits (co-executed builds)
        self.kernel_splits: dict[str, dict] = {}
        # library name -> the spec it was built from, and (weights beside) its weights record
        self.specs: dict[str, BuildSpec] = {}
        self.weights: dict[str, dict] = {}
        # library name -> how it came and how long that took
        self.builds: dict[str, dict[str, Any]] = {}
        self._background: list[BackgroundBuilds] = []
        if cache is not None:
            cache.mkdir(parents=True, exist_ok=True)

    def spec(self, device: str, plan: PartitionPlan | None) -> BuildSpec:
        """The spec of the library of ``device`` (with ``plan`` when co-executed), its weights
        stored as :attr:`weights_placement` says."""
        alone = device == "cpu" and plan is None
        coexec = device == "coexec"
        return BuildSpec(
            device=device,
            plan=None if plan is None else plan.to_json(),
            model_sha256=self._model,
            preset=self.preset.name,
            cpu_target=str(self.preset.target("cpu")),
            gpu_target=str(self.preset.target("gpu")) if self.preset.has_gpu else None,
            winograd=self._winograd,
            packed=self._packed,
            cpu_alone_winograd=alone and self._cpu_alone_winograd,
            cpu_alone_packed=alone and self._cpu_alone_packed,
            coexec_cpu_algorithms=tuple(self.coexec_cpu_algorithms) if coexec else (),
            coexec_cpu_alone=coexec and self.coexec_cpu_alone,
            channel_blocks=coexec and self.channel_blocks,
            row_blocks=coexec and self.row_blocks,
            issue_ahead=not coexec or self.issue_ahead,
            weights=self.weights_placement,
            gpu_data_type=(
                self.gpu_data["data_type"] if device == self.gpu_data_device else "buffer"
            ),
            gpu_dtype=self.gpu_data["dtype"] if device == self.gpu_data_device else "float32",
        )

    def set_gpu_data(self, data_type: str, dtype: str, device: str) -> dict[str, str] | None:
        """Give the GPU-alone build of a compile for ``device`` ``data_type`` tensors
        (``"buffer"``, ``"image"``, ``"auto"``, decided here for the preset's device:
        :func:`gpu_data_type_for`) of ``dtype``; return the record (:attr:`gpu_data`:
        ``asked``, ``data_type``, ``dtype`` and, where ``auto`` chose buffers, ``why``), or
        None where ``device`` is ``"cpu"`` (a note says so where other settings were asked).
        For ``"coexec"`` the record describes the GPU parts of the co-executed builds (images
        where ``"image"`` is asked, and for ``auto`` where the device has images; float16 on
        images where the device has ``cl_khr_fp16``, buffer GPU parts float32 with the reason:
        :func:`~codl_tvm.build.texture_coexec.coexec_gpu_data_type`);
        the builds for one processor keep float32 buffers.

        ``auto`` decides by capability here (images wherever the device can hold them); a
        compile that can reach the device then times :meth:`gpu_data_candidates` and keeps
        the faster (:meth:`keep_gpu_data`).

        Raises
        ------
        DeviceSupportError
            The device cannot do what was asked.
        """
        if device == "coexec" and (data_type, dtype) != ("buffer", "float32"):
            from codl_tvm.build.texture_coexec import (  # deferred
                coexec_gpu_data_type,
                coexec_gpu_dtype,
            )

            caps = None if self.preset.is_cross else image_caps()
            built, why = coexec_gpu_data_type(caps, data_type, dtype)
            self.gpu_data = {
                "asked": data_type,
                "data_type": built,
                "dtype": coexec_gpu_dtype(caps, built, dtype),
            }
            self.gpu_data_device = "coexec"
            if why:
                self.gpu_data["why"] = why
                logger.info("note: %s", why)
            return self.gpu_data
        if device != "opencl":
            if (data_type, dtype) != ("buffer", "float32"):
                logger.info(
                    "note: gpu_data_type and gpu_dtype apply to builds for the GPU alone "
                    "(device 'opencl') for now; the %s build keeps float32 buffers",
                    device,
                )
            return None
        built, why = gpu_data_type_for(self.model.mod, self.preset, data_type, dtype)
        self.gpu_data = {"asked": data_type, "data_type": built, "dtype": dtype}
        self.gpu_data_device = "opencl"
        if why:
            self.gpu_data["why"] = why
            logger.info("GPU tensors in buffers: %s", why)
        return self.gpu_data

    def gpu_data_candidates(self) -> dict[str, BuildSpec]:
        """The GPU-alone builds ``gpu_data_type="auto"`` chooses between by measuring, by data
        type: buffers always, images where :meth:`set_gpu_data` found that the device can hold
        them (it then decided ``"image"``); each the spec of :meth:`spec` but for its type."""
        spec = self.spec("opencl", None)
        types = ("buffer", "image") if self.gpu_data["data_type"] == "image" else ("buffer",)
        return {t: dataclasses.replace(spec, gpu_data_type=t) for t in types}

    def keep_gpu_data(self, data_type: str) -> None:
        """Make ``data_type`` (one of :meth:`gpu_data_candidates`, measured the faster) the
        GPU-alone build's from here on (its spec, :attr:`gpu_data`, :meth:`gpu_vm_devices`)."""
        if data_type not in self.gpu_data_candidates():
            raise ValueError(f"data_type {data_type!r} is not a candidate of this compile")
        self.gpu_data["data_type"] = data_type

    def image_variant_spec(self, name: str) -> BuildSpec:
        """The spec of co-executed library ``name`` (built by this compile) with its GPU parts
        on images: what a measured ``auto`` times beside it (:attr:`measure_images`)."""
        return dataclasses.replace(self.specs[name], gpu_data_type="image")

    def start_image_variant(self, plan: PartitionPlan, workers=None) -> None:
        """Where :attr:`measure_images` is on, start the build of ``plan`` with its GPU parts on
        images (library ``"coexec:image"``) in a worker process, beside the buffer build of
        the same plan in this one; :meth:`image_variant` then takes it. Cached: nothing
        started. ``workers`` of 0 (default: one where the machine has a core to spare,
        :func:`~codl_tvm.build.parallel.default_workers`) builds it here when asked."""
        if not self.measure_images:
            return
        spec = dataclasses.replace(self.spec("coexec", plan), gpu_data_type="image")
        self._start({"coexec:image": spec}, workers)

    def image_variant(self, name: str = "coexec") -> Path:
        """Library ``<name>:image``: co-executed library ``name`` of this compile with its GPU
        parts on images (:meth:`image_variant_spec`)."""
        return self.get(f"{name}:image", self.image_variant_spec(name))

    def gpu_vm_devices(self, data_type: str | None = None) -> list[str]:
        """The VM's devices of the GPU-alone build of ``data_type`` (default: the decided one,
        :attr:`gpu_data`): an image build allocates from one VM device slot per memory scope
        (:data:`codl_tvm.build.texture.VM_DEVICE_SLOTS`), each the OpenCL device."""
        from codl_tvm.build.texture import VM_DEVICE_SLOTS  # deferred, as in build_library
        from codl_tvm.build.texture_coexec import VM_DEVICES

        data_type = data_type or self.gpu_data["data_type"]
        if self.gpu_data_device == "coexec":  # the co-executed build's: its images after
            return list(VM_DEVICES) if data_type == "image" else ["opencl", "cpu"]
        return ["opencl"] * (VM_DEVICE_SLOTS if data_type == "image" else 1)

    def _path(self, name: str) -> Path:
        return self.work / f"{name.replace(':', '_')}.so"

    def _cached(self, spec: BuildSpec) -> Path | None:
        """The cache's library of ``spec`` with every file beside it, or None."""
        if self.cache is None:
            return None
        cached = self.cache / f"{spec.key()}.so"
        files = [cached]
        if spec.weights == "beside":
            files += [cached.with_suffix(".weights"), cached.with_suffix(".weights.json")]
        return cached if all(f.is_file() for f in files) else None

    def start_single(self, devices: tuple[str, ...] = ("cpu", "opencl"), workers=None) -> None:
        """Start the builds for each of ``devices`` alone in worker processes
        (:class:`~codl_tvm.build.parallel.BackgroundBuilds`), while the compile plans and
        builds its co-executed library; :meth:`single` then takes each finished library.

        Libraries the build cache holds are not built. ``workers`` (default
        :func:`~codl_tvm.build.parallel.default_workers`) of 0 starts nothing: the builds then
        run in this process when :meth:`single` asks for them."""
        self._start({d: self.spec(d, None) for d in devices}, workers)

    def _start(self, specs: dict[str, BuildSpec], workers) -> None:
        """Start the builds of ``specs`` (name -> spec) the cache lacks in worker processes."""
        jobs = [
            BuildJob(name, spec, self._path(name), self._warm_devices(spec))
            for name, spec in specs.items()
            if self._cached(spec) is None
        ]
        workers = default_workers(len(jobs)) if workers is None else min(workers, len(jobs))
        if not jobs or workers <= 0:
            return
        self._background.append(
            BackgroundBuilds(
                Path(self.model.path), self._model, self.preset, jobs, build_library, workers
            )
        )

    def _warm_devices(self, spec: BuildSpec) -> tuple[str, ...]:
        warm = self.warm_up and spec.device != "cpu"  # CPU code needs no compiling at its run
        return vm_devices(spec) if warm else ()

    def close(self) -> None:
        """Stop the worker processes still building and the unused warm-up processes (a
        compile that ends early)."""
        for background in self._background:
            background.close()
        self._background = []
        if self.warm_ahead is not None:
            self.warm_ahead.close()

    def get(self, name: str, spec: BuildSpec) -> Path:
        """The library ``name`` described by ``spec``: from the cache, from a worker started
        by :meth:`start_single`, or built here (:func:`build_library`).

        The kernel splits a co-executed build records are kept beside it (in the cache too,
        ``<key>.splits.json``) and in :attr:`kernel_splits` under ``name``. A library with its
        weights beside it (``spec.weights``) has them in ``<library>.weights`` (the cache's
        ``<key>.weights`` and ``<key>.weights.json``) and their record in :attr:`weights`.

        Raises
        ------
        BuildError
            The build failed (in a worker or here); the message is the build's error.
        """
        path = self._path(name)
        self.specs[name] = spec
        start = time.perf_counter()
        cached = self._cached(spec)
        beside = spec.weights == "beside"
        if cached is not None:
            logger.info("reusing the %s library from the build cache (%s)", name, cached.name)
            shutil.copyfile(cached, path)
            sidecar = cached.with_suffix(".splits.json")
            if sidecar.is_file():
                self.kernel_splits[name] = json.loads(sidecar.read_text())
            if beside:
                shutil.copyfile(cached.with_suffix(".weights"), path.with_suffix(".weights"))
                self.weights[name] = json.loads(cached.with_suffix(".weights.json").read_text())
            self.builds[name] = {"source": "cache", "s": round(time.perf_counter() - start, 3)}
            return path
        splits, record, source = self._built_elsewhere(name, spec)
        if source is None:
            if self.warm_up and self.warm_ahead is None and spec.device != "cpu":
                self.warm_ahead = WarmUpProcesses()  # their start overlaps this build
            try:
                splits, record = build_library(path, spec, self.model.mod, self.preset)
            except Exception as exc:  # a kernel that does not build: the caller decides
                self.builds[name] = {"source": "here", "s": round(time.perf_counter() - start, 3)}
                raise build_error(exc, str(self.model.path), _BUILT_FOR[spec.device]) from exc
            source = "here"
            self.builds[name] = {"source": source, "s": round(time.perf_counter() - start, 3)}
        if splits:
            self.kernel_splits[name] = splits
        if beside:
            self.weights[name] = record
        self._store(spec, path, name)
        return path

    def _built_elsewhere(self, name: str, spec: BuildSpec) -> tuple[Any, Any, str | None]:
        """Library ``name`` from a background worker: ``(splits, weights record, "worker")``,
        or ``(None, None, None)`` where no worker built it (then build it here)."""
        bg = next((b for b in self._background if name in b), None)
        if bg is None or bg.jobs[name].spec != spec:
            return None, None, None
        start = time.perf_counter()
        result = bg.result(name)
        if result is None:  # its worker could not start
            return None, None, None
        waited = time.perf_counter() - start
        self.builds[name] = {
            "source": "worker",
            "s": round(result.seconds, 3),
            "waited_s": round(waited, 3),
            **result.phases(),
        }
        if result.error is not None:
            raise BuildError(
                f"{self.model.path}: building for {_BUILT_FOR[spec.device]} failed: {result.error}"
            )
        logger.info(
            "the %s library was built in a worker process (%.1f s; waited %.1f s for it)",
            *(name, result.seconds, waited),
        )
        return result.splits, result.weights, "worker"

    def _store(self, spec: BuildSpec, path: Path, name: str) -> None:
        """Put the library ``name`` just built (and its files) in the build cache."""
        if self.cache is None:
            return
        cached = self.cache / f"{spec.key()}.so"
        replace_file(cached, lambda tmp: shutil.copyfile(path, tmp))
        if name in self.kernel_splits:
            text = json.dumps(self.kernel_splits[name])
            replace_file(cached.with_suffix(".splits.json"), lambda tmp: tmp.write_text(text))
        if spec.weights == "beside":
            wpath = path.with_suffix(".weights")
            replace_file(cached.with_suffix(".weights"), lambda tmp: shutil.copyfile(wpath, tmp))
            text = json.dumps(self.weights[name])
            replace_file(cached.with_suffix(".weights.json"), lambda tmp: tmp.write_text(text))

    def name_of(self, path: Path) -> str:
        """The name of the library at ``path`` (one this compile built or reused)."""
        for name in self.specs:
            if self._path(name) == Path(path):
                return name
        raise KeyError(path)

    def rebuild(self, name: str, weights: str) -> Path:
        """Library ``name`` (built by this compile) again with its weights stored ``weights``
        (library ``<name>:weights-<weights>``)."""
        spec = dataclasses.replace(self.specs[name], weights=weights)
        return self.get(f"{name}:weights-{weights}", spec)

    def coexec(self, name: str, plan: PartitionPlan) -> Path:
        """The co-executed build of ``plan`` (library ``name``: ``"coexec"``,
        ``"coexec:<mode>"``, ...)."""
        return self.get(name, self.spec("coexec", plan))

    def single(self, device: str) -> Path:
        """The model built for one processor (``cpu`` or ``opencl``)."""
        return self.get(device, self.spec(device, None))
