"""The artifact directory: its files, writing it safely, and loading it to run.

Nothing here needs TVM's compiler: a runtime-only TVM (a phone, a board, the device machine)
loads and runs artifacts with this module alone.

``compile_artifact`` writes an artifact into a staging directory beside the target
(:func:`_staged`) and swaps it in only when it is complete, so it never overwrites a directory
it did not write, and a failed compile leaves the earlier artifact (or nothing) behind.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm import runtime
from codl_tvm.build.runner import _flatten, time_vm
from codl_tvm.build.targets import missing_cpu_features
from codl_tvm.core.errors import ArtifactError
from codl_tvm.frontend.importer import TensorSpec
from codl_tvm.runtime import program_binaries
from codl_tvm.runtime.program_binaries import BINARIES
from codl_tvm.runtime.weights import WEIGHTS
from codl_tvm.runtime.weights import start as weights_start

__all__ = [
    "ARTIFACT_FORMAT",
    "ARTIFACT_VERSION",
    "LIBRARY",
    "MANIFEST",
    "REFERENCE",
    "Artifact",
    "is_artifact",
    "load_artifact",
]

ARTIFACT_FORMAT = "codl-tvm-artifact"
ARTIFACT_VERSION = 1
MANIFEST = "manifest.json"
LIBRARY = "model.so"
REFERENCE = "reference.npz"
DEVICES = ("coexec", "cpu", "opencl")
_PROCESSOR = {"cpu": "CPU", "opencl": "GPU"}  # for log lines
_OWN_FILES = (
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


def _sha256(path: Path) -> str:
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
        foreign = sorted(p.name for p in out.iterdir() if p.name not in _OWN_FILES)
        if foreign:
            raise ArtifactError(
                f"{out}: holds files codl-tvm did not write ({', '.join(foreign[:5])}); "
                "refusing to replace the artifact there"
            )


@contextlib.contextmanager
def _staged(out: Path, force: bool) -> Iterator[Path]:
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


def _write_plan(out: Path, plan, report) -> None:
    """The artifact's plan files: ``plan.json``, and the planner's report when there is one."""
    (out / "plan.json").write_text(plan.to_json() + "\n")
    if report is not None:
        report.save(out / "plan_report.json")
        (out / "plan_report.txt").write_text(report.table() + "\n")


def _replace_file(dst: Path, fill: Callable[[Path], Any]) -> None:
    """Write ``dst`` through a temporary file then rename: parallel compiles sharing a build
    cache never see half a file."""
    tmp = dst.with_suffix(f".{os.getpid()}.tmp")
    fill(tmp)
    os.replace(tmp, dst)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _spec(s) -> dict:
    return {"name": s.name, "shape": list(s.shape), "dtype": s.dtype}


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
        Its parsed ``manifest.json``.
    """

    path: Path
    manifest: dict
    _vm: Any = None
    _devices: Any = None
    programs: Any = None  # what the load did with OpenCL programs (program_binaries.prepare)
    weights: Any = None  # the loader of weights stored beside the library (weights.start)

    @property
    def device(self) -> str:
        return self.manifest["device"]

    @property
    def model(self) -> SimpleNamespace:
        """Input/output specs in the shape :mod:`codl_tvm.frontend.importer`'s helpers expect."""
        m = self.manifest["model"]

        def specs(items):
            return [TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in items]

        return SimpleNamespace(
            path=m["file"], inputs=specs(m["inputs"]), outputs=specs(m["outputs"])
        )

    def _load(self):
        if self._vm is not None:
            return
        names = self.manifest["vm_devices"]
        if "opencl" in names:
            runtime.load()
        self._devices = [tvm.opencl(0) if n == "opencl" else tvm.cpu(0) for n in names]
        # the OpenCL context is created while the library loads, not after it
        context = runtime.start_context() if "opencl" in names else None
        try:
            with concurrent.futures.ThreadPoolExecutor(1, "codl-load") as spare:
                loading = spare.submit(tvm.runtime.load_module, str(self.path / LIBRARY))
                if self.manifest["device"] in ("cpu", "coexec"):
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
        return self.manifest.get("kernel_splits")

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
            return _flatten(self._vm["main"](*args))

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
            if _sha256(f) != digest:
                raise ArtifactError(f"{path}: {name} does not match its SHA-256 in {MANIFEST}")
    return Artifact(path=path, manifest=dict(manifest))


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
