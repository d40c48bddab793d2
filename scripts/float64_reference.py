"""A benchmark model's float64 answer, against onnxruntime (float32) and this machine's builds.

The model (:func:`codl_tvm.frontend.models.benchmark_model`, a final Softmax left out as
``scripts/images_on_device.py`` does) and its seeded input (``random_inputs(model, seed=7)``,
the same script's) are run three ways:

- **float64**: every float32 initializer, input and output made float64 (the values unchanged:
  each float32 is exactly a float64), then onnxruntime (CPU) in float64 where its kernels take
  double for every operator, else a small numpy evaluator of the operators the model uses
  (Conv, InstanceNormalization, Relu, Add, Resize nearest, Tanh), checked against
  ``onnx.reference.ReferenceEvaluator`` on the float64 model; the same evaluator in float32 is a
  second float32 implementation beside onnxruntime's, and again with InstanceNormalization's sums
  over H*W accumulated one value after another in float32 (as a loop's accumulator does, rather
  than numpy's pairwise summation);
- **onnxruntime, float32** (CPU), the reference the other benchmarks compare with;
- **builds** on this machine's OpenCL device (``codl-tvm compile --device opencl --gpu-data-type
  buffer|image --no-measure``, ``--build``; ``CODL_OPENCL_PLATFORM`` picks the platform), and
  outputs saved elsewhere as ``.npy`` (``--outputs LABEL=FILE``: e.g. a run on a device).

Each is compared with the float64 answer and with onnxruntime's (largest absolute error, and
that over max(1, the reference's largest magnitude)); ``layers`` gives onnxruntime's float32
error against float64 after each Conv and InstanceNormalization, where it grows::

    CODL_OPENCL_PLATFORM=pocl python scripts/float64_reference.py --model fst \\
        --build buffer,image --out benchmarks/fst_float64_reference.json

``--weights own`` takes the model's own seeded random weights (``seeded_model``) instead of the
benchmarks' separable ones (which compress, and make FST's InstanceNorms ill-conditioned).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from bench_util import envelope, write_json

#: Resize's ``roi`` and ``scales`` inputs stay float32 (the operator takes no other type).
KEEP_FLOAT32_INPUTS = {"Resize": (1, 2)}


def to_float64(proto):
    """A copy of ONNX model ``proto`` computing in float64: its float32 initializers, graph
    inputs, outputs and value infos, Constant values and Cast targets made float64 (Resize's
    ``roi`` and ``scales`` kept float32)."""
    import onnx
    from onnx import TensorProto, numpy_helper

    model = copy.deepcopy(proto)
    graph = model.graph
    kept = {
        node.input[i]
        for node in graph.node
        for i in KEEP_FLOAT32_INPUTS.get(node.op_type, ())
        if i < len(node.input) and node.input[i]
    }
    for k, tensor in enumerate(graph.initializer):
        if tensor.data_type == TensorProto.FLOAT and tensor.name not in kept:
            array = numpy_helper.to_array(tensor).astype(np.float64)
            graph.initializer[k].CopyFrom(numpy_helper.from_array(array, tensor.name))
    for info in [*graph.input, *graph.output, *graph.value_info]:
        if info.type.tensor_type.elem_type == TensorProto.FLOAT and info.name not in kept:
            info.type.tensor_type.elem_type = TensorProto.DOUBLE
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.DOUBLE
            if node.op_type == "Constant" and attr.name == "value":
                if attr.t.data_type == TensorProto.FLOAT and node.output[0] not in kept:
                    array = numpy_helper.to_array(attr.t).astype(np.float64)
                    attr.t.CopyFrom(numpy_helper.from_array(array, attr.t.name))
    onnx.checker.check_model(model)
    return model


# --- a numpy evaluator of the operators FST uses --------------------------------------------------


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict) -> np.ndarray:
    """2-D convolution, group 1, explicit pads, as im2col and one matrix product."""
    if attrs.get("group", 1) != 1 or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise NotImplementedError(f"Conv with {attrs}")
    if any(d != 1 for d in attrs.get("dilations", [1, 1])):
        raise NotImplementedError(f"Conv with {attrs}")
    top, left, bottom, right = attrs.get("pads", [0, 0, 0, 0])
    sh, sw = attrs.get("strides", [1, 1])
    kh, kw = w.shape[2:]
    x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    windows = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))
    windows = windows[:, :, ::sh, ::sw]  # N, C, Ho, Wo, kh, kw
    y = np.tensordot(windows, w, axes=([1, 4, 5], [1, 2, 3]))  # N, Ho, Wo, O
    y = np.ascontiguousarray(y.transpose(0, 3, 1, 2))
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


def _sum_hw(x: np.ndarray, sequential: bool) -> np.ndarray:
    """Sum over H and W, kept as (N, C, 1, 1): numpy's pairwise summation, or with
    ``sequential`` one value after another in ``x``'s dtype (a loop's float32 accumulator)."""
    if not sequential:
        return x.sum(axis=(2, 3), keepdims=True)
    flat = x.reshape(*x.shape[:2], -1)
    return np.cumsum(flat, axis=2, dtype=x.dtype)[..., -1].reshape(*x.shape[:2], 1, 1)


def _instance_norm(
    x: np.ndarray, scale: np.ndarray, bias: np.ndarray, attrs: dict, sequential: bool = False
) -> np.ndarray:
    """InstanceNormalization, two passes (the mean, then the mean squared deviation)."""
    eps = x.dtype.type(attrs.get("epsilon", 1e-5))
    n = x.dtype.type(x.shape[2] * x.shape[3])
    mean = _sum_hw(x, sequential) / n
    centred = x - mean
    var = _sum_hw(centred * centred, sequential) / n
    shape = (1, -1, 1, 1)
    return centred / np.sqrt(var + eps) * scale.reshape(shape) + bias.reshape(shape)


def _resize(x: np.ndarray, scales: np.ndarray, attrs: dict) -> np.ndarray:
    """Resize, nearest, asymmetric coordinates, floor (FST's upsampling)."""
    want = {"mode": b"nearest", "coordinate_transformation_mode": b"asymmetric"}
    want["nearest_mode"] = b"floor"
    for key, value in want.items():
        if attrs.get(key) not in (value, value.decode()):
            raise NotImplementedError(f"Resize with {attrs}")
    for axis, s in enumerate(np.asarray(scales, dtype=np.float64)):
        size = int(np.floor(x.shape[axis] * s))
        index = np.minimum(np.floor(np.arange(size) / s).astype(np.int64), x.shape[axis] - 1)
        x = np.take(x, index, axis=axis)
    return x


def evaluate(
    proto, feeds: dict[str, np.ndarray], dtype, sequential_sums: bool = False
) -> dict[str, np.ndarray]:
    """Every tensor of ONNX model ``proto`` (float32 weights) computed in numpy with float
    tensors in ``dtype``, InstanceNormalization's sums accumulated one value after another with
    ``sequential_sums``; raises NotImplementedError for an operator or attribute it lacks."""
    from onnx import numpy_helper

    values: dict[str, np.ndarray] = {}
    for tensor in proto.graph.initializer:
        array = numpy_helper.to_array(tensor)
        values[tensor.name] = array.astype(dtype) if array.dtype == np.float32 else array
    for name, array in feeds.items():
        values[name] = np.asarray(array).astype(dtype)
    ops: dict[str, Callable] = {
        "Conv": lambda n, i: _conv(i[0], i[1], i[2] if len(i) > 2 else None, _attrs(n)),
        "InstanceNormalization": lambda n, i: _instance_norm(
            i[0], i[1], i[2], _attrs(n), sequential_sums
        ),
        "Relu": lambda n, i: np.maximum(i[0], 0),
        "Add": lambda n, i: i[0] + i[1],
        "Resize": lambda n, i: _resize(i[0], i[2], _attrs(n)),
        "Tanh": lambda n, i: np.tanh(i[0]),
    }
    for node in proto.graph.node:
        if node.op_type not in ops:
            raise NotImplementedError(f"the numpy evaluator lacks {node.op_type}")
        inputs = [values[name] if name else None for name in node.input]
        values[node.output[0]] = ops[node.op_type](node, inputs).astype(dtype, copy=False)
    return values


# --- running and comparing ------------------------------------------------------------------------


def errors(got: np.ndarray, want: np.ndarray) -> dict:
    """Largest absolute error, and that over max(1, the reference's largest magnitude)."""
    got = np.asarray(got, dtype=np.float64).reshape(want.shape)
    want = np.asarray(want, dtype=np.float64)
    error = float(np.max(np.abs(got - want)))
    return {"max_abs": error, "rel": error / max(1.0, float(np.max(np.abs(want))))}


def onnxruntime_run(proto, feeds: dict[str, np.ndarray], outputs: list[str] | None = None):
    """onnxruntime's (CPU) values of ``outputs`` (default: the graph's outputs)."""
    import onnx
    import onnxruntime as ort

    model = copy.deepcopy(proto)
    if outputs is not None:
        del model.graph.output[:]
        model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in outputs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def build_and_run(path: Path, data_type: str, work: Path, inputs: list[np.ndarray]) -> np.ndarray:
    """``codl-tvm compile PATH --device opencl --gpu-data-type DATA_TYPE --no-measure`` here,
    run on ``inputs``: its first output."""
    from codl_tvm.cli import main as cli
    from codl_tvm.runtime.artifact import load_artifact

    out = work / f"gpu_{data_type}"
    argv = ["compile", str(path), "--device", "opencl", "--gpu-data-type", data_type]
    code = cli([*argv, "--no-measure", "--no-reference", "--force", "-o", str(out)])
    if code != 0:
        raise RuntimeError(f"compile exited {code}")
    art = load_artifact(out)
    return np.asarray(art(inputs)[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="fst", help="a benchmark model")
    parser.add_argument("--seed", type=int, default=7, help="random_inputs' seed (7: the device)")
    parser.add_argument("--build", default="", help="comma list of buffer, image: builds here")
    parser.add_argument("--outputs", action="append", default=[], help="LABEL=FILE.npy")
    parser.add_argument(
        "--no-check", action="store_true", help="skip onnx.reference's float64 cross-check"
    )
    parser.add_argument(
        "--weights",
        choices=("benchmark", "own"),
        default="benchmark",
        help="benchmark: the separable seeded weights the benchmarks build (compressible); "
        "own: the model's own seeded random weights (seeded_model)",
    )
    parser.add_argument("--save", default="", help="folder: the float64 and float32 outputs")
    parser.add_argument("--out", required=True, help="JSON file")
    args = parser.parse_args(argv)

    import onnx

    from codl_tvm.frontend.importer import load_onnx, random_inputs
    from codl_tvm.frontend.models import benchmark_model, seeded_model, without_final_softmax

    weights = seeded_model if args.weights == "own" else benchmark_model
    proto = without_final_softmax(weights(args.model))
    model = load_onnx(proto)
    feeds = random_inputs(model, seed=args.seed)
    feeds = {s.name: np.asarray(feeds[s.name], dtype=np.float32) for s in model.inputs}
    output = proto.graph.output[0].name
    ort32 = onnxruntime_run(proto, feeds)[output]

    proto64 = to_float64(proto)
    feeds64 = {k: v.astype(np.float64) for k, v in feeds.items()}
    reference: dict = {}
    try:
        ref64 = onnxruntime_run(proto64, feeds64)[output]
        reference["float64_by"] = "onnxruntime (CPU), float64"
        numpy64 = evaluate(proto, feeds, np.float64)
        reference["numpy_float64_vs_onnxruntime_float64"] = errors(numpy64[output], ref64)
    except Exception as exc:  # onnxruntime lacks a double kernel: the numpy evaluator
        reference["onnxruntime_float64"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        numpy64 = evaluate(proto, feeds, np.float64)
        ref64 = numpy64[output]
        reference["float64_by"] = "numpy evaluator, float64"
        if not args.no_check:  # onnx's own reference evaluator, in float64 too
            from onnx.reference import ReferenceEvaluator

            check = ReferenceEvaluator(proto64).run([output], feeds64)[0]
            reference["float64_vs_onnx_reference_evaluator_float64"] = errors(ref64, check)
    numpy32 = evaluate(proto, feeds, np.float32)
    sequential32 = evaluate(proto, feeds, np.float32, sequential_sums=True)[output]

    # onnxruntime's float32 error after each Conv and InstanceNormalization
    names = [
        n.output[0] for n in proto.graph.node if n.op_type in ("Conv", "InstanceNormalization")
    ]
    inner = onnxruntime_run(proto, feeds, names)
    layers = [{"tensor": name, **errors(inner[name], numpy64[name])} for name in names]

    compared: dict = {
        "onnxruntime_float32": {"vs_float64": errors(ort32, ref64)},
        "numpy_float32": {
            "vs_float64": errors(numpy32[output], ref64),
            "vs_onnxruntime_float32": errors(numpy32[output], ort32),
        },
    }
    # InstanceNormalization's sums (over H*W) accumulated one value after another in float32
    compared["numpy_float32_sequential_instance_norm_sums"] = {
        "vs_float64": errors(sequential32, ref64),
        "vs_onnxruntime_float32": errors(sequential32, ort32),
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{args.model}.onnx"
        onnx.save(proto, str(path))
        for data_type in filter(None, args.build.split(",")):
            label = f"gpu_{data_type}_here"
            try:
                got = build_and_run(path, data_type, Path(tmp), list(feeds.values()))
            except Exception as exc:  # a script: record and go on
                compared[label] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
                continue
            compared[label] = {
                "vs_float64": errors(got, ref64),
                "vs_onnxruntime_float32": errors(got, ort32),
                "vs_sequential_instance_norm_sums": errors(got, sequential32),
            }
            if args.save:
                np.save(Path(args.save) / f"{label}.npy", got)
    for item in args.outputs:
        label, _, file = item.partition("=")
        got = np.load(file)
        compared[label] = {
            "file": file,
            "vs_float64": errors(got, ref64),
            "vs_onnxruntime_float32": errors(got, ort32),
            "vs_sequential_instance_norm_sums": errors(got, sequential32),
        }
    if args.save:
        np.save(Path(args.save) / "float64.npy", ref64)
        np.save(Path(args.save) / "onnxruntime_float32.npy", ort32)

    results = {
        "model": args.model,
        "seed": args.seed,
        "weights": args.weights,
        "output": output,
        "output_max_abs_float64": float(np.max(np.abs(ref64))),
        "opencl_platform": os.environ.get("CODL_OPENCL_PLATFORM", "") or "default",
        **reference,
        "compared": compared,
        "layers_onnxruntime_float32_vs_float64": layers,
    }
    write_json(args.out, envelope(sys.argv, results))
    print(json.dumps(compared, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
