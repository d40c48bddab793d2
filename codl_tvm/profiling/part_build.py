"""Compiling one part of a partitioned operator into a shared library (:func:`compile_part`).

The part's one-op module is built and scheduled by ``cost_model.part_ir`` for its processor
(OpenCL or LLVM) with codl-tvm's single-device pipeline, then exported; the implementation
(``codl.algorithm``) and the dispatch features are read from the scheduled PrimFuncs, never
guessed. A :class:`CompiledPart` is what a run directory's manifest lists: measuring it
(``profiling.timing.measure_op``) is a separate step, so the same library runs here, on a
prepared directory copied to another machine, or through a TVM RPC session.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from codl_tvm.build.targets import export_library, get_preset
from codl_tvm.core.errors import ProfileError
from codl_tvm.cost_model.dispatch import dispatch_features
from codl_tvm.cost_model.features import (
    DispatchFeatures,
    FeatureError,
    OpParams,
    Partition,
    PartShape,
    part_shape,
)
from codl_tvm.cost_model.part_ir import (
    PROCESSOR_DEVICE,
    algorithm_switches,
    check_part,
    compile_scheduled,
    part_target,
    schedule_part,
)
from codl_tvm.profiling.sessions import local_cpu_threads

__all__ = ["CompiledPart", "compile_part"]


@dataclass(frozen=True)
class CompiledPart:
    """One part compiled to a shared library (what a run directory's manifest lists)."""

    library: str  # file name, relative to the directory it lives in
    params: OpParams
    partition: Partition
    processor: str
    part: PartShape
    impl: str
    dispatch: DispatchFeatures
    inputs: tuple[tuple[int, ...], ...]
    name: str | None = None

    def to_json(self) -> dict:
        return {
            "library": self.library,
            "op": self.params.op,
            "params": self.params.to_json(),
            "partition": self.partition.to_json(),
            "processor": self.processor,
            "part": self.part.to_json(),
            "impl": self.impl,
            "dispatch": self.dispatch.to_json(),
            "inputs": [list(s) for s in self.inputs],
            "name": self.name,
        }

    @classmethod
    def from_json(cls, obj: dict) -> CompiledPart:
        p = dict(obj["params"])
        p["padding"] = tuple(p["padding"])
        return cls(
            library=obj["library"],
            params=OpParams(obj["op"], **p),
            partition=Partition(**obj["partition"]),
            processor=obj["processor"],
            part=PartShape(**obj["part"]),
            impl=obj["impl"],
            dispatch=DispatchFeatures(**obj["dispatch"]),
            inputs=tuple(tuple(s) for s in obj["inputs"]),
            name=obj.get("name"),
        )


def _implementation(funcs) -> str:
    """The ``codl.algorithm`` attributes of the scheduled kernels, joined with ``+``."""
    algos = []
    for f in funcs:
        attrs = f.attrs or {}
        if "codl.algorithm" in attrs:
            a = str(attrs["codl.algorithm"])
            if a not in algos:
                algos.append(a)
    # Kernels no codl rule scheduled (dlight / default schedule) are named as such.
    return "+".join(algos) if algos else "default"


def compile_part(
    params: OpParams,
    partition: Partition,
    processor: str,
    out_dir: str | Path,
    target=None,
    name: str | None = None,
    threads: int | None = None,
    verify: bool = True,
    preset: str | None = None,
) -> CompiledPart:
    """Build the ``processor`` part of ``params`` under ``partition`` into ``out_dir``.

    Parameters
    ----------
    params, partition, processor
        The operator, how it is split, and which part (``"gpu"`` or ``"cpu"``).
    out_dir
        Directory the shared library is written into (created if missing).
    target
        Overrides the processor's default target (``cost_model.part_ir.part_target``).
    name
        The operator's name in its model, kept in the record.
    threads
        CPU thread-pool size recorded in the dispatch features (default: this machine's
        ``TVM_NUM_THREADS`` or CPU count; pass the remote's when cross-compiling).
    verify
        Check the part against the one ``PartitionOperators`` makes
        (``cost_model.part_ir.check_part``).
    preset
        A ``codl_tvm.build.targets`` preset name: picks both targets unless ``target`` is given,
        and exports with the preset's (cross-)toolchain, for the board or phone it names.

    Returns
    -------
    CompiledPart
        The library's file name (relative to ``out_dir``) and what its record needs.

    Notes
    -----
    Inside :func:`~codl_tvm.schedules.winograd_enabled` /
    :func:`~codl_tvm.schedules.packed_enabled` (``codl-tvm profile --winograd/--packed``) a conv
    part is built with the algorithm an imported model's conv gets under those switches
    (``cost_model.part_ir.part_module``), so its record names it (``winograd``, ``packed``, or
    ``direct``/``gemm`` below their thresholds).
    """
    # deferred: TVM's compiler; the profiling package also measures on devices whose TVM is
    # runtime-only (`codl-tvm profile --run-dir`)
    from tvm import tirx

    if processor not in PROCESSOR_DEVICE:
        raise ProfileError(f"{params.describe()}: processor {processor!r} is not 'gpu' or 'cpu'")
    try:
        part = part_shape(params, partition, processor)
    except FeatureError as exc:
        raise ProfileError(str(exc)) from None
    if part.empty:
        raise ProfileError(
            f"{params.describe()}: the {processor} part of partition "
            f"{partition.dim}:{partition.ratio:g} is empty"
        )
    if verify:
        check_part(params, partition, processor, part)
    switches = algorithm_switches()
    if preset is not None and target is None:
        target = get_preset(preset).target(processor)
    tgt = part_target(processor, target)
    mod, scheduled = schedule_part(params, part, processor, tgt)
    funcs = [f for _, f in scheduled.functions.items() if isinstance(f, tirx.PrimFunc)]
    impl = _implementation(funcs)
    cpu_threads = None if processor == "gpu" else (threads or local_cpu_threads())
    dispatch = dispatch_features(funcs, cpu_threads) if funcs else DispatchFeatures()

    ex = compile_scheduled(scheduled, tgt)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ident = json.dumps(
        [params.op, params.to_json(), partition.to_json(), processor, str(tgt), switches],
        sort_keys=True,
    )
    lib = f"{params.op}_{processor}_{hashlib.sha1(ident.encode()).hexdigest()[:12]}.so"
    if preset is not None:
        export_library(ex, out / lib, preset)
    else:
        ex.export_library(str(out / lib))
    inputs = tuple(tuple(int(v) for v in p.ty.shape.values) for p in mod["main"].params)
    return CompiledPart(lib, params, partition, processor, part, impl, dispatch, inputs, name)
