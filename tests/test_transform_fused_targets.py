"""codl.RecordFusedTargets / codl.RestoreTargets at IR level: Before/Expected TVMScript modules
compared structurally (CPU only).

FuseTIR (TVM 0.27) builds a fused PrimFunc without the ``target`` of the kernels it fuses, which
would compile a CPU part as OpenCL; the two passes bracket it. The modules are what FuseOps and
FuseTIR leave after :class:`~codl_tvm.passes.place.PlaceParts`, hand-written with tiny kernels:
one fused add+relu on the CPU (a split's part) and a lone kernel on the GPU.
"""

from __future__ import annotations

import json

import pytest
import tvm
from codl_tvm.passes.fused_targets import RecordFusedTargets, RestoreTargets
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

GPU = tvm.target.Target({"kind": "opencl"}, host={"kind": "llvm"})
CPU = tvm.target.Target({"kind": "llvm"})
_SPLITS = json.dumps({"fused_add_relu": "conv2d_0"})


def _vdevices():
    return {"vdevice": [I.vdevice(GPU, 0, "global"), I.vdevice(CPU, 0, "global")]}


# -- RecordFusedTargets: after FuseOps, before FuseTIR ---------------------------------------


@I.ir_module(check_well_formed=False)  # schedulable PrimFuncs (TVM notes)
class BeforeRecord:
    I.module_global_infos(_vdevices())

    @T.prim_func(private=True, check_well_formed=False)
    def add(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"codl.split": "conv2d_0", "op_pattern": 0, "target": CPU})
        # schedulable (a root block), as LegalizeOps writes kernels: FuseTIR needs it
        with T.sblock("root"):
            for i in range(2):
                with T.sblock("y"):
                    vi = T.axis.spatial(2, i)
                    y[vi] = x[vi] + T.float32(1)

    @T.prim_func(private=True, check_well_formed=False)
    def relu(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"codl.split": "conv2d_0", "op_pattern": 0, "target": CPU})
        with T.sblock("root"):
            for i in range(2):
                with T.sblock("y"):
                    vi = T.axis.spatial(2, i)
                    y[vi] = T.max(x[vi], T.float32(0))

    @T.prim_func(private=True)
    def neg(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"op_pattern": 0, "target": GPU})
        for i in range(2):
            y[i] = T.float32(0) - x[i]

    @R.function(private=True)
    def fused_add_relu(
        x: R.Tensor((2,), "float32", "llvm:0:global"),
    ) -> R.Tensor((2,), "float32", "llvm:0:global"):
        R.func_attr({"Primitive": True})
        cls = BeforeRecord
        with R.dataflow():
            a = R.call_tir(cls.add, (x,), out_ty=R.Tensor((2,), "float32", "llvm:0:global"))
            b = R.call_tir(cls.relu, (a,), out_ty=R.Tensor((2,), "float32", "llvm:0:global"))
            R.output(b)
        return b

    @R.function
    def main(
        x: R.Tensor((2,), "float32", "llvm:0:global"),
    ) -> R.Tensor((2,), "float32", "opencl:0:global"):
        cls = BeforeRecord
        with R.dataflow():
            y = cls.fused_add_relu(x)
            gv = R.call_tir(cls.neg, (y,), out_ty=R.Tensor((2,), "float32", "opencl:0:global"))
            R.output(gv)
        return gv


def _with_main_attrs(mod: tvm.IRModule, attrs: dict) -> tvm.IRModule:
    out = mod.clone()
    main_gv = out.get_global_var("main")
    out[main_gv] = out[main_gv].with_attrs(attrs)
    return out


def test_record_fused_targets():
    """Only ``main``'s attributes change: the fused function's shared target and split."""
    after = RecordFusedTargets()(BeforeRecord)
    expected = _with_main_attrs(
        BeforeRecord,
        {"codl_fused_targets": {"fused_add_relu": CPU}, "codl_fused_splits": _SPLITS},
    )
    tvm.ir.assert_structural_equal(after, expected)


