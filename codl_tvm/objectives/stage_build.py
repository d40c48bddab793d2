"""Pipelined builds: a model cut into stages, each built for its processor group, run as a stream.

A pipeline artifact (``codl-tvm compile MODEL --objective throughput``; its files are described
in :mod:`codl_tvm.runtime.staged_artifact`) holds one library per stage of a
:class:`~codl_tvm.planner.stages.search.PipelinePlan`.

- :func:`group_target`: a processor group's TVM target. A CPU group is built for an instruction
  set (:data:`ISAS`: ``host``, this machine's CPU with every feature it has, e.g. AVX-512;
  ``x86-64-v2``, SSE4.2 without AVX: the "little" cluster of an emulated big.LITTLE machine);
  a GPU group is the OpenCL device with the host CPU as host.
- :func:`build_pipeline`: cut ``main`` at the plan's layer boundaries
  (:class:`codl_tvm.passes.stages.CutStages`), build each stage with codl-tvm's single-device
  pipeline for its group, write the artifact (into a staging directory, swapped in when
  complete: a failed build never loses an earlier directory).
- :mod:`codl_tvm.runtime.staged_artifact` loads and runs the artifact (no compiler needed there).
- :func:`layer_shapes`: the layers' GEMM shapes for
:class:`~codl_tvm.planner.stages.layer_model.PipeModel`
  (:mod:`codl_tvm.profiling.layers` measures their latencies on every group).
"""

from __future__ import annotations

import json
import platform
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

from codl_tvm import runtime
from codl_tvm.build.pipeline import single_device_pipeline
from codl_tvm.build.targets import host_cpu_spec
from codl_tvm.core.errors import ArtifactError, PlannerError
from codl_tvm.frontend.importer import OnnxModel, TensorSpec
from codl_tvm.passes.rewrite import op_name
from codl_tvm.passes.stages import MAJOR_OPS, cut_stages, layer_starts, stage_name
from codl_tvm.planner.stages.layer_model import LayerShape
from codl_tvm.planner.stages.search import (
    PipelinePlan,
    ProcessorGroup,
)
from codl_tvm.runtime.staged_artifact import (
    PIPELINE_FORMAT,
    PIPELINE_MANIFEST,
    PIPELINE_VERSION,
    _sha256,
    is_pipeline,
)

__all__ = [
    "ISAS",
    "build_pipeline",
    "check_pipeline_out",
    "compile_library",
    "default_isa",
    "group_target",
    "install_pipeline",
    "layer_shapes",
    "resolve_isas",
    "stage_module",
]


def _host_isa() -> dict[str, Any]:
    return host_cpu_spec()


