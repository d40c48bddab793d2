"""Static shapes of an ONNX graph, and the shape computations they make constant.

Exporters trace shape arithmetic into the graph even where every shape is static. PyTorch's
``x.chunk(2, dim=1)`` (ShuffleNet v2's channel split) becomes::

    s = Shape(x); c = Gather(s, [1]); h = Div(Add(c, 1), 2)
    a = Slice(x, [0], Mul(h, 1), [1]); b = Slice(x, Mul(h, 1), Mul(h, 2), [1])

TVM 0.27's importer turns ``Shape(x)`` into a ``ShapeExpr`` but folds a ``Gather`` of it only for
a 0-d index: a 1-d index (``[1]`` above) becomes ``shape_to_tensor`` + ``take`` computed at run
time, so the Slice becomes ``dynamic_strided_slice`` with an unknown output shape. That unknown
shape spreads to the ops after it, and the build fails in LegalizeOps at the first op that
needs static shapes (``reshape``: "emit_te now only supports Tensor that has ShapeExpr shape").

:func:`fold_shape_computations` evaluates such computations before the import: every ``Shape``
or ``Size`` of a tensor whose shape is static, and every node whose inputs are then all
constant and that depends on one of them, becomes a ``Constant`` node. The Slice above then
has constant starts and ends, which TVM imports as a ``strided_slice`` of static shape.
"""

from __future__ import annotations

import logging

import numpy as np

__all__ = ["fold_shape_computations", "static_shapes"]

logger = logging.getLogger(__name__)

_DEFAULT_DOMAINS = ("", "ai.onnx")

#: Folded values larger than this stay computed by TVM: shape arithmetic is a few numbers, while
#: e.g. ConstantOfShape(Shape(x)) would embed a whole tensor in the model (TVM already builds
#: that from a constant shape).
_MAX_FOLDED_ELEMENTS = 1024


def static_shapes(model) -> dict[str, tuple[int, ...]]:
    """Static shapes of the graph's tensors, from the graph itself and ONNX shape inference.

    Parameters
    ----------
    model
        An ``onnx.ModelProto`` (not changed).

    Returns
    -------
    dict
        Tensor name to shape, for every initializer and every input, intermediate value or
        output whose dimensions are all known and positive.
    """
    import onnx  # deferred like frontend.load_onnx's import

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference rejects some valid models; the graph's own shapes remain
        inferred = model
    graph = inferred.graph
    shapes = {t.name: tuple(int(d) for d in t.dims) for t in graph.initializer}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        ttype = info.type.tensor_type
        if not ttype.HasField("shape"):
            continue
        dims = ttype.shape.dim
        if all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
            shapes[info.name] = tuple(int(d.dim_value) for d in dims)
    return shapes


def _has_subgraph(node) -> bool:
    return any(a.HasField("g") or len(a.graphs) for a in node.attribute)


def _names_used_in_subgraphs(graph) -> set[str]:
    """Every tensor name read by a node of a graph nested in ``graph`` (outer-scope reads)."""
    used: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                used.update(i for n in sub.node for i in n.input)
                used.update(_names_used_in_subgraphs(sub))
    return used


def _shape_value(node, shape: tuple[int, ...]) -> np.ndarray:
    """``Shape`` (with its opset-15 ``start``/``end``) or ``Size`` of a tensor of ``shape``."""
    if node.op_type == "Size":
        return np.array(int(np.prod(shape, dtype=np.int64)), np.int64)
    attrs = {a.name: int(a.i) for a in node.attribute}
    # ONNX clamps start/end after adding the rank to negative ones, as Python slicing does
    return np.array(shape[attrs.get("start", 0) : attrs.get("end", len(shape))], np.int64)


