"""ONNX's backend node tests run through codl-tvm's build paths.

onnx generates its single-operator conformance cases (model, inputs, expected outputs) with
``onnx.backend.test.case.node.collect_testcases()``; the installed wheel does not ship the
``data/node/`` folder, so the cases are generated here as onnx's own tooling does. Each selected
case (the operators codl-tvm's passes, schedules and planner touch: :data:`SELECTED_OPS`) goes
through:

- ``import``: :func:`codl_tvm.frontend.importer.load_onnx` (codl-tvm's input checks, then TVM's
frontend);
- ``cpu`` / ``opencl``: :func:`codl_tvm.build.runner.build` for one processor;
- ``coexec-H`` / ``coexec-OC``: :func:`codl_tvm.build.coexec.compile_coexec` with
  :func:`codl_tvm.core.plan.uniform_plan` (every conv/pool/matmul the plan rules allow split at 0.5,
  what ``codl-tvm run --device coexec --dim H|OC`` builds); ``n/a`` where no operator can be
  split along that dimension;
- ``beside``: the CPU build with its weights beside the library (``compile --weights
  beside``): every constant, however small (the cases' constants are mostly under
  :data:`~codl_tvm.passes.stream_weights.MIN_BYTES`), is fetched through ``codl.weights.get``
  from a ``weights.bin`` that :mod:`codl_tvm.runtime.weights` loads on its thread;
- ``opencl-image`` (:data:`IMAGE_PATH`, not in the default :data:`PATHS`): the GPU alone on
  OpenCL images, float32 (:func:`codl_tvm.build.texture.build_texture_gpu`, what ``compile
  --device opencl --gpu-data-type image`` builds), run through codl-tvm's OpenCL runtime with
  one VM device per memory scope. ``n/a`` where no kernel of the build reads or writes an image
  (the texture layout covers none of the case's operators). Held to :data:`IMAGE_RTOL` as well
  as the case's own tolerances; its ``detail`` keeps the largest error either way.

Outputs are compared with the expected ones as onnx's backend runner does (same shape and dtype,
``np.testing.assert_allclose`` with the case's ``rtol``/``atol``, NaN equal to NaN). A failure is
attributed (:func:`plain_tvm_status`) to TVM when TVM's own ``from_onnx`` + ``tvm.compile`` with
its default pipeline fails the same way, to codl-tvm otherwise.

``scripts/onnx_node_report.py`` runs the whole selection and tabulates the results;
``tests/test_onnx_node_suite.py`` checks the rules (a case that imports and passes on the CPU
passes on every path; a refusal is a :class:`~codl_tvm.core.errors.CodlError`, never a crash).
"""

from __future__ import annotations

import functools
import logging
import tempfile
import traceback
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import tvm
from onnx import numpy_helper
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from codl_tvm import runtime
from codl_tvm.build.coexec import compile_coexec
from codl_tvm.build.pipeline import single_device_pipeline
from codl_tvm.build.runner import build, default_target, max_abs_difference
from codl_tvm.build.texture import build_texture_gpu
from codl_tvm.core.errors import CodlError
from codl_tvm.core.plan import uniform_plan
from codl_tvm.frontend.importer import check_inputs, load_onnx
from codl_tvm.passes.stream_weights import StreamWeights
from codl_tvm.runtime import weights
from codl_tvm.runtime.images import PIXEL_CHANNELS, image_caps
from codl_tvm.runtime.vm import flatten_outputs

__all__ = [
    "CONSTANT_OPERAND_OPS",
    "ERROR",
    "IMAGE_PATH",
    "IMAGE_RTOL",
    "IMAGE_VARIANT_SUFFIX",
    "INITIALIZERS_SUFFIX",
    "MISMATCH",
    "NOT_APPLICABLE",
    "OP_FAMILIES",
    "OURS",
    "PASS",
    "PATHS",
    "REFUSED",
    "SELECTED_OPS",
    "SKIPPED",
    "TVM",
    "CaseResult",
    "NodeCase",
    "PathResult",
    "attribute",
    "compare_outputs",
    "image_variant",
    "node_cases",
    "plain_tvm_status",
    "run_case",
]

