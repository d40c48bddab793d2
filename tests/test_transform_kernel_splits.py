"""codl.RecordKernelSplits at IR level (CPU only): the pass leaves every function structurally
unchanged and records every kernel call of ``main`` in order with its split and processor, as
the module's ``codl_kernel_splits`` attribute.

The Before module is ``main`` as InsertCoexecSync leaves it (kernel calls still ``call_tir`` /
``call_tir_inplace``), hand-written with tiny kernels: one split ``conv2d_0`` whose GPU part
holds 3 of 4 rows, and a kernel outside every split.
"""

from __future__ import annotations

import json

import tvm
from codl_tvm.passes.kernel_splits import (
    KERNEL_SPLITS_ATTR,
    RecordKernelSplits,
    kernel_splits,
    recorded_kernel_splits,
    with_kernel_splits,
)
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

GPU = tvm.target.Target({"kind": "opencl"}, host={"kind": "llvm"})
CPU = tvm.target.Target({"kind": "llvm"})
_PARTS = json.dumps(
    [
        {
            "name": "conv2d_0",
            "ops": ["conv2d_0", "relu_1"],
            "dim": "H",
            "axis": 0,
            "ratio": 0.7,
            "input": "x",
            "output": "y",
            "parts": [
                {"processor": "gpu", "region": [0, 3], "input_region": [0, 3], "bindings": []},
                {"processor": "cpu", "region": [3, 4], "input_region": [3, 4], "bindings": []},
            ],
        }
    ]
)


@I.ir_module
class Before:
    I.module_global_infos({"vdevice": [I.vdevice(GPU, 0, "global"), I.vdevice(CPU, 0, "global")]})

    @T.prim_func(private=True)
    def part_gpu(x: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
        T.func_attr({"codl.split": "conv2d_0", "target": GPU})
        for i in range(3):
            y[i] = x[i] + T.float32(1)

    @T.prim_func
    def part_cpu(x: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
        # a kernel the VM calls by its global_symbol, which differs from its name here
        T.func_attr({"codl.split": "conv2d_0", "global_symbol": "cpu_kernel", "target": CPU})
        y[3] = x[3] + T.float32(1)

    @T.prim_func(private=True)
    def neg(x: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
        T.func_attr({"target": GPU})
        for i in range(4):
            y[i] = T.float32(0) - x[i]

    @R.function
    def main(
        x: R.Tensor((4,), "float32", "opencl:0:global"),
    ) -> R.Tensor((4,), "float32", "opencl:0:global"):
        R.func_attr({"codl_parts": _PARTS, "relax.force_pure": True})
        cls = Before
        y = R.call_tir(cls.part_gpu, (x,), out_ty=R.Tensor((4,), "float32", "opencl:0:global"))
        y1 = R.call_tir_inplace(
            cls.part_cpu,
            (x, y),
            out_ty=R.Tensor((4,), "float32", "llvm:0:global"),
            inplace_indices=[1],
        )
        z = R.call_tir(cls.neg, (y1,), out_ty=R.Tensor((4,), "float32", "opencl:0:global"))
        return z


EXPECTED_RECORD = {
    "splits": {
        "conv2d_0": {
            "ops": ["conv2d_0", "relu_1"],
            "dim": "H",
            "ratio": 0.7,
            "extent": 4,
            "gpu_share": 0.75,  # the share the rounding to whole rows gave the GPU
        }
    },
    "calls": [
        ["part_gpu", "conv2d_0", "gpu"],
        ["cpu_kernel", "conv2d_0", "cpu"],
        ["neg", None, "gpu"],
    ],
}


def test_record_kernel_splits():
    stale = with_kernel_splits(Before, {"stale": True})
    after = RecordKernelSplits()(stale)
    tvm.ir.assert_structural_equal(after.without_attr(KERNEL_SPLITS_ATTR), Before)
    assert recorded_kernel_splits(after) == EXPECTED_RECORD  # replaces the earlier record
    assert recorded_kernel_splits(Before) is None
    assert kernel_splits(Before) == EXPECTED_RECORD


def test_a_module_without_splits_records_only_calls():
    plain = Before.clone()
    plain["main"] = Before["main"].without_attr("codl_parts")
    assert kernel_splits(plain)["splits"] == {}
    assert len(kernel_splits(plain)["calls"]) == 3