def fold_shape_computations(model):
    """``model`` with its static shape computations replaced by ``Constant`` nodes (see the
    module docstring); ``model`` itself when there are none (it is never changed in place).

    Only the main graph is folded; values read by nested graphs stay available. A node the
    ONNX reference evaluator cannot run, or whose result is larger than
    ``_MAX_FOLDED_ELEMENTS``, is left for TVM, as are nodes outside the default domain or with
    nested graphs.

    Parameters
    ----------
    model
        An ``onnx.ModelProto``.

    Returns
    -------
    onnx.ModelProto
        A model computing the same outputs.
    """
    import onnx  # deferred like frontend.load_onnx's import
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    if not any(n.op_type in ("Shape", "Size") and n.domain in _DEFAULT_DOMAINS for n in graph.node):
        return model
    shapes = static_shapes(model)
    opsets = {o.domain or "": o.version for o in model.opset_import}
    # constants already in the graph, converted only when a folded node reads them (the weights
    # of a large model are never copied)
    constant_protos = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in _DEFAULT_DOMAINS and len(node.output):
            constant_protos[node.output[0]] = node
    graph_inputs = {i.name for i in graph.input}
    folded: dict[str, np.ndarray] = {}  # outputs of folded nodes

    def value(name: str) -> np.ndarray | None:
        if name in folded:
            return folded[name]
        proto = constant_protos.get(name)
        if proto is None or name in graph_inputs:  # an initializer may be overridden by input
            return None
        if isinstance(proto, onnx.TensorProto):
            return numpy_helper.to_array(proto)
        try:
            (out,) = ReferenceEvaluator(proto, opsets=opsets).run(None, {})
        except Exception:  # e.g. a sparse value the reference evaluator does not take
            return None
        return np.asarray(out)

    folded_nodes = set()
    for k, node in enumerate(graph.node):
        if node.domain not in _DEFAULT_DOMAINS or _has_subgraph(node):
            continue
        if node.op_type in ("Shape", "Size"):
            shape = shapes.get(node.input[0])
            if shape is not None:
                folded[node.output[0]] = _shape_value(node, shape)
                folded_nodes.add(k)
            continue
        present = [i for i in node.input if i]
        if not present or not any(i in folded for i in present):
            continue  # not shape arithmetic: TVM folds constant subgraphs itself
        args = {i: value(i) for i in present}
        if any(v is None for v in args.values()):
            continue
        try:
            outs = ReferenceEvaluator(node, opsets=opsets).run(None, args)
        except Exception:  # an operator the reference evaluator lacks: TVM computes it
            logger.debug("not folding %s (%s): no reference evaluation", node.name, node.op_type)
            continue
        outs = [np.asarray(o) for o in outs]
        if any(o.size > _MAX_FOLDED_ELEMENTS for o in outs):
            continue
        for name, out in zip(node.output, outs):
            if name:
                folded[name] = out
        folded_nodes.add(k)
    if not folded_nodes:
        return model
    # a folded value stays as a Constant where something other than a folded node reads it
    read = {i for k, n in enumerate(graph.node) if k not in folded_nodes for i in n.input}
    read.update(o.name for o in graph.output)
    read.update(_names_used_in_subgraphs(graph))
    # the Constant operands of the folded arithmetic (Gather's index, Div's 2) go with it
    fed_folded = {i for k in folded_nodes for i in graph.node[k].input}
    dead = {
        k
        for k, n in enumerate(graph.node)
        if n.op_type == "Constant"
        and n.domain in _DEFAULT_DOMAINS
        and any(o in fed_folded for o in n.output)
        and not any(o in read for o in n.output)
    }
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for k, node in enumerate(graph.node):
        if k in dead:
            continue
        if k not in folded_nodes:
            nodes.append(node)
            continue
        for j, name in enumerate(node.output):
            if name in read:
                tensor = numpy_helper.from_array(folded[name], name)
                label = node.name if len(node.output) == 1 else f"{node.name}_{j}"
                nodes.append(helper.make_node("Constant", [], [name], name=label, value=tensor))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    logger.debug("folded %d static shape computations before import", len(folded_nodes))
    return out
