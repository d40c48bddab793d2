"""Conv epilogues whose steps read the conv output more than once (SiLU: ``x * sigmoid(x)``).

TVM 0.27's ``reverse_compute_inline`` drops an intermediate buffer that another block still
reads; the schedules inline such steps into their consumer first (``inline_elementwise_steps``)
and refuse the reverse inline otherwise (``sole_reader``). Reference: onnxruntime.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from codl_tvm.build.runner import build
from codl_tvm.frontend.importer import load_onnx


def _conv_then(tail: str, channels: int = 12, hw: int = 9):
    """x -> Conv(3x3, bias) -> SiLU (``tail="silu"``) or ``y = a * sigmoid(a) + a``."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((channels, 3, 3, 3)).astype("f4"), "W"),
        numpy_helper.from_array(rng.standard_normal(channels).astype("f4"), "B"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["a"], pads=[1] * 4),
        helper.make_node("Sigmoid", ["a"], ["s"]),
        helper.make_node("Mul", ["a", "s"], ["y" if tail == "silu" else "m"]),
    ]
    if tail != "silu":
        nodes.append(helper.make_node("Add", ["m", "a"], ["y"]))
    graph = helper.make_graph(
        nodes,
        tail,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, hw, hw])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("tail", ["silu", "silu_plus_input"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("opencl", marks=pytest.mark.opencl)])
def test_conv_epilogue_reading_the_output_twice(device, tail, tmp_path, monkeypatch, request):
    import onnxruntime as ort

    if device == "opencl":
        request.getfixturevalue("opencl")
    proto = _conv_then(tail)
    x = np.random.default_rng(1).standard_normal((1, 3, 9, 9)).astype("f4")
    monkeypatch.setenv("CODL_TVM_DUMP_IR", str(tmp_path))
    got = build(load_onnx(proto).mod, device)([x])[0]
    monkeypatch.delenv("CODL_TVM_DUMP_IR")
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    scheduled = next(tmp_path.glob("*-schedule.py")).read_text()
    # codl-tvm's conv rule took the kernel, with the whole epilogue in its write-back
    assert '"codl.algorithm": "direct"' in scheduled
    blocks = re.findall(r'T\.sblock\("(\w+)"\)', scheduled)
    assert not any(b.startswith(("compute", "T_multiply", "T_add")) for b in blocks), blocks
