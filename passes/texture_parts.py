"""codl.PackGpuParts: the GPU parts of a co-executed model compute in the texture layout.

CoDL's hybrid data type: the GPU computes on images, the CPU on buffers. This pass rewrites the
operators of every GPU part that :class:`~codl_tvm.passes.texture_layout.ToTextureLayout`
covers to NCHW4c, with its coverage (:data:`~codl_tvm.passes.texture_layout.FULL_COVERAGE`:
depthwise convs of whole pixels, global average pools, broadcasts over H and W too; weights of
each GPU part packed at build time: the partition pass already gave each processor its own
slice, a depthwise conv's OC part its own channels and groups), and leaves the CPU parts as
they are. Conversions
sit at a GPU part's ends: its input (the shared NCHW tensor, or the slice of it the part reads)
is packed by the part's first packed operator, and its output is unpacked for the merge, so the
region the GPU part writes into the shared tensor is written by a conversion kernel
(``MergePartsInPlace`` then points it at the region) and the CPU reads plain buffers as before.
A chain's GPU part stays packed from its first operator to its last.

Preconditions: runs after :class:`~codl_tvm.passes.partition.PartitionOperators` and
``FoldConstant`` (a GPU part's bias must be a constant), before any legalization. Before (the
GPU part of an OC split of a conv, the bias add and ReLU its followers)::

    codl0_gpu_0_conv2d = R.nn.conv2d(x, W0)                      # W0 (8, 3, 3, 3)
    codl0_gpu_1_add = R.add(codl0_gpu_0_conv2d, B0)              # B0 (1, 8, 1, 1)
    codl0_gpu_2_relu = R.nn.relu(codl0_gpu_1_add)
    codl0_cpu_0_conv2d = R.nn.conv2d(x, W1)                      # the CPU part: unchanged
    ...
    codl0_out = R.concat((codl0_gpu_2_relu, codl0_cpu_2_relu), axis=1)

after::

    x_4c = R.layout_transform(x, lambda n, c, h, w: (n, c // 4, h, w, c % 4), pad_value=0.0)
    codl0_gpu_0_conv2d_4c = R.nn.conv2d(x_4c, W0_4o, data_layout="NCHW4c",
                                        kernel_layout="OIHW4o", out_layout="NCHW4c")
    codl0_gpu_1_add_4c = R.add(codl0_gpu_0_conv2d_4c, B0_4)      # B0_4 (2, 1, 1, 4)
    codl0_gpu_2_relu_4c = R.nn.relu(codl0_gpu_1_add_4c)
    codl0_gpu_2_relu = R.layout_transform(codl0_gpu_2_relu_4c,
                                          lambda n, c, h, w, i: (n, c * 4 + i, h, w))
    ...

An operator outside the plan that reads only packed values (a concat or a residual add of
two whole-GPU operators' results) is packed too: the placement puts a kernel whose inputs all
come from the GPU on the GPU, so it computes on images without a conversion.

``main``'s ``codl_parts`` record lists the new bindings in their part (so
:class:`~codl_tvm.passes.place.PlaceParts` puts the conversions on the GPU), and ``main``
gets a ``codl_texture_parts`` attribute (:data:`TEXTURE_PARTS_ATTR`, JSON): for every split, its
GPU part's data type (``"image"`` where at least one of its operators is packed, else
``"buffer"``), how many of its operators are packed, and why the others are not
(:func:`~codl_tvm.passes.texture_layout.unpacked_reason`, the first one); a row
:data:`OUTSIDE` counts the operators outside the plan that were packed. Whether a packed
tensor then lives in an image is decided after placement
(:class:`~codl_tvm.passes.texture_scopes.GpuImageScopes`).

With ``dtype="float16"`` (MACE's and TFLite's half GPU, the CPU parts in float32) every packed
value computes in half: a part's input is cast where it is packed, its weights and per-channel
constants are float16 constants, its convs write float16, and its result is cast back where it
is unpacked, so the region the GPU writes into the shared tensor, and all the CPU reads, stay
float32. The GPU part of the example above becomes::

    x_f16 = R.astype(x, "float16")
    x_4c = R.layout_transform(x_f16, lambda n, c, h, w: (n, c // 4, h, w, c % 4))
    codl0_gpu_0_conv2d_4c = R.nn.conv2d(x_4c, W0_4o, ..., out_dtype="float16")  # W0_4o half
    codl0_gpu_1_add_4c = R.add(codl0_gpu_0_conv2d_4c, B0_4)      # B0_4 half
    codl0_gpu_2_relu_4c = R.nn.relu(codl0_gpu_1_add_4c)
    codl0_gpu_2_relu_f16 = R.layout_transform(codl0_gpu_2_relu_4c,
                                              lambda n, c, h, w, i: (n, c * 4 + i, h, w))
    codl0_gpu_2_relu = R.astype(codl0_gpu_2_relu_f16, "float32")

(fusion makes each cast and its layout transform one conversion kernel: the cast in front of
the packing is inlined by
:class:`~codl_tvm.schedules.opencl_texture.TextureLayoutTransform`). Convs accumulate in half,
as the GPU-alone float16 build's (TVM's ``ToMixedPrecision(out_dtype="float16")``,
:func:`codl_tvm.build.texture.inference_passes`): the GPU parts then compute what the GPU-alone
half build computes, whose error and speed the profiles measure, and an Adreno's half rate
holds through the accumulation. Each row of the record then also says its part's ``dtype``
(``"float16"`` where operators are packed, else ``"float32"``).
"""

