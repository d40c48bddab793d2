"""codl.FoldBatchNorm at IR level: Before/Expected TVMScript modules compared structurally
(CPU only; numerics are in test_fold_bn.py).

The Expected constants follow the fold's definition (float64, cast back once):
``W' = W * s`` per output channel and ``h' = beta - mean * s + bias * s`` with
``s = gamma / sqrt(var + eps)``.
"""

from __future__ import annotations

import numpy as np
import tvm
from codl_tvm.passes.fold_bn import FoldBatchNorm
from tvm.script import ir as I
from tvm.script import relax as R

_rng = np.random.default_rng(0)
W = _rng.standard_normal((3, 2, 3, 3)).astype("float32")
BIAS = _rng.standard_normal(3).astype("float32")
GAMMA = _rng.standard_normal(3).astype("float32")
BETA = _rng.standard_normal(3).astype("float32")
MEAN = _rng.standard_normal(3).astype("float32")
VAR = (_rng.random(3) + 0.5).astype("float32")
EPS = 1e-5


def verify(before: tvm.IRModule, expected: tvm.IRModule) -> None:
    tvm.ir.assert_structural_equal(FoldBatchNorm()(before), expected)


@I.ir_module
class Before:
    @R.function
    def main(x: R.Tensor((1, 2, 4, 4), "float32")) -> R.Tensor((1, 3, 2, 2), "float32"):
        # as the ONNX frontend imports Conv(bias) + BatchNormalization + Relu
        with R.dataflow():
            c = R.nn.conv2d(x, R.const(W))
            rb = R.reshape(R.const(BIAS), R.shape([1, 3, 1, 1]))
            b = R.add(c, rb)
            t = R.nn.batch_norm(
                b,
                R.const(GAMMA),
                R.const(BETA),
                R.const(MEAN),
                R.const(VAR),
                axis=1,
                epsilon=EPS,
                training=False,
            )
            y = t[0]
            gv = R.nn.relu(y)
            R.output(gv)
        return gv


def _folded(eps: float) -> tuple[np.ndarray, np.ndarray]:
    scale = GAMMA.astype(np.float64) / np.sqrt(VAR.astype(np.float64) + eps)
    shift = BETA - MEAN.astype(np.float64) * scale + BIAS.astype(np.float64) * scale
    weight = (W.astype(np.float64) * scale.reshape(-1, 1, 1, 1)).astype("float32")
    return weight, shift.astype("float32").reshape(1, 3, 1, 1)


# the epsilon the pass reads is the attribute's value (stored at the attribute's precision)
_bn = Before["main"].body.blocks[0].bindings[3].value
W_FOLDED, SHIFT = _folded(float(_bn.attrs.epsilon))


@I.ir_module
class Expected:
    @R.function
    def main(x: R.Tensor((1, 2, 4, 4), "float32")) -> R.Tensor((1, 3, 2, 2), "float32"):
        # the conv keeps its variable with scaled weights; y keeps its own, bound to the add
        with R.dataflow():
            c = R.nn.conv2d(x, R.const(W_FOLDED))
            y = R.add(c, R.const(SHIFT))
            gv = R.nn.relu(y)
            R.output(gv)
        return gv


def test_fold_conv_bias_batch_norm():
    verify(Before, Expected)


@I.ir_module
class WeightParam:
    @R.function
    def main(
        x: R.Tensor((1, 2, 4, 4), "float32"), w: R.Tensor((3, 2, 3, 3), "float32")
    ) -> R.Tensor((1, 3, 2, 2), "float32"):
        # a weight that is not a constant: the batch norm stays
        with R.dataflow():
            c = R.nn.conv2d(x, w)
            t = R.nn.batch_norm(
                c,
                R.const(GAMMA),
                R.const(BETA),
                R.const(MEAN),
                R.const(VAR),
                axis=1,
                epsilon=EPS,
                training=False,
            )
            gv = t[0]
            R.output(gv)
        return gv


def test_a_weight_parameter_is_not_folded():
    verify(WeightParam, WeightParam)


@I.ir_module
class TrainingMode:
    @R.function
    def main(x: R.Tensor((1, 2, 4, 4), "float32")) -> R.Tensor((1, 3, 2, 2), "float32"):
        # batch statistics, not an affine map: the batch norm stays
        with R.dataflow():
            c = R.nn.conv2d(x, R.const(W))
            t = R.nn.batch_norm(
                c, R.const(GAMMA), R.const(BETA), R.const(MEAN), R.const(VAR), axis=1, training=True
            )
            gv = t[0]
            R.output(gv)
        return gv


def test_training_mode_is_not_folded():
    verify(TrainingMode, TrainingMode)
