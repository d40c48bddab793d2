"""The libraries one compile builds, and the build cache that reuses them across compiles.

A library is described by one frozen :class:`BuildSpec`: the model, the targets, the plan and
every build setting. The cache's key is the spec's digest, and the builds of
:class:`Libraries` read their settings from the spec they are stored under, so the key cannot
drift from what was built (a hand-kept list of key fields could miss a new setting and hand
out a stale library).

Building needs TVM's compiler (imported when a build starts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tvm

from codl_tvm.build.targets import TargetPreset, export_library
from codl_tvm.core.plan import PartitionPlan
from codl_tvm.runtime.artifact import PROCESSOR_NAMES, Manifest, replace_file
from codl_tvm.runtime.weights import write_weights

__all__ = ["BuildSpec", "Libraries", "code_digest", "source_files", "switch_on"]

logger = logging.getLogger(__name__)


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
    """codl-tvm's Python sources as ``(name, path)``: the package, its passes and its schedules
    (mapped from their own folders)."""
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
    weights
        ``"embedded"`` (constants in the library) or ``"beside"`` (large constants fetched from
        a weights file beside it, :mod:`codl_tvm.runtime.weights`).
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
    weights: str = "embedded"
    code: str = field(default_factory=code_digest)
    tvm_version: str = field(default_factory=_tvm_version)

    def key(self) -> str:
        """The cache key: a digest of every field."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


