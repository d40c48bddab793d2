"""Models used by tests, tutorials and benchmarks: the bundled CNN and onnx's light models.

onnx's light models (VGG19, ResNet50, SqueezeNet, Inception v1, AlexNet, ...) ship inside the
onnx package with every weight stored as ``ConstantOfShape`` (one value everywhere), which makes
all logits equal: :func:`light_model` replaces those weights with seeded random ones so outputs
depend on the input and comparisons mean something.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from codl_tvm.frontend.zoo import build_model

__all__ = [
    "LIGHT_MODELS",
    "benchmark_model",
    "bundled_model_path",
    "light_model",
    "light_model_path",
    "pretranspose_gemm_weights",
    "sanitize_names",
    "seeded_model",
    "with_random_weights",
    "without_final_softmax",
]

LIGHT_MODELS = ("squeezenet", "bvlc_alexnet", "resnet50", "inception_v1", "vgg19")


def bundled_model_path() -> Path:
    """Path of the small CNN shipped with the package (the CLI's default model)."""
    return Path(str(resources.files("codl_tvm") / "data" / "codl_small_cnn.onnx"))


def light_model_path(name: str) -> Path:
    """Path of onnx's light model ``name`` (e.g. "resnet50")."""
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"
    if not path.is_file():
        raise FileNotFoundError(f"onnx ships no light model '{name}' ({path})")
    return path


def with_random_weights(model, seed: int = 0, tiled: bool = False):
    """Return a copy of ``model`` whose ``ConstantOfShape`` weights are seeded random tensors.

    He-scaled normal weights for tensors of rank >= 2; 1-D parameters uniform in [0.5, 1.5] so
    batch-norm variances and scales stay valid. ``tiled`` makes each weight tensor separable,
    ``a[out] * b[in] * c[tap]`` with normal ``a`` and random signs ``b``, ``c`` (He-scaled,
    so activations keep their scale as with dense random weights: no overflow, no denormals),
    which libraries embedding the weights compress ~100x in any packed layout (benchmark
    artifacts travel to the benchmarked board or server in a few MB; latency does not depend
    on values).
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
        elif tiled:
            value = _separable(rng, shape, float(np.sqrt(2.0 / int(np.prod(shape[1:])))))
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
    # IR version 3 lists initializers among the graph inputs; keep only the true inputs (IR >= 4)
    # so importers see each weight once.
    init_names = {t.name for t in graph.initializer}
    kept_inputs = [i for i in graph.input if i.name not in dropped and i.name not in init_names]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    out.ir_version = max(out.ir_version, 4)
    return out


def sanitize_names(model):
    """Rename tensors to C identifiers (``gpu_0/conv1_w_0`` -> ``gpu_0_conv1_w_0``), in place.

    TVM's OpenCL codegen names kernel parameters after the Relax variables, so a weight kept as
    a model parameter with a ``/`` in its name produces OpenCL source that does not compile.
    """

    def fix(name: str) -> str:
        return re.sub(r"[^0-9A-Za-z_]", "_", name) if name else name

    graph = model.graph
    for node in graph.node:
        node.input[:] = [fix(n) for n in node.input]
        node.output[:] = [fix(n) for n in node.output]
    for coll in (graph.input, graph.output, graph.value_info, graph.initializer):
        for item in coll:
            item.name = fix(item.name)
    return model


def pretranspose_gemm_weights(model):
    """Store each ``Gemm(transB=1)`` weight initializer transposed and drop ``transB``, in place.

    Same result; the imported module then multiplies by the weight as stored instead of
    transposing it at every inference (which constant folding only removes when weights are
    compiled in as constants, not when they are inputs of the compiled library).
    """
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type != "Gemm" or len(node.input) < 2 or node.input[1] not in inits:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if not attrs.get("transB", 0):
            continue
        tensor = inits[node.input[1]]
        tensor.CopyFrom(
            numpy_helper.from_array(numpy_helper.to_array(tensor).T.copy(), tensor.name)
        )
        kept = [a for a in node.attribute if a.name != "transB"]
        del node.attribute[:]
        node.attribute.extend(kept)
    return model


def light_model(name: str, seed: int = 3, tiled: bool = False):
    """onnx's light model ``name`` with seeded random weights and C-identifier tensor names
    (``tiled``: see :func:`with_random_weights`)."""
    model = onnx.load(str(light_model_path(name)))
    return sanitize_names(with_random_weights(model, seed=seed, tiled=tiled))


def _separable(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """``a[i0] * b[i1] * c[rest]``: normal ``a``, random signs ``b`` and ``c``, times ``scale``."""
    a = rng.standard_normal(shape[0])
    b = rng.choice([-1.0, 1.0], size=shape[1])
    c = rng.choice([-1.0, 1.0], size=int(np.prod(shape[2:], dtype=np.int64)))
    return (a[:, None, None] * b[None, :, None] * c[None, None, :] * scale).reshape(shape)


def compressible_weights(model, seed: int = 0):
    """A copy of an ONNX model whose weights (initializers of rank >= 2) are separable seeded
    tensors (see :func:`with_random_weights`) with each tensor's original standard deviation.

    For benchmark artifacts only: latency does not depend on weight values, activations keep
    their scale, and libraries embedding the weights compress ~100x in any packed layout.
    Rank-1 parameters (biases, batch-norm statistics) are kept.
    """
    rng = np.random.default_rng(seed)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for i, t in enumerate(out.graph.initializer):
        value = numpy_helper.to_array(t)
        if value.ndim < 2 or not np.issubdtype(value.dtype, np.floating):
            continue
        new = _separable(rng, value.shape, float(value.std()))
        out.graph.initializer[i].CopyFrom(numpy_helper.from_array(new.astype(value.dtype), t.name))
    return out


def benchmark_model(name: str):
    """Model ``name`` as the benchmarks build it: a light model (:data:`LIGHT_MODELS`) with
    tiled weights, or a zoo model (:mod:`codl_tvm.frontend.zoo`) with :func:`compressible_weights`.
    Weights are seeded and compress well (artifacts travel to the machine that runs them); latency
    does not depend on their values."""
    if name in LIGHT_MODELS:
        return light_model(name, tiled=True)
    return compressible_weights(build_model(name))


def seeded_model(name: str):
    """Model ``name`` (one of the ten) with its own dense seeded random weights: a light model
    as :func:`light_model` makes it, a zoo model as its definition does. Numerics checks use
    it: :func:`benchmark_model`'s separable weights compress, but can leave a model
    ill-conditioned (FST's InstanceNorms divide by small spreads)."""
    return light_model(name) if name in LIGHT_MODELS else build_model(name)


def without_final_softmax(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` without a final Softmax, its input the graph's output (a copy; ``proto`` as it
    is where it ends otherwise): numerics checks compare logits, since a saturated softmax
    hides any error in the layers before it."""
    graph = proto.graph
    last = graph.node[-1]
    if last.op_type != "Softmax" or last.output[0] != graph.output[0].name:
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    del out.graph.node[-1]
    del out.graph.output[:]
    out.graph.output.extend([helper.make_empty_tensor_value_info(last.input[0])])
    return out
