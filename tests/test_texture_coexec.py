"""The passes of co-executed builds whose GPU parts compute on images, structurally.

``codl.PackGpuParts`` (the GPU part of a split in NCHW4c, a depthwise conv's too, the CPU part
untouched, the part record updated), ``codl.GpuImageScopes`` (packed tensors only GPU kernels
read get a texture VDevice), and the phases of
:func:`codl_tvm.build.texture_coexec.coexec_texture_pipeline` that differ from the buffer
build's (the scope and schedule phases on a partitioned conv). No device is needed; numerics
are in ``tests/test_texture_coexec_models.py``.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import tvm
from codl_tvm.passes.parts import PARTS_ATTR, collect_parts
from codl_tvm.passes.texture_layout import pack_bias, pack_depthwise, pack_oihw
from codl_tvm.passes.texture_parts import (
    OUTSIDE,
    TEXTURE_PARTS_ATTR,
    PackGpuParts,
    texture_parts,
)
from codl_tvm.passes.texture_scopes import GpuImageScopes, image_tensors
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from codl_tvm.build import texture_coexec
from codl_tvm.core.errors import DeviceSupportError
from codl_tvm.core.plan import OpPartition, PartitionPlan, model_fingerprint
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.runtime.images import ImageCaps

GPU = tvm.target.Target({"kind": "opencl"}, host={"kind": "llvm"})
CPU = tvm.target.Target({"kind": "llvm"})


def _with_attrs(mod: tvm.IRModule, **attrs) -> tvm.IRModule:
    mod = mod.clone()
    gv = mod.get_global_var("main")
    func = mod[gv]
    for key, value in attrs.items():
        func = func.with_attr(key, value)
    mod.update_func(gv, func)
    return mod


def _bound(mod: tvm.IRModule, params: dict[str, np.ndarray]) -> tvm.IRModule:
    return relax.transform.BindParams("main", params)(mod)


def _record(gpu: list[str], cpu: list[str], gpu_channels: int = 8) -> str:
    """The part record of an OC split of ``conv2d_0`` (16 output channels) reading ``x``."""
    return json.dumps(
        [
            {
                "name": "conv2d_0",
                "ops": ["conv2d_0"],
                "dim": "OC",
                "axis": 1,
                "ratio": gpu_channels / 16,
                "input": "x",
                "output": "codl0_out",
                "parts": [
                    {
                        "processor": "gpu",
                        "region": [0, gpu_channels],
                        "input_region": [0, 8],
                        "bindings": gpu,
                    },
                    {
                        "processor": "cpu",
                        "region": [gpu_channels, 16],
                        "input_region": [0, 8],
                        "bindings": cpu,
                    },
                ],
                "foldable": [],
            }
        ]
    )


CPU_PART = ["codl0_cpu_0_conv2d", "codl0_cpu_1_add", "codl0_cpu_2_relu"]


def verify_pack(before: tvm.IRModule, expected: tvm.IRModule) -> None:
    after = PackGpuParts()(before)
    relax.analysis.well_formed(after)  # raises if not
    tvm.ir.assert_structural_equal(after, expected)
    collect_parts(after)  # every recorded name is bound once


def test_gpu_part_of_an_oc_split_computes_packed():
    @I.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 8, 6, 6), "float32"),
            w0: R.Tensor((8, 8, 3, 3), "float32"),
            b0: R.Tensor((1, 8, 1, 1), "float32"),
            w1: R.Tensor((8, 8, 3, 3), "float32"),
            b1: R.Tensor((1, 8, 1, 1), "float32"),
        ) -> R.Tensor((1, 16, 6, 6), "float32"):
            with R.dataflow():
                codl0_gpu_0_conv2d = R.nn.conv2d(x, w0, padding=[1, 1, 1, 1])
                codl0_gpu_1_add = R.add(codl0_gpu_0_conv2d, b0)
                codl0_gpu_2_relu = R.nn.relu(codl0_gpu_1_add)
                codl0_cpu_0_conv2d = R.nn.conv2d(x, w1, padding=[1, 1, 1, 1])
                codl0_cpu_1_add = R.add(codl0_cpu_0_conv2d, b1)
                codl0_cpu_2_relu = R.nn.relu(codl0_cpu_1_add)
                codl0_out = R.concat((codl0_gpu_2_relu, codl0_cpu_2_relu), axis=1)
                R.output(codl0_out)
            return codl0_out

    @I.ir_module
    class Expected:
        @R.function
        def main(
            x: R.Tensor((1, 8, 6, 6), "float32"),
            w0: R.Tensor((2, 8, 3, 3, 4), "float32"),
            b0: R.Tensor((2, 1, 1, 4), "float32"),
            w1: R.Tensor((8, 8, 3, 3), "float32"),
            b1: R.Tensor((1, 8, 1, 1), "float32"),
        ) -> R.Tensor((1, 16, 6, 6), "float32"):
            with R.dataflow():
                # the chain's start: the shared input packed for the GPU part
                x_4c = R.layout_transform(x, index_map=lambda n, c, h, w: (n, c // 4, h, w, c % 4))
                codl0_gpu_0_conv2d_4c = R.nn.conv2d(
                    x_4c,
                    w0,
                    padding=[1, 1, 1, 1],
                    data_layout="NCHW4c",
                    kernel_layout="OIHW4o",
                    out_layout="NCHW4c",
                )
                codl0_gpu_1_add_4c = R.add(codl0_gpu_0_conv2d_4c, b0)
                codl0_gpu_2_relu_4c = R.nn.relu(codl0_gpu_1_add_4c)
                # its end: the part's channels back to NCHW for the merge
                codl0_gpu_2_relu = R.layout_transform(
                    codl0_gpu_2_relu_4c, index_map=lambda n, c, h, w, i: (n, c * 4 + i, h, w)
                )
                # the CPU part keeps buffers
                codl0_cpu_0_conv2d = R.nn.conv2d(x, w1, padding=[1, 1, 1, 1])
                codl0_cpu_1_add = R.add(codl0_cpu_0_conv2d, b1)
                codl0_cpu_2_relu = R.nn.relu(codl0_cpu_1_add)
                codl0_out = R.concat((codl0_gpu_2_relu, codl0_cpu_2_relu), axis=1)
                R.output(codl0_out)
            return codl0_out

    rng = np.random.default_rng(0)
    w0, w1 = (rng.standard_normal((8, 8, 3, 3)).astype("float32") for _ in range(2))
    b0, b1 = (rng.standard_normal((1, 8, 1, 1)).astype("float32") for _ in range(2))
    gpu = ["codl0_gpu_0_conv2d", "codl0_gpu_1_add", "codl0_gpu_2_relu"]
    before = _with_attrs(
        _bound(Before, {"w0": w0, "b0": b0, "w1": w1, "b1": b1}),
        **{PARTS_ATTR: _record(gpu, CPU_PART)},
    )
    packed_gpu = [
        "x_4c",
        "codl0_gpu_0_conv2d_4c",
        "codl0_gpu_1_add_4c",
        "codl0_gpu_2_relu_4c",
        "codl0_gpu_2_relu",
    ]
    summary = [{"split": "conv2d_0", "dim": "OC", "data_type": "image", "packed_ops": "3/3"}]
    expected = _with_attrs(
        _bound(Expected, {"w0": pack_oihw(w0), "b0": pack_bias(b0), "w1": w1, "b1": b1}),
        **{
            PARTS_ATTR: _record(packed_gpu, CPU_PART),
            TEXTURE_PARTS_ATTR: json.dumps(summary),
        },
    )
    verify_pack(before, expected)


def test_residual_operand_of_a_gpu_part_is_converted():
    @I.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 8, 6, 6), "float32"), w0: R.Tensor((4, 8, 1, 1), "float32")
        ) -> R.Tensor((1, 4, 6, 6), "float32"):
            with R.dataflow():
                codl0_gpu_0_conv2d = R.nn.conv2d(x, w0)
                codl0_gpu_1_arg1 = R.strided_slice(x, axes=[1], begin=[0], end=[4])
                codl0_gpu_1_add = R.add(codl0_gpu_0_conv2d, codl0_gpu_1_arg1)
                R.output(codl0_gpu_1_add)
            return codl0_gpu_1_add

    @I.ir_module
    class Expected:
        @R.function
        def main(
            x: R.Tensor((1, 8, 6, 6), "float32"), w0: R.Tensor((1, 8, 1, 1, 4), "float32")
        ) -> R.Tensor((1, 4, 6, 6), "float32"):
            with R.dataflow():
                x_4c = R.layout_transform(x, index_map=lambda n, c, h, w: (n, c // 4, h, w, c % 4))
                codl0_gpu_0_conv2d_4c = R.nn.conv2d(
                    x_4c, w0, data_layout="NCHW4c", kernel_layout="OIHW4o", out_layout="NCHW4c"
                )
                codl0_gpu_1_arg1 = R.strided_slice(x, axes=[1], begin=[0], end=[4])
                # the residual slice is packed (one fused slice-and-pack kernel), not the sum
                # unpacked before the add
                codl0_gpu_1_arg1_4c = R.layout_transform(
                    codl0_gpu_1_arg1, index_map=lambda n, c, h, w: (n, c // 4, h, w, c % 4)
                )
                codl0_gpu_1_add_4c = R.add(codl0_gpu_0_conv2d_4c, codl0_gpu_1_arg1_4c)
                codl0_gpu_1_add = R.layout_transform(
                    codl0_gpu_1_add_4c, index_map=lambda n, c, h, w, i: (n, c * 4 + i, h, w)
                )
                R.output(codl0_gpu_1_add)
            return codl0_gpu_1_add

    w0 = np.random.default_rng(1).standard_normal((4, 8, 1, 1)).astype("float32")
    record = [
        {
            "name": "conv2d_0",
            "ops": ["conv2d_0"],
            "dim": "OC",
            "axis": 1,
            "ratio": 1.0,
            "input": "x",
            "output": "codl0_gpu_1_add",
            "parts": [
                {
                    "processor": "gpu",
                    "region": [0, 4],
                    "input_region": [0, 8],
                    "bindings": ["codl0_gpu_0_conv2d", "codl0_gpu_1_arg1", "codl0_gpu_1_add"],
                }
            ],
        }
    ]
    before = _with_attrs(_bound(Before, {"w0": w0}), **{PARTS_ATTR: json.dumps(record)})
    record[0]["parts"][0]["bindings"] = [
        "x_4c",
        "codl0_gpu_0_conv2d_4c",
        "codl0_gpu_1_arg1",
        "codl0_gpu_1_arg1_4c",
        "codl0_gpu_1_add_4c",
        "codl0_gpu_1_add",
    ]
    summary = [{"split": "conv2d_0", "dim": "OC", "data_type": "image", "packed_ops": "2/2"}]
    expected = _with_attrs(
        _bound(Expected, {"w0": pack_oihw(w0)}),
        **{PARTS_ATTR: json.dumps(record), TEXTURE_PARTS_ATTR: json.dumps(summary)},
    )
    verify_pack(before, expected)


def _depthwise_record(gpu: list[str], cpu: list[str]) -> str:
    """The part record of an OC split of a depthwise ``conv2d_0`` over 16 channels, each part
    reading its own channels of ``x``."""
    parts = [
        {"processor": p, "region": r, "input_region": r, "bindings": names}
        for p, r, names in (("gpu", [0, 8], gpu), ("cpu", [8, 16], cpu))
    ]
    return json.dumps(
        [
            {
                "name": "conv2d_0",
                "ops": ["conv2d_0"],
                "dim": "OC",
                "axis": 1,
                "ratio": 0.5,
                "input": "x",
                "output": "codl0_out",
                "parts": parts,
                "foldable": [],
            }
        ]
    )


def test_depthwise_gpu_part_computes_packed():
    """Co-executed GPU parts have the GPU-alone builds' coverage: a depthwise conv's GPU part
    (an OC split gives each part its channels of the input and as many groups) is packed,
    its weights pre-packed per pixel (``pack_depthwise``)."""

    @I.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 16, 6, 6), "float32"),
            w0: R.Tensor((8, 1, 3, 3), "float32"),
            b0: R.Tensor((1, 8, 1, 1), "float32"),
            w1: R.Tensor((8, 1, 3, 3), "float32"),
            b1: R.Tensor((1, 8, 1, 1), "float32"),
        ) -> R.Tensor((1, 16, 6, 6), "float32"):
            with R.dataflow():
                codl0_gpu_in = R.strided_slice(x, axes=[1], begin=[0], end=[8])
                codl0_gpu_0_conv2d = R.nn.conv2d(codl0_gpu_in, w0, padding=[1, 1, 1, 1], groups=8)
                codl0_gpu_1_add = R.add(codl0_gpu_0_conv2d, b0)
                codl0_cpu_in = R.strided_slice(x, axes=[1], begin=[8], end=[16])
                codl0_cpu_0_conv2d = R.nn.conv2d(codl0_cpu_in, w1, padding=[1, 1, 1, 1], groups=8)
                codl0_cpu_1_add = R.add(codl0_cpu_0_conv2d, b1)
                codl0_out = R.concat((codl0_gpu_1_add, codl0_cpu_1_add), axis=1)
                R.output(codl0_out)
            return codl0_out

    @I.ir_module
    class Expected:
        @R.function
        def main(
            x: R.Tensor((1, 16, 6, 6), "float32"),
            w0: R.Tensor((2, 1, 3, 3, 4), "float32"),
            b0: R.Tensor((2, 1, 1, 4), "float32"),
            w1: R.Tensor((8, 1, 3, 3), "float32"),
            b1: R.Tensor((1, 8, 1, 1), "float32"),
        ) -> R.Tensor((1, 16, 6, 6), "float32"):
            with R.dataflow():
                codl0_gpu_in = R.strided_slice(x, axes=[1], begin=[0], end=[8])
                # the part's channels packed (one fused slice-and-pack kernel)
                codl0_gpu_in_4c = R.layout_transform(
                    codl0_gpu_in, index_map=lambda n, c, h, w: (n, c // 4, h, w, c % 4)
                )
                # output pixel k reads input pixel k only
                codl0_gpu_0_conv2d_4c = R.nn.conv2d(
                    codl0_gpu_in_4c,
                    w0,
                    padding=[1, 1, 1, 1],
                    groups=8,
                    data_layout="NCHW4c",
                    kernel_layout="OIHW4o",
                    out_layout="NCHW4c",
                )
                codl0_gpu_1_add_4c = R.add(codl0_gpu_0_conv2d_4c, b0)
                codl0_gpu_1_add = R.layout_transform(
                    codl0_gpu_1_add_4c, index_map=lambda n, c, h, w, i: (n, c * 4 + i, h, w)
                )
                # the CPU part keeps buffers
                codl0_cpu_in = R.strided_slice(x, axes=[1], begin=[8], end=[16])
                codl0_cpu_0_conv2d = R.nn.conv2d(codl0_cpu_in, w1, padding=[1, 1, 1, 1], groups=8)
                codl0_cpu_1_add = R.add(codl0_cpu_0_conv2d, b1)
                codl0_out = R.concat((codl0_gpu_1_add, codl0_cpu_1_add), axis=1)
                R.output(codl0_out)
            return codl0_out

    rng = np.random.default_rng(4)
    w0, w1 = (rng.standard_normal((8, 1, 3, 3)).astype("float32") for _ in range(2))
    b0, b1 = (rng.standard_normal((1, 8, 1, 1)).astype("float32") for _ in range(2))
    gpu = ["codl0_gpu_in", "codl0_gpu_0_conv2d", "codl0_gpu_1_add"]
    cpu = ["codl0_cpu_in", "codl0_cpu_0_conv2d", "codl0_cpu_1_add"]
    before = _with_attrs(
        _bound(Before, {"w0": w0, "b0": b0, "w1": w1, "b1": b1}),
        **{PARTS_ATTR: _depthwise_record(gpu, cpu)},
    )
    packed_gpu = [
        "codl0_gpu_in",
        "codl0_gpu_in_4c",
        "codl0_gpu_0_conv2d_4c",
        "codl0_gpu_1_add_4c",
        "codl0_gpu_1_add",
    ]
    # the input slice is data movement, not an operator: two operators, both packed
    summary = [{"split": "conv2d_0", "dim": "OC", "data_type": "image", "packed_ops": "2/2"}]
    expected = _with_attrs(
        _bound(Expected, {"w0": pack_depthwise(w0), "b0": pack_bias(b0), "w1": w1, "b1": b1}),
        **{
            PARTS_ATTR: _depthwise_record(packed_gpu, cpu),
            TEXTURE_PARTS_ATTR: json.dumps(summary),
        },
    )
    verify_pack(before, expected)


def test_gpu_part_of_odd_channels_keeps_buffers_and_says_why():
    @I.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 8, 6, 6), "float32"),
            w0: R.Tensor((6, 8, 1, 1), "float32"),
            w1: R.Tensor((10, 8, 1, 1), "float32"),
        ) -> R.Tensor((1, 16, 6, 6), "float32"):
            with R.dataflow():
                codl0_gpu_0_conv2d = R.nn.conv2d(x, w0)
                codl0_cpu_0_conv2d = R.nn.conv2d(x, w1)
                codl0_out = R.concat((codl0_gpu_0_conv2d, codl0_cpu_0_conv2d), axis=1)
                R.output(codl0_out)
            return codl0_out

    rng = np.random.default_rng(2)
    params = {
        "w0": rng.standard_normal((6, 8, 1, 1)).astype("float32"),
        "w1": rng.standard_normal((10, 8, 1, 1)).astype("float32"),
    }
    record = _record(["codl0_gpu_0_conv2d"], ["codl0_cpu_0_conv2d"], gpu_channels=6)
    before = _with_attrs(_bound(Before, params), **{PARTS_ATTR: record})
    summary = [
        {
            "split": "conv2d_0",
            "dim": "OC",
            "data_type": "buffer",
            "packed_ops": "0/1",
            "why": "conv2d: 6 output channels, not a multiple of 4",
        }
    ]
    # nothing rewritten: the module as it was, with the record of why
    expected = _with_attrs(before, **{TEXTURE_PARTS_ATTR: json.dumps(summary)})
    verify_pack(before, expected)
    assert texture_parts(PackGpuParts()(before)) == summary


# --- GpuImageScopes ------------------------------------------------------------------------------


def _scoped_module(gpu_reader_target: str):
    """A packed tensor a GPU kernel writes, read by a kernel of ``gpu_reader_target``."""
    target = {"kind": "opencl", "host": {"kind": "llvm"}}
    reader = {"kind": gpu_reader_target}
    if gpu_reader_target == "opencl":
        reader["host"] = {"kind": "llvm"}

    @I.ir_module
    class Module:
        I.module_global_infos(
            {"vdevice": [I.vdevice(target, 0, "global"), I.vdevice({"kind": "llvm"}, 0, "global")]}
        )

        @T.prim_func(private=True, s_tir=True)
        def pack(x: T.Buffer((1, 4, 2, 2), "float32"), y: T.Buffer((1, 1, 2, 2, 4), "float32")):
            T.func_attr({"target": T.target(target), "codl.split": "conv2d_0"})
            for n, c, h, w, i in T.grid(1, 1, 2, 2, 4):
                with T.sblock("pack"):
                    vn, vc, vh, vw, vi = T.axis.remap("SSSSS", [n, c, h, w, i])
                    y[vn, vc, vh, vw, vi] = x[vn, vc * 4 + vi, vh, vw]

        @T.prim_func(private=True, s_tir=True)
        def unpack(y: T.Buffer((1, 1, 2, 2, 4), "float32"), z: T.Buffer((1, 4, 2, 2), "float32")):
            T.func_attr({"target": T.target(reader), "codl.split": "conv2d_0"})
            for n, c, h, w in T.grid(1, 4, 2, 2):
                with T.sblock("unpack"):
                    vn, vc, vh, vw = T.axis.remap("SSSS", [n, c, h, w])
                    z[vn, vc, vh, vw] = y[vn, vc // 4, vh, vw, vc % 4]

        @R.function
        def main(x: R.Tensor((1, 4, 2, 2), "float32", vdevice="opencl:0:global")):
            cls = Module
            with R.dataflow():
                y = R.call_tir(
                    cls.pack,
                    (x,),
                    out_ty=R.Tensor((1, 1, 2, 2, 4), "float32", vdevice="opencl:0:global"),
                )
                z = R.call_tir(
                    cls.unpack,
                    (y,),
                    out_ty=R.Tensor((1, 4, 2, 2), "float32", vdevice="opencl:0:global"),
                )
                R.output(z)
            return z

    return Module


def test_packed_tensor_read_by_gpu_kernels_gets_an_image():
    before = _scoped_module("opencl")
    after = GpuImageScopes(GPU)(before)
    relax.analysis.well_formed(after)  # raises if not

    @I.ir_module
    class Expected:
        I.module_global_infos(
            {
                "vdevice": [
                    I.vdevice({"kind": "opencl", "host": {"kind": "llvm"}}, 0, "global"),
                    I.vdevice({"kind": "llvm"}, 0, "global"),
                    # appended after the CPU: the VM's devices [opencl, cpu, opencl]
                    I.vdevice({"kind": "opencl", "host": {"kind": "llvm"}}, 0, "global.texture"),
                ]
            }
        )

        @T.prim_func(private=True, s_tir=True)
        def pack(x: T.Buffer((1, 4, 2, 2), "float32"), y: T.Buffer((1, 1, 2, 2, 4), "float32")):
            T.func_attr(
                {
                    "target": T.target({"kind": "opencl", "host": {"kind": "llvm"}}),
                    "codl.split": "conv2d_0",
                }
            )
            for n, c, h, w, i in T.grid(1, 1, 2, 2, 4):
                with T.sblock("pack"):
                    vn, vc, vh, vw, vi = T.axis.remap("SSSSS", [n, c, h, w, i])
                    y[vn, vc, vh, vw, vi] = x[vn, vc * 4 + vi, vh, vw]

        @T.prim_func(private=True, s_tir=True)
        def unpack(y: T.Buffer((1, 1, 2, 2, 4), "float32"), z: T.Buffer((1, 4, 2, 2), "float32")):
            T.func_attr(
                {
                    "target": T.target({"kind": "opencl", "host": {"kind": "llvm"}}),
                    "codl.split": "conv2d_0",
                }
            )
            for n, c, h, w in T.grid(1, 4, 2, 2):
                with T.sblock("unpack"):
                    vn, vc, vh, vw = T.axis.remap("SSSS", [n, c, h, w])
                    z[vn, vc, vh, vw] = y[vn, vc // 4, vh, vw, vc % 4]

        @R.function
        def main(x: R.Tensor((1, 4, 2, 2), "float32", vdevice="opencl:0:global")):
            cls = Expected
            with R.dataflow():
                y = R.call_tir(
                    cls.pack,
                    (x,),
                    out_ty=R.Tensor((1, 1, 2, 2, 4), "float32", vdevice="opencl:1:global.texture"),
                )
                z = R.call_tir(
                    cls.unpack,
                    (y,),
                    out_ty=R.Tensor((1, 4, 2, 2), "float32", vdevice="opencl:0:global"),
                )
                R.output(z)
            return z

    expected = _with_attrs(
        Expected, codl_image_tensors=json.dumps({"images": {"conv2d_0": 1}, "buffers": {}})
    )
    tvm.ir.assert_structural_equal(after, expected, map_free_vars=True)


@pytest.mark.parametrize(
    ("reader", "limits", "why"),
    [
        ("llvm", None, "a packed tensor read outside GPU kernels"),
        ("opencl", (1, 1, 1), "packed shape (1, 1, 2, 2, 4) beyond the device's image limits"),
    ],
)
def test_packed_tensor_stays_in_a_buffer_with_the_reason(reader, limits, why):
    before = _scoped_module(reader)
    after = GpuImageScopes(GPU, limits)(before)
    # the IR as it was (no texture VDevice), the reason recorded
    expected = _with_attrs(
        before,
        codl_image_tensors=json.dumps({"images": {}, "buffers": {"conv2d_0": [why]}}),
    )
    tvm.ir.assert_structural_equal(after, expected)
    assert image_tensors(after) == {"images": {}, "buffers": {"conv2d_0": [why]}}


# --- the pipeline's phases ----------------------------------------------------------------------


def _conv_model(c_out: int = 16):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((c_out, 8, 3, 3)) / 8).astype("float32")
    b = rng.standard_normal(c_out).astype("float32")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["y"]),
        ],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return load_onnx(model)


def _params_scopes(func: tvm.tirx.PrimFunc) -> list[str]:
    return [p.scope() for p in func.params if hasattr(p, "scope")]


@pytest.mark.parametrize("dim", ["OC", "H"])
def test_pipeline_puts_only_gpu_kernels_on_images(dim):
    model = _conv_model()
    plan = PartitionPlan(
        ops=(OpPartition("conv2d_0", dim, 0.5),), model_fingerprint=model_fingerprint(model.mod)
    )
    record: dict = {}
    pipeline = texture_coexec.coexec_texture_pipeline(plan, GPU, CPU, record=record)
    lowered = pipeline(model.mod)  # Relax lowered, its kernels scheduled TIR
    image_kernels, nan_checked = {}, {}
    for gv, func in lowered.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        scopes = _params_scopes(func)
        on_images = any("texture" in s for s in scopes)
        # only OpenCL kernels read or write images, and each keeps its own target
        assert not on_images or func.attrs["target"].kind.name == "opencl", gv.name_hint
        if on_images:
            image_kernels[gv.name_hint] = str(func.attrs.get("codl.config", ""))
        if "relu" in gv.name_hint:
            nan_checked[on_images] = "T.isnan" in func.script()
    # the GPU part: pack, conv (with its bias and ReLU) on images by the texture rule, unpack
    assert len(image_kernels) == 3, image_kernels
    assert "texture" in image_kernels.values()
    # ReLU propagates NaN in the CPU part's kernel, not in the GPU part's image kernel
    assert nan_checked == {True: False, False: True}
    assert record["gpu_parts"] == [
        {"split": "conv2d_0", "dim": dim, "data_type": "image", "packed_ops": "3/3", "images": 2}
    ]
    assert record["vm_devices"] == ["opencl", "cpu", "opencl"]


def test_images_on_a_device_without_them_is_one_error():
    caps = ImageCaps(
        device="test-device",
        image_support=False,
        image2d_max_width=0,
        image2d_max_height=0,
        image_max_array_size=0,
        pitch_alignment_pixels=1,
        base_address_alignment_pixels=1,
        image2d_from_buffer=False,
        rgba_float=False,
        rgba_half=False,
        fp16=False,
        from_buffer_refused=0,
        from_buffer_refused_why="",
    )
    with pytest.raises(DeviceSupportError, match="'test-device' has no image support"):
        texture_coexec.coexec_gpu_data_type(caps, "image", "float32")
    # auto keeps buffers there, half precision float32, each with the reason
    built, why = texture_coexec.coexec_gpu_data_type(caps, "auto", "float16")
    assert built == "buffer" and "'test-device' has no image support" in why and "float16" in why
    # a device with images: auto takes them by capability (a measuring compile times both)
    images = dataclasses.replace(caps, image_support=True, rgba_float=True)
    assert texture_coexec.coexec_gpu_data_type(images, "auto", "float32") == ("image", "")


def test_operator_outside_the_plan_behind_packed_parts_computes_packed():
    @I.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 4, 6, 6), "float32"),
            w0: R.Tensor((4, 4, 1, 1), "float32"),
            w1: R.Tensor((4, 4, 1, 1), "float32"),
        ) -> R.Tensor((1, 4, 6, 6), "float32"):
            with R.dataflow():
                codl0_gpu_0_conv2d = R.nn.conv2d(x, w0)  # whole on the GPU (ratio 1)
                codl1_gpu_0_conv2d = R.nn.conv2d(x, w1)  # whole on the GPU (ratio 1)
                s = R.add(codl0_gpu_0_conv2d, codl1_gpu_0_conv2d)  # outside the plan
                R.output(s)
            return s

    @I.ir_module
    class Expected:
        @R.function
        def main(
            x: R.Tensor((1, 4, 6, 6), "float32"),
            w0: R.Tensor((1, 4, 1, 1, 4), "float32"),
            w1: R.Tensor((1, 4, 1, 1, 4), "float32"),
        ) -> R.Tensor((1, 4, 6, 6), "float32"):
            with R.dataflow():
                x_4c = R.layout_transform(x, index_map=lambda n, c, h, w: (n, c // 4, h, w, c % 4))
                codl0_gpu_0_conv2d_4c = R.nn.conv2d(
                    x_4c, w0, data_layout="NCHW4c", kernel_layout="OIHW4o", out_layout="NCHW4c"
                )
                # one conversion of x for both parts
                codl1_gpu_0_conv2d_4c = R.nn.conv2d(
                    x_4c, w1, data_layout="NCHW4c", kernel_layout="OIHW4o", out_layout="NCHW4c"
                )
                # reads only packed values: packed too, no conversion between the parts and it
                s_4c = R.add(codl0_gpu_0_conv2d_4c, codl1_gpu_0_conv2d_4c)
                s = R.layout_transform(s_4c, index_map=lambda n, c, h, w, i: (n, c * 4 + i, h, w))
                R.output(s)
            return s

    def record(first: list[str], second: list[str], outputs: tuple[str, str]) -> str:
        return json.dumps(
            [
                {
                    "name": f"conv2d_{i}",
                    "ops": [f"conv2d_{i}"],
                    "dim": "OC",
                    "axis": 1,
                    "ratio": 1.0,
                    "input": "x",
                    "output": out,
                    "parts": [
                        {
                            "processor": "gpu",
                            "region": [0, 4],
                            "input_region": [0, 4],
                            "bindings": names,
                        }
                    ],
                }
                for i, (names, out) in enumerate(((first, outputs[0]), (second, outputs[1])))
            ]
        )

    rng = np.random.default_rng(3)
    w0, w1 = (rng.standard_normal((4, 4, 1, 1)).astype("float32") for _ in range(2))
    names = ("codl0_gpu_0_conv2d", "codl1_gpu_0_conv2d")
    before = _with_attrs(
        _bound(Before, {"w0": w0, "w1": w1}),
        **{PARTS_ATTR: record([names[0]], [names[1]], names)},
    )
    packed = tuple(f"{n}_4c" for n in names)  # the NCHW results are gone: only packed reads
    summary = [
        {"split": f"conv2d_{i}", "dim": "OC", "data_type": "image", "packed_ops": "1/1"}
        for i in range(2)
    ]
    summary.append({"split": OUTSIDE, "dim": None, "data_type": "image", "packed_ops": "1"})
    expected = _with_attrs(
        _bound(Expected, {"w0": pack_oihw(w0), "w1": pack_oihw(w1)}),
        **{
            PARTS_ATTR: record(["x_4c", packed[0]], [packed[1]], packed),
            TEXTURE_PARTS_ATTR: json.dumps(summary),
        },
    )
    verify_pack(before, expected)
