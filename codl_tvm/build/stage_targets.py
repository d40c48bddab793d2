"""Building Pipe-it's stages: each processor group's target and one library of Relax functions.

Shared by the throughput objective, which builds a pipeline's stages
(:func:`codl_tvm.objectives.stage_build.build_pipeline`), and the profiling of layers, which
builds every layer as a function for every group (:mod:`codl_tvm.profiling.layers`):

- :data:`ISAS` and :func:`default_isa`: the instruction sets a CPU group is built for (``host``,
  this machine's CPU with every feature it has, e.g. AVX-512; ``x86-64-v2``, SSE4.2 without
  AVX: the little cores of an emulated big.LITTLE SoC, a group named ``little``'s default on
  x86-64);
- :func:`group_target`: a group's TVM target (a GPU group is the OpenCL device with the host
  CPU as host); :func:`resolve_isas`: every group's instruction set, checked;
- :func:`stage_module`: the Relax functions of a module cut into stages
  (:func:`codl_tvm.passes.stages.cut_stages`) with the TIR functions they call;
- :func:`compile_library`: one module built with codl-tvm's single-device pipeline;
- :func:`layer_names`: the layers' names (``"3:lv12"``) that tables of layer latencies carry.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tvm
from tvm import relax

from codl_tvm import runtime
from codl_tvm.build.pipeline import single_device_pipeline
from codl_tvm.build.targets import host_cpu_spec
from codl_tvm.core.errors import PlannerError
from codl_tvm.core.groups import ProcessorGroup
from codl_tvm.passes.rewrite import op_name
from codl_tvm.passes.stages import MAJOR_OPS, layer_starts

__all__ = [
    "ISAS",
    "ISA_NOTES",
    "compile_library",
    "default_isa",
    "group_target",
    "layer_bindings",
    "layer_names",
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

#: What each preset of :data:`ISAS` means, for messages.
ISA_NOTES: dict[str, str] = {
    "host": "this machine's CPU, every feature it has",
    "x86-64-v3": "AVX2 and FMA",
    "x86-64-v3-nofma": "AVX2 without FMA",
    "x86-64-v2": "SSE4.2, no AVX",
    "x86-64": "SSE2 only",
}


def default_isa(group: ProcessorGroup) -> str:
    """The instruction set a group is built for when none is given: ``x86-64-v2`` for a group
    named ``little`` on an x86-64 host (the little cores of an emulated big.LITTLE SoC), else
    ``host``."""
    arch = platform.machine().lower()
    if group.name == "little" and arch in ("x86_64", "amd64"):
        return "x86-64-v2"
    return "host"


def _check_isa(group: ProcessorGroup, isa: str) -> None:
    if isa not in ISAS:
        raise PlannerError(
            f"group {group.name!r}: unknown instruction set {isa!r} (choose from {', '.join(ISAS)})"
        )


def group_target(group: ProcessorGroup, isa: str | None = None) -> tvm.target.Target:
    """The TVM target a stage on ``group`` is built for (``isa``: a CPU group's instruction
    set, default :func:`default_isa`).

    Raises
    ------
    PlannerError
        An unknown instruction-set preset.
    """
    if group.kind == "gpu":
        return tvm.target.Target({"kind": "opencl"}, host=host_cpu_spec())
    isa = isa or default_isa(group)
    _check_isa(group, isa)
    return tvm.target.Target(ISAS[isa]())


def resolve_isas(groups: Sequence[ProcessorGroup], isa: Mapping[str, str] | None) -> dict[str, str]:
    """Every group's instruction set: ``isa``'s where it names the group, else
    :func:`default_isa`; ``"opencl"`` for a GPU group.

    Raises
    ------
    PlannerError
        ``isa`` names a group not in ``groups`` or an unknown instruction set.
    """
    isa = dict(isa or {})
    unknown = set(isa) - {g.name for g in groups}
    if unknown:
        raise PlannerError(
            f"instruction sets given for unknown groups {sorted(unknown)} (the groups are "
            f"{[g.name for g in groups]})"
        )
    out = {}
    for g in groups:
        out[g.name] = "opencl" if g.kind == "gpu" else isa.get(g.name, default_isa(g))
        if g.kind == "cpu":
            _check_isa(g, out[g.name])
    return out


def layer_bindings(func: relax.Function) -> list[relax.Binding]:
    """Each layer's major operator binding (:func:`~codl_tvm.passes.stages.layer_starts`'s
    layers; the first layer may start with other bindings, and a layer without a major operator
    gives its first binding)."""
    bindings = func.body.blocks[0].bindings
    starts = layer_starts(func)
    bounds = [*starts[1:], len(bindings)]
    return [
        next(
            (b for b in bindings[start : bounds[i]] if op_name(b.value) in MAJOR_OPS),
            bindings[start],
        )
        for i, start in enumerate(starts)
    ]


def layer_names(mod: tvm.IRModule) -> list[str]:
    """The names of ``main``'s layers, ``"<index>:<variable of the layer's major operator>"``."""
    return [f"{i}:{b.var.name}" for i, b in enumerate(layer_bindings(mod["main"]))]


def compile_library(mod: tvm.IRModule, target: tvm.target.Target, path: Path, what: str) -> None:
    """Build ``mod`` for ``target`` with codl-tvm's single-device pipeline and export it to
    ``path`` (``what`` names it in a build error).

    Raises
    ------
    BuildError
        The build failed.
    """
    kind = "opencl" if target.kind.name == "opencl" else "cpu"
    if kind == "opencl":
        runtime.load()
    with runtime.build_errors(what, kind):
        ex = tvm.compile(mod, target=target, relax_pipeline=single_device_pipeline(target))
        ex.export_library(str(path))


def stage_module(
    staged: tvm.IRModule, names: Sequence[str], main: str | None = None
) -> tvm.IRModule:
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
