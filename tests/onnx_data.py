"""Access to the ONNX backend test data shipped inside the onnx package."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"


def case_dir(group: str, name: str) -> Path:
    return DATA / group / name


def load_case(directory: Path) -> tuple[onnx.ModelProto, list[np.ndarray], list[np.ndarray]]:
    """Model, inputs and expected outputs of an ONNX backend test case (test_data_set_0)."""
    model = onnx.load(str(directory / "model.onnx"))
    ds = directory / "test_data_set_0"

    def read(prefix: str) -> list[np.ndarray]:
        files = sorted(ds.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
        out = []
        for f in files:
            t = onnx.TensorProto()
            t.ParseFromString(f.read_bytes())
            out.append(numpy_helper.to_array(t))
        return out

    return model, read("input"), read("output")


def light_model(name: str) -> onnx.ModelProto:
    return onnx.load(str(DATA / "light" / f"light_{name}.onnx"))


def with_random_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Replace the light models' constant-filled weights with seeded random ones.

    onnx's light models store every weight as ``ConstantOfShape`` (one value everywhere), which
    makes all logits equal and the softmax output uniform: a comparison would then pass for
    almost any convolution bug. He-scaled normal weights (positive 1-D parameters, so batch-norm
    variances stay valid) give input-dependent outputs.
    """
    rng = np.random.default_rng(seed)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {t.name: t for t in graph.initializer}
    keep_nodes, dropped = [], set()
    for node in graph.node:
        shape_init = inits.get(node.input[0]) if node.op_type == "ConstantOfShape" else None
        if shape_init is None:
            keep_nodes.append(node)
            continue
        shape = tuple(int(v) for v in numpy_helper.to_array(shape_init))
        if len(shape) == 1:
            value = rng.uniform(0.5, 1.5, shape)
        else:
            fan_in = int(np.prod(shape[1:]))
            value = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        graph.initializer.append(numpy_helper.from_array(value.astype("float32"), node.output[0]))
        dropped.add(node.input[0])
    del graph.node[:]
    graph.node.extend(keep_nodes)
    kept = [t for t in graph.initializer if t.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    kept_inputs = [i for i in graph.input if i.name not in dropped]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    return out