logger = logging.getLogger(__name__)

# The operators of the selection, grouped as the docs report them. Only cases whose graph
# holds nodes of exactly one of these types are taken (onnx's "_expanded" function bodies are
# multi-operator graphs of other types and are left out).
OP_FAMILIES: dict[str, tuple[str, ...]] = {
    "conv": ("Conv",),
    "pool": ("AveragePool", "MaxPool", "GlobalAveragePool", "GlobalMaxPool"),
    "gemm/matmul": ("Gemm", "MatMul"),
    "element-wise": (
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Relu",
        "LeakyRelu",
        "PRelu",
        "Sigmoid",
        "Tanh",
        "Clip",
        "Max",
        "Min",
        "Sum",
        "Mean",
        "HardSigmoid",
        "HardSwish",
        "Elu",
    ),
    "softmax": ("Softmax",),
    "concat": ("Concat",),
    "norm": ("BatchNormalization", "InstanceNormalization", "LRN"),
    "reshape": ("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze"),
    "resize": ("Resize", "Upsample"),
    "pad/space": ("Pad", "SpaceToDepth", "DepthToSpace"),
}
SELECTED_OPS: tuple[str, ...] = tuple(op for ops in OP_FAMILIES.values() for op in ops)

# ONNX's cases give these operators' shape operands (Reshape's shape, Resize's roi/scales/sizes,
# Pad's pads, Squeeze's axes, ...) as graph inputs, which codl-tvm refuses (output shapes would
# depend on input values) and TVM's frontend mostly cannot import; exported models hold them
# as initializers. Each such case also runs as a variant with them as initializers, named with
# INITIALIZERS_SUFFIX.
CONSTANT_OPERAND_OPS: tuple[str, ...] = (
    "Reshape",
    "Resize",
    "Upsample",
    "Pad",
    "Squeeze",
    "Unsqueeze",
)
INITIALIZERS_SUFFIX = "_initializers"
#: Names :func:`image_variant`'s cases: a conv or pool case widened to whole pixels of channels.
IMAGE_VARIANT_SUFFIX = "_on_images"
#: The 2-D pools whose cases :func:`image_variant` widens: those the texture layout packs
#: (GlobalMaxPool, a max over H and W, stays NCHW).
_POOLS_2D = ("AveragePool", "MaxPool", "GlobalAveragePool")

PATHS: tuple[str, ...] = ("cpu", "opencl", "coexec-H", "coexec-OC", "beside")
#: The GPU alone on OpenCL images: a path of its own (``run_case(case, (IMAGE_PATH,))``), not in
#: :data:`PATHS`: it needs an OpenCL device with images, and TVM alone has no such build to
#: attribute a failure to.
IMAGE_PATH = "opencl-image"
#: The image path's relative tolerance (issue 46: images equal the reference within 1e-4 in
#: float32), tighter than onnx's default 1e-3; each case's atol is kept.
IMAGE_RTOL = 1e-4

# Outcomes of one path.
PASS = "pass"
MISMATCH = "mismatch"  # ran, wrong values / shape / dtype
REFUSED = "refused"  # a CodlError with a message: a clear refusal
ERROR = "error"  # another exception (a TVM build error, or a crash of ours)
NOT_APPLICABLE = "n/a"  # co-execution with nothing to split along that dimension
SKIPPED = "skipped"  # an earlier step (import) did not succeed

# Whose a failure is (:func:`attribute`).
TVM = "tvm"
OURS = "ours"


@dataclass(frozen=True)
class NodeCase:
    """One generated node test: its model, inputs and expected outputs (first data set)."""

    name: str
    op_type: str
    model: object
    inputs: tuple[np.ndarray, ...]
    expected: tuple[np.ndarray, ...]
    rtol: float
    atol: float


@dataclass
class PathResult:
    """What one path did with a case: an outcome (``pass``, ``mismatch``, ``refused``,
    ``error``, ``n/a``, ``skipped``), the exception type for ``refused``/``error``, and one
    line of detail."""

    outcome: str
    error_type: str = ""
    detail: str = ""


