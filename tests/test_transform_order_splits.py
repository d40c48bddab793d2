"""codl.OrderSplits at IR level: Before/Expected modules compared structurally.

The Before module is what PartitionOperators leaves for a plan that places two branches of an
Inception-like module whole (hand-written, tiny): split ``conv2d_0`` (GPU) and split
``conv2d_1`` (CPU) both read ``x``, a concat joins them, and ``side`` reads only ``x``.
"""

from __future__ import annotations

import json

import pytest
import tvm
from codl_tvm.passes.order import OrderSplits
from tvm.script import ir as I
from tvm.script import relax as R

from codl_tvm.core.errors import PlanError


def _split(name: str, processor: str, bindings: list[str]) -> dict:
    return {
        "name": name,
        "ops": [name],
        "dim": "OC",
        "axis": 1,
        "ratio": 1.0 if processor == "gpu" else 0.0,
        "input": "x",
        "output": bindings[-1],
        "parts": [
            {
                "processor": processor,
                "region": [0, 4],
                "input_region": [0, 2],
                "bindings": bindings,
            }
        ],
    }


_PARTS = json.dumps(
    [_split("conv2d_0", "gpu", ["a", "a_relu"]), _split("conv2d_1", "cpu", ["b", "b_relu"])]
)


@I.ir_module
class Before:
    @R.function
    def main(
        x: R.Tensor((1, 2, 4, 4), "float32"),
        wa: R.Tensor((4, 2, 1, 1), "float32"),
        wb: R.Tensor((4, 2, 1, 1), "float32"),
    ) -> R.Tensor((1, 10, 4, 4), "float32"):
        R.func_attr({"codl_parts": _PARTS})
        with R.dataflow():
            a = R.nn.conv2d(x, wa)
            a_relu = R.nn.relu(a)
            b = R.nn.conv2d(x, wb)
            b_relu = R.nn.relu(b)
            y = R.concat((a_relu, b_relu), axis=1)
            side = R.nn.relu(x)
            out = R.concat((y, side), axis=1)
            R.output(out)
        return out


@I.ir_module
class Expected:
    # the CPU branch first, as a schedule that starts it at 0 and the GPU branch later would;
    # `side` reads only x: as early as possible; the joins once both branches are computed
    @R.function
    def main(
        x: R.Tensor((1, 2, 4, 4), "float32"),
        wa: R.Tensor((4, 2, 1, 1), "float32"),
        wb: R.Tensor((4, 2, 1, 1), "float32"),
    ) -> R.Tensor((1, 10, 4, 4), "float32"):
        R.func_attr({"codl_parts": _PARTS})
        with R.dataflow():
            side = R.nn.relu(x)
            b = R.nn.conv2d(x, wb)
            b_relu = R.nn.relu(b)
            a = R.nn.conv2d(x, wa)
            a_relu = R.nn.relu(a)
            y = R.concat((a_relu, b_relu), axis=1)
            out = R.concat((y, side), axis=1)
            R.output(out)
        return out


def verify(before: tvm.IRModule, order: list[str], expected: tvm.IRModule) -> None:
    after = OrderSplits(order)(before)
    tvm.relax.analysis.well_formed(after)  # raises if not
    tvm.ir.assert_structural_equal(after, expected)


def test_order_splits():
    verify(Before, ["conv2d_1", "conv2d_0"], Expected)


def test_order_of_unlisted_bindings_only_moves_them_earlier():
    """The order the bindings already have: only `side` moves up, to right after its input."""
    after = OrderSplits(["conv2d_0", "conv2d_1"])(Before)
    names = [b.var.name for b in after["main"].body.blocks[0].bindings]
    assert names == ["side", "a", "a_relu", "b", "b_relu", "y", "out"]


def test_order_against_the_data_flow_is_refused():
    parts = json.dumps(
        [_split("conv2d_0", "gpu", ["a", "a_relu"]), _split("conv2d_1", "cpu", ["b"])]
    )

    @I.ir_module
    class Chain:
        @R.function
        def main(
            x: R.Tensor((1, 2, 4, 4), "float32"),
            wa: R.Tensor((2, 2, 1, 1), "float32"),
            wb: R.Tensor((2, 2, 1, 1), "float32"),
        ) -> R.Tensor((1, 2, 4, 4), "float32"):
            R.func_attr({"codl_parts": parts})
            with R.dataflow():
                a = R.nn.conv2d(x, wa)
                a_relu = R.nn.relu(a)
                b = R.nn.conv2d(a_relu, wb)
                R.output(b)
            return b

    with pytest.raises(PlanError, match="split conv2d_1 reads a_relu, computed by split conv2d_0"):
        OrderSplits(["conv2d_1", "conv2d_0"])(Chain)
    with pytest.raises(PlanError, match="main has no split 'conv2d_9'"):
        OrderSplits(["conv2d_9"])(Chain)
    with pytest.raises(PlanError, match="appears twice"):
        OrderSplits(["conv2d_0", "conv2d_0"])
