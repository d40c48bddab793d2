"""The one-op Relax module of an operator part: what the profiler builds and times, and what the
cost model reads kernel features from.

An operator ``OpParams`` split by a ``Partition`` (dim, GPU ratio) has a GPU part and a CPU part
(``features.part_shape``, the convention ``PartitionOperators`` follows). :func:`part_module`
builds one part alone as a one-op Relax module of the part's shape (an H part reads its input
rows plus the halo, with the padding that remains at the borders it touches, :func:`part_padding`),
under the algorithm switches on here (:func:`algorithm_switches`: a conv part becomes the Winograd
or packed conv the model's conv would, :func:`part_rewrite`). :func:`schedule_part` legalizes and
schedules it for its processor with codl-tvm's single-device pipeline and
:func:`compile_scheduled` lowers and compiles the result; :func:`check_part` checks the part
against the one ``PartitionOperators`` makes (:func:`passes_parts`).

The profiler (``codl_tvm.profiling.part_build``) compiles parts with these functions and the
GBDT's kernel features (``cost_model.kernel_counts``) rebuild a recorded part's kernel with them,
so both see the same kernel. The module imports TVM's compiler (Relax, the passes, the schedule
rules) inside the functions that build: the profiler imports it on devices whose TVM is
runtime-only (``codl-tvm profile --run-dir``), where only :func:`target_str` runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import tvm

from codl_tvm import runtime
from codl_tvm.build.runner import default_target
from codl_tvm.core.errors import ProfileError
from codl_tvm.core.plan import uniform_plan
from codl_tvm.cost_model.features import OpParams, Partition, PartShape, part_shape

if TYPE_CHECKING:
    from codl_tvm.passes.winograd import ConvRewrite
    from codl_tvm.schedules import CPUConfig, OpenCLConfig

__all__ = [
    "PROCESSOR_DEVICE",
    "algorithm_switches",
    "check_part",
    "compile_scheduled",
    "part_module",
    "part_padding",
    "part_rewrite",
    "part_target",
    "passes_parts",
    "schedule_part",
    "target_str",
]

#: The TVM device kind of each processor's parts.
PROCESSOR_DEVICE = {"gpu": "opencl", "cpu": "cpu"}


def part_target(processor: str, target=None) -> tvm.target.Target:
    """The target a ``processor`` part is built for: ``target`` (a ``Target`` or its text) or,
    when None, the processor's default (``build.runner.default_target``)."""
    if target is not None:
        return target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    return default_target(PROCESSOR_DEVICE[processor])


def target_str(processor: str, target=None) -> str:
    """The target of :func:`part_target` as its JSON text (kept verbatim when already a string,
    e.g. from a manifest read on a machine whose TVM is runtime-only)."""
    return target if isinstance(target, str) else str(part_target(processor, target))


def part_padding(params: OpParams, part: PartShape) -> tuple[int, int, int, int]:
    """Padding (top, left, bottom, right) of a part built alone.

    An H part keeps the top padding only if it starts at output row 0 and the bottom padding
    it needs to reach its last row's window; other parts keep the operator's padding.
    """
    pt, pl, pb, pr = params.padding
    if part.out_h == params.out_h:
        return (pt, pl, pb, pr)
    first = part.row0 * params.stride - pt
    last = (part.row0 + part.out_h - 1) * params.stride - pt + params.span - 1
    top = max(0, -first)
    bottom = max(0, last - (params.h - 1))
    return (top, pl, bottom, pr)


def algorithm_switches() -> dict[str, list[str]]:
    """The algorithm switches on here: ``{"winograd": presets, "packed": presets}`` of
    :func:`~codl_tvm.schedules.winograd_enabled` / :func:`~codl_tvm.schedules.packed_enabled`
    blocks, empty entries left out (``{}``: direct kernels only).

    Inside :func:`~codl_tvm.schedules.cpu_alone_settings` with an algorithm on, ``"cpu_alone"``
    names the presets whose Winograd/packed kernels then take the settings of builds for the CPU
    alone (:data:`~codl_tvm.schedules.presets.CPU_ALONE_SETTINGS`): other kernels than the
    preset's, so a dataset of them is another dataset."""
    # deferred: TVM's compiler (see the module docstring)
    from codl_tvm.schedules.presets import CPU_ALONE_SETTINGS
    from codl_tvm.schedules.settings import cpu_alone_on, packed_presets, winograd_presets

    switches = {"winograd": sorted(winograd_presets()), "packed": sorted(packed_presets())}
    switches = {k: v for k, v in switches.items() if v}
    if switches and cpu_alone_on():
        switches["cpu_alone"] = sorted(CPU_ALONE_SETTINGS)
    return switches


