"""Pipelined builds: a model cut into stages, each built for its processor group, as one artifact.

A pipeline artifact (``codl-tvm compile MODEL --objective throughput``; its files are described
in :mod:`codl_tvm.runtime.staged_artifact`, which loads and runs it without TVM's compiler) holds
one library per stage of a :class:`~codl_tvm.planner.stages.table.PipelinePlan`, a manifest and
a reference.

- :func:`build_pipeline`: cut ``main`` at the plan's layer boundaries
  (:func:`codl_tvm.passes.stages.cut_stages`), build each stage for its group
  (:func:`codl_tvm.build.stage_targets.group_target`, ``compile_library``), write the manifest
  and the reference into a staging directory swapped in when complete: a failed build never
  loses an earlier directory (:func:`install_pipeline`).
- :func:`compute_reference`: seeded inputs and the unpartitioned model's outputs on the host
  CPU, which ``codl-tvm run PIPELINE/`` checks the pipeline's outputs against.
- :func:`layer_shapes`: the layers' GEMM shapes for
  :class:`~codl_tvm.planner.stages.layer_model.PipeModel`
  (:mod:`codl_tvm.profiling.layers` measures their latencies on every group).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from codl_tvm.build.runner import build
from codl_tvm.build.stage_targets import (
    compile_library,
    group_target,
    layer_bindings,
    resolve_isas,
    stage_module,
)
from codl_tvm.core.errors import ArtifactError, PlannerError
from codl_tvm.core.groups import ProcessorGroup
from codl_tvm.frontend.importer import OnnxModel, random_inputs
from codl_tvm.passes.rewrite import op_name
from codl_tvm.passes.stages import MAJOR_OPS, cut_stages, layer_starts, stage_name
from codl_tvm.planner.stages.layer_model import LayerShape
from codl_tvm.planner.stages.table import PipelinePlan
from codl_tvm.runtime.artifact import REFERENCE, file_sha256
from codl_tvm.runtime.staged_artifact import (
    PIPELINE_FORMAT,
    PIPELINE_MANIFEST,
    PIPELINE_VERSION,
    is_pipeline,
)

__all__ = [
    "Reference",
    "build_pipeline",
    "check_pipeline_out",
    "compute_reference",
    "install_pipeline",
    "layer_shapes",
]


@dataclass(frozen=True)
class Reference:
    """What ``codl-tvm run PIPELINE/`` checks a pipeline against: seeded inputs and the
    unpartitioned model's outputs for them on the host CPU.

    Attributes
    ----------
    seed
        The seed of :func:`~codl_tvm.frontend.importer.random_inputs`.
    inputs
        The inputs by name.
    outputs
        The outputs in graph order.
    """

    seed: int
    inputs: Mapping[str, np.ndarray]
    outputs: Sequence[np.ndarray]


def compute_reference(model: OnnxModel, seed: int) -> Reference:
    """The unpartitioned model built for the host CPU, run on inputs seeded with ``seed``.

    Raises
    ------
    BuildError
        The model failed to build for the host CPU.
    """
    values = random_inputs(model, seed)
    outs = build(model.mod, "cpu", model=str(model.path))([values[s.name] for s in model.inputs])
    return Reference(seed, values, outs)


def layer_shapes(mod: tvm.IRModule) -> list[LayerShape]:
    """The GEMM shape (Pipe-it Eq. 4) of every layer of ``main`` (:func:`layer_starts`).

    A convolution is ``N`` = output pixels, ``K`` = kernel height x width x input channels per
    group, ``M`` = output channels; a matrix product is ``N`` = rows, ``K`` = the reduced extent,
    ``M`` = columns. A layer without a major operator (elementwise ops before the first one) is
    an ``other`` layer of its output's size.
    """
    out = []
    for i, b in enumerate(layer_bindings(mod["main"])):
        name = op_name(b.value)
        shape = [int(d) for d in b.var.ty.shape] if hasattr(b.var.ty, "shape") else [1]
        if name in MAJOR_OPS and name.startswith("relax.nn.conv"):
            w = [int(d) for d in b.value.args[1].ty.shape]
            depthwise = w[1] == 1 and shape[1] > 1 and w[0] == shape[1]
            out.append(
                LayerShape(
                    f"{i}:{b.var.name}",
                    "depthwise_conv2d" if depthwise else "conv2d",
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
    os.chmod(built, out.stat().st_mode & 0o7777)
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
    reference: Reference | None = None,
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
        The artifact directory (created with the user's umask, as any directory); an existing
        one is replaced only with ``force`` and only when it is a pipeline artifact.
    isa
        Instruction set per CPU group name (default:
        :func:`~codl_tvm.build.stage_targets.default_isa`).
    extra
        More fields for the manifest (e.g. how the latencies were obtained).
    reference
        Written as ``reference.npz`` (:func:`compute_reference`); None writes none.

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
    isas = resolve_isas(groups, isa)
    starts = _check_plan(model, plan, groups)
    out.parent.mkdir(parents=True, exist_ok=True)
    # mkdir, not mkdtemp (mode 0700): the artifact gets the user's umask, as any directory
    stage_dir = out.parent / f".{out.name}.codl-new-{os.getpid()}-{secrets.token_hex(4)}"
    stage_dir.mkdir()
    try:
        stages = _build_stages(model, plan, groups, isas, starts, stage_dir)
        manifest = _manifest(model, plan, groups, isas, stages)
        if reference is not None:
            np.savez(
                stage_dir / REFERENCE,
                **{f"input:{k}": v for k, v in reference.inputs.items()},
                **{f"output:{s.name}": o for s, o in zip(model.outputs, reference.outputs)},
            )
            manifest["reference"] = {"file": REFERENCE, "seed": reference.seed, "target": "host"}
        manifest["files"] = {
            p.name: file_sha256(p) for p in sorted(stage_dir.iterdir()) if p.is_file()
        }
        manifest.update(extra or {})
        (stage_dir / PIPELINE_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        install_pipeline(stage_dir, out)
    except BaseException:
        shutil.rmtree(stage_dir, ignore_errors=True)
        raise
    return out


def _check_plan(
    model: OnnxModel, plan: PipelinePlan, groups: Sequence[ProcessorGroup]
) -> list[int]:
    """``main``'s layer starts, after checking that ``plan`` covers them on ``groups``."""
    names = {g.name for g in groups}
    starts = layer_starts(model.mod["main"])
    if not plan.stages or plan.stages[-1].stop_layer != len(starts):
        raise PlannerError(
            f"the plan covers {plan.stages[-1].stop_layer if plan.stages else 0} layers; "
            f"{model.path} has {len(starts)}"
        )
    for s in plan.stages:
        if s.group not in names:
            raise PlannerError(f"the plan names group {s.group!r}, not among {sorted(names)}")
    return starts


