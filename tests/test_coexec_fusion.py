"""Epilogue fusion in co-executed builds: every conv keeps its bias add, ReLU and residual add.

A residual block (conv+bias+ReLU stem; conv->ReLU->conv beside a 1x1 projection, added and
ReLU'd) is built with plans that keep some convs whole on the CPU and split others. The kernels
``main`` calls after fusion are compared with the CPU-only build's: codl.PlaceParts used to make
the elementwise kernels on a GPU/CPU edge opaque, which cut a CPU conv from its bias add or ReLU
and a GPU shortcut conv from the residual add and ReLU (each ran as a kernel of its own). A CPU
kernel of the co-executed build is scheduled exactly as the CPU-only build's (same target, same
rules). Numerics against onnxruntime on the local OpenCL device; nothing is timed.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from codl_tvm.passes import PartitionOperators
from codl_tvm.passes.order import OrderSplits
from codl_tvm.passes.place import PlaceParts

from codl_tvm.build.coexec import _targets
from codl_tvm.build.pipeline import (
    algorithm_passes,
    inference_passes,
    legalize_passes,
    schedule_passes,
)
from codl_tvm.core.plan import OpPartition, PartitionPlan, model_fingerprint, partitionable_ops
from codl_tvm.frontend.importer import load_onnx, random_inputs

from .test_hope_compile import (
    _residual_plan,
    _split_residual_plan,
    assert_close,
    onnxruntime_outputs,
    residual_block,
)


def _whole_and_split_plan(mod) -> PartitionPlan:
    """The stem and the branch's second conv whole on the CPU, its first split, the shortcut
    whole on the GPU (whose residual add then reads the CPU conv's result)."""
    infos = partitionable_ops(mod)
    ratios = {"conv2d_0": 0.0, "conv2d_1": 0.3, "conv2d_2": 0.0, "conv2d_3": 1.0}
    return PartitionPlan(
        tuple(OpPartition(i.name, "H", ratios[i.name]) for i in infos),
        (),
        model_fingerprint(mod, infos),
        home="cpu",
    )


PLANS = {"whole_and_split": _whole_and_split_plan, "split_residual": _split_residual_plan}


def _fused(mod: tvm.IRModule, plan: PartitionPlan | None, schedule: bool = False) -> tvm.IRModule:
    """``mod`` through the pipeline's phases up to fusion (and scheduling): CPU-only without a
    plan, else co-executed on generic OpenCL and this machine's CPU."""
    gpu, cpu = _targets(None, None)
    with cpu if plan is None else gpu:
        out = tvm.transform.Sequential(inference_passes())(mod)
        if plan is None:
            phases = [*algorithm_passes(cpu), *legalize_passes(cpu)]
        else:
            out = PartitionOperators(plan)(out)
            if plan.order:
                out = OrderSplits(plan.order)(out)
            place = PlaceParts(gpu, cpu, plan.home)
            phases = [*algorithm_passes(gpu, cpu), *legalize_passes(gpu, place)]
        if schedule:
            phases += schedule_passes(cpu if plan is None else gpu)
        return tvm.transform.Sequential(phases)(out)


def _calls(mod: tvm.IRModule) -> list[tuple[str, str]]:
    """(kernel name, target kind) of every kernel ``main`` calls, in order."""
    out = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            gv = b.value.args[0]
            attrs = mod[gv].attrs
            kind = attrs["target"].kind.name if "target" in attrs else "llvm"
            out.append((gv.name_hint, kind))
    return out


def _epilogues_alone(mod: tvm.IRModule) -> list[list[str]]:
    """The epilogues (``add``, ``relu``) of every kernel ``main`` calls that computes them
    without a conv, by block names (a kernel's attributes and parameters may name its conv)."""
    alone = []
    for name, _ in _calls(mod):
        text = mod[name].script(show_meta=False)
        ops = [op for op, block in (("add", '"T_add'), ("relu", '"compute"')) if block in text]
        if ops and '"conv2d_nchw"' not in text:
            alone.append(ops)
    return alone


def test_cpu_only_build_fuses_every_epilogue():
    """The reference: four convs, four kernels, each with its epilogues."""
    mod = _fused(load_onnx(residual_block()).mod, None)
    assert len(_calls(mod)) == 4
    assert _epilogues_alone(mod) == []


def test_coexec_build_fuses_every_epilogue():
    """Whole convs on the CPU keep their bias adds and ReLUs, and the GPU shortcut conv, issued
    after the CPU branch it is added to, takes the residual add and ReLU in, as the CPU-only
    build does (four epilogues ran alone: the stem's ReLU and the branch's bias add on the CPU,
    the residual add and its ReLU on the GPU)."""
    mod = load_onnx(residual_block()).mod
    fused = _fused(mod, _whole_and_split_plan(mod))
    assert _epilogues_alone(fused) == []
    # the stem, the split's two parts, the branch's CPU conv, the GPU shortcut
    kinds = [k for n, k in _calls(fused) if "conv2d" in n]
    assert kinds == ["llvm", "opencl", "llvm", "llvm", "opencl"]


def test_residual_add_beside_the_other_processor_keeps_its_relu():
    """A split shortcut issued before the whole CPU conv its add reads: each part's residual
    add waits for that conv, so it stays apart from the part's conv (which runs meanwhile) but
    keeps its ReLU; every conv keeps its bias add (the stem's ReLU and the CPU conv's bias add
    ran alone)."""
    mod = load_onnx(residual_block()).mod
    assert _epilogues_alone(_fused(mod, _split_residual_plan(mod))) == [["add", "relu"]] * 2


def test_shortcut_issued_before_the_branch_is_not_fused_into_its_add():
    """The shortcut whole on the CPU, issued before the GPU branch its add reads: its kernel is
    still called before the branch's last conv (fused with the add, it would wait for it)."""
    mod = load_onnx(residual_block()).mod
    fused = _fused(mod, _residual_plan(mod, 0.0))
    calls = _calls(fused)
    convs = [(i, k) for i, (n, k) in enumerate(calls) if "conv2d" in n]
    shortcut = [i for i, k in convs if k == "llvm"]
    assert len(shortcut) == 1 and shortcut[0] < convs[-1][0], calls
    assert _epilogues_alone(fused) == [["add", "relu"]]


def test_whole_cpu_conv_is_the_cpu_only_kernel():
    """The stem, whole on the CPU, is one kernel (conv, bias add, ReLU) for the CPU target,
    scheduled exactly as in the CPU-only build."""
    mod = load_onnx(residual_block()).mod
    alone = _fused(mod, None, schedule=True)["fused_conv2d_add_relu"]
    coexec = _fused(mod, _whole_and_split_plan(mod), schedule=True)
    assert ("fused_conv2d_add_relu", "llvm") in _calls(coexec)
    placed = coexec["fused_conv2d_add_relu"]
    assert str(placed.attrs["target"]) == str(_targets(None, None)[1])
    tvm.ir.assert_structural_equal(placed.body, alone.body, map_free_vars=True)


@pytest.mark.opencl
@pytest.mark.parametrize("plan_name", sorted(PLANS))
def test_fused_coexec_build_equals_onnxruntime(opencl, plan_name):
    import codl_tvm

    proto = residual_block()
    model = load_onnx(proto)
    feeds = random_inputs(model, seed=3)
    (want,) = onnxruntime_outputs(proto, feeds)
    built = codl_tvm.compile(model.mod, PLANS[plan_name](model.mod))
    got = built([feeds[s.name] for s in model.inputs])[0]
    assert_close(np.asarray(got), want)
