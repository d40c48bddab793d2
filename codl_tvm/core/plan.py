"""Partition plans: which operators are split between GPU and CPU, along which dimension, how much.

A :class:`PartitionPlan` is the contract between the planner (or a user, or a file) and the
partitioning passes (``codl_tvm.passes``). It is versioned JSON::

    {
      "version": 1,
      "model_fingerprint": "9c1e...",            # optional
      "home": "cpu",                             # optional, default "gpu"
      "ops":    [{"op": "conv2d_0", "dim": "H", "ratio": 0.5}],
      "chains": [{"ops": ["conv2d_2", "max_pool2d_3"], "dim": "H", "ratio": 0.4}],
      "order": ["conv2d_2..max_pool2d_3", "conv2d_0"]   # optional
    }

``ratio`` is the GPU's share rho in [0, 1] (0: CPU only, 1: GPU only). The GPU gets the first
``rho`` of the output rows (H) or output channels (OC), the CPU the rest.

``order`` (optional) is the order in which the build issues the entries' kernels (named like
the parts record names them: the operator, ``first..last`` for a chain), e.g. the dispatch order
of a placement schedule that runs independent branches on both processors at once; entries not
named, and the kernels between them, come as early as their inputs allow
(:class:`~codl_tvm.passes.order.OrderSplits`). Without it ``main``'s order is kept.

``home`` is the processor of the kernels outside every partition (batch norms, softmax, concats,
residual adds, ...) whose inputs do not decide: such a kernel runs where its inputs were computed
and, when they come from both processors, from a merged split or from the model's inputs, on
``home``. CoDL keeps data on the GPU; the planner sets ``home`` to the processor it predicts
faster for the whole model.

Operator names
--------------
Operators are named by :func:`partitionable_ops`: the calls of ``main`` to ``relax.nn.conv2d``,
``relax.nn.max_pool2d``, ``relax.nn.avg_pool2d`` and ``relax.matmul``, numbered in binding order
(one counter over all kinds) and named ``f"{kind}_{index}"``, e.g. ``conv2d_0``, ``max_pool2d_1``,
``conv2d_2``, ``matmul_3``. The numbering depends only on the order of those calls in ``main``, so
it is stable for a given model import (the ONNX frontend emits nodes in graph order); the optional
``model_fingerprint`` (:func:`model_fingerprint`: kinds, shapes and attributes of all of them)
catches a plan applied to a different model. Names refer to the module *before* partitioning.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codl_tvm.core.errors import PlanError

__all__ = [
    "PLAN_VERSION",
    "ChainPlan",
    "OpInfo",
    "OpPartition",
    "PartitionDim",
    "PartitionPlan",
    "PlanError",
    "model_fingerprint",
    "partitionable_bindings",
    "partitionable_ops",
    "static_shape",
    "uniform_plan",
]

PLAN_VERSION = 1


class PartitionDim(str, enum.Enum):
    """The dimension an operator is split along: output rows (H) or output channels (OC)."""

    H = "H"
    OC = "OC"

    @classmethod
    def parse(cls, value: PartitionDim | str, where: str = "plan") -> PartitionDim:
        if isinstance(value, PartitionDim):
            return value
        try:
            return cls(str(value).upper())
        except ValueError:
            raise PlanError(
                f"{where}: unknown partition dimension {value!r}; "
                f"expected one of {[d.value for d in cls]}"
            ) from None


def _check_ratio(ratio: Any, where: str) -> float:
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
        raise PlanError(f"{where}: ratio must be a number in [0, 1], got {ratio!r}")
    value = float(ratio)
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise PlanError(f"{where}: ratio {ratio!r} is outside [0, 1]")
    return value


@dataclass(frozen=True)
class OpPartition:
    """One operator split on its own: its input is shared, its parts merged right after it."""

    op: str
    dim: PartitionDim
    ratio: float

    def __post_init__(self):
        if not isinstance(self.op, str) or not self.op:
            raise PlanError(
                f"op partition: operator name must be a non-empty string, got {self.op!r}"
            )
        object.__setattr__(self, "dim", PartitionDim.parse(self.dim, f"op {self.op}"))
        object.__setattr__(self, "ratio", _check_ratio(self.ratio, f"op {self.op}"))

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "dim": self.dim.value, "ratio": self.ratio}


@dataclass(frozen=True)
class ChainPlan:
    """Consecutive operators split with one dimension and ratio (CoDL section 4.2).

    Each processor computes its share of the chain's last output from the chain's input alone,
    recomputing the halo rows it needs; data is shared only at chain entry and exit.
    """

    ops: tuple[str, ...]
    dim: PartitionDim
    ratio: float

    def __post_init__(self):
        ops = tuple(self.ops) if not isinstance(self.ops, str) else (self.ops,)
        if not ops or not all(isinstance(o, str) and o for o in ops):
            raise PlanError(f"chain {list(ops)}: needs a non-empty list of operator names")
        if len(set(ops)) != len(ops):
            raise PlanError(f"chain {list(ops)}: an operator appears twice")
        object.__setattr__(self, "ops", ops)
        where = f"chain {list(ops)}"
        object.__setattr__(self, "dim", PartitionDim.parse(self.dim, where))
        object.__setattr__(self, "ratio", _check_ratio(self.ratio, where))

    def to_dict(self) -> dict[str, Any]:
        return {"ops": list(self.ops), "dim": self.dim.value, "ratio": self.ratio}


@dataclass(frozen=True)
class PartitionPlan:
    """A versioned set of operator partitions and chains; operators not named run unsplit."""

    ops: tuple[OpPartition, ...] = ()
    chains: tuple[ChainPlan, ...] = ()
    model_fingerprint: str | None = None
    version: int = PLAN_VERSION
    home: str = "gpu"
    #: GPU share of the channel blocks (InstanceNorm) split after a split, with
    #: ``PartitionOperators(channel_blocks=True)``; None: each block takes its split's ratio.
    block_ratio: float | None = None
    #: Entry names (:meth:`entry_name`) in the order their kernels are issued; () keeps main's.
    order: tuple[str, ...] = ()

    def __post_init__(self):
        if self.version != PLAN_VERSION:
            raise PlanError(
                f"plan version {self.version!r} is not supported (this codl-tvm "
                f"reads version {PLAN_VERSION})"
            )
        if self.home not in ("gpu", "cpu"):
            raise PlanError(f"plan: home must be 'gpu' or 'cpu', got {self.home!r}")
        if self.block_ratio is not None:
            object.__setattr__(self, "block_ratio", _check_ratio(self.block_ratio, "block_ratio"))
        object.__setattr__(self, "ops", tuple(self.ops))
        object.__setattr__(self, "chains", tuple(self.chains))
        seen: dict[str, str] = {}
        for entry in self.entries():
            where = f"chain {list(entry.ops)}" if len(entry.ops) > 1 else f"op {entry.ops[0]}"
            for name in entry.ops:
                if name in seen:
                    raise PlanError(
                        f"{where}: operator {name} is already partitioned by {seen[name]}"
                    )
                seen[name] = where
        order = (self.order,) if isinstance(self.order, str) else tuple(self.order)
        object.__setattr__(self, "order", order)
        names = [self.entry_name(e) for e in self.entries()]
        for name in order:
            if not isinstance(name, str) or name not in names:
                raise PlanError(
                    f"plan: order names {name!r}, which is no entry of the plan (entries: "
                    f"{', '.join(names[:8]) or 'none'}{', ...' if len(names) > 8 else ''})"
                )
        if len(set(order)) != len(order):
            raise PlanError(f"plan: order names an entry twice: {list(order)}")

    @staticmethod
    def entry_name(entry: ChainPlan | OpPartition) -> str:
        """The name of an entry in ``order`` and in the parts record: its operator, or
        ``first..last`` for a chain."""
        ops = (entry.op,) if isinstance(entry, OpPartition) else entry.ops
        return ops[0] if len(ops) == 1 else f"{ops[0]}..{ops[-1]}"

    def entries(self) -> list[ChainPlan]:
        """Every partition as a chain (an :class:`OpPartition` is a chain of one operator)."""
        return [ChainPlan((p.op,), p.dim, p.ratio) for p in self.ops] + list(self.chains)

    # -- JSON -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version}
        if self.model_fingerprint is not None:
            out["model_fingerprint"] = self.model_fingerprint
        out["home"] = self.home
        if self.block_ratio is not None:
            out["block_ratio"] = self.block_ratio
        out["ops"] = [p.to_dict() for p in self.ops]
        out["chains"] = [c.to_dict() for c in self.chains]
        if self.order:
            out["order"] = list(self.order)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PartitionPlan:
        if not isinstance(data, Mapping):
            raise PlanError(f"plan: expected a JSON object, got {type(data).__name__}")
        unknown = set(data) - {
            "version",
            "model_fingerprint",
            "home",
            "block_ratio",
            "ops",
            "chains",
            "order",
        }
        if unknown:
            raise PlanError(f"plan: unknown field(s) {sorted(unknown)}")
        if "version" not in data:
            raise PlanError("plan: missing 'version'")
        version = data["version"]
        if version != PLAN_VERSION:
            raise PlanError(
                f"plan version {version!r} is not supported (this codl-tvm reads "
                f"version {PLAN_VERSION})"
            )
        ops = [
            _entry(OpPartition, e, ("op", "dim", "ratio"), i, "ops")
            for i, e in enumerate(data.get("ops", []))
        ]
        chains = [
            _entry(ChainPlan, e, ("ops", "dim", "ratio"), i, "chains")
            for i, e in enumerate(data.get("chains", []))
        ]
        fp = data.get("model_fingerprint")
        if fp is not None and not isinstance(fp, str):
            raise PlanError(f"plan: model_fingerprint must be a string, got {fp!r}")
        return cls(
            tuple(ops),
            tuple(chains),
            fp,
            version,
            data.get("home", "gpu"),
            data.get("block_ratio"),
            _names(data.get("order", []), "order"),
        )

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> PartitionPlan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"plan: not valid JSON ({exc})") from None
        return cls.from_dict(data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> PartitionPlan:
        p = Path(path)
        if not p.is_file():
            raise PlanError(f"{p}: no such plan file")
        try:
            return cls.from_json(p.read_text())
        except PlanError as exc:
            raise PlanError(f"{p}: {exc}") from None

    # -- against a module --------------------------------------------------------------------
    def validate(self, mod) -> dict[str, OpInfo]:
        """Check the plan against ``mod``; return its partitionable operators by name.

        Raises :class:`PlanError` for an operator name the module does not have, a dimension
        the operator cannot be split along, a chain whose operators are out of data-flow order,
        or a fingerprint that differs from the module's.
        """
        infos = partitionable_ops(mod)
        by_name = {i.name: i for i in infos}
        if self.model_fingerprint is not None:
            actual = model_fingerprint(mod, infos)
            if actual != self.model_fingerprint:
                raise PlanError(
                    f"plan was made for model fingerprint {self.model_fingerprint}, "
                    f"this module has {actual}"
                )
        for entry in self.entries():
            where = f"chain {list(entry.ops)}" if len(entry.ops) > 1 else f"op {entry.ops[0]}"
            for name in entry.ops:
                info = by_name.get(name)
                if info is None:
                    known = ", ".join(i.name for i in infos[:12]) or "none"
                    more = ", ..." if len(infos) > 12 else ""
                    raise PlanError(
                        f"{where}: the module has no partitionable operator "
                        f"{name!r} (it has: {known}{more})"
                    )
                if entry.dim not in info.dims:
                    raise PlanError(
                        f"{where}: {name} ({info.kind}, input {info.input_shape}) "
                        f"cannot be split along {entry.dim.value}: {info.reason}"
                    )
            idx = [by_name[n].index for n in entry.ops]
            if idx != sorted(idx):
                raise PlanError(f"{where}: operators are not in data-flow order")
        return by_name


def _names(data: Any, what: str) -> tuple[str, ...]:
    if not isinstance(data, list) or not all(isinstance(n, str) for n in data):
        raise PlanError(f"plan: {what} must be a list of entry names, got {data!r}")
    return tuple(data)


def _entry(cls, data: Any, keys: tuple[str, ...], i: int, what: str):
    if not isinstance(data, Mapping):
        raise PlanError(f"plan: {what}[{i}] must be an object, got {data!r}")
    missing = [k for k in keys if k not in data]
    unknown = set(data) - set(keys)
    if missing or unknown:
        raise PlanError(
            f"plan: {what}[{i}] {dict(data)}: missing {missing}, unknown {sorted(unknown)}"
        )
    return cls(**{k: data[k] for k in keys})


# -- operator discovery ----------------------------------------------------------------------

_KINDS = {
    "relax.nn.conv2d": "conv2d",
    "relax.nn.max_pool2d": "max_pool2d",
    "relax.nn.avg_pool2d": "avg_pool2d",
    "relax.matmul": "matmul",
}


@dataclass(frozen=True)
class OpInfo:
    """A partitionable operator of ``main``.

    Attributes
    ----------
    name
        ``f"{kind}_{index}"``, the name plans use.
    index
        Position among the partitionable calls of ``main`` in binding order.
    kind
        ``conv2d``, ``max_pool2d``, ``avg_pool2d`` or ``matmul``.
    var
        Name of the Relax variable the call is bound to (for messages; not unique in general).
    input_shape, weight_shape, output_shape
        Static shapes (``weight_shape`` is ``None`` for pools).
    attrs
        The attributes that matter for partitioning (strides, padding, ...), JSON-friendly.
    dims
        The dimensions it can be split along; ``reason`` says why one is missing.
    """

    name: str
    index: int
    kind: str
    var: str
    input_shape: tuple[int, ...]
    weight_shape: tuple[int, ...] | None
    output_shape: tuple[int, ...]
    attrs: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    dims: tuple[PartitionDim, ...] = ()
    reason: str = ""


def static_shape(expr) -> tuple[int, ...] | None:
    """The static shape of a Relax tensor expression, or ``None`` (not a tensor, or dynamic)."""
    # deferred here and below: plans are read where TVM is runtime-only (artifacts on a device),
    # and tvm.relax needs TVM's compiler
    from tvm import relax

    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    try:
        return tuple(int(v) for v in ty.shape.values)
    except (TypeError, AttributeError):
        return None


def _ints(values) -> list[int]:
    return [int(v) for v in values]


def _op_info(index: int, var, call) -> OpInfo:
    kind = _KINDS[call.op.name]
    name = f"{kind}_{index}"
    in_shape = static_shape(call.args[0])
    w_shape = static_shape(call.args[1]) if kind in ("conv2d", "matmul") else None
    out_shape = static_shape(var)
    attrs: dict[str, Any] = {}
    dims: tuple[PartitionDim, ...] = ()
    reason = ""
    a = call.attrs
    if in_shape is None or out_shape is None or (kind in ("conv2d", "matmul") and w_shape is None):
        reason = "shapes are not static"
    elif kind == "conv2d":
        attrs = {
            "strides": _ints(a.strides),
            "padding": _ints(a.padding),
            "dilation": _ints(a.dilation),
            "groups": int(a.groups),
        }
        layouts = (str(a.data_layout), str(a.kernel_layout), str(a.out_layout))
        if layouts != ("NCHW", "OIHW", "NCHW"):
            reason = f"layouts {layouts} are not (NCHW, OIHW, NCHW)"
        else:
            dims = (PartitionDim.H, PartitionDim.OC)
    elif kind in ("max_pool2d", "avg_pool2d"):
        attrs = {
            "pool_size": _ints(a.pool_size),
            "strides": _ints(a.strides),
            "padding": _ints(a.padding),
            "dilation": _ints(a.dilation),
            "ceil_mode": bool(a.ceil_mode),
            "count_include_pad": bool(a.count_include_pad),
        }
        layouts = (str(a.layout), str(a.out_layout))
        if layouts != ("NCHW", "NCHW"):
            reason = f"layouts {layouts} are not NCHW"
        else:
            dims = (PartitionDim.H, PartitionDim.OC)
    else:  # matmul
        if len(w_shape) < 2 or len(in_shape) < 1:
            reason = "matmul with a 1-D weight has no output channels"
        elif len(in_shape) < 2 or len(in_shape) != len(out_shape):
            # A part reads its input by the output's axes; a vector input, or one broadcast
            # against a batched weight, has fewer axes than the output.
            reason = (
                f"matmul with a {len(in_shape)}-D input and a {len(out_shape)}-D output is not "
                "split (an OC split needs input and output of the same rank, at least 2)"
            )
        else:
            dims = (PartitionDim.OC,)
            reason = "matmul is split along its output channels (OC) only"
    return OpInfo(
        name, index, kind, var.name, in_shape or (), w_shape, out_shape or (), attrs, dims, reason
    )


def iter_main_bindings(mod):
    """``(block, binding)`` for every binding of ``main`` in order (shared with the passes)."""
    from tvm import relax  # deferred: needs TVM's compiler (see static_shape)

    func = mod["main"]
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        raise PlanError("module: 'main' is not a Relax function in normal form")
    for block in func.body.blocks:
        for binding in block.bindings:
            yield block, binding


def partitionable_bindings(mod) -> list[tuple[OpInfo, object]]:
    """``(OpInfo, VarBinding)`` for each partitionable operator of ``main``, in binding order."""
    # deferred: needs TVM's compiler (see static_shape)
    import tvm
    from tvm import relax

    found: list[tuple[OpInfo, object]] = []
    for _, binding in iter_main_bindings(mod):
        value = getattr(binding, "value", None)
        if (
            isinstance(value, relax.Call)
            and isinstance(value.op, tvm.ir.Op)
            and value.op.name in _KINDS
        ):
            found.append((_op_info(len(found), binding.var, value), binding))
    return found


def partitionable_ops(mod) -> list[OpInfo]:
    """The partitionable operators of ``mod["main"]`` in binding order (see module docstring)."""
    return [info for info, _ in partitionable_bindings(mod)]


def model_fingerprint(mod, infos: Iterable[OpInfo] | None = None) -> str:
    """A short hash of the kinds, shapes and attributes of the module's partitionable operators."""
    infos = partitionable_ops(mod) if infos is None else infos
    desc = [
        [i.name, list(i.input_shape), list(i.weight_shape or ()), list(i.output_shape), i.attrs]
        for i in infos
    ]
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]


def uniform_plan(mod, dim: PartitionDim | str, ratio: float) -> PartitionPlan:
    """Split every partitionable operator of ``mod`` alone along ``dim``, GPU share ``ratio``.

    Operators that cannot be split along ``dim`` (e.g. ``matmul`` for H, or an NHWC conv) are left
    out of the plan and run unsplit.
    """
    d = PartitionDim.parse(dim, "uniform plan")
    r = _check_ratio(ratio, "uniform plan")
    infos = partitionable_ops(mod)
    ops = tuple(OpPartition(i.name, d, r) for i in infos if d in i.dims)
    return PartitionPlan(ops=ops, model_fingerprint=model_fingerprint(mod, infos))
