"""A pool straight behind a conv with no epilogue reads the conv's image (the texture build path,
:mod:`codl_tvm.build.texture`; docs/onnx-node-tests.md, "On images").

A conv with neither bias nor activation is a kernel of its own, and its output keeps the
texture scope ``AnnotateCustomMemoryScope`` gave it only if its legalization passes that type
on (:func:`~codl_tvm.build.texture.legalize_conv2d`); TVM's pool legalization then types the
pool by its input, so a conv output left in a buffer put the pool (``max_pool2d``, not
``max_pool2d_opencl``) and every kernel after it on buffers. Each model here must build with
the pool and the conv after it reading images, and equal onnxruntime within 1e-4 on a real
OpenCL device (PoCL from pip, or the device ``CODL_OPENCL_PLATFORM`` selects).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from tvm.relax.frontend.onnx import from_onnx
from tvm.runtime.vm import VirtualMachine

from codl_tvm.build import texture

GPU = tvm.target.Target({"kind": "opencl"}, host={"kind": "llvm"})
SHAPE = (1, 8, 12, 12)


def conv_pool_model(kernel: int, pool: str, seed: int = 0) -> onnx.ModelProto:
    """A conv (``kernel`` x ``kernel``, same padding) with no bias, a 2x2/2 ``pool``
    (``"MaxPool"`` or ``"AveragePool"``) right behind it, and a 3x3 conv with no bias after
    the pool: no epilogue anywhere for fusion to carry a texture scope through."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((8, 8, kernel, kernel)) / (8 * kernel)).astype("float32")
    w2 = (rng.standard_normal((8, 8, 3, 3)) / 24).astype("float32")
    inits = [
        helper.make_tensor(name, TensorProto.FLOAT, v.shape, v.ravel())
        for name, v in (("w1", w1), ("w2", w2))
    ]
    pad = (kernel - 1) // 2
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], pads=[pad] * 4),
        helper.make_node(pool, ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "w2"], ["y"], pads=[1] * 4),
    ]
    n, c, h, w = SHAPE
    graph = helper.make_graph(
        nodes,
        "conv_pool_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (n, c, h // 2, w // 2))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


# (conv kernel size, pool, the pool's image kernel)
CASES = [
    (3, "MaxPool", "max_pool2d_opencl"),
    (1, "MaxPool", "max_pool2d_opencl"),
    (3, "AveragePool", "avg_pool2d_opencl"),
]
IDS = [f"{k}x{k}-{pool}" for k, pool, _ in CASES]


@pytest.mark.parametrize(("kernel", "pool", "pool_kernel"), CASES, ids=IDS)
def test_pool_behind_a_bare_conv_reads_its_image(kernel, pool, pool_kernel):
    build = texture.build_texture_gpu(from_onnx(conv_pool_model(kernel, pool)), GPU)
    kernels = dict(build.kernels)
    # the pool is the image variant, and nothing between the input's packing and the
    # output's unpacking runs on buffers: the convs on both sides of the pool use images
    assert kernels.get(pool_kernel) is True, build.kernels
    convs = [name for name in kernels if name.startswith("conv2d_NCHWc_OIHWo")]
    assert len(convs) == 2 and all(kernels[name] for name in convs), build.kernels
    # in the generated OpenCL C the pool's input is an image
    source = build.kernel_source()
    head = f"__kernel void {pool_kernel}_kernel("
    signature = source[source.index(head) : source.index(")", source.index(head))]
    assert "__read_only image2d_array_t" in signature, signature


@pytest.mark.opencl
@pytest.mark.parametrize(("kernel", "pool", "pool_kernel"), CASES, ids=IDS)
def test_pool_behind_a_bare_conv_matches_onnxruntime(
    opencl, tmp_path: Path, kernel, pool, pool_kernel
):
    ort = pytest.importorskip("onnxruntime")
    model = conv_pool_model(kernel, pool)
    x = np.random.default_rng(1).standard_normal(SHAPE).astype("float32")
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]

    build = texture.build_texture_gpu(from_onnx(model), GPU)
    assert dict(build.kernels).get(pool_kernel) is True, build.kernels
    build.executable.export_library(str(tmp_path / "model.so"))
    lib = tvm.runtime.load_module(str(tmp_path / "model.so"))
    dev = tvm.opencl(0)
    vm = VirtualMachine(lib, build.vm_devices(dev))
    got = vm["main"](tvm.runtime.tensor(x, dev)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
