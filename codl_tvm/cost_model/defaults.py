"""The cost models shipped with codl-tvm and which one a target preset uses.

Each was fitted on datasets measured on a 16-core Xeon host with an H100, shipped in the source
tree beside the models (``codl_tvm/data/cost_models/datasets/``; each model's
``meta["dataset"]`` names its own); a device that is not one of these needs its own
(``codl-tvm profile`` then ``codl-tvm cost-model fit``).

- ``emulated-soc``: PoCL's CPU OpenCL device on 8 Xeon cores as the GPU, TVM's AVX-512 kernels on
  8 other cores: the stand-in for a phone SoC, and the default for every CPU OpenCL device
  (PoCL, Intel's CPU runtime) since it is the closest measured pair;
- ``device-h100``: NVIDIA H100 through NVIDIA's OpenCL + 16 Xeon cores;
- ``emulated-soc-k12`` and ``emulated-soc-k12-alone``: the emulated SoC with PoCL on 12 cores
  and TVM's kernels on 4 (the GPU-weak point of the benchmark report), the second fitted with
  the CPU-alone kernels' dataset too;
- ``emulated-soc-k14``: PoCL on 14 cores and TVM's kernels on 2, where the two processors are
  within 2x of each other on the ten benchmark models, as a phone's are.

Each records the device it was fitted on (``meta["device"]``,
:mod:`codl_tvm.cost_model.fitted_device`). ``--cost-model`` takes a file or one of these names
(:func:`cost_model_path`).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from codl_tvm import runtime
from codl_tvm.core.errors import ModelFileError, NoDefaultModelError

__all__ = [
    "SHIPPED",
    "NoDefaultModelError",
    "cost_model_path",
    "default_model_path",
    "shipped_model_path",
]

SHIPPED = (
    "emulated-soc",
    "device-h100",
    "emulated-soc-k12",
    "emulated-soc-k12-alone",
    "emulated-soc-k14",
)
# Presets whose device pair one shipped model describes.
_BY_PRESET = {"emulated-soc": "emulated-soc", "pocl": "emulated-soc", "device-h100": "device-h100"}


def shipped_model_path(name: str) -> Path:
    """Path of the shipped model ``name`` (one of :data:`SHIPPED`)."""
    if name not in SHIPPED:
        raise NoDefaultModelError(f"no shipped cost model {name!r}; shipped: {', '.join(SHIPPED)}")
    path = Path(str(resources.files("codl_tvm") / "data" / "cost_models" / f"{name}.json"))
    if not path.is_file():
        raise NoDefaultModelError(f"the shipped cost model {path} is missing from the package")
    return path


def cost_model_path(value: str | Path | None, preset: str | None = None) -> Path:
    """The cost-model file ``value`` names: a file, a shipped model's name (:data:`SHIPPED`),
    or None for the shipped model of ``preset`` (:func:`default_model_path`), as ``plan`` and
    ``compile`` both read ``--cost-model``.

    Raises
    ------
    ModelFileError
        ``value`` is neither a file nor a shipped model's name.
    NoDefaultModelError
        ``value`` is None and no shipped model describes ``preset``.
    """
    if value is None or str(value) == "":
        return default_model_path(preset)
    path = Path(value)
    if path.is_file():
        return path
    if str(value) in SHIPPED:
        return shipped_model_path(str(value))
    raise ModelFileError(
        f"cost model {value}: no such file, and not a shipped model ({', '.join(SHIPPED)})"
    )


def default_model_path(preset: str | None = None) -> Path:
    """The shipped model for ``preset``; for ``None``/``opencl``/``host`` the local OpenCL
    device decides (NVIDIA GPUs: ``device-h100``, others: ``emulated-soc``)."""
    if preset in _BY_PRESET:
        return shipped_model_path(_BY_PRESET[preset])
    if preset in (None, "opencl", "host"):
        return shipped_model_path(_local_pair())
    raise NoDefaultModelError(
        f"no shipped cost model describes preset {preset!r}: profile that device "
        "(`codl-tvm profile ... --rpc HOST:PORT --rpc-key KEY`), fit a model "
        "(`codl-tvm cost-model fit`) and pass it with --cost-model"
    )


def _local_pair() -> str:
    try:
        runtime.load()
        info = runtime.info()
        names = f"{info.platform} {info.devices[0].name}".lower()
    except Exception:  # no OpenCL here: the CPU-OpenCL model is as good a guess as any
        return "emulated-soc"
    return "device-h100" if "nvidia" in names else "emulated-soc"
