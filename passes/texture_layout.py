"""Compute GPU operators in the texture layout: NCHW4c activations, OIHW4o weights.

CoDL keeps GPU tensors in OpenCL images (the "GPU-friendly type", 3.5x faster convs on
Adreno). TVM reaches images through 5-D tensors whose innermost axis is 4 (one RGBA pixel):
its Adreno backend gives them ``global.texture*`` scopes (``AnnotateCustomMemoryScope``) and
its Adreno conv legalization computes ``NCHW4c`` data with ``OIHW4o`` weights. TVM's own way
there, ``ConvertLayout``, segfaults in the pinned apache-tvm-ffi for every packed layout, so
this pass writes the packed graph itself. Before (``main`` after ``FoldConstant``)::

    y = R.nn.conv2d(x, W, padding=[1, 1, 1, 1])      # x (1, 32, 56, 56), W (32, 32, 3, 3)
    z = R.add(y, B)                                  # B (1, 32, 1, 1)
    r = R.nn.relu(z)
    p = R.nn.max_pool2d(r, pool_size=[2, 2], strides=[2, 2])
    o = R.nn.softmax(p, axis=1)                      # not covered: reads NCHW

after::

    x4 = R.layout_transform(x, lambda n, c, h, w: (n, c // 4, h, w, c % 4))
    y4 = R.nn.conv2d(x4, W4, padding=[1, 1, 1, 1], data_layout="NCHW4c",
                     kernel_layout="OIHW4o", out_layout="NCHW4c")   # W4 (8, 32, 3, 3, 4)
    z4 = R.add(y4, B4)                               # B4 (8, 1, 1, 4)
    r4 = R.nn.relu(z4)
    p4 = R.nn.max_pool2d(r4, pool_size=[2, 2], strides=[2, 2], layout="NCHW4c",
                         out_layout="NCHW4c")
    p = R.layout_transform(p4, lambda n, c, h, w, i: (n, c * 4 + i, h, w))
    o = R.nn.softmax(p, axis=1)

``W4`` and ``B4`` are constants arranged here, at build time (CoDL pre-arranges weights once
per plan): no weight is transformed at run time. A per-channel constant becomes 4-D
``(C/4, 1, 1, 4)``, which broadcasts like the 5-D one but which TVM's scope annotation keeps in
a buffer (it puts every small 5-D tensor in a ``texture-weight`` image, and the VM uploads
constants into buffers only). Packed values flow from op to op; a value is unpacked (one
``layout_transform`` binding its old variable) only where something else reads it, so a chain
of covered operators stays in the texture layout and converts at its ends only.

Covered: 2-D convs with constant OIHW weights (``groups == 1``, output channels a multiple
of 4, NCHW in and out; input channels short of a whole pixel, as an RGB image's, are padded
with zero channels in the packed input and the weights), max and average 2-D pools
(:data:`POOL_OPS`), the elementwise unary ops of :data:`UNARY_OPS`, and the binary ops of
:data:`BINARY_OPS` between two packed tensors of one shape or with a per-channel
``(1, C, 1, 1)`` / ``(C, 1, 1)`` or scalar constant, and concats along channels whose every
input has whole pixels of channels (``C % 4 == 0``: SqueezeNet's and Inception's branches
join without a conversion). Pools, elementwise ops and concats are packed only behind a packed
producer (never at a chain's start). With :data:`FULL_COVERAGE` (:class:`ToTextureLayout` and
co-executed GPU parts, :mod:`.texture_parts`) also depthwise convs (``groups`` equal to the
input and output channels, a multiple of 4; weights :func:`pack_depthwise`'s
``(C/4, 1, KH, KW, 4)``), packed like dense convs, and means over H and W keeping their dims
(ONNX's GlobalAveragePool) behind a packed producer, as an NCHW4c
``adaptive_avg_pool2d`` to ``(N, C/4, 1, 1, 4)``: TVM's scope annotation lets a pool, not a
reduction, read an image. Grouped convs that are not depthwise, depthwise convs over channels
short of whole pixels (the zero channels would reach the output) or with a channel multiplier,
and means that drop H and W stay NCHW. It also lets a binary op of two packed tensors
broadcast over H and W (a squeeze-and-excitation block's scale). Static shapes only. Run after
``FoldConstant`` (the frontend's bias ``reshape`` must already be a constant) and before any
legalization; the result is what TVM's Adreno pipeline expects after its ``ConvertLayout``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from codl_tvm.core.plan import static_shape

from .rewrite import op_name, rewrite_functions

__all__ = [
    "BINARY_OPS",
    "FULL_COVERAGE",
    "MEAN_OP",
    "PACK",
    "POOL_OPS",
    "UNARY_OPS",
    "Coverage",
    "PackedFunction",
    "ToTextureLayout",
    "pack_bias",
    "pack_depthwise",
    "pack_function",
    "pack_nchw",
    "pack_oihw",
    "to_texture_layout",
    "unpacked_reason",
]

#: Channels per pixel of an OpenCL RGBA image.
PACK = 4

#: Elementwise ops of one tensor computed on packed tensors as they are.
UNARY_OPS = frozenset(
    {
        "relax.nn.relu",
        "relax.sigmoid",
        "relax.tanh",
        "relax.exp",
        "relax.negative",
        "relax.abs",
        "relax.sqrt",
        "relax.clip",
        "relax.nn.silu",
        "relax.nn.leakyrelu",
        # casts: a float16 build computes an op without a half policy (LeakyReLU) in float32
        "relax.astype",
    }
)

#: 2-D pools computed on packed tensors (NCHW4c layout attributes).
POOL_OPS = frozenset({"relax.nn.max_pool2d", "relax.nn.avg_pool2d"})

#: Elementwise ops of two tensors (broadcasting a per-channel or scalar constant).
BINARY_OPS = frozenset(
    {
        "relax.add",
        "relax.subtract",
        "relax.multiply",
        "relax.divide",
        "relax.maximum",
        "relax.minimum",
    }
)

#: A mean over H and W (ONNX's GlobalAveragePool) computed on packed tensors.
MEAN_OP = "relax.mean"

_FLOATS = frozenset({"float32", "float16"})


def pack_nchw(x: np.ndarray) -> np.ndarray:
    """``x`` (N, C, H, W) as NCHW4c (N, C/4, H, W, 4): channel ``4k + i`` at ``[:, k, ..., i]``."""
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n, c // PACK, PACK, h, w).transpose(0, 1, 3, 4, 2))


def pack_oihw(w: np.ndarray) -> np.ndarray:
    """Conv weights (O, I, KH, KW) as OIHW4o (O/4, I', KH, KW, 4), TVM's Adreno kernel layout;
    ``I'`` is ``I`` rounded up to whole pixels, the added input channels zero (they meet the
    zero channels that pad the packed input)."""
    o, i, kh, kw = w.shape
    w = np.pad(w, ((0, 0), (0, -i % PACK), (0, 0), (0, 0)))
    i = w.shape[1]
    return np.ascontiguousarray(w.reshape(o // PACK, PACK, i, kh, kw).transpose(0, 2, 3, 4, 1))


def pack_depthwise(w: np.ndarray) -> np.ndarray:
    """Depthwise conv weights (C, 1, KH, KW) as (C/4, 1, KH, KW, 4): OIHW4o with one input
    channel per group, so output pixel ``k`` of the packed conv reads input pixel ``k``
    (TVM's old Adreno depthwise kernel layout)."""
    c, m, kh, kw = w.shape
    return np.ascontiguousarray(w.reshape(c // PACK, PACK, m, kh, kw).transpose(0, 2, 3, 4, 1))


def pack_bias(b: np.ndarray) -> np.ndarray:
    """A per-channel constant of ``C`` values as (C/4, 1, 1, 4) (see the module docstring)."""
    flat = b.reshape(-1)
    return np.ascontiguousarray(flat.reshape(flat.size // PACK, 1, 1, PACK))


def _nchw_to_packed(n, c, h, w):
    return (n, c // PACK, h, w, c % PACK)


def _packed_to_nchw(n, c, h, w, i):
    return (n, c * PACK + i, h, w)


def _tensor_ok(expr: relax.Expr) -> bool:
    shape = static_shape(expr)
    return shape is not None and len(shape) == 4 and str(expr.ty.dtype) in _FLOATS


def _conv_ok(call: relax.Call) -> bool:
    a = call.attrs
    w = call.args[1]
    return (
        isinstance(w, tvm.ir.Constant)
        and _tensor_ok(call.args[0])
        and static_shape(w) is not None
        and static_shape(w)[0] % PACK == 0
        and int(a.groups) == 1
        and (str(a.data_layout), str(a.kernel_layout)) == ("NCHW", "OIHW")
        and str(a.out_layout) == "NCHW"
    )


def _depthwise_ok(call: relax.Call) -> bool:
    """A depthwise conv of multiplier 1 over whole pixels: ``groups`` equal to the input and
    output channels, a multiple of 4 (a padded pixel would carry its zero channels into the
    output and every consumer; depthwise convs of mobile CNNs have whole pixels)."""
    a = call.attrs
    w = call.args[1]
    shape = static_shape(w)
    data = static_shape(call.args[0])
    return (
        isinstance(w, tvm.ir.Constant)
        and _tensor_ok(call.args[0])
        and shape is not None
        and shape[1] == 1
        and shape[0] == data[1] == int(a.groups)
        and shape[0] % PACK == 0
        and (str(a.data_layout), str(a.kernel_layout)) == ("NCHW", "OIHW")
        and str(a.out_layout) == "NCHW"
    )


def _spatial_mean(call: relax.Call) -> bool:
    """A mean over exactly H and W of a 4-D tensor keeping its dims (ONNX's
    GlobalAveragePool); without them the result is no longer NCHW."""
    axis = call.attrs.axis
    if axis is None or not call.attrs.keepdims or len(static_shape(call.args[0]) or ()) != 4:
        return False
    return sorted(int(a) % 4 for a in axis) == [2, 3]


def _pixel_broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether NCHW shapes ``a`` and ``b`` agree on N and C and broadcast over H and W."""
    return a[:2] == b[:2] and all(x == y or 1 in (x, y) for x, y in zip(a[2:], b[2:]))


def _channel_constant(expr: relax.Expr, channels: int) -> np.ndarray | None:
    """The values of a per-channel constant broadcast over NCHW, else None."""
    if not isinstance(expr, tvm.ir.Constant):
        return None
    shape = static_shape(expr)
    if shape in ((1, channels, 1, 1), (channels, 1, 1)):
        return expr.value.numpy()
    return None


@dataclass(frozen=True)
class Coverage:
    """Operators packed beyond dense convs, pools, elementwise ops and concats.

    Attributes
    ----------
    depthwise
        Depthwise convs of multiplier 1 over whole pixels (weights pre-packed by
        :func:`pack_depthwise`), packed like dense convs, also at a chain's start.
    means
        Means over H and W keeping their dims behind a packed producer (ONNX's
        GlobalAveragePool), computed as an NCHW4c adaptive average pool to ``(N, C/4, 1, 1,
        4)``.
    broadcast
        Binary ops between two packed tensors of one N and C whose H and W broadcast (a
        squeeze-and-excitation block's ``(N, C, 1, 1)`` scale times its feature map): the
        packed shapes broadcast the same way, pixel by pixel.
    """

    depthwise: bool = False
    means: bool = False
    broadcast: bool = False


#: The coverage of GPU-alone texture builds (:class:`ToTextureLayout`).
FULL_COVERAGE = Coverage(depthwise=True, means=True, broadcast=True)


class _Packer:
    """Rewrites one dataflow block: ``packed`` maps an original variable to its packed value."""

    def __init__(
        self,
        uses: dict[relax.Var, list[relax.Expr]],
        outside: set[relax.Var],
        packable: Callable[[relax.Var], bool] | None = None,
        convert_operands: bool = False,
        behind_packed: Callable[[relax.Var], bool] | None = None,
        coverage: Coverage | None = None,
    ):
        self.uses = uses
        self.coverage = coverage or Coverage()
        self.outside = outside
        self.packable = packable
        self.behind_packed = behind_packed
        self.convert_operands = convert_operands
        self.packed: dict[relax.Var, relax.Var] = {}
        # every variable this packer binds -> the original binding it was made for (a packed
        # value's own, a conversion's first packed consumer's)
        self.owner: dict[relax.Var, relax.Var] = {}
        self._current: relax.Var | None = None
        # NCHW values converted for packed consumers (not packed producers: a pool reading one
        # still stays NCHW)
        self.converted: dict[relax.Var, relax.Var] = {}
        self.bindings: list[relax.Binding] = []
        self.changed = 0

    def bind(self, value: relax.Expr, hint: str, dataflow: bool) -> relax.Var:
        value = relax.BlockBuilder().normalize(value)
        var = (relax.DataflowVar if dataflow else relax.Var)(hint, value.ty)
        self.bindings.append(relax.VarBinding(var, value))
        if self._current is not None:
            self.owner[var] = self._current
        return var

    def operand(self, expr: relax.Expr, dataflow: bool) -> relax.Expr:
        """``expr`` packed: its packed value, or a new layout_transform of it."""
        if isinstance(expr, relax.Var) and expr in self.packed:
            return self.packed[expr]
        if isinstance(expr, relax.Var) and expr in self.converted:
            return self.converted[expr]  # one conversion for all its packed consumers
        name = expr.name if isinstance(expr, relax.Var) else "x"
        # channels short of a whole pixel (an RGB input) are padded with zeros
        pad = None if static_shape(expr)[1] % PACK == 0 else 0.0
        value = relax.op.layout_transform(expr, _nchw_to_packed, pad_value=pad)
        var = self.bind(value, f"{name}_4c", dataflow)
        if isinstance(expr, relax.Var):
            self.converted[expr] = var
        return var

    def packed_value(self, call: relax.Call, dataflow: bool) -> relax.Expr | None:
        """The packed version of ``call``, or None where it stays NCHW."""
        name = op_name(call)
        args = list(call.args)
        in_packed = [isinstance(a, relax.Var) and a in self.packed for a in args]
        if name == "relax.nn.conv2d" and self.coverage.depthwise and _depthwise_ok(call):
            return self._depthwise(call, dataflow)
        if name == "relax.nn.conv2d" and _conv_ok(call):
            a = call.attrs
            w4 = relax.const(pack_oihw(args[1].value.numpy()))
            x4 = self.operand(args[0], dataflow)
            return relax.op.nn.conv2d(
                x4,
                w4,
                strides=a.strides,
                padding=a.padding,
                dilation=a.dilation,
                groups=1,
                data_layout="NCHW4c",
                kernel_layout="OIHW4o",
                out_layout="NCHW4c",
                out_dtype=a.out_dtype,
            )
        if name in POOL_OPS and in_packed[0] and str(call.attrs.layout) == "NCHW":
            return self._pool(call)
        if name == MEAN_OP and self.coverage.means and in_packed[0] and _spatial_mean(call):
            # as TVM's Adreno backend: an adaptive pool, which its scope annotation (unlike
            # a reduction) lets read an image; (N, C/4, H, W, 4) -> (N, C/4, 1, 1, 4)
            return relax.op.nn.adaptive_avg_pool2d(
                self.packed[args[0]], output_size=[1, 1], layout="NCHW4c", out_layout="NCHW4c"
            )
        if name in UNARY_OPS and in_packed[0]:
            return relax.Call(call.op, [self.packed[args[0]], *args[1:]], call.attrs)
        if name in BINARY_OPS and any(in_packed[:2]):
            return self._binary(call, in_packed, dataflow)
        if name == "relax.concat":
            return self._concat(call, dataflow)
        return None

    def _concat(self, call: relax.Call, dataflow: bool) -> relax.Expr | None:
        """A concat along channels of tensors whose channels fill whole pixels, behind at
        least one packed producer: the packed tensors concatenated along ``C/4``."""
        parts = call.args[0]
        if not isinstance(parts, relax.Tuple) or call.attrs.axis is None:
            return None
        shapes = [static_shape(p) for p in parts.fields]
        if any(s is None or len(s) != 4 for s in shapes) or int(call.attrs.axis) not in (1, -3):
            return None
        if any(s[1] % PACK for s in shapes) or not any(p in self.packed for p in parts.fields):
            return None
        return relax.op.concat([self.operand(p, dataflow) for p in parts.fields], axis=1)

    def _depthwise(self, call: relax.Call, dataflow: bool) -> relax.Expr:
        """The depthwise conv on NCHW4c: each output pixel from the same input pixel."""
        a = call.attrs
        return relax.op.nn.conv2d(
            self.operand(call.args[0], dataflow),
            relax.const(pack_depthwise(call.args[1].value.numpy())),
            strides=a.strides,
            padding=a.padding,
            dilation=a.dilation,
            groups=int(a.groups),
            data_layout="NCHW4c",
            kernel_layout="OIHW4o",
            out_layout="NCHW4c",
            out_dtype=a.out_dtype,
        )

    def _pool(self, call: relax.Call) -> relax.Expr:
        a = call.attrs
        common = {
            "pool_size": a.pool_size,
            "strides": a.strides,
            "padding": a.padding,
            "dilation": a.dilation,
            "ceil_mode": bool(a.ceil_mode),
            "layout": "NCHW4c",
            "out_layout": "NCHW4c",
        }
        data = self.packed[call.args[0]]
        if op_name(call) == "relax.nn.max_pool2d":
            return relax.op.nn.max_pool2d(data, **common)
        return relax.op.nn.avg_pool2d(data, count_include_pad=bool(a.count_include_pad), **common)

    def _binary(self, call: relax.Call, in_packed: list[bool], dataflow: bool) -> relax.Expr | None:
        lhs, rhs = call.args[0], call.args[1]
        if all(in_packed[:2]):
            shapes = static_shape(lhs), static_shape(rhs)
            if shapes[0] != shapes[1] and not (
                self.coverage.broadcast and _pixel_broadcast(*shapes)
            ):
                return None
            return relax.Call(call.op, [self.packed[lhs], self.packed[rhs]], call.attrs)
        tensor, other = (lhs, rhs) if in_packed[0] else (rhs, lhs)
        channels = static_shape(tensor)[1]
        if (
            self.convert_operands
            and isinstance(other, relax.Var)
            and static_shape(other) == static_shape(tensor)
            and channels % PACK == 0
            and str(other.ty.dtype) == str(tensor.ty.dtype)
        ):
            converted = self.operand(other, dataflow)
            args = (
                [self.packed[tensor], converted]
                if in_packed[0]
                else [converted, self.packed[tensor]]
            )
            return relax.Call(call.op, args, call.attrs)
        if isinstance(other, tvm.ir.Constant) and static_shape(other) == ():
            new_other = other
        else:
            values = _channel_constant(other, channels)
            if values is None:
                return None
            new_other = relax.const(pack_bias(values))
        args = (
            [self.packed[tensor], new_other] if in_packed[0] else [new_other, self.packed[tensor]]
        )
        return relax.Call(call.op, args, call.attrs)

    def _all_packed(self, value) -> bool:
        """Whether every variable ``value`` reads (a call's arguments, a tuple's fields) is
        packed: an operator that reads only packed values needs no conversion."""
        if not isinstance(value, relax.Call):
            return False
        args = []
        for a in value.args:
            args.extend(a.fields if isinstance(a, relax.Tuple) else [a])
        tensors = [a for a in args if isinstance(a, relax.Var)]
        return bool(tensors) and all(a in self.packed for a in tensors)

    def needs_nchw(self, var: relax.Var, covered: set[relax.Expr]) -> bool:
        """Whether anything but a packed consumer reads ``var``."""
        return var in self.outside or any(u not in covered for u in self.uses.get(var, ()))

    def run(self, block: relax.BindingBlock) -> relax.BindingBlock:
        dataflow = isinstance(block, relax.DataflowBlock)
        pending: list[tuple[relax.Var, relax.Var]] = []
        covered: set[relax.Expr] = set()
        for binding in block.bindings:
            value = binding.value if isinstance(binding, relax.VarBinding) else None
            if self.packable is not None and not self.packable(binding.var):
                follows = self.behind_packed is not None and self.behind_packed(binding.var)
                if not (follows and self._all_packed(value)):
                    value = None
            self._current = binding.var
            new = self.packed_value(value, dataflow) if isinstance(value, relax.Call) else None
            if new is None:
                self.bindings.append(binding)
                continue
            covered.add(value)
            self.changed += 1
            var4 = self.bind(new, f"{binding.var.name}_4c", dataflow)
            self.packed[binding.var] = var4
            pending.append((binding.var, var4))
        self._current = None
        # unpack in a second sweep: whether a value is read as NCHW is known once every
        # consumer of it has been seen; the unpack is placed right after the packed binding
        if not pending:
            return block
        unpack = {
            var4: var
            for var, var4 in pending
            if self.needs_nchw(var, covered) or not isinstance(var, relax.DataflowVar)
        }
        out: list[relax.Binding] = []
        for b in self.bindings:
            out.append(b)
            var = unpack.get(b.var)
            if var is not None:
                value = relax.BlockBuilder().normalize(
                    relax.op.layout_transform(b.var, _packed_to_nchw)
                )
                out.append(relax.VarBinding(var, value))
        kind = relax.DataflowBlock if dataflow else relax.BindingBlock
        return kind(out)


def _uses(func: relax.Function) -> tuple[dict[relax.Var, list[relax.Expr]], set[relax.Var]]:
    """Each variable's consuming values, and the variables read by the function's result."""
    uses: dict[relax.Var, list[relax.Expr]] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            if isinstance(binding, relax.VarBinding):
                for var in relax.analysis.free_vars(binding.value):
                    uses.setdefault(var, []).append(binding.value)
    return uses, set(relax.analysis.free_vars(func.body.body))


@dataclass(frozen=True)
class PackedFunction:
    """The result of :func:`pack_function`.

    Attributes
    ----------
    func
        The function with its covered operators in NCHW4c.
    changed
        How many operators were rewritten.
    owners
        Every variable name the rewrite bound anew -> the name of the original binding it was
        made for (a packed value's own; a conversion's first packed consumer's).
    """

    func: relax.Function
    changed: int
    owners: dict[str, str] = field(default_factory=dict)


def pack_function(
    func: relax.Function,
    packable: Callable[[relax.Var], bool] | None = None,
    convert_operands: bool = False,
    behind_packed: Callable[[relax.Var], bool] | None = None,
    coverage: Coverage | None = None,
) -> PackedFunction:
    """``func`` with its covered operators computing in NCHW4c (see the module docstring).

    ``packable``: only bindings whose variable it accepts are rewritten (None: all), e.g. the
    GPU parts of a co-executed build. ``convert_operands``: a binary op between a packed tensor
    and an NCHW variable of the same shape (a residual add reading a slice) converts the
    variable instead of unpacking the packed one; off in GPU-alone builds, where the NCHW
    operand comes from an operator left in buffers anyway. ``behind_packed``: bindings
    ``packable`` refuses that are rewritten all the same where every variable they read is
    packed (in a co-executed build: operators outside the plan that read only GPU parts'
    packed results, which the placement then puts on the GPU, as it does every kernel whose
    inputs all come from it). ``coverage``: what else is packed (:class:`Coverage`; None:
    none of it; :class:`ToTextureLayout` and co-executed GPU parts ask for all of it).
    """
    if not isinstance(func.body, relax.SeqExpr):
        return PackedFunction(func, 0)
    uses, outside = _uses(func)
    blocks, changed, owners = [], 0, {}
    for block in func.body.blocks:
        packer = _Packer(uses, outside, packable, convert_operands, behind_packed, coverage)
        blocks.append(packer.run(block))
        changed += packer.changed
        owners.update({new.name: old.name for new, old in packer.owner.items()})
    if not changed:
        return PackedFunction(func, 0)
    body = relax.BlockBuilder().normalize(relax.SeqExpr(blocks, func.body.body))
    new_func = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
    return PackedFunction(new_func, changed, owners)


def to_texture_layout(func: relax.Function) -> tuple[relax.Function, int]:
    """``func`` with its covered operators computing in NCHW4c, and how many were rewritten."""
    packed = pack_function(func, coverage=FULL_COVERAGE)
    return packed.func, packed.changed


def unpacked_reason(call: relax.Expr) -> str:
    """Why the texture layout leaves ``call`` (an operator of a GPU part) in NCHW buffers."""
    name = op_name(call)
    if name is None:
        return "not an operator call"
    short = name.rpartition(".")[2]
    if name == "relax.nn.conv2d":
        a = call.attrs
        w = call.args[1]
        shape = static_shape(w)
        if not isinstance(w, tvm.ir.Constant) or shape is None:
            return "conv2d: its weights are not a build-time constant"
        if int(a.groups) != 1:
            return f"conv2d: grouped or depthwise (groups={int(a.groups)})"
        if shape[0] % PACK:
            return f"conv2d: {shape[0]} output channels, not a multiple of {PACK}"
        if not _tensor_ok(call.args[0]):
            return "conv2d: input not a static 4-D float tensor"
        return "conv2d: layouts other than NCHW/OIHW"
    if name in POOL_OPS or name in UNARY_OPS or name in BINARY_OPS or name == "relax.concat":
        return f"{short}: packed only behind a packed producer (with whole pixels of channels)"
    return f"{short}: not covered by the texture layout"


@tvm.transform.module_pass(opt_level=0, name="codl.ToTextureLayout")
class ToTextureLayout:
    """Rewrite covered GPU operators of every Relax function to the texture layout (NCHW4c
    data, OIHW4o weights pre-arranged as constants), converting only at chain ends."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_functions(mod, to_texture_layout)