@dataclass
class CaseResult:
    """The import and every path's result for one case."""

    name: str
    op_type: str
    imported: PathResult
    paths: dict[str, PathResult] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "op_type": self.op_type,
            "import": vars(self.imported),
            "paths": {k: vars(v) for k, v in self.paths.items()},
        }

    @classmethod
    def from_json(cls, data: dict) -> CaseResult:
        return cls(
            data["name"],
            data["op_type"],
            PathResult(**data["import"]),
            {k: PathResult(**v) for k, v in data["paths"].items()},
        )


@functools.cache
def _all_cases() -> tuple[NodeCase, ...]:
    # deferred: collecting the cases imports every node test's module and builds its models
    from onnx.backend.test.case.node import collect_testcases

    # Generating the cases runs numpy reference code that warns about overflows and
    # divisions by zero on purpose (inf/NaN expected outputs).
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        raw = collect_testcases()
    selected = set(SELECTED_OPS)
    cases = []
    for tc in raw:
        ops = {n.op_type for n in tc.model.graph.node}
        if len(ops) != 1 or not ops <= selected or not tc.data_sets:
            continue
        inputs, expected = tc.data_sets[0]
        case = NodeCase(
            name=tc.name,
            op_type=ops.pop(),
            model=tc.model,
            inputs=tuple(np.asarray(x) for x in inputs),
            expected=tuple(np.asarray(y) for y in expected),
            rtol=float(tc.rtol),
            atol=float(tc.atol),
        )
        cases.append(case)
        if case.op_type in CONSTANT_OPERAND_OPS and len(case.inputs) > 1:
            cases.append(_with_initializers(case))
    return tuple(sorted(cases, key=lambda c: c.name))


