"""``codl.ImportedClip``: the kernels TVM's ONNX importer makes of Clip become ``R.clip``.

Structurally (the importer's two kernels and their NaN guards become one ``R.clip``, or
``R.maximum`` and ``R.minimum`` with ``clip=False``; a Clip with one bound becomes
``R.maximum``; a kernel of other code is left alone, whatever its name), and numerically:
ONNX Clip graphs (ReLU6 after a conv, one bound, ``min > max``, a NaN bound) imported,
rewritten and built for the CPU against onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from codl_tvm.passes.imported_clip import ImportedClip
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from codl_tvm.frontend.importer import load_onnx


def verify(before: tvm.IRModule, expected: tvm.IRModule, clip: bool = True) -> None:
    after = ImportedClip(clip)(before)
    relax.analysis.well_formed(after)  # raises if not
    tvm.ir.assert_structural_equal(after, expected)


@pytest.mark.parametrize("clip", [True, False])
def test_relu6_kernels_become_one_clip(clip):
    # TVM's importer's output for Conv -> Clip(c, 0, 6) (opset 13)
    @I.ir_module
    class Before:
        @T.prim_func(private=True, s_tir=True)
        def maximum(
            A: T.Buffer((T.int64(1), T.int64(4), T.int64(5), T.int64(5)), "float32"),
            lv1: T.Buffer((), "float32"),
            T_maximum: T.Buffer((T.int64(1), T.int64(4), T.int64(5), T.int64(5)), "float32"),
        ):
            T.func_attr({"tirx.noalias": True})
            for ax0, ax1, ax2, ax3 in T.grid(T.int64(1), T.int64(4), T.int64(5), T.int64(5)):
                with T.sblock("T_maximum"):
                    v0, v1, v2, v3 = T.axis.remap("SSSS", [ax0, ax1, ax2, ax3])
                    T.reads(A[v0, v1, v2, v3], lv1[()])
                    T.writes(T_maximum[v0, v1, v2, v3])
                    T_maximum[v0, v1, v2, v3] = T.max(A[v0, v1, v2, v3], lv1[()])

        @T.prim_func(private=True, s_tir=True)
        def minimum(
            lv3: T.Buffer((T.int64(1), T.int64(4), T.int64(5), T.int64(5)), "float32"),
            lv5: T.Buffer((), "float32"),
            T_minimum: T.Buffer((T.int64(1), T.int64(4), T.int64(5), T.int64(5)), "float32"),
        ):
            T.func_attr({"tirx.noalias": True})
            for ax0, ax1, ax2, ax3 in T.grid(T.int64(1), T.int64(4), T.int64(5), T.int64(5)):
                with T.sblock("T_minimum"):
                    v0, v1, v2, v3 = T.axis.remap("SSSS", [ax0, ax1, ax2, ax3])
                    T.reads(lv3[v0, v1, v2, v3], lv5[()])
                    T.writes(T_minimum[v0, v1, v2, v3])
                    T_minimum[v0, v1, v2, v3] = T.min(lv3[v0, v1, v2, v3], lv5[()])

        @R.function
        def main(
            x: R.Tensor((1, 4, 5, 5), "float32"), w: R.Tensor((4, 4, 1, 1), "float32")
        ) -> R.Tensor((1, 4, 5, 5), "float32"):
            cls = Before
            with R.dataflow():
                # each bound unbounded where NaN, as ONNX defines
                lv = R.isnan(R.const(0.0, "float32"))
                lv1 = R.where(lv, R.const(float("-inf"), "float32"), R.const(0.0, "float32"))
                lv2 = R.nn.conv2d(x, w)
                lv3 = R.call_tir(
                    cls.maximum, (lv2, lv1), out_ty=R.Tensor((1, 4, 5, 5), dtype="float32")
                )
                lv4 = R.isnan(R.const(6.0, "float32"))
                lv5 = R.where(lv4, R.const(float("inf"), "float32"), R.const(6.0, "float32"))
                lv6 = R.call_tir(
                    cls.minimum, (lv3, lv5), out_ty=R.Tensor((1, 4, 5, 5), dtype="float32")
                )
                R.output(lv6)
            return lv6

    @I.ir_module
    class Expected:
        @R.function
        def main(
            x: R.Tensor((1, 4, 5, 5), "float32"), w: R.Tensor((4, 4, 1, 1), "float32")
        ) -> R.Tensor((1, 4, 5, 5), "float32"):
            with R.dataflow():
                lv2 = R.nn.conv2d(x, w)
                # one operator the texture layout packs and fusion puts in the conv's epilogue;
                # the guards and the kernels are gone
                lv6 = R.clip(lv2, 0.0, 6.0)
                R.output(lv6)
            return lv6

    @I.ir_module
    class ExpectedMinMax:
        @R.function
        def main(
            x: R.Tensor((1, 4, 5, 5), "float32"), w: R.Tensor((4, 4, 1, 1), "float32")
        ) -> R.Tensor((1, 4, 5, 5), "float32"):
            with R.dataflow():
                lv2 = R.nn.conv2d(x, w)
                # clip=False (float16 builds): operators ToMixedPrecision takes
                lv3 = R.maximum(lv2, R.const(0.0, "float32"))
                lv6 = R.minimum(lv3, R.const(6.0, "float32"))
                R.output(lv6)
            return lv6

    verify(Before, Expected if clip else ExpectedMinMax, clip)


def test_one_bound_becomes_a_binary_op_and_other_code_stays():
    @I.ir_module
    class Before:
        @T.prim_func(private=True, s_tir=True)
        def maximum(
            A: T.Buffer((T.int64(1), T.int64(8)), "float32"),
            b: T.Buffer((T.int64(1),), "float32"),
            T_maximum: T.Buffer((T.int64(1), T.int64(8)), "float32"),
        ):
            T.func_attr({"tirx.noalias": True})
            for ax0, ax1 in T.grid(T.int64(1), T.int64(8)):
                with T.sblock("T_maximum"):
                    v0, v1 = T.axis.remap("SS", [ax0, ax1])
                    T.reads(A[v0, v1], b[T.int64(0)])
                    T.writes(T_maximum[v0, v1])
                    T_maximum[v0, v1] = T.max(A[v0, v1], b[T.int64(0)])

        @T.prim_func(private=True, s_tir=True)
        def minimum(
            A: T.Buffer((T.int64(1), T.int64(8)), "float32"),
            b: T.Buffer((T.int64(1),), "float32"),
            T_minimum: T.Buffer((T.int64(1), T.int64(8)), "float32"),
        ):
            # named like the importer's kernel, but another computation
            T.func_attr({"tirx.noalias": True})
            for ax0, ax1 in T.grid(T.int64(1), T.int64(8)):
                with T.sblock("T_minimum"):
                    v0, v1 = T.axis.remap("SS", [ax0, ax1])
                    T.reads(A[v0, v1], b[T.int64(0)])
                    T.writes(T_minimum[v0, v1])
                    T_minimum[v0, v1] = A[v0, v1] + b[T.int64(0)]

        @R.function
        def main(x: R.Tensor((1, 8), "float32")) -> R.Tensor((1, 8), "float32"):
            cls = Before
            with R.dataflow():
                # a bound the importer carries as a (1,) constant
                m = R.call_tir(
                    cls.maximum,
                    (x, R.const(np.array([0.5], "float32"))),
                    out_ty=R.Tensor((1, 8), dtype="float32"),
                )
                y = R.call_tir(
                    cls.minimum,
                    (m, R.const(np.array([2.0], "float32"))),
                    out_ty=R.Tensor((1, 8), dtype="float32"),
                )
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @T.prim_func(private=True, s_tir=True)
        def minimum(
            A: T.Buffer((T.int64(1), T.int64(8)), "float32"),
            b: T.Buffer((T.int64(1),), "float32"),
            T_minimum: T.Buffer((T.int64(1), T.int64(8)), "float32"),
        ):
            T.func_attr({"tirx.noalias": True})
            for ax0, ax1 in T.grid(T.int64(1), T.int64(8)):
                with T.sblock("T_minimum"):
                    v0, v1 = T.axis.remap("SS", [ax0, ax1])
                    T.reads(A[v0, v1], b[T.int64(0)])
                    T.writes(T_minimum[v0, v1])
                    T_minimum[v0, v1] = A[v0, v1] + b[T.int64(0)]

        @R.function
        def main(x: R.Tensor((1, 8), "float32")) -> R.Tensor((1, 8), "float32"):
            cls = Expected
            with R.dataflow():
                m = R.maximum(x, R.const(0.5, "float32"))  # Clip's min alone: a binary op
                y = R.call_tir(
                    cls.minimum,
                    (m, R.const(np.array([2.0], "float32"))),
                    out_ty=R.Tensor((1, 8), dtype="float32"),
                )
                R.output(y)
            return y

    verify(Before, Expected)


# --- numerics against onnxruntime ---------------------------------------------------------------


def _clip_model(lo: float | None, hi: float | None) -> onnx.ModelProto:
    """Conv 4 -> 4 then Clip with the given bounds (None: that input left out)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype("float32"), "w")]
    inputs = ["c"]
    for name, value in (("lo", lo), ("hi", hi)):
        if value is None:
            inputs.append("")
        else:
            inits.append(numpy_helper.from_array(np.array(value, "float32"), name))
            inputs.append(name)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Clip", inputs, ["y"])],
        "clip",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _ops(mod: tvm.IRModule) -> set[str]:
    names = set()
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op):
                names.add(b.value.op.name)
    return names