class Libraries:
    """The exported libraries of one compile, in its work directory, reused from and stored in
    a build cache where one is given (keyed by :class:`BuildSpec`).

    The settings that differ between the builds of one compile are attributes set by the
    compile (:attr:`coexec_cpu_algorithms`, :attr:`coexec_cpu_alone`, :attr:`channel_blocks`,
    :attr:`row_blocks`); :meth:`spec` turns them into the spec of one library."""

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
        # where the libraries built from here on store their weights
        self.weights_placement = "embedded"
        # library name -> its kernel calls and their splits (co-executed builds)
        self.kernel_splits: dict[str, dict] = {}
        # library name -> the spec it was built from, and (weights beside) its weights record
        self.specs: dict[str, BuildSpec] = {}
        self.weights: dict[str, dict] = {}
        self._pending_weights: dict | None = None
        self._pending_splits: dict | None = None
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
            weights=self.weights_placement,
        )

    def key(self, device: str, plan: PartitionPlan | None) -> str:
        """The build-cache key of the library of ``device`` (with ``plan``)."""
        return self.spec(device, plan).key()

    def get(self, name: str, spec: BuildSpec, build: Callable[[BuildSpec], Any]) -> Path:
        """The library ``name`` described by ``spec``, from the cache or ``build(spec)``.

        The kernel splits a co-executed build records are kept beside it (in the cache too,
        ``<key>.splits.json``) and in :attr:`kernel_splits` under ``name``. A library with its
        weights beside it (``spec.weights``) has them in ``<library>.weights`` (the cache's
        ``<key>.weights`` and ``<key>.weights.json``) and their record in :attr:`weights`."""
        path = self.work / f"{name.replace(':', '_')}.so"
        self.specs[name] = spec
        cached = None if self.cache is None else self.cache / f"{spec.key()}.so"
        sidecar = None if cached is None else cached.with_suffix(".splits.json")
        beside = spec.weights == "beside"
        wpath = path.with_suffix(".weights")
        cached_w = None if cached is None else cached.with_suffix(".weights")
        record_w = None if cached is None else cached.with_suffix(".weights.json")
        if (
            cached is not None
            and cached.is_file()
            and (not beside or (cached_w.is_file() and record_w.is_file()))
        ):
            logger.info("reusing the %s library from the build cache (%s)", name, cached.name)
            shutil.copyfile(cached, path)
            if sidecar.is_file():
                self.kernel_splits[name] = json.loads(sidecar.read_text())
            if beside:
                shutil.copyfile(cached_w, wpath)
                self.weights[name] = json.loads(record_w.read_text())
            return path
        self._pending_splits = None
        self._pending_weights = {} if beside else None
        export_library(build(spec), path, self.preset)
        if self._pending_splits:
            self.kernel_splits[name] = self._pending_splits
        if beside:
            found = self._pending_weights
            self.weights[name] = write_weights(wpath, found.get("arrays") or [], found.get("key"))
        if cached is not None:
            replace_file(cached, lambda tmp: shutil.copyfile(path, tmp))
            if name in self.kernel_splits:
                text = json.dumps(self.kernel_splits[name])
                replace_file(sidecar, lambda tmp: tmp.write_text(text))
            if beside:
                replace_file(cached_w, lambda tmp: shutil.copyfile(wpath, tmp))
                text = json.dumps(self.weights[name])
                replace_file(record_w, lambda tmp: tmp.write_text(text))
        return path

    def name_of(self, path: Path) -> str:
        """The name of the library at ``path`` (one this compile built or reused)."""
        for name in self.specs:
            if self.work / f"{name.replace(':', '_')}.so" == Path(path):
                return name
        raise KeyError(path)

    def rebuild(self, name: str, weights: str) -> Path:
        """Library ``name`` (built by this compile) again with its weights stored ``weights``
        (library ``<name>:weights-<weights>``)."""
        spec = dataclasses.replace(self.specs[name], weights=weights)
        build = self._build_coexec if spec.device == "coexec" else self._build_single
        return self.get(f"{name}:weights-{weights}", spec, build)

    def coexec(self, name: str, plan: PartitionPlan) -> Path:
        """The co-executed build of ``plan`` (library ``name``: ``"coexec"``,
        ``"coexec:<mode>"``, ...)."""
        return self.get(name, self.spec("coexec", plan), self._build_coexec)

    def single(self, device: str) -> Path:
        """The model built for one processor (``cpu`` or ``opencl``)."""
        return self.get(device, self.spec(device, None), self._build_single)

    def _build_coexec(self, spec: BuildSpec):
        # deferred here and in _build_single: building needs TVM's compiler, and this package is
        # imported where TVM is runtime-only (artifacts on a device)
        from codl_tvm.build.pipeline import coexec_pipeline
        from codl_tvm.schedules import cpu_alone_settings

        plan = PartitionPlan.from_json(spec.plan)
        gpu, cpu = self.preset.target("gpu"), self.preset.target("cpu")
        logger.info(
            "building %s for co-execution (preset %s)", Path(self.model.path).name, spec.preset
        )
        self._pending_splits = {}
        with contextlib.ExitStack() as stack:
            # the switches the compile entered for planning, from the spec: what the key says
            switch_on(stack, spec.coexec_cpu_algorithms, self.preset)
            if spec.coexec_cpu_alone:
                stack.enter_context(cpu_alone_settings(True))
            return tvm.compile(
                self.model.mod,
                target=gpu,
                relax_pipeline=coexec_pipeline(
                    plan,
                    gpu,
                    cpu,
                    channel_blocks=spec.channel_blocks,
                    row_blocks=spec.row_blocks,
                    kernel_splits=self._pending_splits,
                    weights=self._pending_weights,
                ),
            )

    def _build_single(self, spec: BuildSpec):
        # deferred: needs TVM's compiler (see _build_coexec)
        from codl_tvm.build.pipeline import single_device_pipeline
        from codl_tvm.schedules import cpu_alone_settings, packed_enabled, winograd_enabled
        from codl_tvm.schedules.presets import PACKED_CPU_ALONE, WINOGRAD_CPU_ALONE
        from codl_tvm.schedules.settings import packed_presets, winograd_presets

        device = spec.device
        target = self.preset.target("cpu" if device == "cpu" else "gpu")
        presets = set(winograd_presets())
        packed = set(packed_presets())
        if spec.cpu_alone_winograd:
            presets |= set(WINOGRAD_CPU_ALONE)
        if spec.cpu_alone_packed:
            packed |= set(PACKED_CPU_ALONE)
        logger.info("building for the %s alone (preset %s)", PROCESSOR_NAMES[device], spec.preset)
        with (
            winograd_enabled(presets),
            packed_enabled(packed),
            cpu_alone_settings(spec.cpu_alone_packed),
        ):
            return tvm.compile(
                self.model.mod,
                target=target,
                relax_pipeline=single_device_pipeline(target, weights=self._pending_weights),
            )
