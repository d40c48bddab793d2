"""codl.PlaceParts at IR level: Before/Expected modules compared structurally (CPU only).

The Before module is what LegalizeOps leaves after PartitionOperators (hand-written, with tiny
kernels): one split ``add_0`` whose GPU and CPU parts call the same PrimFunc, merged by a concat
kernel, after a kernel outside every split and beside another one.
"""

from __future__ import annotations

import json

import pytest
import tvm
from codl_tvm.passes.place import PlaceParts
from tvm.s_tir import renew_defs
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

GPU = tvm.target.Target({"kind": "opencl"}, host={"kind": "llvm"})
CPU = tvm.target.Target({"kind": "llvm"})

_MERGE = json.dumps({"axis": 0, "regions": [[0, 2], [2, 4]], "processors": ["gpu", "cpu"]})
_PARTS = json.dumps(
    [
        {
            "name": "add_0",
            "ops": ["add_0"],
            "dim": "OC",
            "axis": 0,
            "ratio": 0.5,
            "input": "x1",
            "output": "codl0_out",
            "parts": [
                {
                    "processor": "gpu",
                    "region": [0, 2],
                    "input_region": [0, 2],
                    "bindings": ["codl0_gpu"],
                },
                {
                    "processor": "cpu",
                    "region": [2, 4],
                    "input_region": [0, 2],
                    "bindings": ["codl0_cpu"],
                },
            ],
        }
    ]
)


@I.ir_module
class Before:
    @T.prim_func(private=True)
    def add_one(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"op_pattern": 0})
        for i in range(2):
            y[i] = x[i] + T.float32(1)

    @T.prim_func(private=True)
    def cat(
        a: T.Buffer((2,), "float32"), b: T.Buffer((2,), "float32"), y: T.Buffer((4,), "float32")
    ):
        T.func_attr({"op_pattern": 2})
        for i in range(4):
            y[i] = T.if_then_else(i < 2, a[i], b[i - 2])

    @R.function
    def main(x: R.Tensor((2,), "float32")) -> R.Tensor((4,), "float32"):
        R.func_attr({"codl_parts": _PARTS})
        cls = Before
        with R.dataflow():
            x1 = R.call_tir(cls.add_one, (x,), out_ty=R.Tensor((2,), "float32"))
            codl0_gpu = R.call_tir(cls.add_one, (x1,), out_ty=R.Tensor((2,), "float32"))
            codl0_cpu = R.call_tir(cls.add_one, (x1,), out_ty=R.Tensor((2,), "float32"))
            codl0_out = R.call_tir(
                cls.cat, (codl0_gpu, codl0_cpu), out_ty=R.Tensor((4,), "float32")
            )
            side = R.call_tir(cls.add_one, (x1,), out_ty=R.Tensor((2,), "float32"))
            R.output(codl0_out, side)
        return codl0_out


