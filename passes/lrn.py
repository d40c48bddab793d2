"""Compute LRN's window over channels as shifted adds instead of a 3-D average pool.

TVM's ONNX frontend imports ``LRN`` (Inception v1, AlexNet) on an NCHW tensor ``x`` as

    s = multiply(x, x)      e = expand_dims(s, axis=[1])
    p = avg_pool3d(e, pool_size=[n, 1, 1], padding=[n//2, 0, 0, n//2, 0, 0], count_include_pad)
    q = squeeze(p, axis=[1])     ... multiply, add, power, divide(x, ...)

The pool slides a window of ``n`` channels over the 5-D tensor's depth axis. Neither
processor's schedules cover 3-D pools: the OpenCL build ran Inception v1's two LRNs as
serial kernels (a kernel trace on a 2-core VM's PoCL, a diagnosis and not a benchmark, put
nearly all of the model's time in them; on an emulated SoC (a 16-core Xeon, PoCL on 12 cores)
the GPU took 239 ms for the model, against 46 ms for ResNet50), and the CPU lane of its co-executed
build spent 2.5 of 15.6 ms on them at 4 threads (its timeline on the emulated SoC).
:class:`LRNWindowSum` rewrites ``q`` as the same average written with injective ops,

    z = pad(s, channels n//2 before and after)
    q = (slice(z, c 0..C) + slice(z, c 1..C+1) + ... + slice(z, c n-1..C+n-1)) / n

which FuseOps fuses with the square before and the elementwise tail after into one kernel per
LRN, scheduled like any elementwise kernel on either processor. The sum runs in the pool's
order (the window's channels in turn, zeros for the padding), then one division by ``n``, so
it matches the pool to rounding. ``q`` keeps its variable; the pool and the expanded copy are
dropped when nothing else uses them. No partitionable operator is touched (plans, which name
only those, still apply).
"""

from __future__ import annotations

import tvm
from tvm import relax

from codl_tvm.core.plan import static_shape

from .rewrite import Bindings, op_name, rebuild, rewrite_functions

__all__ = ["LRNWindowSum", "lrn_window_sums"]


def _channel_window(pool: relax.Call, expanded_shape) -> int | None:
    """The window size ``n`` of an average pool over the depth axis only (what the frontend
    makes of LRN), else None."""
    a = pool.attrs
    size = [int(v) for v in a.pool_size]
    if len(size) != 3 or size[1:] != [1, 1] or size[0] % 2 != 1:
        return None
    n = size[0]
    if [int(v) for v in a.strides] != [1, 1, 1] or [int(v) for v in a.dilation] != [1, 1, 1]:
        return None
    if [int(v) for v in a.padding] != [n // 2, 0, 0, n // 2, 0, 0]:
        return None
    if not bool(a.count_include_pad) or bool(a.ceil_mode):
        return None
    if str(a.layout) != "NCDHW" or str(a.out_layout) != "NCDHW":
        return None
    if expanded_shape is None or len(expanded_shape) != 5 or expanded_shape[1] != 1:
        return None
    return n


def lrn_window_sums(func: relax.Function) -> tuple[relax.Function, int]:
    """``func`` with every LRN channel-window pool written as shifted adds, and how many."""
    if not isinstance(func.body, relax.SeqExpr):
        return func, 0
    scan = Bindings(func)
    value_of, uses = scan.value_of, scan.uses
    replace: dict[relax.Var, list[relax.VarBinding]] = {}
    drop: set[relax.Var] = set()
    for var, value in value_of.items():
        if op_name(value) != "relax.squeeze" or [int(v) for v in value.attrs.axis or []] != [1]:
            continue
        pooled = value.args[0]
        pool = value_of.get(pooled) if isinstance(pooled, relax.Var) else None
        if op_name(pool) != "relax.nn.avg_pool3d" or uses.get(pooled, 0) != 1:
            continue
        expanded = pool.args[0]
        expand = value_of.get(expanded) if isinstance(expanded, relax.Var) else None
        if op_name(expand) != "relax.expand_dims" or [int(v) for v in expand.attrs.axis] != [1]:
            continue
        n = _channel_window(pool, static_shape(expanded))
        src = expand.args[0]
        shape = static_shape(var)
        if n is None or shape is None or len(shape) != 4 or static_shape(src) != shape:
            continue
        replace[var] = _window_bindings(src, n, shape[1], var)
        drop.add(pooled)
        if uses.get(expanded, 0) == 1:
            drop.add(expanded)
    if not replace:
        return func, 0
    return rebuild(func, drop, replace), len(replace)


def _window_bindings(src: relax.Expr, n: int, channels: int, var: relax.Var):
    """Bindings computing the average of ``n`` channels around each channel of ``src`` (zeros
    outside), the last one binding ``var``; inner values get ``<var>_lrn<i>`` variables."""
    bb = relax.BlockBuilder()
    bindings: list[relax.VarBinding] = []

    def bind(call) -> relax.Var:
        call = bb.normalize(call)
        inner = type(var)(f"{var.name}_lrn{len(bindings)}", call.ty)  # DataflowVar in a block
        bindings.append(relax.VarBinding(inner, call))
        return inner

    half = n // 2
    acc = src  # a window of one channel
    if half:
        padded = bind(relax.op.nn.pad(src, [0, 0, half, half, 0, 0, 0, 0]))
        for k in range(n):
            part = bind(relax.op.strided_slice(padded, axes=[1], begin=[k], end=[k + channels]))
            acc = part if k == 0 else bind(relax.op.add(acc, part))
    dtype = str(src.ty.dtype)
    total = bb.normalize(relax.op.divide(acc, relax.const(float(n), dtype)))
    bindings.append(relax.VarBinding(var, total))
    return bindings


@tvm.transform.module_pass(opt_level=0, name="codl.LRNWindowSum")
class LRNWindowSum:
    """Write LRN's channel-window average pools as shifted adds, in every Relax function."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_functions(mod, lrn_window_sums)