def _with_initializers(case: NodeCase) -> NodeCase:
    """``case`` with every input after the first made an initializer holding its test value."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    graph = model.graph
    operands = list(graph.input[1:])
    del graph.input[1:]
    for info, value in zip(operands, case.inputs[1:]):
        graph.initializer.append(numpy_helper.from_array(value, info.name))
    return NodeCase(
        name=case.name + INITIALIZERS_SUFFIX,
        op_type=case.op_type,
        model=model,
        inputs=case.inputs[:1],
        expected=case.expected,
        rtol=case.rtol,
        atol=case.atol,
    )


def image_variant(case: NodeCase) -> NodeCase | None:
    """``case``'s conv or pool widened so that the texture layout covers it, with expected
    outputs derived exactly from ``case``'s; None for other cases.

    ONNX's conv cases have one output channel and its pools read the graph input; the texture
    layout packs convs with whole pixels of output channels (4) and constant weights, and pools
    only behind a packed producer, so no case as generated reaches an image. The variant keeps
    the operator and its attributes and changes only channels, so every output channel equals
    one of the original's (``np.tile`` of the expected outputs along C):

    - a 2-D conv (``group=1``) gets its weights (and bias) repeated 4 times along the output
      channels, as initializers;
    - a float32 2-D pool gets a conv in front that repeats the input's C channels 4 times
      (weights 1 and 0: exact in float32 for finite inputs), so it reads a packed tensor.
    """
    graph = case.model.graph
    node = graph.node[0]
    if len(graph.node) != 1 or len(node.output) != 1 or case.inputs[0].dtype != np.float32:
        return None
    if case.inputs[0].ndim != 4:
        return None
    expected = (np.tile(case.expected[0], (1, PIXEL_CHANNELS, 1, 1)),)
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    graph = model.graph
    if case.op_type == "Conv":
        if any(a.name == "group" and a.i != 1 for a in node.attribute):
            return None
        operands = list(graph.input[1:])
        del graph.input[1:]
        for info, value in zip(operands, case.inputs[1:]):
            wide = np.tile(value, (PIXEL_CHANNELS,) + (1,) * (value.ndim - 1))
            graph.initializer.append(numpy_helper.from_array(wide, info.name))
    elif case.op_type in _POOLS_2D:
        channels = case.inputs[0].shape[1]
        # a 3 x 3 conv (padded by 1) with the weight on its centre tap and a zero bias, as a
        # model's conv before a pool; a 1 x 1 conv or one without bias would do as well (the
        # pool reads its image either way: tests/test_texture_pool_input.py); kept so that the
        # variants stay those benchmarks/onnx_node_images_pocl.jsonl records
        repeat = np.zeros((PIXEL_CHANNELS * channels, channels, 3, 3), np.float32)
        out_channels = np.arange(PIXEL_CHANNELS * channels)
        repeat[out_channels, out_channels % channels, 1, 1] = 1.0
        x = graph.input[0].name
        repeated, weights, bias = f"{x}_repeated", f"{x}_repeat_weights", f"{x}_repeat_bias"
        graph.initializer.append(numpy_helper.from_array(repeat, weights))
        graph.initializer.append(
            numpy_helper.from_array(np.zeros(PIXEL_CHANNELS * channels, np.float32), bias)
        )
        conv = onnx.helper.make_node("Conv", [x, weights, bias], [repeated], pads=[1, 1, 1, 1])
        graph.node.insert(0, conv)
        graph.node[1].input[0] = repeated
    else:
        return None
    # the output's declared shape grows with its channels
    out = graph.output[0]
    del out.type.tensor_type.shape.dim[:]
    for extent in expected[0].shape:
        out.type.tensor_type.shape.dim.add().dim_value = extent
    return NodeCase(
        name=case.name + IMAGE_VARIANT_SUFFIX,
        op_type=case.op_type,
        model=model,
        inputs=case.inputs[:1],
        expected=expected,
        rtol=case.rtol,
        atol=case.atol,
    )


def node_cases(names: Iterable[str] | None = None) -> list[NodeCase]:
    """The selected node cases (all, or those named, in the order given)."""
    cases = _all_cases()
    if names is None:
        return list(cases)
    by_name = {c.name: c for c in cases}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise KeyError(f"not among the selected ONNX node cases: {missing}")
    return [by_name[n] for n in names]


def compare_outputs(
    got: Sequence[np.ndarray], expected: Sequence[np.ndarray], rtol: float, atol: float
) -> str:
    """``""`` when ``got`` matches ``expected`` as onnx's backend runner checks it, else why."""
    if len(got) != len(expected):
        return f"{len(got)} outputs, expected {len(expected)}"
    for i, (out, ref) in enumerate(zip(got, expected)):
        out = np.asarray(out)
        if out.shape != ref.shape:
            return f"output {i}: shape {out.shape}, expected {ref.shape}"
        if out.dtype != ref.dtype:
            return f"output {i}: dtype {out.dtype}, expected {ref.dtype}"
        try:
            np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            mismatched = next((ln for ln in lines if ln.startswith("Mismatched")), "")
            worst = next((ln for ln in lines if ln.startswith("Max absolute")), "")
            return f"output {i}: {mismatched} {worst}".strip()
    return ""


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    # TVM errors end with the message after a C++ backtrace; ours are one line.
    text = lines[-1] if lines else ""
    return text[:300]


def _error_result(exc: BaseException) -> PathResult:
    kind = type(exc)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if isinstance(exc, CodlError):
        return PathResult(REFUSED, name, _one_line(exc))
    # keep where a crash of ours happened: the innermost frame of the traceback
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
    return PathResult(ERROR, name, f"{_one_line(exc)}{where}")


def _ordered_inputs(model, case: NodeCase) -> list[np.ndarray]:
    return check_inputs(
        model, {s.name: x for s, x in zip(model.inputs, case.inputs)}, f"node test {case.name}"
    )


def _run_beside(mod, inputs: list[np.ndarray], name: str) -> list[np.ndarray]:
    """Build ``mod`` for the CPU with every constant fetched from a weights file beside the
    library, start loading the file as an artifact does (before the VM is created: the VM
    looks its packed functions up when it is created), and run once."""
    sink: dict = {}
    target = default_target("cpu")
    # min_bytes=0: a node case's constants are small; all of them take the fetch path here
    pipeline = tvm.transform.Sequential(
        [single_device_pipeline(target), StreamWeights(sink, "cpu", min_bytes=0)]
    )
    with runtime.build_errors(f"node test {name}", "cpu"):
        ex = tvm.compile(mod, target=target, relax_pipeline=pipeline)
    dev = tvm.cpu(0)
    with tempfile.TemporaryDirectory(prefix="codl-node-") as tmp:
        loader = None
        if sink["arrays"]:
            record = weights.write_weights(Path(tmp) / weights.WEIGHTS, sink["arrays"], sink["key"])
            loader = weights.start(tmp, record, dev)
        vm = relax.VirtualMachine(ex, dev)
        got = flatten_outputs(vm["main"](*[tvm.runtime.tensor(x, dev) for x in inputs]))
        if loader is not None:
            loader.join()  # its file goes with the directory
        return got