def _x86_64_v2() -> dict[str, Any]:
    # SSE4.2/POPCNT, no AVX: 4-wide float vectors against AVX-512's 16
    return {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64-v2"}


def _x86_64_v3() -> dict[str, Any]:
    # AVX2 and FMA: 8-wide float vectors
    return {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64-v3"}


def _x86_64_v3_nofma() -> dict[str, Any]:
    # AVX2 without FMA (LLVM's "-fma" feature): 8-wide vectors, a multiply and an add apiece
    return {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64-v3", "mattr": ["-fma"]}


def _x86_64() -> dict[str, Any]:
    # the x86-64 baseline: SSE2 only
    return {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64"}


#: Instruction-set presets of CPU groups: name -> the LLVM target spec (JSON-dict form).
ISAS: dict[str, Callable[[], dict[str, Any]]] = {
    "host": _host_isa,
    "x86-64-v3": _x86_64_v3,
    "x86-64-v3-nofma": _x86_64_v3_nofma,
    "x86-64-v2": _x86_64_v2,
    "x86-64": _x86_64,
}


def default_isa(group: ProcessorGroup) -> str:
    """The instruction set a group is built for by default: ``x86-64-v2`` for a group named
    ``little`` on an x86-64 host (the emulated little cluster), else ``host``."""
    arch = platform.machine().lower()
    if group.name == "little" and arch in ("x86_64", "amd64"):
        return "x86-64-v2"
    return "host"


def group_target(group: ProcessorGroup, isa: str | None = None) -> tvm.target.Target:
    """The TVM target a stage on ``group`` is built for.

    Raises
    ------
    PlannerError
        An unknown instruction-set preset.
    """
    if group.kind == "gpu":
        return tvm.target.Target({"kind": "opencl"}, host=host_cpu_spec())
    isa = isa or default_isa(group)
    if isa not in ISAS:
        raise PlannerError(
            f"group {group.name!r}: unknown instruction set {isa!r} (choose from {', '.join(ISAS)})"
        )
    return tvm.target.Target(ISAS[isa]())


def resolve_isas(groups: Sequence[ProcessorGroup], isa: Mapping[str, str] | None) -> dict[str, str]:
    isa = dict(isa or {})
    unknown = set(isa) - {g.name for g in groups}
    if unknown:
        raise PlannerError(f"instruction sets given for unknown groups {sorted(unknown)}")
    out = {}
    for g in groups:
        out[g.name] = "opencl" if g.kind == "gpu" else isa.get(g.name, default_isa(g))
        if g.kind == "cpu" and out[g.name] not in ISAS:
            raise PlannerError(
                f"group {g.name!r}: unknown instruction set {out[g.name]!r} (choose from "
                f"{', '.join(ISAS)})"
            )
    return out


def layer_shapes(mod: tvm.IRModule) -> list[LayerShape]:
    """The GEMM shape (Pipe-it Eq. 4) of every layer of ``main`` (:func:`layer_starts`).

    A convolution is ``N`` = output pixels, ``K`` = kernel height x width x input channels per
    group, ``M`` = output channels; a matrix product is ``N`` = rows, ``K`` = the reduced extent,
    ``M`` = columns. A layer without a major operator (elementwise ops before the first one) is
    an ``other`` layer of its output's size.
    """
    func = mod["main"]
    bindings = func.body.blocks[0].bindings
    starts = layer_starts(func)
    bounds = [*starts[1:], len(bindings)]
    out = []
    for i, start in enumerate(starts):
        # the layer's major operator (the first layer may start with other bindings)
        b = next(
            (b for b in bindings[start : bounds[i]] if op_name(b.value) in MAJOR_OPS),
            bindings[start],
        )
        name = op_name(b.value)
        shape = [int(d) for d in b.var.ty.shape] if hasattr(b.var.ty, "shape") else [1]
        if name in MAJOR_OPS and name.startswith("relax.nn.conv"):
            w = [int(d) for d in b.value.args[1].ty.shape]
            out.append(
                LayerShape(
                    f"{i}:{b.var.name}",
                    "depthwise_conv2d"
                    if w[1] == 1 and shape[1] > 1 and w[0] == shape[1]
                    else "conv2d",
                    max(1, shape[2] * shape[3]),
                    max(1, w[1] * w[2] * w[3]),
                    max(1, shape[1]),
                )
            )
        elif name in MAJOR_OPS:
            a = [int(d) for d in b.value.args[0].ty.shape]
            out.append(
                LayerShape(
                    f"{i}:{b.var.name}",
                    "dense",
                    max(1, int(np.prod(a[:-1]))),
                    max(1, a[-1]),
                    max(1, shape[-1]),
                )
            )
        else:
            out.append(LayerShape(f"{i}:{b.var.name}", "other", max(1, int(np.prod(shape))), 1, 1))
    return out


def compile_library(mod: tvm.IRModule, target: tvm.target.Target, path: Path, what: str) -> None:
    kind = "opencl" if target.kind.name == "opencl" else "cpu"
    if kind == "opencl":
        runtime.load()
    with runtime.build_errors(what, kind):
        ex = tvm.compile(mod, target=target, relax_pipeline=single_device_pipeline(target))
        ex.export_library(str(path))


def stage_module(staged: tvm.IRModule, names: Sequence[str], main: str | None = None):
    """The Relax functions ``names`` of ``staged`` (``main`` renamed to ``main``) with the TIR
    functions they call (the ONNX frontend emits some ops, e.g. Clip, as ``call_tir``)."""
    funcs = {
        gv: f
        for gv, f in staged.functions.items()
        if isinstance(f, tvm.tirx.PrimFunc) or gv.name_hint in (*names, main)
    }
    if main is not None:
        gv = staged.get_global_var(main)
        funcs[tvm.ir.GlobalVar("main")] = funcs.pop(gv).with_attr("global_symbol", "main")
    mod = tvm.IRModule(funcs)
    entries = ["main"] if main is not None else list(names)
    return relax.transform.DeadCodeElimination(entries)(mod)


def check_pipeline_out(out: Path, force: bool) -> None:
    """Refuse an ``out`` that a pipeline build may not replace (touches nothing): an existing
    one without ``force``, or one that is not a pipeline artifact.

    Raises
    ------
    ArtifactError
        As above.
    """
    if out.exists():
        if not force:
            raise ArtifactError(f"{out} exists (pass --force to replace it)")
        if not is_pipeline(out):
            raise ArtifactError(f"{out} exists and is not a pipeline artifact: not replacing it")


def install_pipeline(built: Path, out: Path) -> None:
    """Move the complete pipeline directory ``built`` to ``out`` (beside it, so a rename); an
    existing ``out``, already checked replaceable, is set aside first, put back if the move
    fails and deleted once it succeeded, so a failure never leaves the user without one."""
    if not out.exists():
        built.rename(out)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    out.rename(aside / "old")
    try:
        built.rename(out)
    except BaseException:
        (aside / "old").rename(out)
        aside.rmdir()
        raise
    shutil.rmtree(aside, ignore_errors=True)


def build_pipeline(
    model: OnnxModel,
    plan: PipelinePlan,
    groups: Sequence[ProcessorGroup],
    out: str | Path,
    *,
    isa: Mapping[str, str] | None = None,
    force: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Build ``model`` as ``plan``'s stages and write the pipeline artifact ``out``.

    Parameters
    ----------
    model
        The imported model.
    plan
        The stages (layers are :func:`layer_starts`'s layers of ``model.mod``'s ``main``).
    groups
        The processor groups the plan names.
    out
        The artifact directory; an existing one is replaced only with ``force`` and only when
        it is a pipeline artifact.
    isa
        Instruction set per CPU group name (default: :func:`default_isa`).
    extra
        More fields for the manifest (e.g. how the latencies were obtained).

    Raises
    ------
    PlannerError
        A plan that does not cover the model's layers or names unknown groups.
    ArtifactError
        ``out`` exists and is not a pipeline artifact, or exists without ``force``.
    BuildError
        A stage failed to build.
    """
    out = Path(out)
    check_pipeline_out(out, force)
    by_name = {g.name: g for g in groups}
    isas = resolve_isas(groups, isa)
    starts = layer_starts(model.mod["main"])
    if not plan.stages or plan.stages[-1].stop_layer != len(starts):
        raise PlannerError(
            f"the plan covers {plan.stages[-1].stop_layer if plan.stages else 0} layers; "
            f"{model.path} has {len(starts)}"
        )
    for s in plan.stages:
        if s.group not in by_name:
            raise PlannerError(f"the plan names group {s.group!r}, not among {sorted(by_name)}")
    cuts = [starts[s.first_layer] for s in plan.stages[1:]]
    staged = cut_stages(model.mod, cuts)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage_dir = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        stages = []
        files = {}
        for k, s in enumerate(plan.stages):
            group = by_name[s.group]
            lib = f"{stage_name(k)}.so"
            compile_library(
                stage_module(staged, [], stage_name(k)),
                group_target(group, isas[s.group] if group.kind == "cpu" else None),
                stage_dir / lib,
                f"{model.path} ({stage_name(k)} on {s.group})",
            )
            files[lib] = _sha256(stage_dir / lib)
            stages.append(
                {
                    "library": lib,
                    "group": s.group,
                    "kind": group.kind,
                    "isa": isas[s.group],
                    "cores": list(s.cores),
                    "core_count": s.core_count,
                    "layers": [s.first_layer, s.stop_layer],
                    "predicted_ms": s.latency_ms,
                }
            )
        manifest = {
            "format": PIPELINE_FORMAT,
            "version": PIPELINE_VERSION,
            "model": {
                "file": str(model.path),
                "inputs": [_spec(t) for t in model.inputs],
                "outputs": [_spec(t) for t in model.outputs],
            },
            "groups": [
                {"name": g.name, "kind": g.kind, "cores": list(g.cores), "isa": isas[g.name]}
                for g in groups
            ],
            "plan": plan.to_json() | {"describe": plan.describe()},
            "stages": stages,
            "files": files,
            **dict(extra or {}),
        }
        (stage_dir / PIPELINE_MANIFEST).write_text(json.dumps(manifest, indent=2))
        install_pipeline(stage_dir, out)
    except BaseException:
        shutil.rmtree(stage_dir, ignore_errors=True)
        raise
    return out


def _spec(t: TensorSpec) -> dict:
    return {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}
