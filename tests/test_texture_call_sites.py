"""``codl.OwnScopedKernels``: a PrimFunc shared by call sites of different memory scopes gets
a copy per scope signature (``SpecializePrimFuncBasedOnCallSite`` gives a PrimFunc one site's
scopes); SqueezeNet's shared concat on images is in tests/test_texture_models.py."""

from __future__ import annotations

import tvm
from codl_tvm.passes.texture_call_sites import OwnScopedKernels
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

VDEVICES = {
    "vdevice": [
        I.vdevice({"kind": "opencl"}, 0, "global.texture-nhwc"),
        I.vdevice({"kind": "opencl"}, 0, "global"),
    ]
}


def test_each_scope_signature_gets_its_own_kernel():
    @I.ir_module
    class Before:
        I.module_global_infos(VDEVICES)

        @T.prim_func(s_tir=True)
        def relu(x: T.Buffer((1, 2, 3, 3, 4), "float32"), y: T.Buffer((1, 2, 3, 3, 4), "float32")):
            for i0, i1, i2, i3, i4 in T.grid(1, 2, 3, 3, 4):
                with T.sblock("relu"):
                    v0, v1, v2, v3, v4 = T.axis.remap("SSSSS", [i0, i1, i2, i3, i4])
                    y[v0, v1, v2, v3, v4] = T.max(x[v0, v1, v2, v3, v4], T.float32(0))

        @R.function
        def main(x: R.Tensor((1, 2, 3, 3, 4), "float32", vdevice="opencl:0:global.texture-nhwc")):
            cls = Before
            with R.dataflow():
                a = R.call_tir(
                    cls.relu,
                    (x,),
                    out_ty=R.Tensor(
                        (1, 2, 3, 3, 4), "float32", vdevice="opencl:0:global.texture-nhwc"
                    ),
                )
                # same scopes: shares the kernel
                b = R.call_tir(
                    cls.relu,
                    (a,),
                    out_ty=R.Tensor(
                        (1, 2, 3, 3, 4), "float32", vdevice="opencl:0:global.texture-nhwc"
                    ),
                )
                # an image in, a buffer out: a kernel of its own
                c = R.call_tir(
                    cls.relu,
                    (b,),
                    out_ty=R.Tensor((1, 2, 3, 3, 4), "float32", vdevice="opencl:1:global"),
                )
                R.output(c)
            return c

    @I.ir_module
    class Expected:
        I.module_global_infos(VDEVICES)

        @T.prim_func(s_tir=True)
        def relu(x: T.Buffer((1, 2, 3, 3, 4), "float32"), y: T.Buffer((1, 2, 3, 3, 4), "float32")):
            for i0, i1, i2, i3, i4 in T.grid(1, 2, 3, 3, 4):
                with T.sblock("relu"):
                    v0, v1, v2, v3, v4 = T.axis.remap("SSSSS", [i0, i1, i2, i3, i4])
                    y[v0, v1, v2, v3, v4] = T.max(x[v0, v1, v2, v3, v4], T.float32(0))

        @T.prim_func(s_tir=True)
        def relu_scoped1(
            x: T.Buffer((1, 2, 3, 3, 4), "float32"), y: T.Buffer((1, 2, 3, 3, 4), "float32")
        ):
            for i0, i1, i2, i3, i4 in T.grid(1, 2, 3, 3, 4):
                with T.sblock("relu"):
                    v0, v1, v2, v3, v4 = T.axis.remap("SSSSS", [i0, i1, i2, i3, i4])
                    y[v0, v1, v2, v3, v4] = T.max(x[v0, v1, v2, v3, v4], T.float32(0))

        @R.function
        def main(x: R.Tensor((1, 2, 3, 3, 4), "float32", vdevice="opencl:0:global.texture-nhwc")):
            cls = Expected
            with R.dataflow():
                a = R.call_tir(
                    cls.relu,
                    (x,),
                    out_ty=R.Tensor(
                        (1, 2, 3, 3, 4), "float32", vdevice="opencl:0:global.texture-nhwc"
                    ),
                )
                b = R.call_tir(
                    cls.relu,
                    (a,),
                    out_ty=R.Tensor(
                        (1, 2, 3, 3, 4), "float32", vdevice="opencl:0:global.texture-nhwc"
                    ),
                )
                c = R.call_tir(
                    cls.relu_scoped1,
                    (b,),
                    out_ty=R.Tensor((1, 2, 3, 3, 4), "float32", vdevice="opencl:1:global"),
                )
                R.output(c)
            return c

    tvm.ir.assert_structural_equal(OwnScopedKernels()(Before), Expected)
    # one signature per kernel: nothing changes
    assert OwnScopedKernels()(Expected).same_as(Expected)
