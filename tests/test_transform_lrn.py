"""codl.LRNWindowSum at IR level: Before/Expected TVMScript modules compared structurally
(CPU only; numerics are in test_lrn.py)."""

from __future__ import annotations

import tvm
from codl_tvm.passes.lrn import LRNWindowSum
from tvm.script import ir as I
from tvm.script import relax as R


def verify(before: tvm.IRModule, expected: tvm.IRModule) -> None:
    tvm.ir.assert_structural_equal(LRNWindowSum()(before), expected)


@I.ir_module
class Before:
    @R.function
    def main(x: R.Tensor((1, 4, 2, 2), "float32")) -> R.Tensor((1, 4, 2, 2), "float32"):
        # the ONNX frontend's LRN(size=3) window: a 3-D average pool over the channels
        with R.dataflow():
            s = R.multiply(x, x)
            e = R.expand_dims(s, axis=[1])
            p = R.nn.avg_pool3d(
                e,
                pool_size=[3, 1, 1],
                strides=[1, 1, 1],
                padding=[1, 0, 0, 1, 0, 0],
                count_include_pad=True,
                layout="NCDHW",
            )
            q = R.squeeze(p, axis=[1])
            gv = R.divide(x, q)
            R.output(gv)
        return gv


@I.ir_module
class Expected:
    @R.function
    def main(x: R.Tensor((1, 4, 2, 2), "float32")) -> R.Tensor((1, 4, 2, 2), "float32"):
        # zero-pad one channel each side, add the three shifted windows in the pool's order,
        # divide once by the window size; the pool and the expanded copy are gone
        with R.dataflow():
            s = R.multiply(x, x)
            q_lrn0 = R.nn.pad(s, [0, 0, 1, 1, 0, 0, 0, 0])
            q_lrn1 = R.strided_slice(q_lrn0, axes=[1], begin=[0], end=[4])
            q_lrn2 = R.strided_slice(q_lrn0, axes=[1], begin=[1], end=[5])
            q_lrn3 = R.add(q_lrn1, q_lrn2)
            q_lrn4 = R.strided_slice(q_lrn0, axes=[1], begin=[2], end=[6])
            q_lrn5 = R.add(q_lrn3, q_lrn4)
            q = R.divide(q_lrn5, R.const(3.0, "float32"))
            gv = R.divide(x, q)
            R.output(gv)
        return gv


def test_lrn_window_as_shifted_adds():
    verify(Before, Expected)


@I.ir_module
class EvenWindow:
    @R.function
    def main(x: R.Tensor((1, 4, 2, 2), "float32")) -> R.Tensor((1, 4, 2, 2), "float32"):
        # not the frontend's LRN form (an even window): untouched
        with R.dataflow():
            e = R.expand_dims(x, axis=[1])
            p = R.nn.avg_pool3d(
                e,
                pool_size=[2, 1, 1],
                strides=[1, 1, 1],
                padding=[1, 0, 0, 0, 0, 0],
                count_include_pad=True,
                layout="NCDHW",
            )
            gv = R.squeeze(p, axis=[1])
            R.output(gv)
        return gv


def test_other_channel_pools_are_left_alone():
    verify(EvenWindow, EvenWindow)
