"""``codl-tvm refine``: rebalance a co-executed artifact's splits from timelines measured on
this machine, and build the result with the settings of the artifact it refines.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from codl_tvm.core.errors import ArtifactError
from codl_tvm.core.plan import PartitionPlan
from codl_tvm.frontend.importer import random_inputs
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.objectives.verify import refine_from_timelines
from codl_tvm.options import CompileOptions
from codl_tvm.planner.split.refine import RefineError
from codl_tvm.runtime.artifact import MANIFEST, Manifest, file_sha256, load_artifact

__all__ = ["compile_refined", "refine_artifact", "refined_plan"]

logger = logging.getLogger(__name__)


def refine_artifact(
    artifact_dir: str | Path,
    out_dir: str | Path,
    *,
    traces: int = 5,
    model_path: str | Path | None = None,
    step: float = 1.0,
    force: bool = False,
) -> Path:
    """Time a co-executed artifact's splits inside the model and rebuild it balanced.

    :func:`refined_plan` (timelines on this machine, each split moved to the share that
    balances it), then :func:`compile_refined` (the refined plan built with the artifact's
    settings into ``out_dir``). ``manifest["plan"]["refined"]`` records the measurements and
    the changes.

    Parameters
    ----------
    artifact_dir
        A co-executed artifact built by this codl-tvm (its manifest holds the kernel record).
    out_dir
        The new artifact's directory (``artifact_dir`` itself is never overwritten).
    traces
        Timelines to take; each split's time is the median over them.
    model_path
        The ONNX model, when the path in the artifact's manifest is gone (its SHA-256 must
        match the manifest's).
    step
        Fraction of the way to the balanced shares.
    force
        Replace an earlier artifact in ``out_dir``.
    """
    if Path(out_dir).resolve() == Path(artifact_dir).resolve():
        raise ArtifactError(f"{out_dir}: the refined artifact needs a directory of its own")
    plan, record = refined_plan(artifact_dir, traces=traces, step=step)
    return compile_refined(artifact_dir, plan, record, out_dir, model_path=model_path, force=force)


def refined_plan(
    artifact_dir: str | Path,
    *,
    traces: int = 5,
    step: float = 1.0,
) -> tuple[Any, dict]:
    """Run a co-executed artifact on this machine, take ``traces`` timelines
    (:func:`codl_tvm.profiling.trace.trace_inference`), measure each split's time on each processor
    (:func:`codl_tvm.planner.split.refine.split_times`) and move every split's ratio, and the plan's
    ``block_ratio``, to the share that balances it (:func:`codl_tvm.planner.split.refine.
    refine_plan`).

    Returns
    -------
    (PartitionPlan, dict)
        The refined plan, and the record :func:`compile_refined` stores: the source artifact,
        its plan, the timelines' spans and each split's measurements and change.
    """
    src = Path(artifact_dir)
    if not isinstance(traces, int) or traces < 1:
        raise ArtifactError(f"traces must be a number >= 1, got {traces!r}")
    art = load_artifact(src)
    if art.device != "coexec":
        raise ArtifactError(
            f"{src}: the artifact runs on the {art.device} alone; there are no splits to refine"
        )
    splits = art.kernel_splits
    if not splits:
        raise ArtifactError(
            f"{src}: the manifest has no kernel record (built by an older codl-tvm); "
            "compile it again to refine it"
        )
    ref = art.reference()
    values = ref[0] if ref is not None else random_inputs(art.model, 0)
    inputs = [values[s.name] for s in art.model.inputs]
    logger.info("tracing %s (%d inferences)", src, traces)
    plan = PartitionPlan.load(src / "plan.json")
    try:
        refined, record = refine_from_timelines(art, splits, inputs, plan, traces, step)
    except RefineError as exc:
        raise ArtifactError(f"{src}: {exc}") from None
    rows = record["splits"]
    for row in rows:
        if "new_ratio" in row:
            measured = (
                f" (CPU {row['cpu_ms']:.3f} ms, GPU {row['gpu_ms']:.3f} ms)"
                if row.get("cpu_ms") is not None
                else ""
            )
            logger.info(
                "  %s: GPU share %.2f -> %.2f%s",
                row["split"],
                row["built_share"],
                row["new_ratio"],
                measured,
            )
    return refined, {"from": str(src), **record}


def compile_refined(
    artifact_dir: str | Path,
    plan,
    record: dict,
    out_dir: str | Path,
    *,
    model_path: str | Path | None = None,
    force: bool = False,
) -> Path:
    """Build ``plan`` (from :func:`refined_plan`) with the settings of the artifact it refines
    (preset, CPU kernels, channel blocks, reference seed) into ``out_dir``; ``record`` goes to
    ``manifest["plan"]["refined"]``. ``model_path``: the ONNX model, when the artifact's path
    to it is gone (its SHA-256 must match)."""
    src = Path(artifact_dir)
    m = load_artifact(src, verify=False, check_cpu=False).manifest
    model = Path(model_path) if model_path is not None else Path(m.model.file)
    if not model.is_file():
        raise ArtifactError(
            f"{model}: the artifact's model file is gone; give its path (model_path)"
        )
    if file_sha256(model) != m.model.sha256:
        raise ArtifactError(f"{model}: not the model {src} was built from (SHA-256 differs)")
    options = CompileOptions(
        device="coexec",
        plan=plan,
        preset=m.preset,
        reference=m.reference is not None,
        seed=(m.reference or {}).get("seed", 0),
        force=force,
        winograd=True if m.winograd else None,
        packed=True if m.packed else None,
        coexec_cpu_alone=bool(m.coexec_cpu_alone_kernels),
        # artifacts from before channel or row blocks existed were built with / without them
        split_channel_blocks=True if m.split_channel_blocks is None else m.split_channel_blocks,
        split_row_blocks=bool(m.split_row_blocks),
    )
    out = compile_artifact(model, out_dir, options)
    new = Manifest.from_json((out / MANIFEST).read_text())
    new.plan["source"] = "refined"
    new.plan["refined"] = record
    new.write(out)
    return out