from __future__ import annotations

import json

import tvm
from tvm import relax

from .parts import PARTS_ATTR
from .rewrite import op_name
from .texture_layout import FULL_COVERAGE, PACK, pack_function, unpacked_reason

__all__ = [
    "DTYPES",
    "OUTSIDE",
    "TEXTURE_PARTS_ATTR",
    "PackGpuParts",
    "half_packed",
    "pack_gpu_parts",
    "texture_parts",
]

#: ``main``'s attribute recording each split's GPU part data type (JSON).
TEXTURE_PARTS_ATTR = "codl_texture_parts"

#: The record's row of the operators outside the plan packed behind GPU parts.
OUTSIDE = "(outside the plan)"

#: Data types the packed values of GPU parts can compute in.
DTYPES = ("float32", "float16")

_HALF = "float16"


def _bound_values(func: relax.Function) -> dict[str, relax.Expr]:
    return {
        b.var.name: b.value
        for block in func.body.blocks
        for b in block.bindings
        if isinstance(b, relax.VarBinding)
    }


def pack_gpu_parts(func: relax.Function, dtype: str = "float32") -> tuple[relax.Function, int]:
    """``func`` (a partitioned ``main``) with its GPU parts' covered operators in NCHW4c
    computing in ``dtype`` (:func:`half_packed` for ``"float16"``), its part record updated and
    its :data:`TEXTURE_PARTS_ATTR` written; and how many operators were rewritten."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype: one of {DTYPES}, got {dtype!r}")
    attrs = func.attrs
    if attrs is None or PARTS_ATTR not in attrs:
        return func, 0
    records = json.loads(str(attrs[PARTS_ATTR]))
    gpu_names = {
        name
        for rec in records
        for part in rec["parts"]
        if part["processor"] == "gpu"
        for name in part["bindings"]
    }
    in_parts = {name for rec in records for part in rec["parts"] for name in part["bindings"]}
    before = _bound_values(func)
    packed = pack_function(
        func,
        lambda var: var.name in gpu_names,
        convert_operands=True,
        behind_packed=lambda var: var.name not in in_parts,
        coverage=FULL_COVERAGE,
    )
    new, owners = packed.func, dict(packed.owners)
    if dtype == _HALF and packed.changed:
        new, added = half_packed(new, set(owners))
        # a cast belongs to the part of the conversion it sits with
        owners.update({name: owners.get(of, of) for name, of in added.items()})
    order = [b.var.name for block in new.body.blocks for b in block.bindings if b.var is not None]
    bound = set(order)
    # a packed value whose NCHW variable is gone (read only by packed operators) replaces it
    replaced = {
        old: name for name, old in owners.items() if old not in bound and name == f"{old}_4c"
    }
    summary = []
    for rec in records:
        for part in rec["parts"]:
            names = set(part["bindings"])
            # a conversion several parts read belongs to its first reader's part only
            part["bindings"] = [n for n in order if n in names or owners.get(n) in names]
        for key in ("input", "output"):
            if rec.get(key) in replaced:
                rec[key] = replaced[rec[key]]
        row = _gpu_part_summary(rec, before, owners)
        if dtype == _HALF and row["data_type"] != "none":
            row["dtype"] = _HALF if row["data_type"] == "image" else "float32"
        summary.append(row)
    outside = [n for n in before if n not in in_parts and owners.get(f"{n}_4c") == n]
    if outside:
        row = {"split": OUTSIDE, "dim": None, "data_type": "image", "packed_ops": str(len(outside))}
        if dtype == _HALF:
            row["dtype"] = _HALF
        summary.append(row)
    new = new.with_attr(PARTS_ATTR, json.dumps(records))
    new = new.with_attr(TEXTURE_PARTS_ATTR, json.dumps(summary))
    return new, max(packed.changed, 1)


def _packed_type(ty) -> bool:
    """Whether ``ty`` is an NCHW4c tensor type (5-D, pixels of :data:`PACK` channels)."""
    shape = getattr(ty, "shape", None)
    values = getattr(shape, "values", None)
    return values is not None and len(values) == 5 and int(values[-1]) == PACK


def _half_operand(expr: relax.Expr, remap: dict[relax.Var, relax.Var]) -> relax.Expr:
    """An operand of a packed operator in half: its halved variable, a float constant cast,
    a tuple's fields each; anything else (a ``PrimValue`` bound) as it is."""
    if isinstance(expr, relax.Var):
        return remap.get(expr, expr)
    if isinstance(expr, tvm.ir.Constant) and str(expr.ty.dtype) in DTYPES:
        return relax.const(expr.value.numpy().astype(_HALF))
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_half_operand(f, remap) for f in expr.fields])
    return expr