def _build_stages(
    model: OnnxModel,
    plan: PipelinePlan,
    groups: Sequence[ProcessorGroup],
    isas: Mapping[str, str],
    starts: Sequence[int],
    stage_dir: Path,
) -> list[dict[str, Any]]:
    """Build every stage's library into ``stage_dir``; the manifest's ``stages`` records."""
    by_name = {g.name: g for g in groups}
    staged = cut_stages(model.mod, [starts[s.first_layer] for s in plan.stages[1:]])
    stages = []
    for k, s in enumerate(plan.stages):
        group = by_name[s.group]
        lib = f"{stage_name(k)}.so"
        compile_library(
            stage_module(staged, [], stage_name(k)),
            group_target(group, isas[s.group] if group.kind == "cpu" else None),
            stage_dir / lib,
            f"{model.path} ({stage_name(k)} on {s.group})",
        )
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
    return stages


def _manifest(
    model: OnnxModel,
    plan: PipelinePlan,
    groups: Sequence[ProcessorGroup],
    isas: Mapping[str, str],
    stages: list[dict[str, Any]],
) -> dict[str, Any]:
    """The manifest's fields but ``files``, ``reference`` and the caller's extras."""
    model_file = Path(model.path)
    on_disk = model_file.is_file()  # not for a model imported from memory ("<memory>")
    return {
        "format": PIPELINE_FORMAT,
        "version": PIPELINE_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "codl_tvm_version": _version("codl-tvm"),
        "tvm_version": tvm.__version__,
        "model": {
            # resolved: the manifest is read from other directories
            "file": str(model_file.resolve()) if on_disk else str(model.path),
            "sha256": file_sha256(model_file) if on_disk else None,
            "inputs": [t.to_dict() for t in model.inputs],
            "outputs": [t.to_dict() for t in model.outputs],
        },
        "groups": [
            {"name": g.name, "kind": g.kind, "cores": list(g.cores), "isa": isas[g.name]}
            for g in groups
        ],
        "plan": plan.to_json() | {"describe": plan.describe()},
        "stages": stages,
    }


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
