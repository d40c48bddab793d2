"""ONNX graph rewrites applied before TVM's ONNX importer, for operators it imports wrongly.

TVM 0.27's importer reads some operators without an attribute that changes their result; the
model then builds and runs with silently wrong outputs. Each such operator is either rewritten
here into ONNX operators TVM imports correctly (the operator's definition written out), or the
model is refused with a :class:`~codl_tvm.core.errors.ModelError` naming the node and attribute.

- ``SpaceToDepth`` with ``mode="CRD"`` (opset 28): TVM always emits the DCR order. Rewritten as
  ONNX defines CRD: ``Reshape(b, c, h/s, s, w/s, s)``, ``Transpose(0, 1, 3, 5, 2, 4)``,
  ``Reshape(b, c*s*s, h/s, w/s)``; the input's shape must be known statically (from the graph
  or ONNX shape inference).

``DepthToSpace`` (both modes) is imported correctly by TVM and left alone.

- ``BatchNormalization`` with ``training_mode=1`` and its running-mean/variance outputs used:
  TVM returns the input statistics unchanged for those outputs (``Y`` itself is right). Refused.
- ``Resize`` with ``antialias=1`` (ignored by TVM), with
  ``coordinate_transformation_mode="half_pixel_symmetric"`` (TVM's build fails), or with
  ``scales`` that do not map the input size to a whole output size: ONNX then maps coordinates
  with the scale itself, TVM with the ratio of the output and input sizes. Refused.
"""

from __future__ import annotations

import numpy as np

from codl_tvm.core.errors import ModelError
from codl_tvm.frontend.static_shapes import static_shapes

__all__ = ["rewrite_for_import"]

_DEFAULT_DOMAINS = ("", "ai.onnx")


def _mode(node) -> str:
    for attr in node.attribute:
        if attr.name == "mode":
            return attr.s.decode()
    return "DCR"


def _blocksize(node) -> int:
    for attr in node.attribute:
        if attr.name == "blocksize":
            return int(attr.i)
    return 0


def _needs_rewrite(node) -> bool:
    return (
        node.op_type == "SpaceToDepth" and node.domain in _DEFAULT_DOMAINS and _mode(node) != "DCR"
    )


def _training_statistics(node) -> bool:
    """A training-mode BatchNormalization whose running mean or variance output is used."""
    if node.op_type != "BatchNormalization" or node.domain not in _DEFAULT_DOMAINS:
        return False
    training = any(a.name == "training_mode" and a.i for a in node.attribute)
    return training and any(node.output[1:])


def _resize_checker(model):
    """A function from a node to why TVM's importer would give a wrong Resize ("" if fine)."""
    from onnx import numpy_helper  # deferred like frontend.load_onnx's import

    inits = {t.name: t for t in model.graph.initializer}
    shapes: dict[str, tuple[int, ...]] | None = None

    def problem(node) -> str:
        nonlocal shapes
        if node.op_type != "Resize" or node.domain not in _DEFAULT_DOMAINS:
            return ""
        attrs = {a.name: a for a in node.attribute}
        if "antialias" in attrs and attrs["antialias"].i:
            return "antialias=1 is ignored by TVM's ONNX importer"
        mode = attrs.get("coordinate_transformation_mode")
        if mode is not None and mode.s.decode() == "half_pixel_symmetric":
            return "coordinate_transformation_mode=half_pixel_symmetric is not supported by TVM"
        scales = node.input[2] if len(node.input) > 2 else ""
        sizes = node.input[3] if len(node.input) > 3 else ""
        if not scales or sizes or scales not in inits:
            return ""
        if shapes is None:
            shapes = static_shapes(model)
        shape = shapes.get(node.input[0])
        values = numpy_helper.to_array(inits[scales]).astype(np.float64)
        if shape is None or len(values) != len(shape):
            return ""
        scaled = np.asarray(shape, dtype=np.float64) * values
        if np.any(np.abs(scaled - np.round(scaled)) > 1e-6):
            return (
                f"scales {values.tolist()} give a fractional output size for input {shape}; "
                "TVM then maps coordinates by the size ratio, ONNX by the scale (give sizes "
                "instead of scales)"
            )
        return ""

    return problem