def _onnxruntime_outputs(case: NodeCase) -> list[np.ndarray] | None:
    """``case``'s model run by onnxruntime's CPU provider, or None where onnxruntime is missing
    or cannot run it."""
    try:
        # deferred: onnxruntime is a test dependency, needed by the image path only
        import onnxruntime
    except ImportError:
        return None
    graph = case.model.graph
    initializers = {t.name for t in graph.initializer}
    names = [i.name for i in graph.input if i.name not in initializers]
    try:
        sess = onnxruntime.InferenceSession(
            case.model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        return list(sess.run(None, dict(zip(names, case.inputs))))
    except Exception as exc:  # onnxruntime's own errors have no common base class
        logger.info("%s: onnxruntime cannot run it (%s)", case.name, _one_line(exc))
        return None


def _run_image(mod, inputs: list[np.ndarray], case: NodeCase) -> PathResult:
    """Build ``mod`` for the GPU alone on images (float32), run it once and compare it with
    ``case``'s expected outputs at the case's tolerances (as every other path) and with
    onnxruntime's at :data:`IMAGE_RTOL` (ONNX stores some expected outputs rounded to four
    decimals, as AveragePool's ``ceil_last_window_starts_on_pad``: 0.1511 for 0.151056);
    ``n/a`` where no kernel uses an image."""
    runtime.load()
    with runtime.build_errors(f"node test {case.name}", "opencl"):
        built = build_texture_gpu(mod, default_target("opencl"), caps=image_caps())
    if built.image_kernels == 0:
        return PathResult(
            NOT_APPLICABLE, detail=f"none of its {len(built.kernels)} kernels uses an image"
        )
    dev = tvm.opencl(0)
    with tempfile.TemporaryDirectory(prefix="codl-node-") as tmp:
        lib_path = Path(tmp) / "images.so"
        with runtime.build_errors(f"node test {case.name}", "opencl"):
            built.executable.export_library(str(lib_path))
            lib = tvm.runtime.load_module(str(lib_path))
    vm = relax.VirtualMachine(lib, built.vm_devices(dev))
    got = flatten_outputs(vm["main"](*[tvm.runtime.tensor(x, dev) for x in inputs]))
    why = compare_outputs(got, case.expected, case.rtol, case.atol)
    if why:
        return PathResult(MISMATCH, detail=f"against onnx's expected outputs: {why}")
    reference = _onnxruntime_outputs(case)
    source = "onnxruntime"
    if reference is None:
        reference, source = list(case.expected), "onnx's expected outputs"
    why = compare_outputs(got, reference, min(case.rtol, IMAGE_RTOL), case.atol)
    # the largest error is kept for passes too: how close to the tolerance a case came
    err = f"max abs error {max_abs_difference(got, reference):.3g} against {source}"
    if why:
        return PathResult(MISMATCH, detail=f"{why}; {err}")
    images = ", ".join(name for name, image in built.kernels if image)
    return PathResult(PASS, detail=f"image kernels: {images}; {err}")


def _run_path(path: str, model, case: NodeCase) -> PathResult:
    try:
        inputs = _ordered_inputs(model, case)
        if path == IMAGE_PATH:
            return _run_image(model.mod, inputs, case)
        if path == "beside":
            got = _run_beside(model.mod, inputs, case.name)
            why = compare_outputs(got, case.expected, case.rtol, case.atol)
            return PathResult(MISMATCH, detail=why) if why else PathResult(PASS)
        if path in ("cpu", "opencl"):
            built = build(model.mod, path)
        else:
            plan = uniform_plan(model.mod, path.split("-", 1)[1], 0.5)
            if not plan.ops:
                return PathResult(NOT_APPLICABLE)
            built = compile_coexec(model.mod, plan)
        got = built(inputs)
    except Exception as exc:
        return _error_result(exc)
    why = compare_outputs(got, case.expected, case.rtol, case.atol)
    return PathResult(MISMATCH, detail=why) if why else PathResult(PASS)


def run_case(case: NodeCase, paths: Sequence[str] = PATHS) -> CaseResult:
    """Import ``case`` with codl-tvm and run it on ``paths``; never raises for the case's sake."""
    try:
        model = load_onnx(case.model)
    except Exception as exc:
        result = CaseResult(case.name, case.op_type, _error_result(exc))
        result.paths = {p: PathResult(SKIPPED) for p in paths}
        return result
    result = CaseResult(case.name, case.op_type, PathResult(PASS))
    for path in paths:
        result.paths[path] = _run_path(path, model, case)
    return result


def plain_tvm_status(case: NodeCase, device: str = "cpu") -> PathResult:
    """The case through plain TVM: ``from_onnx``, ``tvm.compile`` with TVM's default pipeline
    for ``device`` ("cpu" or "opencl"), run in the Relax VM (OpenCL through codl-tvm's runtime
    plugin, which plain TVM's wheel lacks). A failure here that matches codl-tvm's is TVM's."""
    try:
        mod = from_onnx(case.model)
        target = default_target(device)
        if device == "opencl":
            runtime.load()
        with target:
            ex = tvm.compile(mod, target=target)
        if device == "opencl":
            with tempfile.TemporaryDirectory(prefix="codl-node-") as tmp:
                lib_path = Path(tmp) / "plain.so"
                ex.export_library(str(lib_path))
                lib = tvm.runtime.load_module(str(lib_path))
            dev = tvm.opencl(0)
        else:
            lib, dev = ex, tvm.cpu(0)
        vm = relax.VirtualMachine(lib, dev)
        # plain TVM gets the inputs as they are (0-d arrays stay 0-d)
        args = [tvm.runtime.tensor(np.asarray(x), dev) for x in case.inputs]
        got = flatten_outputs(vm["main"](*args))
    except Exception as exc:
        return _error_result(exc)
    why = compare_outputs(got, case.expected, case.rtol, case.atol)
    return PathResult(MISMATCH, detail=why) if why else PathResult(PASS)


def attribute(case: NodeCase, result: CaseResult) -> dict[str, str]:
    """Whose each failure of ``result`` is: ``"tvm"`` or ``"ours"``, by step (``import`` and
    the failing paths).

    - A refusal at import is TVM's when TVM's frontend is what refused (plain ``from_onnx``
      fails too), ours when codl-tvm's own checks refuse a case plain TVM imports and runs.
    - A CPU or OpenCL failure is TVM's when plain TVM's build for that device fails too.
    - A co-executed, ``beside`` or image failure is ours when the CPU build passed or did not
      run (co-execution, streamed weights and images must then work; TVM's own texture build
      does not run on a desktop driver to compare with); otherwise it shares the CPU failure's
      attribution.
    """
    owners: dict[str, str] = {}
    plain: dict[str, PathResult] = {}

    def plain_ok(device: str) -> bool:
        if device not in plain:
            plain[device] = plain_tvm_status(case, device)
        return plain[device].outcome == PASS

    if result.imported.outcome != PASS:
        owners["import"] = OURS if plain_ok("cpu") else TVM
        return owners
    for path in ("cpu", "opencl"):
        res = result.paths.get(path)
        if res is not None and res.outcome not in (PASS, NOT_APPLICABLE, SKIPPED):
            owners[path] = OURS if plain_ok(path) else TVM
    cpu = result.paths.get("cpu")
    for path in ("coexec-H", "coexec-OC", "beside", IMAGE_PATH):
        res = result.paths.get(path)
        if res is None or res.outcome in (PASS, NOT_APPLICABLE, SKIPPED):
            continue
        if cpu is None or cpu.outcome == PASS:
            owners[path] = OURS
        else:
            owners[path] = owners.get("cpu", OURS)
    return owners
