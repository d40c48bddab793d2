"""The artifact directory: its files, its manifest, writing it safely, and loading it to run.

Nothing here needs TVM's compiler: a runtime-only TVM (a phone, a board) loads and runs
artifacts with this module alone.

The manifest is a typed :class:`Manifest` (``manifest.json`` on disk, read back with
:meth:`Manifest.from_json`). ``compile_artifact`` writes an artifact into a staging directory
beside the target (:func:`staged_directory`) and swaps it in only when it is complete, so it
never overwrites a directory it did not write, and a failed compile leaves the earlier artifact
(or nothing) behind.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm import runtime
from codl_tvm.core.errors import ArtifactError
from codl_tvm.core.tensors import TensorSpec
from codl_tvm.runtime import program_binaries
from codl_tvm.runtime.cpu_features import missing_cpu_features
from codl_tvm.runtime.program_binaries import BINARIES
from codl_tvm.runtime.vm import flatten_outputs, time_vm
from codl_tvm.runtime.weights import WEIGHTS
from codl_tvm.runtime.weights import start as weights_start

__all__ = [
    "ARTIFACT_FILES",
    "ARTIFACT_FORMAT",
    "ARTIFACT_VERSION",
    "DEVICES",
    "LIBRARY",
    "MANIFEST",
    "PROCESSOR_NAMES",
    "REFERENCE",
    "Artifact",
    "Manifest",
    "ModelRecord",
    "file_sha256",
    "is_artifact",
    "load_artifact",
    "package_version",
    "read_manifest",
    "replace_file",
    "staged_directory",
    "start_weights",
    "write_plan_files",
]

ARTIFACT_FORMAT = "codl-tvm-artifact"
ARTIFACT_VERSION = 1
MANIFEST = "manifest.json"
LIBRARY = "model.so"
REFERENCE = "reference.npz"
DEVICES = ("coexec", "cpu", "opencl")
#: What messages call each processor.
PROCESSOR_NAMES = {"cpu": "CPU", "opencl": "GPU"}
#: The files an artifact directory may hold: a directory with others is not replaced.
ARTIFACT_FILES = (
    MANIFEST,
    LIBRARY,
    REFERENCE,
    "plan.json",
    "plan_report.json",
    "plan_report.txt",
    "placement.json",
    BINARIES,
    WEIGHTS,
)


def file_sha256(path: Path) -> str:
    """The SHA-256 of the file at ``path`` (hex), read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_artifact(path: str | Path) -> bool:
    """Whether ``path`` is a directory with a codl-tvm artifact manifest."""
    manifest = Path(path) / MANIFEST
    if not manifest.is_file():
        return False
    try:
        return json.loads(manifest.read_text()).get("format") == ARTIFACT_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _check_out(out: Path, force: bool) -> None:
    """Refuse an output directory that ``compile_artifact`` may not replace (touches nothing)."""
    if out.exists() and not out.is_dir():
        raise ArtifactError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not is_artifact(out):
            raise ArtifactError(
                f"{out}: directory is not empty and holds no codl-tvm artifact; "
                "choose an empty or new directory (nothing in it was touched)"
            )
        if not force:
            raise ArtifactError(f"{out}: holds an artifact already; pass --force to replace it")
        foreign = sorted(p.name for p in out.iterdir() if p.name not in ARTIFACT_FILES)
        if foreign:
            raise ArtifactError(
                f"{out}: holds files codl-tvm did not write ({', '.join(foreign[:5])}); "
                "refusing to replace the artifact there"
            )