def part_rewrite(
    params: OpParams, part: PartShape, algorithm_config: CPUConfig | OpenCLConfig | None = None
) -> ConvRewrite | None:
    """The Winograd or packed conv (``passes.winograd.ConvRewrite``) that ``codl.Conv2DWinograd``
    makes of the conv ``part`` of ``params`` under ``algorithm_config``; None where the part
    keeps its direct/GEMM kernel (no config, not a conv, or the rules decline)."""
    if algorithm_config is None or params.op != "conv2d":
        return None
    # deferred: TVM's compiler (see the module docstring)
    from codl_tvm.passes.winograd import conv2d_rewrite
    from codl_tvm.schedules import conv2d_shape_info

    pad = part_padding(params, part)
    info = conv2d_shape_info(
        (1, part.ic, part.in_h, part.in_w),
        (part.oc, part.ic // part.groups, params.kernel, params.kernel),
        (params.stride, params.stride),
        pad,
        (params.dilation, params.dilation),
        part.groups,
    )
    rewrite = conv2d_rewrite(info, algorithm_config, pad)
    return None if isinstance(rewrite, str) else rewrite


def part_module(
    params: OpParams, part: PartShape, algorithm_config: CPUConfig | OpenCLConfig | None = None
) -> tvm.IRModule:
    """A Relax module whose ``main`` computes one part of ``params`` (inputs: data, weight).

    ``algorithm_config`` (a schedule config with Winograd or packed convs on): a conv part
    that ``codl.Conv2DWinograd`` would rewrite under it is built as that Winograd/packed conv,
    its weight an input in the transformed layout.
    """
    from tvm import relax  # deferred: TVM's compiler (see the module docstring)

    if part.empty:
        raise ProfileError(f"{params.describe()}: the part {part} is empty")
    bb = relax.BlockBuilder()
    pad = part_padding(params, part)
    h_split = part.out_h != params.out_h
    if params.op == "dense":
        x = relax.Var("x", relax.TensorType((part.out_h, part.ic), "float32"))
        w = relax.Var("w", relax.TensorType((part.ic, part.oc), "float32"))
        args = [x, w]
        with bb.function("main", args):
            with bb.dataflow():
                out = bb.emit_output(relax.op.matmul(x, w))
            bb.emit_func_output(out)
    elif params.op == "conv2d":
        x = relax.Var("x", relax.TensorType((1, part.ic, part.in_h, part.in_w), "float32"))
        wshape = (part.oc, part.ic // part.groups, params.kernel, params.kernel)
        rewrite = part_rewrite(params, part, algorithm_config)
        if rewrite is not None:
            wshape = rewrite.weight_shape
        w = relax.Var("w", relax.TensorType(wshape, "float32"))
        with bb.function("main", [x, w]):
            with bb.dataflow():
                if rewrite is not None:
                    out = bb.emit_output(bb.call_te(rewrite.compute, x, w, **rewrite.attrs))
                else:
                    out = bb.emit_output(
                        relax.op.nn.conv2d(
                            x,
                            w,
                            strides=params.stride,
                            padding=pad,
                            dilation=params.dilation,
                            groups=part.groups,
                        )
                    )
            bb.emit_func_output(out)
    else:  # pool
        x = relax.Var("x", relax.TensorType((1, part.ic, part.in_h, part.in_w), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(
                    relax.op.nn.max_pool2d(
                        x,
                        pool_size=params.kernel,
                        strides=params.stride,
                        padding=pad,
                        dilation=params.dilation,
                        ceil_mode=params.ceil_mode and not h_split,
                    )
                )
            bb.emit_func_output(out)
    mod = bb.get()
    shape = [int(v) for v in mod["main"].ret_ty.shape.values]
    want = [part.out_h, part.oc] if params.op == "dense" else [1, part.oc, part.out_h, part.out_w]
    if shape != want:
        raise ProfileError(
            f"{params.describe()}: the part module outputs {shape}, expected {want} "
            f"(part {part.to_json()}, padding {list(pad)})"
        )
    return mod


def passes_parts(params: OpParams, partition: Partition) -> dict[str, dict]:
    """The parts ``PartitionOperators`` makes of a one-op module of ``params`` under
    ``partition``: ``{processor: {"region": (a, b), "input_region": (c, d), "axis": k}}``."""
    # deferred: TVM's compiler (see the module docstring)
    from codl_tvm.passes import PartitionOperators
    from codl_tvm.passes.parts import collect_parts

    full = part_shape(params, Partition(), "gpu")
    mod = part_module(params, full)
    if partition.dim == "none":  # not split: the whole operator on either processor
        whole = {"region": (0, full.out_h), "input_region": (0, full.in_h), "axis": 2}
        return {"gpu": whole, "cpu": dict(whole)}
    mod = PartitionOperators(uniform_plan(mod, partition.dim, partition.ratio))(mod)
    splits = collect_parts(mod)
    if len(splits) != 1:
        raise ProfileError(
            f"{params.describe()}: PartitionOperators made {len(splits)} splits, expected 1"
        )
    return {
        str(getattr(p.processor, "value", p.processor)): {
            "region": tuple(p.region),
            "input_region": tuple(p.input_region),
            "axis": splits[0].axis,
        }
        for p in splits[0].parts
    }


def check_part(params: OpParams, partition: Partition, processor: str, part: PartShape) -> None:
    """Raise ``ProfileError`` unless ``part`` is the part ``PartitionOperators`` produces."""
    parts = passes_parts(params, partition)
    got = parts.get(processor)
    if got is None:
        if not part.empty:
            raise ProfileError(
                f"{params.describe()}: PartitionOperators makes no {processor} part for "
                f"{partition.dim}:{partition.ratio:g}, the profiler expected {part.to_json()}"
            )
        return
    a, b = got["region"]
    c, d = got["input_region"]
    if partition.dim == "H" or partition.dim == "none":
        want = ((part.row0, part.row0 + part.out_h), None if params.op == "dense" else part.in_h)
        have = ((a, b), None if params.op == "dense" else d - c)
    else:
        want = ((part.oc0, part.oc0 + part.oc), None)
        have = ((a, b), None)
    if want != have:
        raise ProfileError(
            f"{params.describe()}: the {processor} part of {partition.dim}:{partition.ratio:g} "
            f"is (region, input rows) {have} in PartitionOperators but {want} in the profiler"
        )


def schedule_part(
    params: OpParams, part: PartShape, processor: str, target=None
) -> tuple[tvm.IRModule, tvm.IRModule]:
    """The one-op module of ``part`` (:func:`part_module`, under the algorithm switches on here)
    and that module legalized and scheduled for ``processor``'s ``target`` (default:
    :func:`part_target`), as the profiler's ``compile_part`` builds it: ``(module, scheduled)``.
    The cost model reads its kernels' TIR (``cost_model.kernel_counts``)."""
    # deferred: TVM's compiler (see the module docstring)
    from codl_tvm.build.pipeline import legalize_passes, schedule_passes

    tgt = part_target(processor, target)
    config = None
    if algorithm_switches() and params.op == "conv2d":
        from codl_tvm.schedules import cpu_config, opencl_config  # deferred: as above

        kind = tgt.kind.name
        if kind in ("llvm", "opencl"):
            config = cpu_config(tgt) if kind == "llvm" else opencl_config(tgt)
    mod = part_module(params, part, algorithm_config=config)
    if processor == "gpu":
        runtime.load()
    with tgt:
        scheduled = tvm.transform.Sequential(legalize_passes(tgt) + schedule_passes(tgt))(mod)
    return mod, scheduled


def compile_scheduled(scheduled: tvm.IRModule, target: tvm.target.Target):
    """Compile a part module scheduled by :func:`schedule_part` for ``target`` with the rest of
    codl-tvm's single-device pipeline (dataflow lowering, then finalization); returns the
    executable."""
    # deferred: TVM's compiler (see the module docstring)
    from codl_tvm.build.pipeline import dataflow_lower_passes, finalize_passes

    @tvm.transform.module_pass(opt_level=0, name="codl.part.Lower")
    def _lower(m, _ctx):
        with target:
            return tvm.transform.Sequential(
                dataflow_lower_passes(target) + finalize_passes(target)
            )(m)

    return tvm.compile(scheduled, target=target, relax_pipeline=_lower)
