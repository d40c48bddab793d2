"""codl.PartitionOperators at IR level: Before/Expected TVMScript modules compared structurally
(CPU only; single-op Before/Expected cases and the numerics are in test_passes_split.py and
test_passes_chain.py).

Weights are parameters of ``main`` (the frontend's ``keep_params_in_input`` form), so OC parts
slice them in the IR.
"""

from __future__ import annotations

import json

import tvm
from codl_tvm.passes import PartitionOperators
from tvm.script import ir as I
from tvm.script import relax as R

from codl_tvm.core.plan import ChainPlan, OpPartition, PartitionDim, PartitionPlan

H, OC = PartitionDim.H, PartitionDim.OC


@I.ir_module
class Before:
    @R.function
    def main(
        x: R.Tensor((1, 2, 8, 8), "float32"),
        w0: R.Tensor((3, 2, 3, 3), "float32"),
        w1: R.Tensor((4, 3, 3, 3), "float32"),
        b1: R.Tensor((1, 4, 1, 1), "float32"),
    ) -> R.Tensor((1, 4, 4, 4), "float32"):
        with R.dataflow():
            a = R.nn.conv2d(x, w0, padding=[1, 1, 1, 1])
            r = R.nn.relu(a)
            c = R.nn.conv2d(r, w1, strides=[2, 2], padding=[1, 1, 1, 1])
            gv = R.add(c, b1)
            R.output(gv)
        return gv


@I.ir_module
class ChainH:
    @R.function
    def main(
        x: R.Tensor((1, 2, 8, 8), "float32"),
        w0: R.Tensor((3, 2, 3, 3), "float32"),
        w1: R.Tensor((4, 3, 3, 3), "float32"),
        b1: R.Tensor((1, 4, 1, 1), "float32"),
    ) -> R.Tensor((1, 4, 4, 4), "float32"):
        with R.dataflow():
            # GPU: output rows [0, 2) of the stride-2 conv read rows [0, 4) of r (1 row of own
            # top padding), which the first conv computes from x rows [0, 5): the halo
            # grows backwards through the chain
            g_in = R.strided_slice(x, axes=[2], begin=[0], end=[5], assume_inbound=True)
            g0 = R.nn.conv2d(g_in, w0, padding=[1, 1, 0, 1])
            g1 = R.nn.relu(g0)
            g2 = R.nn.conv2d(g1, w1, strides=[2, 2], padding=[1, 1, 0, 1])
            g3 = R.add(g2, b1)
            # CPU: output rows [2, 4) read r rows [3, 8), computed from x rows [2, 8) with
            # 1 row of own bottom padding; r rows 3 and 4 are computed by both processors
            c_in = R.strided_slice(x, axes=[2], begin=[2], end=[8], assume_inbound=True)
            c0 = R.nn.conv2d(c_in, w0, padding=[0, 1, 1, 1])
            c1 = R.nn.relu(c0)
            c2 = R.nn.conv2d(c1, w1, strides=[2, 2], padding=[0, 1, 0, 1])
            c3 = R.add(c2, b1)
            gv = R.concat((g3, c3), axis=2)
            R.output(gv)
        return gv


@I.ir_module
class ConvOC:
    @R.function
    def main(
        x: R.Tensor((1, 2, 8, 8), "float32"),
        w0: R.Tensor((3, 2, 3, 3), "float32"),
        w1: R.Tensor((4, 3, 3, 3), "float32"),
        b1: R.Tensor((1, 4, 1, 1), "float32"),
    ) -> R.Tensor((1, 4, 4, 4), "float32"):
        with R.dataflow():
            a = R.nn.conv2d(x, w0, padding=[1, 1, 1, 1])
            r = R.nn.relu(a)
            # each part: its output channels' weights and bias; the input is read whole
            gw = R.strided_slice(w1, axes=[0], begin=[0], end=[2], assume_inbound=True)
            g0 = R.nn.conv2d(r, gw, strides=[2, 2], padding=[1, 1, 1, 1])
            gb = R.strided_slice(b1, axes=[1], begin=[0], end=[2], assume_inbound=True)
            g1 = R.add(g0, gb)
            cw = R.strided_slice(w1, axes=[0], begin=[2], end=[4], assume_inbound=True)
            c0 = R.nn.conv2d(r, cw, strides=[2, 2], padding=[1, 1, 1, 1])
            cb = R.strided_slice(b1, axes=[1], begin=[2], end=[4], assume_inbound=True)
            c1 = R.add(c0, cb)
            gv = R.concat((g1, c1), axis=1)
            R.output(gv)
        return gv


def verify(plan: PartitionPlan, expected: tvm.IRModule) -> list[dict]:
    """Compare ``main`` without its part record; return the record."""
    after = PartitionOperators(plan)(Before)
    tvm.relax.analysis.well_formed(after)  # raises on a violation
    tvm.ir.assert_structural_equal(after["main"].without_attr("codl_parts"), expected["main"])
    return json.loads(str(after["main"].attrs["codl_parts"]))


def test_h_chain_with_halo():
    plan = PartitionPlan(chains=(ChainPlan(("conv2d_0", "conv2d_1"), H, 0.5),))
    (record,) = verify(plan, ChainH)
    assert (record["ops"], record["axis"], record["input"]) == (["conv2d_0", "conv2d_1"], 2, "x")
    regions = [(p["processor"], p["region"], p["input_region"]) for p in record["parts"]]
    assert regions == [("gpu", [0, 2], [0, 5]), ("cpu", [2, 4], [2, 8])]


def test_oc_split_slices_weight_and_bias_parameters():
    plan = PartitionPlan(ops=(OpPartition("conv2d_1", OC, 0.5),))
    (record,) = verify(plan, ConvOC)
    assert (record["axis"], record["input"]) == (1, "r")
    regions = [(p["processor"], p["region"], p["input_region"]) for p in record["parts"]]
    assert regions == [("gpu", [0, 2], [0, 3]), ("cpu", [2, 4], [0, 3])]


def test_an_empty_plan_changes_nothing():
    tvm.ir.assert_structural_equal(PartitionOperators(PartitionPlan())(Before), Before)
