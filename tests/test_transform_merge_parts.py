"""codl.MergePartsInPlace at IR level: Before/Expected TVMScript modules compared structurally
(CPU only).

The Before module is ``main`` after PlaceParts, fusion and scheduling, with tiny kernels: the
GPU part and the CPU part of a split each produce one row of a 2x2 output, merged by a
``codl.merge`` concat kernel.
"""

from __future__ import annotations

import json

import tvm
from codl_tvm.passes.merge import MergePartsInPlace, site_id
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

GPU = tvm.target.Target({"kind": "opencl"}, host={"kind": "llvm"})
CPU = tvm.target.Target({"kind": "llvm"})
_MERGE = json.dumps({"axis": 0, "regions": [[0, 1], [1, 2]], "processors": ["gpu", "cpu"]})


def _vdevices():
    return {"vdevice": [I.vdevice(GPU, 0, "global"), I.vdevice(CPU, 0, "global")]}


@I.ir_module
class Before:
    I.module_global_infos(_vdevices())

    @T.prim_func(private=True)
    def part_gpu(x: T.Buffer((1, 2), "float32"), y: T.Buffer((1, 2), "float32")):
        T.func_attr({"codl.split": "add_0", "target": GPU})
        for i, j in T.grid(1, 2):
            y[i, j] = x[i, j] + T.float32(1)

    @T.prim_func(private=True)
    def part_cpu(x: T.Buffer((1, 2), "float32"), y: T.Buffer((1, 2), "float32")):
        T.func_attr({"codl.split": "add_0", "target": CPU})
        for i, j in T.grid(1, 2):
            y[i, j] = x[i, j] + T.float32(1)

    @T.prim_func
    def codl_merge_y(
        a: T.Buffer((1, 2), "float32"),
        b: T.Buffer((1, 2), "float32"),
        y: T.Buffer((2, 2), "float32"),
    ):
        T.func_attr({"codl.merge": _MERGE, "op_pattern": 8, "target": GPU})
        for i, j in T.grid(2, 2):
            y[i, j] = T.if_then_else(i < 1, a[i, j], b[i - 1, j])

    @R.function
    def main(
        x0: R.Tensor((1, 2), "float32", "opencl:0:global"),
        x1: R.Tensor((1, 2), "float32", "opencl:0:global"),
    ) -> R.Tensor((2, 2), "float32", "opencl:0:global"):
        cls = Before
        with R.dataflow():
            p0 = R.call_tir(
                cls.part_gpu, (x0,), out_ty=R.Tensor((1, 2), "float32", "opencl:0:global")
            )
            p1 = R.call_tir(
                cls.part_cpu, (x1,), out_ty=R.Tensor((1, 2), "float32", "llvm:0:global")
            )
            y = R.call_tir(
                cls.codl_merge_y, (p0, p1), out_ty=R.Tensor((2, 2), "float32", "opencl:0:global")
            )
            R.output(y)
        return y


# the runtime allocates the shared tensor once per call site: the pass's own id of main's merge
SHARED_SITE = site_id(Before["main"], "merge", 0)


@I.ir_module
class Expected:
    I.module_global_infos(_vdevices())

    # each part writes its rows of the full 2x2 tensor: the output buffer takes the full
    # tensor's strides and any offset; the merge kernel is gone
    @T.prim_func
    def part_gpu_inplace(
        x: T.Buffer((1, 2), "float32"),
        y: T.Buffer((1, 2), "float32", strides=(2, 1), offset_factor=1),
    ):
        T.func_attr({"codl.shared_output": True, "codl.split": "add_0", "target": GPU})
        for i, j in T.grid(1, 2):
            y[i, j] = x[i, j] + T.float32(1)

    @T.prim_func
    def part_cpu_inplace(
        x: T.Buffer((1, 2), "float32"),
        y: T.Buffer((1, 2), "float32", strides=(2, 1), offset_factor=1),
    ):
        T.func_attr({"codl.shared_output": True, "codl.split": "add_0", "target": CPU})
        for i, j in T.grid(1, 2):
            y[i, j] = x[i, j] + T.float32(1)

    @R.function
    def main(
        x0: R.Tensor((1, 2), "float32", "opencl:0:global"),
        x1: R.Tensor((1, 2), "float32", "opencl:0:global"),
    ) -> R.Tensor((2, 2), "float32", "opencl:0:global"):
        cls = Expected
        with R.dataflow():
            # on the GPU device (SVM); not cached: main returns it
            y_shared = R.call_pure_packed(
                "codl.coexec.alloc",
                SHARED_SITE,
                R.shape([2, 2]),
                R.dtype("float32"),
                0,
                T.bool(False),
                ty_args=(R.Tensor((2, 2), "float32", "opencl:0:global"),),
            )
            p0_view = R.call_pure_packed(
                "codl.coexec.region_view",
                y_shared,
                0,  # axis
                0,  # rows [0, 1)
                1,
                ty_args=(R.Tensor((1, 2), "float32", "opencl:0:global"),),
            )
            p0 = R.call_tir_inplace(
                cls.part_gpu_inplace,
                (x0, p0_view),
                out_ty=R.Tensor((1, 2), "float32", "opencl:0:global"),
                inplace_indices=[1],
            )
            p1_view = R.call_pure_packed(
                "codl.coexec.region_view",
                y_shared,
                0,
                1,  # rows [1, 2)
                2,
                ty_args=(R.Tensor((1, 2), "float32", "llvm:0:global"),),
            )
            p1 = R.call_tir_inplace(
                cls.part_cpu_inplace,
                (x1, p1_view),
                out_ty=R.Tensor((1, 2), "float32", "llvm:0:global"),
                inplace_indices=[1],
            )
            # the shared tensor, ordered after both parts
            y = R.call_pure_packed(
                "codl.coexec.join",
                y_shared,
                p0,
                p1,
                ty_args=(R.Tensor((2, 2), "float32", "opencl:0:global"),),
            )
            R.output(y)
        return y


