"""Fold inference batch norms into the convolutions before them.

An inference-mode ``batch_norm`` after a convolution with constant weights is an affine map per
output channel, ``y = s * conv(x, W) + h`` with ``s = gamma / sqrt(var + eps)`` and
``h = beta - mean * s``. :class:`FoldBatchNorm` rewrites

    c = conv2d(x, W)            [b = add(c, bias)]     t = batch_norm(c or b, ...)     y = t[0]

into ``c = conv2d(x, W * s)`` and ``y = add(c, bias * s + h)``, as inference engines do
(onnxruntime's Conv+BatchNormalization fusion). Without it ``batch_norm`` stays a kernel of its
own: its legalized TIR has a tuple output, so FuseOps cannot put it into the conv's write-back,
and every such layer pays one more pass over its output and one more launch (YOLOv2's
co-executed emulated-SoC timeline: 43 batch-norm kernels, 4.8 ms of processor time in a 76 ms
inference). After folding, the bias add is an elementwise epilogue that the schedules fuse into
the conv and that the partitioning pass splits with it.

Variables keep their identity: the conv's binding keeps its variable (plans name operators by
their order and shapes, which do not change, so a plan made for the unfolded module applies to
the folded one), and ``y`` keeps its own, now bound to the add. A batch norm is left alone when
any of its parameters or the conv's weight is not a constant, its mean/var outputs are used, it
is in training mode, its axis is not the conv's channel axis, or the conv's output (or the bias
add) has another user.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from codl_tvm.core.plan import static_shape

from .rewrite import Bindings, op_name, rebuild, rewrite_functions

__all__ = ["FoldBatchNorm", "fold_batch_norms"]


class _Function(Bindings):
    """Bindings and uses of one Relax function body, and the constants among its values."""

    def const(self, expr) -> np.ndarray | None:
        """The value of ``expr`` when it is a constant, possibly reshaped."""
        if isinstance(expr, tvm.ir.Constant):
            return expr.value.numpy()
        if isinstance(expr, relax.Var) and op_name(self.value_of.get(expr)) == "relax.reshape":
            src = self.const(self.value_of[expr].args[0])
            shape = static_shape(expr)
            return None if src is None or shape is None else src.reshape(shape)
        return None


def _plan_fold(fn: _Function, bn_var: relax.Var, bn: relax.Call):
    """``(conv var, conv call, bias var | None, bias, scale, shift)`` or ``None``."""
    attrs = bn.attrs
    if bool(getattr(attrs, "training", False)) or int(attrs.axis) != 1:
        return None
    x = bn.args[0]
    if not isinstance(x, relax.Var) or fn.uses.get(x, 0) != 1:
        return None
    params = [fn.const(a) for a in bn.args[1:5]]
    if any(p is None or p.ndim != 1 for p in params):
        return None
    gamma, beta, mean, var = (p.astype(np.float64) for p in params)
    if not bool(attrs.scale):
        gamma = np.ones_like(gamma)
    if not bool(attrs.center):
        beta = np.zeros_like(beta)
    bias_var, bias = None, None
    src = fn.value_of.get(x)
    if op_name(src) == "relax.add":
        a, b = src.args
        if not isinstance(a, relax.Var) or fn.uses.get(a, 0) != 1:
            return None
        bias = fn.const(b)
        if bias is None:
            return None
        bias_var, x, src = x, a, fn.value_of.get(a)
    if op_name(src) != "relax.nn.conv2d":
        return None
    ca = src.attrs
    if (str(ca.data_layout), str(ca.kernel_layout), str(ca.out_layout)) != (
        "NCHW",
        "OIHW",
        "NCHW",
    ):
        return None
    weight = fn.const(src.args[1])
    out = static_shape(x)
    if weight is None or out is None or len(out) != 4 or weight.shape[0] != out[1]:
        return None
    channels = out[1]
    if gamma.shape != (channels,):
        return None
    if bias is not None:
        if bias.size == 1:
            bias = np.full(channels, float(bias.reshape(())))
        elif bias.shape in ((1, channels, 1, 1), (channels, 1, 1)):
            bias = bias.reshape(channels)
        else:
            return None
    scale = gamma / np.sqrt(var + float(attrs.epsilon))
    shift = beta - mean * scale
    if bias is not None:
        shift = shift + bias.astype(np.float64) * scale
    return x, src, bias_var, weight, scale, shift


def fold_batch_norms(func: relax.Function) -> tuple[relax.Function, int]:
    """``func`` with every foldable conv + batch norm folded, and how many were folded."""
    if not isinstance(func.body, relax.SeqExpr):
        return func, 0
    fn = _Function(func)
    replace: dict[relax.Var, relax.Expr] = {}  # binding var -> new value
    drop: set[relax.Var] = set()
    bb = relax.BlockBuilder()
    folded = 0
    for var, value in fn.value_of.items():
        if op_name(value) != "relax.nn.batch_norm":
            continue
        getitems = [
            (v, e)
            for v, e in fn.value_of.items()
            if isinstance(e, relax.TupleGetItem) and e.tuple_value.same_as(var)
        ]
        if fn.uses.get(var, 0) != len(getitems):
            continue  # the tuple itself is used
        main_out = [v for v, e in getitems if e.index == 0]
        if len(main_out) != 1 or any(fn.uses.get(v, 0) for v, e in getitems if e.index != 0):
            continue
        found = _plan_fold(fn, var, value)
        if found is None:
            continue
        conv_var, conv, bias_var, weight, scale, shift = found
        dtype = weight.dtype
        new_w = (weight.astype(np.float64) * scale.reshape(-1, 1, 1, 1)).astype(dtype)
        replace[conv_var] = bb.normalize(
            relax.Call(conv.op, [conv.args[0], relax.const(new_w)], conv.attrs, conv.ty_args)
        )
        shift_c = relax.const(shift.astype(dtype).reshape(1, -1, 1, 1))
        replace[main_out[0]] = bb.normalize(relax.op.add(conv_var, shift_c))
        drop.add(var)
        drop.update(v for v, _ in getitems if not v.same_as(main_out[0]))
        if bias_var is not None:
            drop.add(bias_var)
            operand = fn.value_of[bias_var].args[1]
            if isinstance(operand, relax.Var) and fn.uses.get(operand, 0) == 1:
                drop.add(operand)  # the reshaped bias constant, now unused
        folded += 1
    if not folded:
        return func, 0
    bindings = {var: [relax.VarBinding(var, value)] for var, value in replace.items()}
    return rebuild(func, drop, bindings), folded


@tvm.transform.module_pass(opt_level=0, name="codl.FoldBatchNorm")
class FoldBatchNorm:
    """Fold inference batch norms into the convs before them, in every Relax function."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_functions(mod, fold_batch_norms)