def _half_op(call: relax.Call, remap: dict[relax.Var, relax.Var]) -> relax.Expr:
    """A packed operator computing in half (see the module docstring: convs write float16)."""
    args = [_half_operand(a, remap) for a in call.args]
    name = op_name(call)
    if name == "relax.nn.conv2d":
        a = call.attrs
        return relax.op.nn.conv2d(
            args[0],
            args[1],
            strides=a.strides,
            padding=a.padding,
            dilation=a.dilation,
            groups=int(a.groups),
            data_layout=str(a.data_layout),
            kernel_layout=str(a.kernel_layout),
            out_layout=str(a.out_layout),
            out_dtype=_HALF,
        )
    if name == "relax.astype":  # a packed cast (a float16 model's): the part is in half
        return relax.op.astype(args[0], _HALF)
    return relax.Call(call.op, args, call.attrs)


def half_packed(func: relax.Function, new_names: set[str]) -> tuple[relax.Function, dict]:
    """``func`` (:func:`~codl_tvm.passes.texture_layout.pack_function`'s result, ``new_names``
    the variables it bound anew) with its packed values in float16: each packing conversion
    casts its NCHW input first, each packed operator computes in half (float constants cast),
    each unpacking conversion casts its result back to the type its variable had; and every
    cast's name -> the name of the binding it was added for.
    """
    remap: dict[relax.Var, relax.Var] = {}
    added: dict[str, str] = {}
    blocks = []
    for block in func.body.blocks:
        dataflow = isinstance(block, relax.DataflowBlock)
        out: list[relax.Binding] = []

        def bind(value: relax.Expr, name: str, _out=out, _dataflow=dataflow) -> relax.Var:
            value = relax.BlockBuilder().normalize(value)
            var = (relax.DataflowVar if _dataflow else relax.Var)(name, value.ty)
            _out.append(relax.VarBinding(var, value))
            return var

        for b in block.bindings:
            value = b.value if isinstance(b, relax.VarBinding) else None
            name = b.var.name
            if not isinstance(value, relax.Call) or not (
                name in new_names or any(v in remap for v in relax.analysis.free_vars(value))
            ):
                out.append(b)
                continue
            if op_name(value) == "relax.layout_transform" and not _packed_type(value.args[0].ty):
                # packing: the NCHW input cast to half, then packed
                src = value.args[0]
                stem = name[: -len("_4c")] if name.endswith("_4c") else name
                half = bind(relax.op.astype(src, _HALF), f"{stem}_f16")
                added[half.name] = name
                pad = value.attrs.pad_value  # a pixel's padding channels: zeros of half
                packed = relax.op.layout_transform(
                    half, value.attrs.index_map, None if pad is None else float(pad.value)
                )
                remap[b.var] = bind(packed, name)
            elif op_name(value) == "relax.layout_transform" and value.args[0] in remap:
                # unpacking: the half NCHW result cast back for its readers (the CPU, a merge)
                unpacked = bind(
                    relax.Call(value.op, [remap[value.args[0]]], value.attrs), f"{name}_f16"
                )
                added[unpacked.name] = name
                cast = relax.BlockBuilder().normalize(
                    relax.op.astype(unpacked, str(b.var.ty.dtype))
                )
                out.append(relax.VarBinding(b.var, cast))
            elif name in new_names and _packed_type(b.var.ty):
                remap[b.var] = bind(_half_op(value, remap), name)
            else:
                raise ValueError(f"{name}: reads a packed value but is no packed operator")
        blocks.append((relax.DataflowBlock if dataflow else relax.BindingBlock)(out))
    body = relax.BlockBuilder().normalize(relax.SeqExpr(blocks, func.body.body))
    new = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
    return new, added