def test_merge_parts_in_place():
    tvm.ir.assert_structural_equal(MergePartsInPlace()(Before), Expected)


@I.ir_module
class OtherUse:
    """Before, but main also reads the GPU part's output ``p0`` itself."""

    I.module_global_infos(_vdevices())

    @T.prim_func(private=True)
    def part_gpu(x: T.Buffer((1, 2), "float32"), y: T.Buffer((1, 2), "float32")):
        T.func_attr({"codl.split": "add_0", "target": GPU})
        for i, j in T.grid(1, 2):
            y[i, j] = x[i, j] + T.float32(1)

    @T.prim_func(private=True)
    def part_cpu(x: T.Buffer((1, 2), "float32"), y: T.Buffer((1, 2), "float32")):
        T.func_attr({"codl.split": "add_0", "target": CPU})
        for i, j in T.grid(1, 2):
            y[i, j] = x[i, j] + T.float32(1)

    @T.prim_func
    def codl_merge_y(
        a: T.Buffer((1, 2), "float32"),
        b: T.Buffer((1, 2), "float32"),
        y: T.Buffer((2, 2), "float32"),
    ):
        T.func_attr({"codl.merge": _MERGE, "op_pattern": 8, "target": GPU})
        for i, j in T.grid(2, 2):
            y[i, j] = T.if_then_else(i < 1, a[i, j], b[i - 1, j])

    @R.function
    def main(
        x0: R.Tensor((1, 2), "float32", "opencl:0:global"),
        x1: R.Tensor((1, 2), "float32", "opencl:0:global"),
    ) -> R.Tuple(
        R.Tensor((2, 2), "float32", "opencl:0:global"),
        R.Tensor((1, 2), "float32", "opencl:0:global"),
    ):
        cls = OtherUse
        with R.dataflow():
            p0 = R.call_tir(
                cls.part_gpu, (x0,), out_ty=R.Tensor((1, 2), "float32", "opencl:0:global")
            )
            p1 = R.call_tir(
                cls.part_cpu, (x1,), out_ty=R.Tensor((1, 2), "float32", "llvm:0:global")
            )
            y = R.call_tir(
                cls.codl_merge_y, (p0, p1), out_ty=R.Tensor((2, 2), "float32", "opencl:0:global")
            )
            again = R.call_tir(
                cls.part_gpu, (p0,), out_ty=R.Tensor((1, 2), "float32", "opencl:0:global")
            )
            R.output(y, again)
        return (y, again)


def test_a_part_with_another_use_keeps_its_concat():
    """A part output read elsewhere cannot be written into the shared tensor: the merge stays
    a concat kernel, and main's report says why."""
    expected = OtherUse.clone()
    expected["main"] = OtherUse["main"].with_attr(
        "codl_merge_report", json.dumps({"y": "part output p0 has other uses"})
    )
    tvm.ir.assert_structural_equal(MergePartsInPlace()(OtherUse), expected)


def test_merged_main_is_well_formed():
    """The join of a merge main returns stays an output var of the dataflow block."""
    tvm.relax.analysis.well_formed(MergePartsInPlace()(Before))  # raises on a violation
