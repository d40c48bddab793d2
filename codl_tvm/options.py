"""Options of the library calls behind the commands, one frozen dataclass per call.

``codl-tvm compile`` has some twenty flags; :class:`CompileOptions` carries them to
:func:`compile_model` as one value (the CLI builds it from its arguments, scripts and tutorials
can build and reuse it), instead of a long list of keyword arguments forwarded by hand.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from codl_tvm.artifact import compile_artifact
from codl_tvm.core.plan import PartitionPlan

__all__ = ["CompileOptions", "compile_model"]


@dataclass(frozen=True)
class CompileOptions:
    """How :func:`compile_model` plans and builds an artifact.

    Every field is the keyword argument of :func:`codl_tvm.artifact.compile_artifact` of the
    same name, with the same default; its docstring describes them.
    """

    device: str = "coexec"
    mode: str = "codl"
    cost_model: str | Path | None = None
    plan: PartitionPlan | None = None
    preset: str | None = None
    reference: bool = True
    seed: int = 0
    force: bool = False
    winograd: bool | None = None
    packed: bool | None = None
    verify: int = 0
    verify_modes: tuple[str, ...] = ()
    tracker: str | None = None
    key: str | None = None
    build_cache: str | Path | None = None
    coexec_cpu_alone: bool | None = None
    verify_calibrate: bool = True
    split_channel_blocks: bool = True
    split_row_blocks: bool = False
    refine: int = 0
    refine_traces: int = 5
    weight_gbps: tuple[float, float] | None = None
    processor_scale: tuple[float, float] = (1.0, 1.0)
    weights: str = "embedded"


def compile_model(
    model_path: str | Path,
    out_dir: str | Path,
    options: CompileOptions | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """Plan and build the ONNX model at ``model_path`` into the artifact directory ``out_dir``
    as ``options`` say (default: :class:`CompileOptions`); returns the directory."""
    options = options or CompileOptions()
    kwargs = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    return compile_artifact(model_path, out_dir, log=log, **kwargs)
