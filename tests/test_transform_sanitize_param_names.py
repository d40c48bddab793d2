"""codl.SanitizeParamNames at IR level (Before/Expected), and hand-made modules with odd parameter
names built for OpenCL and co-executed against numpy.

Relax's structural equality maps variables by position, not by name, so ``verify`` also compares
every function's parameter names: the names are what the pass changes. The Before modules are
built with a BlockBuilder because TVMScript cannot spell a parameter called ``x/0``.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from codl_tvm.passes.param_names import SanitizeParamNames
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import codl_tvm
from codl_tvm.build.pipeline import inference_passes
from codl_tvm.build.runner import build
from codl_tvm.core.plan import uniform_plan

X_SHAPE, W_SHAPE = (1, 3, 6, 6), (4, 3, 3, 3)


def _names(mod: tvm.IRModule) -> dict[str, list[str]]:
    return {
        gv.name_hint: [p.name for p in func.params]
        for gv, func in mod.functions_items()
        if isinstance(func, relax.Function)
    }


def verify(before: tvm.IRModule, expected: tvm.IRModule) -> None:
    after = SanitizeParamNames()(before)
    tvm.ir.assert_structural_equal(after, expected)
    assert _names(after) == _names(expected)
    relax.analysis.well_formed(after)  # raises if not


def _conv_relu(names: tuple[str, str, str]) -> tvm.IRModule:
    """main(x, w, b) = relu(conv2d(x, w, padding=1) + b), with the given parameter names."""
    x = relax.Var(names[0], relax.TensorType(X_SHAPE, "float32"))
    w = relax.Var(names[1], relax.TensorType(W_SHAPE, "float32"))
    b = relax.Var(names[2], relax.TensorType((1, 4, 1, 1), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            z = bb.emit(relax.op.add(y, b))
            out = bb.emit_output(relax.op.nn.relu(z))
        bb.emit_func_output(out)
    return bb.get()


@I.ir_module
class Expected:
    # 'x/0' -> x_0; 'a/b' and 'a_b' sanitize alike: the valid name keeps it, the other gets _1
    @R.function
    def main(
        x_0: R.Tensor((1, 3, 6, 6), "float32"),
        a_b_1: R.Tensor((4, 3, 3, 3), "float32"),
        a_b: R.Tensor((1, 4, 1, 1), "float32"),
    ) -> R.Tensor((1, 4, 6, 6), "float32"):
        with R.dataflow():
            lv = R.nn.conv2d(x_0, a_b_1, padding=[1, 1, 1, 1])
            lv1 = R.add(lv, a_b)
            gv = R.nn.relu(lv1)
            R.output(gv)
        return gv


def test_odd_names_become_c_identifiers():
    verify(_conv_relu(("x/0", "a/b", "a_b")), Expected)


def test_valid_names_leave_the_module_as_it_was():
    mod = _conv_relu(("x", "w", "b"))
    assert SanitizeParamNames()(mod).same_as(mod)


def test_every_relax_function_is_renamed():
    mod = _conv_relu(("x/0", "a/b", "a_b"))
    helper_func = _conv_relu(("1st", "in-put", "données"))["main"]
    mod["helper"] = helper_func.with_attr("global_symbol", "helper")
    after = SanitizeParamNames()(mod)
    assert _names(after) == {
        "main": ["x_0", "a_b_1", "a_b"],
        "helper": ["_1st", "in_put", "donnu00e9es"],
    }
    relax.analysis.well_formed(after)


def test_runs_first_in_the_pipelines():
    # the single-device and the co-executed pipelines both start with inference_passes()
    assert inference_passes()[0].info.name == "codl.SanitizeParamNames"


# -- builds: clBuildProgram rejected the kernels of these modules before the pass ---------------


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [
        rng.standard_normal(X_SHAPE).astype("float32"),
        rng.standard_normal(W_SHAPE).astype("float32"),
        rng.standard_normal((1, 4, 1, 1)).astype("float32"),
    ]


def _numpy_conv_relu(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """relu(conv2d(x, w, padding=1, stride=1) + b) for NCHW/OIHW in float64."""
    k = w.shape[2]
    padded = np.pad(x.astype("float64"), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (k, k), axis=(2, 3))
    y = np.einsum("nchwij,ocij->nohw", windows, w.astype("float64")) + b
    return np.maximum(y, 0.0)


def _close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.opencl
def test_hand_made_module_with_odd_names_on_opencl_and_coexecuted(opencl):
    mod = _conv_relu(("x/0", "a/b", "a_b"))
    inputs = _inputs()
    want = _numpy_conv_relu(*inputs)
    _close(build(mod, "opencl")(inputs)[0], want)
    for dim in ("H", "OC"):
        _close(codl_tvm.compile(mod, uniform_plan(mod, dim, 0.5))(inputs)[0], want)


@pytest.mark.opencl
def test_tvm_from_onnx_module_with_a_slash_on_opencl(opencl):
    # TVM's own importer only replaces '.' in input names: 'gpu_0/data_0' reaches the build
    from tvm.relax.frontend.onnx import from_onnx

    x, w, b = _inputs()
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["gpu_0/data_0", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Add", ["c", "gpu_0/bias:0"], ["s"]),
            helper.make_node("Relu", ["s"], ["out"]),
        ],
        "slash",
        [
            helper.make_tensor_value_info("gpu_0/data_0", TensorProto.FLOAT, list(X_SHAPE)),
            helper.make_tensor_value_info("gpu_0/bias:0", TensorProto.FLOAT, [1, 4, 1, 1]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 6, 6])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    mod = from_onnx(model)
    assert "gpu_0/data_0" in _names(mod)["main"]  # what the build used to receive
    _close(build(mod, "opencl")([x, b])[0], _numpy_conv_relu(x, w, b))