def _gpu_part_summary(rec: dict, before: dict[str, relax.Expr], owners: dict[str, str]) -> dict:
    """The record of one split's GPU part: data type, packed operators, reasons."""
    gpu = [p for p in rec["parts"] if p["processor"] == "gpu"]
    row: dict = {"split": rec["name"], "dim": rec["dim"]}
    if not gpu:
        row.update(data_type="none", why="no GPU part (ratio 0)")
        return row
    mine = {owners.get(n, n) for n in gpu[0]["bindings"]}  # the names it bound before packing
    ops, packed_ops, reasons = 0, 0, []
    for name, value in before.items():
        if name not in mine or op_name(value) is None:
            continue
        if op_name(value) in ("relax.strided_slice", "relax.concat"):
            continue  # the part's input slice and weight slices: data movement, not operators
        ops += 1
        if owners.get(f"{name}_4c") == name:  # its own packed value (not a conversion of it)
            packed_ops += 1
        else:
            reasons.append(unpacked_reason(value))
    row["data_type"] = "image" if packed_ops else "buffer"
    row["packed_ops"] = f"{packed_ops}/{ops}"
    if reasons:
        # the first: later operators of a part mostly follow it (an op behind a conv left in
        # buffers is not packed because of that conv)
        row["why"] = reasons[0]
    return row


def texture_parts(mod: tvm.IRModule) -> list[dict] | None:
    """``main``'s :data:`TEXTURE_PARTS_ATTR` record, or None where it has none."""
    attrs = mod["main"].attrs
    if attrs is None or TEXTURE_PARTS_ATTR not in attrs:
        return None
    return json.loads(str(attrs[TEXTURE_PARTS_ATTR]))


@tvm.transform.module_pass(opt_level=0, name="codl.PackGpuParts")
class PackGpuParts:
    """Rewrite the covered operators of every GPU part of ``main`` to the texture layout (see
    the module docstring).

    Parameters
    ----------
    dtype
        What the packed values compute in: ``"float32"``, or ``"float16"`` (cast at the GPU
        parts' conversions; the CPU parts and the shared tensors stay float32).
    """

    def __init__(self, dtype: str = "float32") -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype: one of {DTYPES}, got {dtype!r}")
        self.dtype = dtype

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        main = mod.get_global_var("main")
        func, changed = pack_gpu_parts(mod[main], self.dtype)
        if not changed:
            return mod
        mod = mod.clone()
        mod.update_func(main, func)
        return mod