def test_record_refuses_a_function_fused_across_processors():
    mixed = BeforeRecord.clone()
    relu = mixed.get_global_var("relu")
    mixed[relu] = mixed[relu].with_attr("target", GPU)
    with pytest.raises(ValueError, match="fused function fused_add_relu mixes kernels"):
        RecordFusedTargets()(mixed)


def test_record_leaves_a_module_without_fused_functions_alone():
    unfused = BeforeRecord.clone()
    del unfused[unfused.get_global_var("fused_add_relu")]
    assert RecordFusedTargets()(unfused).same_as(unfused)


# -- RestoreTargets: after FuseTIR -----------------------------------------------------------


@I.ir_module
class BeforeRestore:
    I.module_global_infos(_vdevices())

    # FuseTIR's output: no target, no split
    @T.prim_func(private=True)
    def fused_add_relu(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        for i in range(2):
            y[i] = T.max(x[i] + T.float32(1), T.float32(0))

    @T.prim_func(private=True)
    def neg(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"op_pattern": 0, "target": GPU})
        for i in range(2):
            y[i] = T.float32(0) - x[i]

    @R.function
    def main(
        x: R.Tensor((2,), "float32", "llvm:0:global"),
    ) -> R.Tensor((2,), "float32", "opencl:0:global"):
        R.func_attr({"codl_fused_targets": {"fused_add_relu": CPU}, "codl_fused_splits": _SPLITS})
        cls = BeforeRestore
        with R.dataflow():
            y = R.call_tir(
                cls.fused_add_relu, (x,), out_ty=R.Tensor((2,), "float32", "llvm:0:global")
            )
            gv = R.call_tir(cls.neg, (y,), out_ty=R.Tensor((2,), "float32", "opencl:0:global"))
            R.output(gv)
        return gv


@I.ir_module
class ExpectedRestore:
    I.module_global_infos(_vdevices())

    # the target of its call's output VDevice (agreeing with the record), and its split
    @T.prim_func(private=True)
    def fused_add_relu(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"codl.split": "conv2d_0", "target": CPU})
        for i in range(2):
            y[i] = T.max(x[i] + T.float32(1), T.float32(0))

    @T.prim_func(private=True)
    def neg(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"op_pattern": 0, "target": GPU})
        for i in range(2):
            y[i] = T.float32(0) - x[i]

    @R.function
    def main(
        x: R.Tensor((2,), "float32", "llvm:0:global"),
    ) -> R.Tensor((2,), "float32", "opencl:0:global"):
        # the record is removed
        cls = ExpectedRestore
        with R.dataflow():
            y = R.call_tir(
                cls.fused_add_relu, (x,), out_ty=R.Tensor((2,), "float32", "llvm:0:global")
            )
            gv = R.call_tir(cls.neg, (y,), out_ty=R.Tensor((2,), "float32", "opencl:0:global"))
            R.output(gv)
        return gv


def test_restore_targets():
    tvm.ir.assert_structural_equal(RestoreTargets()(BeforeRestore), ExpectedRestore)


def test_restore_refuses_a_record_that_contradicts_the_placement():
    wrong = _with_main_attrs(BeforeRestore, {"codl_fused_targets": {"fused_add_relu": GPU}})
    with pytest.raises(ValueError, match="kernel fused_add_relu: its output VDevice says llvm"):
        RestoreTargets()(wrong)


def test_the_pair_around_tvms_fuse_tir():
    """Through TVM's own FuseTIR: the fused CPU kernel keeps its target and split."""
    mod = RestoreTargets()(relax.transform.FuseTIR()(RecordFusedTargets()(BeforeRecord)))
    fused = mod[mod.get_global_var("fused_add_relu")]
    assert fused.attrs["target"].kind.name == "llvm"
    assert str(fused.attrs["codl.split"]) == "conv2d_0"
    assert "codl_fused_targets" not in mod["main"].attrs
