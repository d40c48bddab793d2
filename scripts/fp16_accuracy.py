"""Half precision on the GPU: each benchmark model's error against onnxruntime, per GPU variant.

Builds every model as ``codl-tvm compile`` does (no timing:
:func:`codl_tvm.objectives.latency.compile_artifact`) in float32 and float16 variants, runs each on
the same seeded random inputs and compares its outputs with onnxruntime's (CPU, float32)::

    python scripts/fp16_accuracy.py --out benchmarks/fp16_accuracy_intel_cpu_opencl.json

Variants (``--variants``):

- ``gpu_buffer_fp32``: the GPU alone, buffers, float32 (the baseline: the GPU's kernels'
  own error);
- ``gpu_buffer_fp16`` / ``gpu_image_fp16`` (and ``gpu_image_fp32``): the GPU alone with its
  tensors in half buffers / half images (``compile --device opencl --gpu-data-type buffer|image
  --gpu-dtype float16``: TVM's mixed precision, convs accumulating in half);
- ``coexec_image_fp16`` (and ``coexec_image_fp32``): co-executed with the GPU parts on half
  images, the CPU parts in float32, under the plan ``--coexec-dim``/``--coexec-ratio`` (by
  default every conv split along output channels at 0.5, ``compile --device coexec --dim OC
  --ratio 0.5``: the cost model's plan on a small CPU OpenCL device keeps one processor, which
  would not co-execute at all).

Per output: the largest absolute error, that error over the reference's largest magnitude, and
whether ``run --check``'s float16 tolerance holds (the error within 5% of max(1, largest
magnitude)); for classifier outputs (one axis of at least 10 values) whether the top-1 class
matches and how many of the reference's top five are among the variant's top five. With
``--inputs N`` each model runs N seeded inputs; errors are the largest over them.

The half-precision variants need an OpenCL device with ``cl_khr_fp16`` (NVIDIA's OpenCL lacks
it; Intel's CPU OpenCL runtime from PyPI has it; ``CODL_OPENCL_PLATFORM`` picks the platform).
Models are built and run one at a time, in the order given; ``--time-limit-s`` skips the
remaining variants of a model whose builds and runs took longer (recorded as not done); ``--resume``
adds models to an earlier ``--out`` (its commands kept as ``earlier_commands``).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

#: The ten benchmark models, smallest first (builds and runs grow with them).
MODELS = (
    "squeezenet",
    "bvlc_alexnet",
    "inception_v1",
    "retinaface",
    "posenet",
    "resnet50",
    "fst",
    "yolov2",
    "vgg16",
    "vgg19",
)

#: Variant name -> (``--device``, ``--gpu-data-type``, ``--gpu-dtype``).
VARIANTS: dict[str, tuple[str, str, str]] = {
    "gpu_buffer_fp32": ("opencl", "buffer", "float32"),
    "gpu_buffer_fp16": ("opencl", "buffer", "float16"),
    "gpu_image_fp32": ("opencl", "image", "float32"),
    "gpu_image_fp16": ("opencl", "image", "float16"),
    "coexec_image_fp32": ("coexec", "image", "float32"),
    "coexec_image_fp16": ("coexec", "image", "float16"),
}
DEFAULT_VARIANTS = (
    "gpu_buffer_fp32",
    "gpu_buffer_fp16",
    "gpu_image_fp32",
    "gpu_image_fp16",
    "coexec_image_fp16",
)

#: ``run --check``'s float16 tolerance (:data:`codl_tvm.cli.run.CHECK_TOLERANCE`), relative to
#: max(1, the reference's largest magnitude).
FP16_TOLERANCE = 5e-2
#: An output with one axis of at least this many values (the others 1) is a classifier's.
MIN_CLASSES = 10


# --- error metrics (pure) -------------------------------------------------------------------------


def is_classifier_output(shape: Sequence[int]) -> bool:
    """Whether an output of ``shape`` holds one score per class: one axis of at least
    :data:`MIN_CLASSES` values, every other axis 1 (``(1, 1000)``, ``(1, 1000, 1, 1)``)."""
    big = [d for d in shape if d != 1]
    return len(big) == 1 and big[0] >= MIN_CLASSES


def top_k(scores: np.ndarray, k: int) -> list[int]:
    """The indices of the ``k`` largest of ``scores`` (flattened), largest first."""
    flat = np.asarray(scores, dtype=np.float64).ravel()
    return [int(i) for i in np.argsort(-flat, kind="stable")[:k]]


def output_errors(got: np.ndarray, want: np.ndarray) -> dict:
    """How far ``got`` is from the reference ``want`` (same shape).

    Returns
    -------
    dict
        ``max_abs_error``; ``ref_max_abs`` (the reference's largest magnitude);
        ``max_rel_error`` (the first over the second; inf where the reference is all zero but
        ``got`` is not); ``within_check_tolerance`` (``run --check``'s float16 rule: the error
        at most :data:`FP16_TOLERANCE` of max(1, ``ref_max_abs``)); ``finite`` (no NaN or inf
        in ``got``); and for a classifier output (:func:`is_classifier_output`) ``top1_match``
        and ``top5_overlap`` (how many of the reference's top five are in ``got``'s).

    Raises
    ------
    ValueError
        ``got`` and ``want`` differ in shape.
    """
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise ValueError(f"got: shape {got.shape}, want: shape {want.shape}")
    finite = bool(np.isfinite(got).all())
    err = float(np.abs(got - want).max()) if got.size else 0.0
    if not finite:
        err = float("inf")
    ref_max = float(np.abs(want).max()) if want.size else 0.0
    if ref_max > 0:
        rel = err / ref_max
    else:
        rel = 0.0 if err == 0 else float("inf")
    row: dict = {
        "max_abs_error": err,
        "ref_max_abs": ref_max,
        "max_rel_error": rel,
        "within_check_tolerance": err <= FP16_TOLERANCE * max(1.0, ref_max),
        "finite": finite,
    }
    if is_classifier_output(want.shape):
        row["top1_match"] = top_k(got, 1) == top_k(want, 1)
        row["top5_overlap"] = len(set(top_k(got, 5)) & set(top_k(want, 5)))
    return row


def combine(rows: Sequence[dict]) -> dict:
    """One summary of per-output, per-input rows of :func:`output_errors`: the largest errors,
    whether every row was within tolerance and finite, and for classifier rows how many top-1
    classes matched (of how many) and the smallest top-5 overlap."""
    if not rows:
        raise ValueError("rows: at least one row of output_errors")
    summary: dict = {
        "max_abs_error": max(r["max_abs_error"] for r in rows),
        "max_rel_error": max(r["max_rel_error"] for r in rows),
        "within_check_tolerance": all(r["within_check_tolerance"] for r in rows),
        "finite": all(r["finite"] for r in rows),
    }
    classes = [r for r in rows if "top1_match" in r]
    if classes:
        summary["top1_agree"] = sum(r["top1_match"] for r in classes)
        summary["top1_of"] = len(classes)
        summary["top5_min_overlap"] = min(r["top5_overlap"] for r in classes)
    return summary


# --- building and running -------------------------------------------------------------------------


def _model_file(name: str, folder: Path) -> Path:
    """The ONNX file of benchmark model ``name``, as the planner benchmark makes it
    (:func:`codl_tvm.frontend.models.benchmark_model`: seeded random weights)."""
    import onnx

    from codl_tvm.frontend.models import benchmark_model

    path = folder / f"{name}.onnx"
    if not path.exists():
        onnx.save(benchmark_model(name), str(path))
    return path


def _reference(path: Path, inputs: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """onnxruntime's outputs (CPU, float32) for each of ``inputs``."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [[np.asarray(o) for o in session.run(None, x)] for x in inputs]


def _build(path: Path, out: Path, variant: str, dim: str, ratio: float) -> dict:
    """Compile ``path`` as ``variant`` into ``out``; returns what the manifest says was built."""
    from codl_tvm.core.plan import uniform_plan
    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.objectives.latency import compile_artifact
    from codl_tvm.options import CompileOptions

    device, data_type, dtype = VARIANTS[variant]
    plan = None
    if device == "coexec":
        plan = uniform_plan(load_onnx(path).mod, dim, ratio)  # what --dim/--ratio give
    options = CompileOptions(
        device=device,
        plan=plan,
        measure=False,
        reference=False,
        force=True,
        gpu_data_type=data_type,
        gpu_dtype=dtype,
    )
    compile_artifact(str(path), str(out), options)
    from codl_tvm.runtime.artifact import load_artifact

    manifest = load_artifact(out).manifest
    built: dict = {"device": manifest.device, "gpu": dict(manifest.get("gpu") or {})}
    parts = (manifest.get("kernel_splits") or {}).get("gpu_parts") or []
    if parts:
        half = sum(1 for r in parts if r.get("dtype") == "float16")
        built["gpu_parts"] = {"splits": len(parts), "float16": half}
    return built


def _run(out: Path, inputs: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """The artifact at ``out`` run on each of ``inputs``."""
    from codl_tvm.frontend.importer import check_inputs
    from codl_tvm.runtime.artifact import load_artifact

    art = load_artifact(out)
    results = [art(check_inputs(art.model, x, "inputs")) for x in inputs]
    del art
    gc.collect()
    return results


def measure_model(
    name: str,
    variants: Sequence[str],
    work: Path,
    n_inputs: int,
    dim: str,
    ratio: float,
    time_limit_s: float,
) -> dict:
    """Every variant of model ``name`` against onnxruntime; a variant that failed records its
    error, one left out after ``time_limit_s`` of builds and runs records ``not_done``."""
    from codl_tvm.frontend.importer import load_onnx, random_inputs

    path = _model_file(name, work)
    model = load_onnx(path)
    inputs = [random_inputs(model, seed=s) for s in range(n_inputs)]
    reference = _reference(path, inputs)
    record: dict = {
        "outputs": [{"name": s.name, "shape": list(s.shape)} for s in model.outputs],
        "variants": {},
    }
    start = time.perf_counter()
    for variant in variants:
        spent = time.perf_counter() - start
        if spent > time_limit_s:
            record["variants"][variant] = {
                "not_done": f"the model's builds and runs took {spent:.0f} s > --time-limit-s"
            }
            print(f"{name} {variant}: not done ({spent:.0f} s of builds and runs)", flush=True)
            continue
        out = work / f"{name}_{variant}"
        t0 = time.perf_counter()
        try:
            built = _build(path, out, variant, dim, ratio)
            build_s = time.perf_counter() - t0
            outputs = _run(out, inputs)
        except Exception as exc:  # a script: record and go on with the next variant
            line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            record["variants"][variant] = {"error": f"{type(exc).__name__}: {line}"}
            print(f"{name} {variant}: FAILED {line}", flush=True)
            continue
        finally:
            shutil.rmtree(out, ignore_errors=True)
        rows = [
            output_errors(got, want)
            for outs, refs in zip(outputs, reference, strict=True)
            for got, want in zip(outs, refs, strict=True)
        ]
        row = {**built, "build_s": round(build_s, 1), **combine(rows)}
        record["variants"][variant] = row
        print(
            f"{name} {variant}: built {built['device']} in {build_s:.0f} s, max abs "
            f"{row['max_abs_error']:.3g}, rel {row['max_rel_error']:.3g}"
            + (f", top-1 {row['top1_agree']}/{row['top1_of']}" if "top1_agree" in row else ""),
            flush=True,
        )
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated, in order")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    parser.add_argument(
        "--coexec-models",
        default=None,
        help="models that get the coexec_* variants (default: every model)",
    )
    parser.add_argument("--coexec-dim", default="OC", choices=("OC", "H"))
    parser.add_argument("--coexec-ratio", type=float, default=0.5)
    parser.add_argument("--inputs", type=int, default=3, help="seeded random inputs per model")
    parser.add_argument("--time-limit-s", type=float, default=600.0)
    parser.add_argument("--work-dir", default=None, help="default: a temporary folder")
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the models already in --out (measured by an earlier command) and add to them",
    )
    args = parser.parse_args(argv)

    from bench_util import envelope, open_opencl, write_json

    from codl_tvm.runtime.images import image_caps

    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    models = [m for m in args.models.split(",") if m]
    coexec = set(models if args.coexec_models is None else args.coexec_models.split(","))
    _, device = open_opencl()
    caps = image_caps()
    device["cl_khr_fp16"] = caps.fp16
    if not caps.fp16:
        print(f"warning: OpenCL device '{caps.device}' lacks cl_khr_fp16", file=sys.stderr)
    results: dict = {}
    earlier: list[str] = []
    if args.resume and Path(args.out).is_file():
        previous = json.loads(Path(args.out).read_text())
        results = previous["results"]
        earlier = [*previous.get("earlier_commands", []), previous["command"]]
    with tempfile.TemporaryDirectory(prefix="codl-fp16-") as tmp:
        work = Path(args.work_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in models:
            if name in results:
                print(f"{name}: kept from {args.out}", flush=True)
                continue
            chosen = [v for v in variants if not v.startswith("coexec") or name in coexec]
            results[name] = measure_model(
                name,
                chosen,
                work,
                args.inputs,
                args.coexec_dim,
                args.coexec_ratio,
                args.time_limit_s,
            )
            skipped = [v for v in variants if v not in chosen]
            for v in skipped:
                results[name]["variants"][v] = {"not_done": "not in --coexec-models"}
            # written after each model: a long run keeps what it measured
            write_json(
                args.out,
                envelope(
                    ["python", "scripts/fp16_accuracy.py", *(argv or sys.argv[1:])],
                    results,
                    **({"earlier_commands": earlier} if earlier else {}),
                    device=device,
                    reference="onnxruntime (CPU, float32)",
                    inputs=args.inputs,
                    coexec_plan={"dim": args.coexec_dim, "ratio": args.coexec_ratio},
                    fp16_tolerance=FP16_TOLERANCE,
                ),
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
