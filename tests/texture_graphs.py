"""ONNX graphs the texture tests build: small models whose operators the image layout covers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper


def conv_pool_model(path: Path, h: int = 20, w: int = 20, seed: int = 0) -> Path:
    """RGB input, conv-leaky relu, conv, residual add, relu, max pool 1x2: every operator
    covered by the texture layout."""
    rng = np.random.default_rng(seed)
    inits = [
        helper.make_tensor(name, TensorProto.FLOAT, v.shape, v.ravel())
        for name, v in (
            ("w1", (rng.standard_normal((8, 3, 3, 3)) / 3).astype("float32")),
            ("b1", rng.standard_normal(8).astype("float32")),
            ("w2", (rng.standard_normal((8, 8, 3, 3)) / 8).astype("float32")),
        )
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("LeakyRelu", ["c1"], ["a"], alpha=0.1),
        helper.make_node("Conv", ["a", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["a", "c2"], ["s"]),
        helper.make_node("Relu", ["s"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[1, 2], strides=[1, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, h, w))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, h, w // 2))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path
