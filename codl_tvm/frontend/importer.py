"""Load ONNX models into Relax with the input/output metadata the rest of codl-tvm needs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from codl_tvm.core.errors import ModelError
from codl_tvm.core.tensors import TensorSpec  # re-exported: its home before core
from codl_tvm.frontend.rewrites import rewrite_for_import
from codl_tvm.frontend.static_shapes import fold_shape_computations

__all__ = ["ModelError", "OnnxModel", "TensorSpec", "load_onnx", "random_inputs"]


@dataclass(frozen=True)
class OnnxModel:
    """An ONNX model imported into Relax.

    Attributes
    ----------
    path
        The file it came from (or ``"<memory>"``).
    mod
        The Relax module; ``main`` takes the inputs in ``inputs`` order.
    inputs
        The graph inputs that are not initializers, in ``main``'s parameter order.
    outputs
        The graph outputs, in the order ``main`` returns them.
    """

    path: str
    mod: object
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


#: ONNX element types of graph inputs: those TVM's ONNX frontend imports and numpy holds natively
#: (bfloat16, float8 and complex types are left out: numpy has no native type for their data).
_ONNX_DTYPES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
}


def _spec(value_info, path: str, what: str) -> TensorSpec:
    ttype = value_info.type.tensor_type
    if not ttype.HasField("shape"):
        raise ModelError(
            f"{path}: {what} '{value_info.name}' has no shape (not even its rank); codl-tvm "
            "needs static shapes (export the model with fixed input sizes)"
        )
    dims = []
    for d in ttype.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        elif d.HasField("dim_value") and d.dim_value == 0:
            shape = [x.dim_value if x.HasField("dim_value") else "?" for x in ttype.shape.dim]
            raise ModelError(
                f"{path}: {what} '{value_info.name}' has a zero-sized dimension (shape {shape}); "
                "codl-tvm needs non-empty tensors"
            )
        else:
            label = d.dim_param or "?"
            raise ModelError(
                f"{path}: {what} '{value_info.name}' has a dynamic dimension '{label}'; "
                "codl-tvm needs static shapes (export the model with fixed input sizes)"
            )
    dtype = _ONNX_DTYPES.get(ttype.elem_type)
    if dtype is None:
        import onnx  # deferred like load_onnx's import

        try:
            type_name = onnx.TensorProto.DataType.Name(ttype.elem_type)
        except ValueError:
            type_name = "unknown"
        raise ModelError(
            f"{path}: {what} '{value_info.name}' has unsupported ONNX element type "
            f"{ttype.elem_type} ({type_name}); codl-tvm takes {sorted(set(_ONNX_DTYPES.values()))}"
        )
    return TensorSpec(value_info.name, tuple(dims), dtype)


def load_onnx(model: str | Path | object) -> OnnxModel:
    """Import an ONNX model (path or ``onnx.ModelProto``) into a Relax module.

    Weights become constants of the module. Raises :class:`ModelError` naming the file and the
    problem for a missing or unreadable file, dynamic shapes, or operators TVM cannot import.
    """
    # deferred here and below (onnx, tvm.relax): this module also serves `codl-tvm run
    # ARTIFACT/` on devices whose TVM is runtime-only, where importing ONNX is never needed
    import onnx

    if isinstance(model, (str, Path)):
        path = str(model)
        if not Path(path).is_file():
            raise ModelError(f"{path}: no such model file")
        try:
            proto = onnx.load(path)
        except Exception as exc:  # protobuf raises several unrelated types
            raise ModelError(f"{path}: not a readable ONNX model ({exc})") from None
    else:
        path, proto = "<memory>", model
    graph = proto.graph
    init_names = {t.name for t in graph.initializer}
    inputs = tuple(_spec(i, path, "input") for i in graph.input if i.name not in init_names)
    outputs = tuple(o.name for o in graph.output)
    proto = rewrite_for_import(proto, path)  # operators TVM's importer reads wrongly
    # shape arithmetic TVM's importer leaves to run time would give tensors of unknown shape
    proto = fold_shape_computations(proto)
    try:
        from tvm.relax.frontend.onnx import from_onnx  # deferred: needs TVM's compiler

        # TVM's own renaming only replaces '.'; names.py makes every input a C identifier.
        mod = from_onnx(proto, sanitize_input_names=False)
    except Exception as exc:
        first = str(exc).strip().splitlines()
        raise ModelError(
            f"{path}: TVM's ONNX frontend cannot import this model: {first[-1] if first else exc}"
        ) from None
    # Kernel arguments are named after main's parameters ('gpu_0/data_0' breaks OpenCL C); the
    # user's names stay in `inputs`, and inputs are bound by position. Deferred with TVM's import.
    from codl_tvm.core.names import c_identifiers, rename_params

    main = mod["main"]
    mod["main"] = rename_params(main, c_identifiers(p.name for p in main.params))
    out_specs = tuple(_output_specs(mod, outputs, path))
    return OnnxModel(path, mod, inputs, out_specs)


def _output_specs(mod, names: tuple[str, ...], path: str) -> list[TensorSpec]:
    from tvm import relax  # deferred: tvm.relax needs TVM's compiler (see load_onnx)

    ret = mod["main"].ret_ty
    infos = list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]
    if len(infos) != len(names):
        raise ModelError(
            f"{path}: main returns {len(infos)} values but the graph has {len(names)} outputs"
        )
    specs = []
    for name, info in zip(names, infos):
        try:
            shape = tuple(int(v) for v in info.shape.values) if info.shape is not None else None
        except TypeError:  # a symbolic dimension
            shape = None
        if shape is None:
            # e.g. Unsqueeze/Squeeze whose axes are a graph input: the CPU schedules and the
            # OpenCL build crash on such shapes, so refuse here with a reason
            raise ModelError(
                f"{path}: output '{name}' has no static shape (it depends on the values of an "
                "input such as axes or shape); codl-tvm needs static shapes: make such inputs "
                "initializers"
            )
        specs.append(TensorSpec(name, shape, str(info.dtype)))
    return specs


def random_inputs(model: OnnxModel, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs for every graph input (uniform [0, 1) floats, small ints)."""
    rng = np.random.default_rng(seed)
    out = {}
    for spec in model.inputs:
        if spec.dtype.startswith("float"):
            out[spec.name] = rng.random(spec.shape, dtype=np.float64).astype(spec.dtype)
        else:
            out[spec.name] = rng.integers(0, 4, spec.shape).astype(spec.dtype)
    return out


