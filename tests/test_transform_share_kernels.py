"""codl.ShareIdenticalKernels at IR level: Before/Expected TVMScript modules compared
structurally (CPU only).

The Before module is ``main`` after PlaceParts (one PrimFunc per processor and split) and
InsertCoexecSync, with tiny kernels: two splits' GPU kernels of the same code, a CPU kernel of
that code, and a GPU kernel of other code.
"""

from __future__ import annotations

import tvm
from codl_tvm.passes.kernel_splits import recorded_kernel_splits, with_kernel_splits
from codl_tvm.passes.share_kernels import ShareIdenticalKernels
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

GPU = tvm.target.Target({"kind": "opencl"}, host={"kind": "llvm"})
CPU = tvm.target.Target({"kind": "llvm"})


def _vdevices():
    return {"vdevice": [I.vdevice(GPU, 0, "global"), I.vdevice(CPU, 0, "global")]}


@I.ir_module
class Before:
    I.module_global_infos(_vdevices())

    @T.prim_func
    def add_a(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"codl.split": "conv2d_0", "target": GPU})
        for i in range(2):
            y[i] = x[i] + T.float32(1)

    @T.prim_func
    def add_b(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"codl.split": "conv2d_1", "target": GPU})
        for i in range(2):
            y[i] = x[i] + T.float32(1)

    @T.prim_func
    def add_cpu(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"codl.split": "conv2d_1", "target": CPU})
        for i in range(2):
            y[i] = x[i] + T.float32(1)

    @T.prim_func
    def add_two(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"codl.split": "conv2d_1", "target": GPU})
        for i in range(2):
            y[i] = x[i] + T.float32(2)

    @R.function
    def main(
        x: R.Tensor((2,), "float32", "opencl:0:global"),
    ) -> R.Tensor((2,), "float32", "opencl:0:global"):
        R.func_attr({"relax.force_pure": True})
        cls = Before
        a = R.call_tir(cls.add_a, (x,), out_ty=R.Tensor((2,), "float32", "opencl:0:global"))
        b = R.call_tir(cls.add_b, (a,), out_ty=R.Tensor((2,), "float32", "opencl:0:global"))
        c = R.call_tir(cls.add_cpu, (b,), out_ty=R.Tensor((2,), "float32", "llvm:0:global"))
        d = R.call_tir(cls.add_two, (c,), out_ty=R.Tensor((2,), "float32", "opencl:0:global"))
        return d


@I.ir_module
class Expected:
    I.module_global_infos(_vdevices())

    # add_b differed from add_a only in its split: one kernel (the first by name) for both
    @T.prim_func
    def add_a(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"codl.split": "conv2d_0", "target": GPU})
        for i in range(2):
            y[i] = x[i] + T.float32(1)

    # same code, other target: kept
    @T.prim_func
    def add_cpu(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"codl.split": "conv2d_1", "target": CPU})
        for i in range(2):
            y[i] = x[i] + T.float32(1)

    # other code: kept
    @T.prim_func
    def add_two(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"codl.split": "conv2d_1", "target": GPU})
        for i in range(2):
            y[i] = x[i] + T.float32(2)

    @R.function
    def main(
        x: R.Tensor((2,), "float32", "opencl:0:global"),
    ) -> R.Tensor((2,), "float32", "opencl:0:global"):
        R.func_attr({"relax.force_pure": True})
        cls = Expected
        a = R.call_tir(cls.add_a, (x,), out_ty=R.Tensor((2,), "float32", "opencl:0:global"))
        b = R.call_tir(cls.add_a, (a,), out_ty=R.Tensor((2,), "float32", "opencl:0:global"))
        c = R.call_tir(cls.add_cpu, (b,), out_ty=R.Tensor((2,), "float32", "llvm:0:global"))
        d = R.call_tir(cls.add_two, (c,), out_ty=R.Tensor((2,), "float32", "opencl:0:global"))
        return d


def test_share_identical_kernels():
    tvm.ir.assert_structural_equal(ShareIdenticalKernels()(Before), Expected)


def test_the_kernel_record_follows_the_shared_kernels():
    """The record written before the pass keeps each call's split, under the kernel the VM
    now calls."""
    record = {
        "splits": {},
        "calls": [
            ["add_a", "conv2d_0", "gpu"],
            ["add_b", "conv2d_1", "gpu"],
            ["add_cpu", "conv2d_1", "cpu"],
            ["add_two", "conv2d_1", "gpu"],
        ],
    }
    after = ShareIdenticalKernels()(with_kernel_splits(Before, record))
    assert recorded_kernel_splits(after)["calls"] == [
        ["add_a", "conv2d_0", "gpu"],
        ["add_a", "conv2d_1", "gpu"],
        ["add_cpu", "conv2d_1", "cpu"],
        ["add_two", "conv2d_1", "gpu"],
    ]


def test_nothing_to_share_leaves_the_module_alone():
    distinct = ShareIdenticalKernels()(Before)
    assert ShareIdenticalKernels()(distinct).same_as(distinct)
