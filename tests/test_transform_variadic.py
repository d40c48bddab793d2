"""codl.PairwiseVariadic at IR level: Before/Expected TVMScript modules compared structurally
(CPU only; numerics are in test_variadic.py)."""

from __future__ import annotations

import tvm
from codl_tvm.passes.variadic import PairwiseVariadic
from tvm.script import ir as I
from tvm.script import relax as R


def verify(before: tvm.IRModule, expected: tvm.IRModule) -> None:
    tvm.ir.assert_structural_equal(PairwiseVariadic()(before), expected)


@I.ir_module
class SumBefore:
    @R.function
    def main(
        a: R.Tensor((1, 2, 3, 3), "float32"),
        b: R.Tensor((1, 2, 3, 3), "float32"),
        c: R.Tensor((1, 2, 1, 1), "float32"),
    ) -> R.Tensor((1, 2, 3, 3), "float32"):
        # the ONNX frontend's Sum(a, b, c): broadcast copies, stack, reduce over the stack
        with R.dataflow():
            a1 = R.broadcast_to(a, (1, 2, 3, 3))
            b1 = R.broadcast_to(b, (1, 2, 3, 3))
            c1 = R.broadcast_to(c, (1, 2, 3, 3))
            s = R.stack((a1, b1, c1), axis=0)
            y = R.sum(s, axis=[0])
            gv = R.nn.relu(y)
            R.output(gv)
        return gv


@I.ir_module
class SumExpected:
    @R.function
    def main(
        a: R.Tensor((1, 2, 3, 3), "float32"),
        b: R.Tensor((1, 2, 3, 3), "float32"),
        c: R.Tensor((1, 2, 1, 1), "float32"),
    ) -> R.Tensor((1, 2, 3, 3), "float32"):
        # a left fold in the reduction's order, broadcasting like ONNX; copies and stack gone
        with R.dataflow():
            y_fold0 = R.add(a, b)
            y = R.add(y_fold0, c)
            gv = R.nn.relu(y)
            R.output(gv)
        return gv


def test_sum_of_three_is_a_left_fold_of_adds():
    verify(SumBefore, SumExpected)


@I.ir_module
class MaxBefore:
    @R.function
    def main(a: R.Tensor((2, 3), "float32"), b: R.Tensor((2, 3), "float32")) -> R.Tensor(
        (2, 3), "float32"
    ):
        with R.dataflow():
            a1 = R.broadcast_to(a, (2, 3))
            b1 = R.broadcast_to(b, (2, 3))
            s = R.stack((a1, b1), axis=0)
            gv = R.max(s, axis=[0])
            R.output(gv)
        return gv


@I.ir_module
class MaxExpected:
    @R.function
    def main(a: R.Tensor((2, 3), "float32"), b: R.Tensor((2, 3), "float32")) -> R.Tensor(
        (2, 3), "float32"
    ):
        with R.dataflow():
            gv = R.maximum(a, b)
            R.output(gv)
        return gv


def test_max_of_two_is_maximum():
    verify(MaxBefore, MaxExpected)


@I.ir_module
class StackUsedTwice:
    @R.function
    def main(a: R.Tensor((2, 3), "float32"), b: R.Tensor((2, 3), "float32")) -> R.Tuple(
        R.Tensor((2, 3), "float32"), R.Tensor((2, 2, 3), "float32")
    ):
        with R.dataflow():
            s = R.stack((a, b), axis=0)
            y = R.sum(s, axis=[0])
            R.output(y, s)
        return (y, s)


def test_a_stack_with_another_use_is_left_alone():
    verify(StackUsedTwice, StackUsedTwice)


@I.ir_module
class KeepdimsSum:
    @R.function
    def main(a: R.Tensor((2, 3), "float32"), b: R.Tensor((2, 3), "float32")) -> R.Tensor(
        (1, 2, 3), "float32"
    ):
        with R.dataflow():
            s = R.stack((a, b), axis=0)
            gv = R.sum(s, axis=[0], keepdims=True)
            R.output(gv)
        return gv


def test_a_reduction_that_keeps_the_axis_is_left_alone():
    verify(KeepdimsSum, KeepdimsSum)
