"""``codl.TextureScopeCopies``: a tensor written in one texture scope and read in another is
copied by a kernel (no image copy changes an image's extents); structurally, and the copy
kernel between images of each pair of scopes on OpenCL (pyopencl images, TVM's kernels)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from codl_tvm.passes.texture_scope_copy import TextureScopeCopies, copy_prim_func
from codl_tvm.schedules.opencl_texture import TextureLayoutTransform
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from codl_tvm.build import texture

from .texture_opencl import TextureRunner

GPU = tvm.target.Target({"kind": "opencl"}, host={"kind": "llvm"})


def test_copies_between_texture_scopes_become_kernels():
    @I.ir_module
    class Before:
        I.module_global_infos(
            {
                "vdevice": [
                    I.vdevice({"kind": "opencl"}, 0, "global.texture"),
                    I.vdevice({"kind": "opencl"}, 0, "global.texture-nhwc"),
                    I.vdevice({"kind": "opencl"}, 0, "global"),
                ]
            }
        )

        @R.function
        def main(x: R.Tensor((1, 2, 4, 4, 4), "float32", vdevice="opencl:0:global.texture")):
            with R.dataflow():
                # image -> image of another layout: a kernel
                y = R.to_vdevice(x, dst_vdevice="opencl:1:global.texture-nhwc")
                # image -> buffer: the runtime's copy
                z = R.to_vdevice(x, dst_vdevice="opencl:2:global")
                R.output(y, z)
            return (y, z)

    @I.ir_module
    class Expected:
        I.module_global_infos(
            {
                "vdevice": [
                    I.vdevice({"kind": "opencl"}, 0, "global.texture"),
                    I.vdevice({"kind": "opencl"}, 0, "global.texture-nhwc"),
                    I.vdevice({"kind": "opencl"}, 0, "global"),
                ]
            }
        )

        @T.prim_func(s_tir=True)
        def texture_copy(src: T.handle, dst: T.handle):
            # stands for copy_prim_func's kernel (put in below): the identity of the tensor,
            # run on OpenCL images in the test after this one
            T.evaluate(0)

        @R.function
        def main(x: R.Tensor((1, 2, 4, 4, 4), "float32", vdevice="opencl:0:global.texture")):
            cls = Expected
            with R.dataflow():
                y = R.call_tir(
                    cls.texture_copy,
                    (x,),
                    out_ty=R.Tensor(
                        (1, 2, 4, 4, 4), "float32", vdevice="opencl:1:global.texture-nhwc"
                    ),
                )
                z = R.to_vdevice(x, dst_vdevice="opencl:2:global")
                R.output(y, z)
            return (y, z)

    after = TextureScopeCopies()(Before)
    expected = Expected.clone()
    kernel = copy_prim_func((1, 2, 4, 4, 4), "float32").with_attr("global_symbol", "texture_copy")
    expected.update_func(expected.get_global_var("texture_copy"), kernel)
    tvm.ir.assert_structural_equal(after, expected)
    # nothing to copy: the module comes back as it was
    assert TextureScopeCopies()(Expected).same_as(Expected)


def _copy_func(shape: tuple[int, ...], src_scope: str, dst_scope: str) -> tvm.tirx.PrimFunc:
    """TextureScopeCopies' kernel with its call site's scopes (as
    SpecializePrimFuncBasedOnCallSite gives them)."""

    @T.prim_func(private=True, s_tir=True)
    def copy(
        src: T.Buffer(shape, "float32", scope=src_scope),
        dst: T.Buffer(shape, "float32", scope=dst_scope),
    ):
        for i0, i1, i2, i3, i4 in T.grid(*shape):
            with T.sblock("texture_copy"):
                v0, v1, v2, v3, v4 = T.axis.remap("SSSSS", [i0, i1, i2, i3, i4])
                dst[v0, v1, v2, v3, v4] = src[v0, v1, v2, v3, v4]

    return copy


@pytest.mark.opencl
@pytest.mark.parametrize(
    "src_scope, dst_scope",
    [
        ("global.texture", "global.texture-nhwc"),  # VGG's first pool and the conv after it
        ("global.texture-nhwc", "global.texture-weight"),
        ("global.texture-weight", "global.texture"),
    ],
)
def test_copy_kernel_moves_every_pixel_between_image_layouts(src_scope, dst_scope):
    """The copy kernel, scheduled by TextureLayoutTransform (one read_imagef and one
    write_imagef per pixel), between images of different extents, on OpenCL."""
    shape = (1, 3, 5, 7, 4)  # N, C/4, H, W, pixel: every image extent differs by scope
    target = texture.texture_target(GPU)
    rule = TextureLayoutTransform()
    func = _copy_func(shape, src_scope, dst_scope)
    with target:
        sch = rule.apply(func, target, False)
    assert sch is not None, rule.explain(func, target)
    runner = TextureRunner.for_primfuncs({"copy": sch.mod["main"]}, GPU)
    x = np.random.default_rng(2).standard_normal(shape).astype("float32")
    src = runner.tensor(shape, "float32", src_scope, x)
    dst = runner.tensor(shape, "float32", dst_scope)
    runner.call("copy", [src, dst])
    np.testing.assert_array_equal(runner.read(dst), x)
    body = runner.source.split("__kernel void copy_kernel(")[-1]  # after the image macros
    assert body.count("write_imagef") == 1 and body.count("READ_IMAGEF") == 1