@I.ir_module
class Expected:
    # main's tensors say where they live: the VM's device order, GPU first
    I.module_global_infos({"vdevice": [I.vdevice(GPU, 0, "global"), I.vdevice(CPU, 0, "global")]})

    # The first (processor, split) user keeps the shared PrimFunc's name: the CPU part's.
    @T.prim_func(private=True)
    def add_one(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"codl.split": "add_0", "op_pattern": 0, "target": CPU})
        for i in range(2):
            y[i] = x[i] + T.float32(1)

    # x1 reads only the model input: the plan's home (GPU); `side` is outside every split and
    # reads a GPU tensor: it follows its producer to the GPU. Both keep their pattern (fusable).
    @T.prim_func
    def add_one_gpu(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"op_pattern": 0, "target": GPU})
        for i in range(2):
            y[i] = x[i] + T.float32(1)

    # one PrimFunc per (processor, split): the GPU part's kernel names its split
    @T.prim_func
    def add_one_gpu1(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"codl.split": "add_0", "op_pattern": 0, "target": GPU})
        for i in range(2):
            y[i] = x[i] + T.float32(1)

    # the merging concat: opaque, on the GPU, tagged with the split's axis and regions
    @T.prim_func
    def codl_merge_codl0_out(
        a: T.Buffer((2,), "float32"), b: T.Buffer((2,), "float32"), y: T.Buffer((4,), "float32")
    ):
        T.func_attr({"codl.merge": _MERGE, "op_pattern": 8, "target": GPU})
        for i in range(4):
            y[i] = T.if_then_else(i < 2, a[i], b[i - 2])

    @R.function
    def main(x: R.Tensor((2,), "float32")) -> R.Tensor((4,), "float32", vdevice="opencl:0:global"):
        R.func_attr({"codl_parts": _PARTS})
        cls = Expected
        with R.dataflow():
            x1 = R.call_tir(
                cls.add_one_gpu, (x,), out_ty=R.Tensor((2,), "float32", "opencl:0:global")
            )
            codl0_gpu = R.call_tir(
                cls.add_one_gpu1, (x1,), out_ty=R.Tensor((2,), "float32", "opencl:0:global")
            )
            # the CPU part reads x1 from the GPU through a fence (an alias FuseOps cannot fuse
            # across), so no kernel loses its fusions on its own processor
            codl_fence: R.Tensor((2,), "float32", "opencl:0:global") = x1
            codl0_cpu = R.call_tir(
                cls.add_one, (codl_fence,), out_ty=R.Tensor((2,), "float32", "llvm:0:global")
            )
            codl0_out = R.call_tir(
                cls.codl_merge_codl0_out,
                (codl0_gpu, codl0_cpu),
                out_ty=R.Tensor((4,), "float32", "opencl:0:global"),
            )
            # side is issued after the CPU part: fused with x1 it would delay x1 behind the CPU
            # part, so this same-processor edge is fenced too
            codl_fence1: R.Tensor((2,), "float32", "opencl:0:global") = x1
            side = R.call_tir(
                cls.add_one_gpu, (codl_fence1,), out_ty=R.Tensor((2,), "float32", "opencl:0:global")
            )
            R.output(codl0_out, side)
        return codl0_out


def verify(after: tvm.IRModule, expected: tvm.IRModule) -> None:
    """PlaceParts' clones share their parameter objects with the original (``with_attr``),
    which a structural comparison reads as one variable defined twice: renew each PrimFunc's
    definitions first (the functions stay the same)."""
    fresh = tvm.IRModule(
        {
            gv: renew_defs(f) if isinstance(f, tvm.tirx.PrimFunc) else f
            for gv, f in after.functions.items()
        },
        global_infos=after.global_infos,
    )
    tvm.ir.assert_structural_equal(fresh, expected)


def test_place_parts():
    verify(PlaceParts(GPU, CPU)(Before), Expected)


def _placement(mod: tvm.IRModule) -> dict[str, str]:
    """Each bound variable of main -> the target kind of the kernel computing it."""
    out = {}
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, tvm.relax.Call):  # not the fences
                out[b.var.name] = mod[b.value.args[0]].attrs["target"].kind.name
    return out


def test_home_decides_kernels_outside_every_split():
    """With ``home="cpu"`` the kernel that reads only the model input goes to the CPU, and so
    does ``side``, which follows it; the parts and the merge keep their processors."""
    assert _placement(PlaceParts(GPU, CPU, home="cpu")(Before)) == {
        "x1": "llvm",
        "codl0_gpu": "opencl",
        "codl0_cpu": "llvm",
        "codl0_out": "opencl",
        "side": "llvm",
    }
    assert _placement(PlaceParts(GPU, CPU)(Before))["side"] == "opencl"


def test_bad_home_is_refused():
    with pytest.raises(ValueError, match="home must be 'gpu' or 'cpu'"):
        PlaceParts(GPU, CPU, home="npu")
