"""Write the small CNN bundled with codl-tvm (codl_tvm/data/codl_small_cnn.onnx).

Seeded weights; the operators co-execution cares about: 3x3/1x1/depthwise/strided convolutions
with bias, batch-norm, ReLU, residual add, max and average pooling, and a Gemm classifier.

Usage: python scripts/make_bundled_model.py [OUT.onnx]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build(seed: int = 2022) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def weight(name, shape, scale=None):
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        s = scale if scale is not None else np.sqrt(2.0 / fan_in)
        inits.append(
            numpy_helper.from_array((rng.standard_normal(shape) * s).astype("float32"), name)
        )
        return name

    def conv(x, out, cin, cout, k, stride=1, group=1, pad=None):
        pad = k // 2 if pad is None else pad
        w = weight(f"{out}_w", (cout, cin // group, k, k))
        b = weight(f"{out}_b", (cout,), scale=0.1)
        nodes.append(
            helper.make_node(
                "Conv",
                [x, w, b],
                [out],
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[pad] * 4,
                group=group,
            )
        )
        return out

    def relu(x, out):
        nodes.append(helper.make_node("Relu", [x], [out]))
        return out

    x = relu(conv("input", "c1", 3, 16, 3), "r1")
    x = relu(conv(x, "c2", 16, 32, 3, stride=2), "r2")
    y = conv(x, "c3", 32, 32, 3)
    scale = weight("bn_scale", (32,), scale=0.2)
    inits[-1] = numpy_helper.from_array(1.0 + numpy_helper.to_array(inits[-1]), "bn_scale")
    bias = weight("bn_bias", (32,), scale=0.1)
    mean = weight("bn_mean", (32,), scale=0.1)
    var = weight("bn_var", (32,), scale=0.1)
    inits[-1] = numpy_helper.from_array(np.abs(numpy_helper.to_array(inits[-1])) + 0.5, "bn_var")
    nodes.append(
        helper.make_node("BatchNormalization", [y, scale, bias, mean, var], ["bn"], epsilon=1e-5)
    )
    nodes.append(helper.make_node("Add", ["bn", x], ["res"]))
    x = relu("res", "r3")
    nodes.append(helper.make_node("MaxPool", [x], ["mp"], kernel_shape=[2, 2], strides=[2, 2]))
    x = relu(conv("mp", "dw", 32, 32, 3, group=32), "r4")
    x = relu(conv(x, "pw", 32, 64, 1), "r5")
    x = relu(conv(x, "c6", 64, 64, 5, stride=2), "r6")
    nodes.append(
        helper.make_node(
            "AveragePool",
            [x],
            ["ap"],
            kernel_shape=[3, 3],
            strides=[1, 1],
            pads=[1, 1, 1, 1],
            count_include_pad=0,
        )
    )
    nodes.append(helper.make_node("GlobalAveragePool", ["ap"], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], axis=1))
    fc_w = weight("fc_w", (10, 64))
    fc_b = weight("fc_b", (10,), scale=0.1)
    nodes.append(helper.make_node("Gemm", ["flat", fc_w, fc_b], ["logits"], transB=1))
    graph = helper.make_graph(
        nodes,
        "codl_small_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="codl-tvm"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    out = (
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else (Path(__file__).resolve().parents[1] / "codl_tvm" / "data" / "codl_small_cnn.onnx")
    )
    onnx.save(build(), str(out))
    print(f"wrote {out}")
