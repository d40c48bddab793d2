"""Weights stored beside the library, loaded on a thread while the model already runs.

A library built with ``--weights beside`` fetches each large constant through the packed
function ``codl.weights.get(key, i)`` right before its first use
(:class:`codl_tvm.passes.stream_weights.StreamWeights`), and its arrays are in
``weights.bin`` beside ``model.so``: raw, one after another in first-use order, each at a
64-byte aligned offset. ``manifest["weights"]`` records the file, the key the library's fetches
carry, the file's size and each tensor's shape, dtype, offset, size and CRC-32.

Loading (:func:`start`) checks the file's size (a truncated file is refused at once), then a
thread reads the tensors in order, checks each one's CRC-32 (a tampered file is refused at that
tensor), places it on the VM's first device (the device the VM would have placed the constant
on) and wakes any fetch waiting for it. A fetch blocks only until its own tensor is there, so
reading, uploading and the first inference form a pipeline (NNV12, MobiSys 2022); later
inferences find every tensor ready.

The thread holds Python's GIL only between steps: reading into a numpy buffer, the CRC and the
upload (a TVM FFI call) each release it, so the VM, which calls the fetch from C++, runs
meanwhile.

Nothing here needs TVM's compiler.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tvm

from codl_tvm.core.errors import ArtifactError

__all__ = ["ALIGN", "GET", "PLACEMENTS", "WEIGHTS", "WeightLoader", "start", "write_weights"]

#: The file beside ``model.so`` that holds the weights of a ``--weights beside`` build.
WEIGHTS = "weights.bin"
#: Where an artifact's weights are stored.
PLACEMENTS = ("embedded", "beside")
#: Offsets of tensors in the file are multiples of this (cache lines, SIMD loads).
ALIGN = 64
#: The packed function the library's fetches call (registered by :func:`start`).
GET = "codl.weights.get"


def write_weights(path: Path, arrays: Sequence[np.ndarray], key: str) -> dict:
    """Write ``arrays`` to ``path`` in order; return the record ``manifest["weights"]`` holds
    (without ``placement``)."""
    tensors = []
    offset = 0
    with open(path, "wb") as f:
        for a in arrays:
            a = np.asarray(a, order="C")  # ascontiguousarray would make a 0-d weight 1-d
            pad = -offset % ALIGN
            f.write(b"\0" * pad)
            offset += pad
            f.write(a.tobytes())
            tensors.append(
                {
                    "shape": list(a.shape),
                    "dtype": str(a.dtype),
                    "offset": offset,
                    "nbytes": int(a.nbytes),
                    "crc32": zlib.crc32(a),
                }
            )
            offset += a.nbytes
    return {"file": path.name, "key": key, "bytes": offset, "tensors": tensors}


class WeightLoader:
    """Reads one artifact's ``weights.bin`` on a thread and hands each tensor to the fetches.

    Parameters
    ----------
    path
        The weights file.
    record
        Its ``manifest["weights"]`` record.
    device
        Where the tensors go (the VM's first device).

    Raises
    ------
    ArtifactError
        The file is missing or its size is not the record's (truncated or replaced).
    """

    def __init__(self, path: Path, record: dict, device) -> None:
        self.path, self.key, self.device = path, record["key"], device
        self._tensors = record["tensors"]
        self._ready: list = [None] * len(self._tensors)
        self._error: ArtifactError | None = None
        self._failed_at = len(self._tensors)  # tensors from here on will never come
        self._cond = threading.Condition()
        try:
            size = os.path.getsize(path)
        except OSError as exc:
            raise ArtifactError(f"{path}: cannot read the weights file ({exc})") from None
        if size != record["bytes"]:
            raise ArtifactError(
                f"{path}: {size} bytes where the manifest records {record['bytes']} (truncated "
                "or replaced); copy the artifact again or recompile it"
            )
        self._thread = threading.Thread(target=self._load, name="codl-weights", daemon=True)
        self._thread.start()

    @property
    def error(self) -> ArtifactError | None:
        """The error that stopped the loader, if one did."""
        return self._error

    def _load(self) -> None:
        i = 0
        try:
            with open(self.path, "rb", buffering=0) as f:
                for i, t in enumerate(self._tensors):
                    arr = np.empty(t["shape"], t["dtype"])
                    f.seek(t["offset"])
                    n = f.readinto(memoryview(arr).cast("B"))
                    if n != t["nbytes"]:
                        raise ArtifactError(
                            f"{self.path}: weight {i} is cut short ({n} of {t['nbytes']} bytes)"
                        )
                    if zlib.crc32(arr) != t["crc32"]:
                        raise ArtifactError(
                            f"{self.path}: weight {i} {tuple(t['shape'])} {t['dtype']} does not "
                            "match its CRC-32 in the manifest (the file was altered); copy the "
                            "artifact again or recompile it"
                        )
                    tensor = tvm.runtime.tensor(arr, self.device)
                    with self._cond:
                        self._ready[i] = tensor
                        self._cond.notify_all()
        except ArtifactError as exc:
            self._fail(i, exc)
        except Exception as exc:  # an OS or device error: one clear message naming the weight
            self._fail(i, ArtifactError(f"{self.path}: cannot load weight {i} ({exc})"))

    def _fail(self, i: int, exc: ArtifactError) -> None:
        with self._cond:
            self._error, self._failed_at = exc, i
            self._cond.notify_all()

    def get(self, i: int):
        """Tensor ``i``, once the thread has placed it on the device.

        Raises
        ------
        ArtifactError
            Tensor ``i`` does not exist, or the loader stopped before it.
        """
        if not 0 <= i < len(self._ready):
            raise ArtifactError(f"{self.path}: no weight {i} (the file holds {len(self._ready)})")
        tensor = self._ready[i]
        if tensor is not None:  # the steady state: no lock
            return tensor
        with self._cond:
            while self._ready[i] is None and i < self._failed_at:
                self._cond.wait()
            if self._ready[i] is None:
                raise self._error
            return self._ready[i]

    def join(self) -> None:
        """Wait until the thread has finished (every tensor placed, or an error)."""
        self._thread.join()


# key@device -> the live loader; an artifact holds its loader, the VM calls through this table
_LOADERS: weakref.WeakValueDictionary[str, WeightLoader] = weakref.WeakValueDictionary()
_REGISTERED = False
_LOCK = threading.Lock()


def _get(key: str, i: int):
    loader = _LOADERS.get(key)
    if loader is None:
        raise ArtifactError(
            f"weights {key} are not loaded: a library with its weights beside it runs through "
            "codl_tvm.runtime.artifact.load_artifact, which starts its loader"
        )
    return loader.get(int(i))


def _join_all() -> None:
    # at exit, before the OpenCL driver's statics go: a thread still uploading would call into them
    for loader in list(_LOADERS.values()):
        loader.join()


def start(path: str | os.PathLike, record: dict, device) -> WeightLoader:
    """Start loading an artifact's weights (its directory ``path`` and ``manifest["weights"]``
    record) onto ``device``; returns the loader, which the caller keeps for as long as it runs
    the library. A live loader of the same weights (same key, same device) is shared.

    Raises
    ------
    ArtifactError
        The file is missing, or truncated (see :class:`WeightLoader`).
    """
    global _REGISTERED
    with _LOCK:
        if not _REGISTERED:
            tvm.register_global_func(GET, _get, override=True)
            atexit.register(_join_all)
            _REGISTERED = True
        live = _LOADERS.get(record["key"])
        if live is not None and live.error is None and str(live.device) == str(device):
            return live
        loader = WeightLoader(Path(path) / record["file"], record, device)
        _LOADERS[record["key"]] = loader
        return loader