@pytest.mark.parametrize(
    ("lo", "hi", "ops"),
    [
        (0.0, 6.0, {"relax.clip"}),  # ReLU6
        (-0.5, None, {"relax.maximum"}),
        (None, 0.5, {"relax.minimum"}),
        (1.0, -1.0, {"relax.maximum", "relax.minimum"}),  # min > max: ONNX's order kept
        (float("nan"), 0.5, {"relax.maximum", "relax.minimum"}),  # NaN: unbounded below
    ],
)
def test_imported_clip_matches_onnxruntime(lo, hi, ops):
    ort = pytest.importorskip("onnxruntime")
    proto = _clip_model(lo, hi)
    mod = ImportedClip()(load_onnx(proto).mod)
    assert "relax.call_tir" not in _ops(mod)
    assert ops <= _ops(mod)
    if "relax.clip" not in ops:  # TVM 0.27's ToMixedPrecision rejects R.clip only
        relax.transform.ToMixedPrecision(out_dtype="float16")(mod)
    x = (np.random.default_rng(1).standard_normal((1, 4, 5, 5)) * 4).astype("float32")
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    want = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_two_operand_kernels_that_cannot_be_a_clip_stay():
    """A kernel of two tensors that do not broadcast (a matmul's operands) is not a Clip bound:
    the pass leaves it unchanged instead of building a reference kernel for the pair."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 96), "float32"))
    w = relax.Var("w", relax.TensorType((96, 50), "float32"))
    with bb.function("main", [x, w]):
        out = bb.emit_te(tvm.topi.matmul, x, w)
        bb.emit_func_output(out)
    before = bb.get()
    verify(before, before)