def check_inputs(model: OnnxModel, values: dict[str, np.ndarray], source: str) -> list[np.ndarray]:
    """Order ``values`` as ``main`` expects, checking names, shapes and dtypes."""
    missing = [s.name for s in model.inputs if s.name not in values]
    if missing:
        raise ModelError(
            f"{source}: missing input(s) {missing}; the model "
            f"{model.path} needs {[s.name for s in model.inputs]}"
        )
    extra = sorted(set(values) - {s.name for s in model.inputs})
    if extra:
        raise ModelError(
            f"{source}: unknown input(s) {extra}; the model {model.path} "
            f"takes {[s.name for s in model.inputs]}"
        )
    ordered = []
    for spec in model.inputs:
        arr = np.asarray(values[spec.name])
        if tuple(arr.shape) != spec.shape:
            raise ModelError(
                f"{source}: input '{spec.name}' has shape {tuple(arr.shape)}, "
                f"the model expects {spec.shape}"
            )
        if str(arr.dtype) != spec.dtype:
            raise ModelError(
                f"{source}: input '{spec.name}' has dtype {arr.dtype}, "
                f"the model expects {spec.dtype}"
            )
        ordered.append(np.asarray(arr, order="C"))  # ascontiguousarray makes 0-d 1-d
    return ordered
