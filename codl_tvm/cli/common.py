"""Helpers the ``codl-tvm`` commands share: input and output files, the OpenCL banner, reports.

Everything here checks what the user gave before any work starts and raises
:class:`~codl_tvm.core.errors.CliError` (one line, exit status 2) when it cannot be used.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import zipfile
from pathlib import Path

import numpy as np

from codl_tvm import runtime
from codl_tvm.core.errors import CliError
from codl_tvm.frontend.importer import OnnxModel, check_inputs, random_inputs

__all__ = [
    "add_run_arguments",
    "building",
    "check_output_file",
    "load_inputs",
    "load_npz",
    "opencl_banner",
    "print_outputs_and_latency",
    "save_outputs",
]


def add_run_arguments(
    p: argparse.ArgumentParser, outputs_help: str, repeat_help: str = "timing repeats"
) -> None:
    """The flags of the commands that run a model (``run``, ``deploy``): its inputs, where its
    outputs go, the seed of random inputs and the timing."""
    p.add_argument("--inputs", help=".npz of inputs keyed by graph input names")
    p.add_argument("--save-outputs", help=outputs_help)
    p.add_argument("--force", action="store_true", help="overwrite --save-outputs if it exists")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--repeat", type=int, default=3, help=repeat_help)
    p.add_argument("--number", type=int, default=5, help="runs per timing repeat")


def load_npz(path: str, flag: str = "--inputs") -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` file ``path``, keyed by name."""
    p = Path(path)
    if not p.is_file():
        raise CliError(f"{flag} {path}: no such file")
    # np.load reads anything that is not a zip as a pickle or .npy and then says "pickled
    # (object) data" about a text file: tell the user what the file is not instead.
    if not zipfile.is_zipfile(p):
        raise CliError(f"{flag} {path}: not an .npz file (expected numpy.savez output)")
    try:
        with np.load(p, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise CliError(f"{flag} {path}: not a readable .npz file ({exc})") from None


def load_inputs(path: str | None, model: OnnxModel, seed: int) -> list[np.ndarray]:
    """The model's inputs in graph order: from the ``.npz`` at ``path``, or seeded random."""
    if path is None:
        return check_inputs(model, random_inputs(model, seed), "random inputs")
    return check_inputs(model, load_npz(path), f"--inputs {path}")


def check_output_file(path: str | None, force: bool, flag: str = "--save-outputs") -> None:
    """Fail before any work when the output file ``path`` could not be written afterwards: a
    wrong suffix, an existing file without ``force``, a missing or read-only directory."""
    if not path:
        return
    out = Path(path)
    if out.suffix != ".npz":
        raise CliError(f"{flag} {path}: the file name must end in .npz")
    if out.is_dir():
        raise CliError(f"{flag} {path}: is a directory")
    if out.exists() and not force:
        raise CliError(f"{flag} {path}: file exists; pass --force to overwrite it")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise CliError(f"{flag} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise CliError(f"{flag} {path}: directory {parent} is not writable")


def save_outputs(path: str, model: OnnxModel, outputs: list[np.ndarray], force: bool) -> None:
    """Write ``outputs`` to the ``.npz`` at ``path``, keyed by the graph's output names."""
    check_output_file(path, force)
    np.savez(path, **{spec.name: arr for spec, arr in zip(model.outputs, outputs)})
    print(f"saved outputs to {path}")


def building(model: str | Path, device: str) -> contextlib.AbstractContextManager[None]:
    """Turn a failure while building or first running ``model`` for ``device`` into one line
    (:func:`codl_tvm.runtime.build_errors`)."""
    return runtime.build_errors(str(model), device)


def opencl_banner() -> None:
    """Load the OpenCL runtime and print the platform and device in use."""
    try:
        runtime.load()
        info = runtime.info()
    except Exception as exc:  # the plugin reports a missing or unusable platform as TVM errors
        raise CliError(f"OpenCL is not usable here: {one_line(str(exc))}") from None
    print(
        f"OpenCL: {info.platform} / {info.devices[0].name} "
        f"({info.devices[0].compute_units} CUs, SVM {info.svm_mode})"
    )


def one_line(text: str) -> str:
    """``text`` on one line (its lines joined with "; ")."""
    return "; ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def print_outputs_and_latency(model: OnnxModel, outputs, lat, number: int) -> None:
    """Print each output's shape and dtype, then the latency summary."""
    for spec, arr in zip(model.outputs, outputs):
        print(f"output {spec.name}: shape {tuple(arr.shape)} dtype {arr.dtype}")
    print(
        f"latency: median {lat.median_ms:.3f} ms (min {lat.min_ms:.3f}, max {lat.max_ms:.3f}, "
        f"{lat.repeats} repeats of {number})"
    )
