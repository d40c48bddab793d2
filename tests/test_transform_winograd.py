"""codl.Conv2DWinograd at IR level: the pass's output compared structurally with an Expected
module built from the same primitives (CPU only; numerics are in test_winograd.py).

The Winograd PrimFunc is TVM-generated from :func:`~codl_tvm.schedules.winograd.
winograd_conv2d`, so Expected calls it through ``call_te`` exactly as the rewrite should, with
the weight transformed at compile time by :func:`~codl_tvm.schedules.winograd.
transform_weight`: the comparison fails if the pass picks another conv, another algorithm,
tile, padding or weight transform, or changes the rest of ``main``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from codl_tvm.passes.winograd import Conv2DWinograd
from codl_tvm.schedules.presets import SSE
from codl_tvm.schedules.winograd import transform_weight, winograd_conv2d
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

LLVM = tvm.target.Target({"kind": "llvm"})
TILE = 2
# Winograd on, for any channel count and tile count; packed convs off
CONFIG = dataclasses.replace(
    SSE,
    winograd=True,
    winograd_tile=TILE,
    winograd_min_channels=1,
    winograd_min_tiles=0,
    conv_packed=False,
)
_rng = np.random.default_rng(0)
W3 = _rng.standard_normal((4, 4, 3, 3)).astype("float32")
W1 = _rng.standard_normal((4, 4, 1, 1)).astype("float32")


@I.ir_module
class Before:
    @R.function
    def main(x: R.Tensor((1, 4, 6, 6), "float32")) -> R.Tensor((1, 4, 6, 6), "float32"):
        with R.dataflow():
            a = R.nn.conv2d(x, R.const(W3), padding=[1, 1, 1, 1])
            b = R.nn.relu(a)
            gv = R.nn.conv2d(b, R.const(W1))  # 1x1: not a Winograd conv
            R.output(gv)
        return gv


def expected() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 6, 6), "float32"))
    with bb.function("main", [x], attrs={"global_symbol": "main"}):
        with bb.dataflow():
            a = bb.emit(
                bb.call_te(
                    winograd_conv2d,
                    x,
                    relax.const(transform_weight(W3, TILE), "float32"),
                    padding=(1, 1, 1, 1),
                    tile=TILE,
                    primfunc_name_hint="conv2d_winograd",
                )
            )
            b = bb.emit(relax.op.nn.relu(a))
            gv = bb.emit_output(relax.op.nn.conv2d(b, relax.const(W1)))
        bb.emit_func_output(gv)
    return bb.get()


def test_conv2d_winograd():
    rewrite = Conv2DWinograd(LLVM, cpu=CONFIG)
    tvm.ir.assert_structural_equal(rewrite(Before), expected())
    assert rewrite.decisions["a"] == "winograd"
    assert rewrite.decisions["gv"] == "kernel 1x1, Winograd needs 3x3"


def test_winograd_off_leaves_the_module_alone():
    off = Conv2DWinograd(LLVM, cpu=dataclasses.replace(CONFIG, winograd=False))
    assert off(Before).same_as(Before)
    assert off.decisions["a"] == f"Winograd disabled in config {CONFIG.name!r}"