@contextlib.contextmanager
def staged_directory(out: Path, force: bool) -> Iterator[Path]:
    """A new directory beside ``out`` to write the artifact into; on success it replaces
    ``out``, on any failure it is removed and ``out`` is as it was.

    Writing in place would destroy an earlier artifact before the new one exists (a
    ``--force`` compile that fails would leave nothing) and leave an empty ``out`` behind a
    failed compile. The staging directory sits in ``out``'s parent, so the swap is two renames
    on one file system: the old artifact is renamed aside, the new one in, then the old one is
    deleted. Parent directories created for ``out`` are removed again on failure.
    """
    _check_out(out, force)
    # a link to the directory: replace the directory it names, and keep the link
    out = out.resolve() if out.is_symlink() else out.absolute()
    created = [d for d in (out.parent, *out.parent.parents) if not d.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # mkdir, not mkdtemp: the directory gets the user's umask, as `out` would
        stage = out.parent / f".{out.name}.codl-new-{os.getpid()}-{secrets.token_hex(4)}"
        stage.mkdir()
    except OSError as exc:
        raise ArtifactError(f"{out}: cannot create the artifact directory ({exc})") from None
    try:
        yield stage
        _check_out(out, force)  # another process may have written there meanwhile
        if out.is_dir():
            os.chmod(stage, out.stat().st_mode & 0o7777)
            aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.codl-old-", dir=out.parent))
            os.replace(out, aside / "old")
            try:
                os.replace(stage, out)
            except OSError:
                os.replace(aside / "old", out)
                raise
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        for d in created:  # innermost first; only what this compile made and left empty
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


def write_plan_files(out: Path, plan, report) -> None:
    """The artifact's plan files: ``plan.json``, and the planner's report when there is one."""
    (out / "plan.json").write_text(plan.to_json() + "\n")
    if report is not None:
        report.save(out / "plan_report.json")
        (out / "plan_report.txt").write_text(report.table() + "\n")


def replace_file(dst: Path, fill: Callable[[Path], Any]) -> None:
    """Write ``dst`` through a temporary file then rename: parallel compiles sharing a build
    cache never see half a file."""
    tmp = dst.with_suffix(f".{os.getpid()}.tmp")
    fill(tmp)
    os.replace(tmp, dst)


def package_version(dist: str) -> str | None:
    """The installed version of the distribution ``dist``, or None."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------------------
# The manifest.


@dataclass
class ModelRecord:
    """The model an artifact was built from (``manifest["model"]``).

    Attributes
    ----------
    file
        The ONNX file's absolute path at compile time.
    sha256
        Its SHA-256.
    inputs, outputs
        The graph's inputs and outputs.
    """

    file: str
    sha256: str | None
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "sha256": self.sha256,
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [s.to_dict() for s in self.outputs],
        }

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> ModelRecord:
        return cls(
            file=record["file"],
            sha256=record.get("sha256"),
            inputs=[TensorSpec.from_dict(s) for s in record.get("inputs", ())],
            outputs=[TensorSpec.from_dict(s) for s in record.get("outputs", ())],
        )


# Written whatever their value; every other field only when it is not None.
_ALWAYS_WRITTEN = (
    "format",
    "version",
    "created",
    "codl_tvm_version",
    "tvm_version",
    "model",
    "device",
    "vm_devices",
    "preset",
    "winograd",
    "winograd_cpu_alone",
    "packed",
    "packed_cpu_alone",
    "files",
)


@dataclass(eq=False)
class Manifest(Mapping[str, Any]):
    """An artifact's ``manifest.json``: what it holds, how it was built, and how to run it.

    Read-only callers may index it as the JSON mapping it is written as
    (``manifest["plan"]["mode"]``); the compile fills its fields. :meth:`to_json` writes the
    same JSON as every earlier codl-tvm of this format version; keys this class does not know
    (added by a later step, e.g. ``compile --objective cold``'s ``"cold"``) are kept in
    :attr:`extra`.

    Attributes
    ----------
    format, version
        :data:`ARTIFACT_FORMAT` and :data:`ARTIFACT_VERSION`.
    created
        When it was compiled (UTC, ISO 8601).
    codl_tvm_version, tvm_version
        The versions that compiled it.
    model
        The model it was built from.
    device
        ``"coexec"``, ``"cpu"`` or ``"opencl"``: what the library runs on.
    vm_devices
        The Relax VM's devices, in order.
    preset
        The target preset.
    winograd, packed
        Whether Winograd / channel-packed convs were switched on for every preset.
    winograd_cpu_alone, packed_cpu_alone
        Whether a build for the CPU alone gets the preset's CPU-alone Winograd / packed convs.
    cpu
        The instruction set the library's CPU code needs
        (:func:`codl_tvm.build.targets.cpu_record`).
    coexec_cpu_alone_kernels
        True where co-executed CPU functions got the kernels of the build for the CPU alone.
    coexec_cpu_algorithms
        The algorithms switched on for co-executed CPU parts (co-executed compiles).
    cpu_alone_unmodelled
        The CPU-alone kernels the cost model has no data for.
    plan
        How the plan was made: ``source`` (``planner``, ``given``, ``refined``), the planner
        mode, cost model and prediction summary, and what ``verify`` and ``refine`` did.
    split_channel_blocks, split_row_blocks
        A co-executed compile's block settings.
    kernel_splits
        A co-executed build's kernel calls and the split each computes (written for every
        co-executed compile, null where it recorded none).
    targets
        The TVM target of each processor the library runs on.
    verify
        The timings ``verify`` measured and the build it chose.
    weights
        Where the weights are stored (``placement``; the weights file's record when beside).
    program_binaries
        The OpenCL program binaries shipped (written for every library with OpenCL code, null
        where none were).
    reference
        The stored reference inputs and outputs.
    files
        The SHA-256 of every file of the directory.
    extra
        Keys this class does not know, as read.
    """

    format: str = ARTIFACT_FORMAT
    version: int = ARTIFACT_VERSION
    created: str | None = None
    codl_tvm_version: str | None = None
    tvm_version: str | None = None
    model: ModelRecord | None = None
    device: str = "coexec"
    vm_devices: list[str] = field(default_factory=list)
    preset: str | None = None
    winograd: bool = False
    winograd_cpu_alone: bool = False
    packed: bool = False
    packed_cpu_alone: bool = False
    cpu: dict[str, Any] | None = None
    coexec_cpu_alone_kernels: bool | None = None
    coexec_cpu_algorithms: list[str] | None = None
    cpu_alone_unmodelled: list[str] | None = None
    plan: dict[str, Any] | None = None
    split_channel_blocks: bool | None = None
    split_row_blocks: bool | None = None
    kernel_splits: dict[str, Any] | None = None
    targets: dict[str, str] | None = None
    verify: dict[str, Any] | None = None
    weights: dict[str, Any] | None = None
    program_binaries: dict[str, Any] | None = None
    reference: dict[str, Any] | None = None
    files: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def _written(self, name: str, value: Any) -> bool:
        if name in _ALWAYS_WRITTEN or value is not None:
            return True
        if name == "kernel_splits":  # set with the block settings by every co-executed compile
            return self.split_channel_blocks is not None
        if name == "program_binaries":
            return "opencl" in self.vm_devices
        return False

    def to_dict(self) -> dict[str, Any]:
        """The JSON mapping ``manifest.json`` holds."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or not self._written(f.name, value):
                continue
            out[f.name] = value.to_dict() if isinstance(value, ModelRecord) else value
        out.update(self.extra)
        return out

    def to_json(self) -> str:
        """``manifest.json``'s text."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> Manifest:
        """The manifest of a JSON mapping (:meth:`to_dict`)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in record.items() if k in names}
        if isinstance(known.get("model"), Mapping):
            known["model"] = ModelRecord.from_dict(known["model"])
        extra = {k: v for k, v in record.items() if k not in names}
        return cls(**known, extra=extra)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """The manifest of ``manifest.json``'s text."""
        return cls.from_dict(json.loads(text))

    def write(self, directory: Path) -> None:
        """Write ``manifest.json`` into ``directory`` (through a temporary file)."""
        text = self.to_json()
        replace_file(Path(directory) / MANIFEST, lambda tmp: tmp.write_text(text))

    # Read-only mapping over the JSON form, for callers that index the manifest as a dict.
    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


# ---------------------------------------------------------------------------------------------
# Running (runtime-only TVM is enough).


@dataclass
class Artifact:
    """A loaded artifact: ``artifact(inputs)`` runs it, ``time`` measures it.

    Attributes
    ----------
    path
        The artifact directory.
    manifest
        Its ``manifest.json`` (:class:`Manifest`; also indexable as the JSON mapping).
    """

    path: Path
    manifest: Manifest
    _vm: Any = None
    _devices: Any = None
    programs: Any = None  # what the load did with OpenCL programs (program_binaries.prepare)
    weights: Any = None  # the loader of weights stored beside the library (weights.start)

    @property
    def device(self) -> str:
        return self.manifest.device

    @property
    def model(self) -> SimpleNamespace:
        """Input/output specs in the shape :mod:`codl_tvm.frontend.importer`'s helpers expect."""
        m = self.manifest.model
        return SimpleNamespace(path=m.file, inputs=list(m.inputs), outputs=list(m.outputs))

    def _load(self):
        if self._vm is not None:
            return
        names = self.manifest.vm_devices
        if "opencl" in names:
            runtime.load()
        self._devices = [tvm.opencl(0) if n == "opencl" else tvm.cpu(0) for n in names]
        # the OpenCL context is created while the library loads, not after it
        context = runtime.start_context() if "opencl" in names else None
        try:
            with concurrent.futures.ThreadPoolExecutor(1, "codl-load") as spare:
                loading = spare.submit(tvm.runtime.load_module, str(self.path / LIBRARY))
                if self.manifest.device in ("cpu", "coexec"):
                    # TVM's CPU thread pool belongs to the thread that first launches a
                    # parallel kernel (this one, which runs the VM): start it while the spare
                    # thread loads the library, not inside the first run
                    tvm.runtime.num_threads()
                lib = loading.result()
        finally:
            if context is not None:
                context.join()
        if "opencl" in names:
            self.programs = program_binaries.prepare(self.path, self.manifest, lib)
        self.weights = start_weights(self.path, self.manifest, self._devices[0])
        self._vm = VirtualMachine(lib, self._devices)

    @property
    def kernel_splits(self) -> dict | None:
        """A co-executed build's kernel calls in execution order, each with the split it
        computes (:func:`codl_tvm.passes.kernel_splits.kernel_splits`); None for other builds."""
        return self.manifest.kernel_splits

    @property
    def vm(self):
        """The Relax VM over the manifest's devices (created on first use)."""
        self._load()
        return self._vm

    def reference(self) -> tuple[dict[str, np.ndarray], list[np.ndarray]] | None:
        """``(inputs, outputs)`` stored at compile time, or None."""
        ref = self.path / REFERENCE
        if not ref.is_file():
            return None
        with np.load(ref, allow_pickle=False) as data:
            inputs = {k[6:]: data[k] for k in data.files if k.startswith("input:")}
            outs = {k[7:]: data[k] for k in data.files if k.startswith("output:")}
        return inputs, [outs[s.name] for s in self.model.outputs]

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run once on inputs in ``main``'s order; return numpy outputs."""
        self._load()
        args = [tvm.runtime.tensor(np.asarray(x, order="C"), self._devices[0]) for x in inputs]
        with self._weight_errors():
            return flatten_outputs(self._vm["main"](*args))

    @contextlib.contextmanager
    def _weight_errors(self) -> Iterator[None]:
        """A run that failed because a weight could not be loaded raises the loader's error
        (naming the file and the weight) instead of the VM's wrapping of it."""
        try:
            yield
        except Exception:
            if self.weights is not None and self.weights.error is not None:
                raise self.weights.error from None
            raise

    def runner(self, inputs: Sequence[np.ndarray]) -> Callable[[], None]:
        """A function that runs one inference on ``inputs`` (placed on the device once, here)
        and returns when every device has finished: for timing loops of one's own."""
        self._load()
        args = [tvm.runtime.tensor(np.asarray(x, order="C"), self._devices[0]) for x in inputs]
        main = self._vm["main"]
        devices = list({str(d): d for d in self._devices}.values())

        def run() -> None:
            with self._weight_errors():
                main(*args)
            for dev in devices:
                dev.sync()

        return run

    def time(self, inputs: Sequence[np.ndarray], number: int = 5, repeat: int = 3):
        """Latency (``time_evaluator`` on the first VM device's timer; warm-up run first)."""
        self._load()
        return time_vm(self._vm, self._devices[0], inputs, number, repeat)


def read_manifest(manifest_path: Path, fmt: str, version: int, kind: str) -> dict[str, Any]:
    """The JSON manifest at ``manifest_path``, checked to be of format ``fmt`` and ``version``
    (``kind`` names it in the errors: "artifact", "pipeline").

    Raises
    ------
    ArtifactError
        Unreadable, not such a manifest, or another format version.
    """
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{manifest_path}: unreadable ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != fmt:
        raise ArtifactError(f"{manifest_path}: not a codl-tvm {kind} manifest")
    if manifest.get("version") != version:
        raise ArtifactError(
            f"{manifest_path}: {kind} format version {manifest.get('version')!r}; this "
            f"codl-tvm reads version {version} (recompile with `codl-tvm compile`)"
        )
    return manifest


def start_weights(path: Path, manifest: Mapping, device) -> Any:
    """Start loading the weights of an artifact built with ``--weights beside`` onto ``device``
    (the VM's first device) before its VM is created; None for embedded weights. The caller
    keeps the loader while it runs the library (:func:`codl_tvm.runtime.weights.start`)."""
    record = manifest.get("weights") or {}
    if record.get("placement") != "beside" or not record.get("tensors"):
        return None
    return weights_start(path, record, device)


def load_artifact(path: str | Path, verify: bool = True, check_cpu: bool = True) -> Artifact:
    """Read an artifact directory.

    Parameters
    ----------
    path
        The artifact directory.
    verify
        Check every file against its SHA-256 in the manifest.
    check_cpu
        Check that this machine's CPU has every instruction-set feature the library's CPU code
        was compiled for (``manifest["cpu"]``): a library for another CPU would die of an
        illegal instruction. Off to read an artifact's files without running it.

    Raises
    ------
    ArtifactError
        Not an artifact, another format version, a file altered, or a CPU that cannot run it.
    """
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise ArtifactError(f"{path}: no {MANIFEST}; not a codl-tvm artifact directory")
    manifest = read_manifest(manifest_path, ARTIFACT_FORMAT, ARTIFACT_VERSION, "artifact")
    for key in ("device", "vm_devices", "model", "files"):
        if key not in manifest:
            raise ArtifactError(f"{manifest_path}: missing field {key!r}")
    if check_cpu and isinstance(manifest.get("cpu"), Mapping):
        _check_cpu(path, manifest["cpu"])
    if verify:
        for name, digest in manifest["files"].items():
            f = path / name
            if not f.is_file():
                raise ArtifactError(f"{path}: {name} is missing")
            if file_sha256(f) != digest:
                raise ArtifactError(f"{path}: {name} does not match its SHA-256 in {MANIFEST}")
    return Artifact(path=path, manifest=Manifest.from_dict(manifest))


def _check_cpu(path: Path, record: Mapping) -> None:
    """Refuse an artifact whose CPU code this machine cannot run (``manifest["cpu"]``)."""
    arch, missing = missing_cpu_features(dict(record))
    name = record.get("name", "generic")
    if arch is not None:
        raise ArtifactError(
            f"{path}: built for {record.get('arch')} CPUs ({name}); this machine is {arch}"
        )
    if missing:
        raise ArtifactError(
            f"{path}: built for CPU {name!r}, whose instructions this machine's CPU lacks "
            f"({', '.join(missing)}); compile it again here (`codl-tvm compile`) or run it on "
            "such a CPU"
        )