def _subgraph_nodes(graph):
    """Every node of the graphs nested in ``graph``'s nodes (If/Loop/Scan bodies)."""
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from sub.node
                yield from _subgraph_nodes(sub)


def rewrite_for_import(model, path: str):
    """``model`` with every operator TVM's importer would read wrongly written out in ONNX
    operators it reads correctly (see the module docstring); ``model`` itself when none occurs
    (it is never changed in place).

    Raises
    ------
    ModelError
        For such an operator that cannot be rewritten: an unknown mode, a nested graph, or an
        input of unknown shape. The message names the file, node, operator and attribute.
    """
    import onnx  # deferred like frontend.load_onnx's import
    from onnx import helper, numpy_helper

    def where(node) -> str:
        return f"{path}: node '{node.name or node.output[0]}' ({node.op_type}, mode={_mode(node)})"

    for node in _subgraph_nodes(model.graph):
        if _needs_rewrite(node):
            raise ModelError(
                f"{where(node)} inside a subgraph: TVM's ONNX importer ignores the mode and "
                "codl-tvm rewrites it only in the main graph"
            )
    resize_problem = _resize_checker(model)
    for node in model.graph.node:
        problem = resize_problem(node)
        if problem:
            raise ModelError(f"{path}: node '{node.name or node.output[0]}' (Resize): {problem}")
        if _training_statistics(node):
            raise ModelError(
                f"{path}: node '{node.name or node.output[0]}' (BatchNormalization, "
                "training_mode=1): TVM's ONNX importer returns wrong running mean and variance "
                "outputs; export the model for inference"
            )
    todo = [n for n in model.graph.node if _needs_rewrite(n)]
    if not todo:
        return model
    for node in todo:
        if _mode(node) != "CRD":
            raise ModelError(f"{where(node)}: unknown mode; ONNX defines DCR and CRD")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    shapes = static_shapes(out)
    taken = {t.name for t in out.graph.initializer}
    taken.update(o for n in out.graph.node for o in n.output)
    taken.update(i.name for i in out.graph.input)

    def fresh(stem: str) -> str:
        name, k = stem, 1
        while name in taken:
            name, k = f"{stem}_{k}", k + 1
        taken.add(name)
        return name

    nodes = []
    for node in out.graph.node:
        if not _needs_rewrite(node):
            nodes.append(node)
            continue
        x, (y,) = node.input[0], node.output
        shape = shapes.get(x)
        s = _blocksize(node)
        if shape is None or len(shape) != 4:
            raise ModelError(
                f"{where(node)}: the shape of its input '{x}' is not known statically; TVM's "
                "ONNX importer ignores the mode, and codl-tvm's rewrite needs that shape"
            )
        b, c, h, w = shape
        if s < 1 or h % s or w % s:
            raise ModelError(f"{where(node)}: blocksize {s} does not divide the input {shape}")
        stem = f"{node.name or y}_codl_crd"
        split_shape, tmp, moved, merged_shape = (fresh(f"{stem}_{k}") for k in range(4))
        for name, dims in (
            (split_shape, [b, c, h // s, s, w // s, s]),
            (merged_shape, [b, c * s * s, h // s, w // s]),
        ):
            out.graph.initializer.append(numpy_helper.from_array(np.array(dims, np.int64), name))
        nodes += [
            helper.make_node("Reshape", [x, split_shape], [tmp]),
            helper.make_node("Transpose", [tmp], [moved], perm=[0, 1, 3, 5, 2, 4]),
            helper.make_node("Reshape", [moved, merged_shape], [y]),
        ]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out
