"""End-to-end planner benchmark: every baseline and codl-tvm per model.

Compile (here, or on the device machine with TVM's compiler library), then run there::

    python scripts/bench_planner.py compile --jobs 8 --preset emulated-soc \\
        --models squeezenet,vgg16 --cost-model codl_tvm/data/cost_models/emulated-soc.json \\
        --oracle oracle.json --out .device/plans_soc
    python3 scripts/bench_planner.py run --dir .device/plans_soc --out $OUT/planner.json \\
        --tvm-cpus 8-15 --rounds 5 --number 3 --trace-dir $OUT/traces

Per model the directory holds one ``codl-tvm compile`` artifact per baseline: ``cpu`` and
``gpu`` (single-processor builds), the planner modes (``codl``, ``codl_no_chain``, ``h_only``,
``oc_only``, ``ulayer_like``; ``MODE_alone`` builds a mode with the CPU-alone kernels on
every CPU function, ``MODE_wholenorm`` keeping InstanceNorm-like blocks whole,
``MODE_streaming`` planned with ``--weight-gbps``, ``MODE_rowlrn`` splitting LRN blocks by rows;
suffixes combine in any order)
with the cost model, and ``oracle`` (``codl_no_chain`` planned with
a table of measured part latencies: each operator's measured best split). ``run`` checks every
artifact against the host reference stored with the CPU build, times it, and reports speedups
over the best single processor and over uLayer-like, the share of the ideal bound
T* = 1 / (1/Tcpu + 1/Tgpu) and of the same bound with each processor's latency measured while
the other runs its own build (``--concurrent-s``: T* under contention), plan statistics and the
planning time; ``--trace-dir`` also writes a timeline of one codl inference per model (of the
first co-executed variant where codl fell back to one processor). Variants are timed
round-robin (``--rounds`` samples of ``--number`` runs each). ``plot`` draws latency against
T* and codl's plan statistics from run JSONs. ``compare --a codl --b codl_rowlrn`` pools two
builds' per-round latency ratios over run JSONs, with a sign test (an A/B of a default).

``refine --from codl --tag codl_refined`` rebalances each model's ``codl`` artifact from
timelines taken on this machine (``codl-tvm refine``): the timelines one model at a time (the
machine must be quiet), then the refined builds in parallel; ``warm`` them before ``run``.
Refining ``codl_refined`` again into ``codl_refined2`` is a second round.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

PLANNER_MODES = ("codl", "codl_no_chain", "h_only", "oc_only", "ulayer_like")
#: HOPE's placement modes and their baselines (``compile --mode``), built like the above.
PLACEMENT_MODES = ("hope", "hope_greedy", "starpu", "mosaic", "codl_hope")
#: A mode tag ending so (``codl_alone``) is that mode built with ``compile
#: --coexec-cpu-alone-kernels``: every CPU function gets the kernels of the build for the CPU alone.
ALONE_SUFFIX = "_alone"
#: ... and ending so (``codl_wholenorm``): that mode with ``compile --no-split-channel-blocks``
#: (InstanceNorm-like blocks after a split stay whole on one processor).
WHOLENORM_SUFFIX = "_wholenorm"
#: ... and ending so (``codl_streaming``): that mode planned with ``compile --weight-gbps``
#: (``compile`` takes the rates from this script's ``--weight-gbps``).
STREAMING_SUFFIX = "_streaming"
#: ... and ending so (``codl_rowlrn``): that mode with ``compile --split-row-blocks`` (an LRN
#: after an H split is split along rows; off by default since an A/B measured it slower, which
#: tagged the whole LRN ``codl_wholelrn`` while the split was the default).
ROWLRN_SUFFIX = "_rowlrn"
#: ... and ending so (``codl_hostorder``): that mode with ``compile --no-issue-ahead`` (GPU
#: kernels enqueued in ``main``'s order, when the host reaches them): the A/B of the issue order.
HOSTORDER_SUFFIX = "_hostorder"
#: ... and ending so (``codl_image``): that mode with ``compile --gpu-data-type image`` (the GPU
#: parts on OpenCL images, the CPU parts on buffers): the A/B of the GPU's data type.
IMAGE_SUFFIX = "_image"
#: GPU-alone variants (``compile --gpu-variants``): tag ``gpu_VARIANT`` built with ``compile
#: --device opencl`` and these ``--gpu-data-type``, ``--gpu-dtype``, beside the buffers' ``gpu``.
GPU_VARIANTS = {
    "image": ("image", "float32"),
    "fp16": ("buffer", "float16"),
    "image_fp16": ("image", "float16"),
    # what `--gpu-data-type auto` keeps after timing buffers against images here
    "auto": ("auto", "float32"),
}


class _TagFlags(NamedTuple):
    mode: str
    alone: bool = False
    wholenorm: bool = False
    streaming: bool = False
    rowlrn: bool = False
    hostorder: bool = False
    image: bool = False


_SUFFIXES = {
    ALONE_SUFFIX: "alone",
    WHOLENORM_SUFFIX: "wholenorm",
    STREAMING_SUFFIX: "streaming",
    ROWLRN_SUFFIX: "rowlrn",
    HOSTORDER_SUFFIX: "hostorder",
    IMAGE_SUFFIX: "image",
}


def _tag_mode(tag: str, strict: bool = True) -> _TagFlags:
    """A planner-mode tag's mode and build flags, its suffixes in any order
    (``codl_alone_rowlrn``: mode codl, the CPU-alone kernels, LRN split by rows).

    Raises SystemExit, with ``strict``, for a mode that is not a planner mode (e.g. the retired
    ``_wholelrn``); without it, other tags (``cpu``, ``oracle``, ``codl_verify``) get no flags.
    """
    flags: dict[str, bool] = {}
    rest = tag
    while True:
        hit = next((s for s in _SUFFIXES if rest.endswith(s)), None)
        if hit is None:
            break
        flags[_SUFFIXES[hit]] = True
        rest = rest.removesuffix(hit)
    if strict and rest not in (*PLANNER_MODES, *PLACEMENT_MODES):
        hint = (
            ": LRN blocks are whole by default now, `_rowlrn` splits them"
            if tag.endswith("_wholelrn")
            else ""
        )
        sys.exit(
            f"bench_planner: tag {tag!r} names no planner mode (one of {', '.join(PLANNER_MODES)} "
            f"with suffixes {', '.join(_SUFFIXES)}){hint}"
        )
    return _TagFlags(rest, **flags)


def _model_file(name: str, tmp: Path, model_dir: Path | None = None) -> Path:
    import onnx

    from codl_tvm.frontend.models import benchmark_model, bundled_model_path

    if name == "codl_small_cnn":
        return bundled_model_path()
    if model_dir is not None and (model_dir / f"{name}.onnx").is_file():
        return model_dir / f"{name}.onnx"  # e.g. the unseen models (export_unseen_models.py)
    path = tmp / f"{name}.onnx"
    if not path.exists():
        onnx.save(benchmark_model(name), str(path))
    return path


def _planning_alone_s(name: str, manifest: dict, preset: str, repeat: int) -> float | None:
    """Median seconds of planning ``name`` again here, one plan at a time, with the artifact's
    cost model and mode (the compile's own ``planning_s`` ran beside parallel builds). None for
    an artifact that was not planned by the cost model."""
    import tempfile

    from codl_tvm.artifact import planning_context
    from codl_tvm.cost_model.base import load_model
    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.planner import plan_model

    plan = manifest.get("plan") or {}
    cm = (plan.get("cost_model") or {}).get("file")
    if plan.get("source") != "planner" or not cm or repeat < 1:
        return None
    recorded = Path((manifest.get("model") or {}).get("path", ""))
    with tempfile.TemporaryDirectory() as tmp:
        # the compiled file where it is still there (a model outside the ten), else the ten's
        model = load_onnx(recorded if recorded.is_file() else _model_file(name, Path(tmp)))
    cost_model = load_model(cm)
    times = []
    with planning_context(preset, cm) as config:
        for _ in range(repeat):
            t0 = time.perf_counter()
            plan_model(model.mod, cost_model, plan["mode"], config)
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


class _Job(NamedTuple):
    """One artifact to build (picklable: spawned build workers receive it)."""

    name: str
    tag: str
    path: Path
    target: Path
    device: str
    mode: str | None
    cost_model: str | None
    preset: str
    verify: int
    verify_modes: tuple[str, ...]
    cache: Path
    refine: int
    weight_gbps: tuple[float, float] | None
    processor_scale: tuple[float, float] = (1.0, 1.0)
    # a GPU-alone variant's data type and dtype (tag gpu_VARIANT)
    gpu_data_type: str = "buffer"
    gpu_dtype: str = "float32"
    # the tag `default`: `codl-tvm compile` as a user runs it, which times its candidates here
    measure: bool = False


#: The tag of the build a default ``codl-tvm compile`` makes (``compile --default``).
DEFAULT_TAG = "default"


def _compile_job(job: _Job) -> tuple[str, str, str | None, float]:
    from codl_tvm.objectives.latency import compile_artifact
    from codl_tvm.options import CompileOptions

    flags = _tag_mode(job.tag, strict=False)
    t0 = time.perf_counter()
    try:
        options = CompileOptions(
            device=job.device,
            mode=job.mode or "codl",
            cost_model=job.cost_model,
            preset=job.preset,
            reference=(job.tag == "cpu"),
            verify=job.verify,
            verify_modes=job.verify_modes,
            # a baseline is one build as planned; only `default` measures, as a user's compile
            measure=job.measure,
            refine=job.refine,
            build_cache=job.cache,
            coexec_cpu_alone=True if flags.alone else None,  # else: as the cost model says
            split_channel_blocks=not flags.wholenorm,
            weight_gbps=job.weight_gbps if flags.streaming else None,
            split_row_blocks=flags.rowlrn,
            issue_ahead=not flags.hostorder,
            processor_scale=job.processor_scale,
            gpu_data_type="image" if flags.image else job.gpu_data_type,
            gpu_dtype=job.gpu_dtype,
        )
        compile_artifact(job.path, job.target, options)
    except Exception as exc:  # one failing build must not lose the others
        return job.name, job.tag, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0
    return job.name, job.tag, None, time.perf_counter() - t0


def _gpu_variants(text: str) -> str:
    unknown = [v for v in text.split(",") if v and v not in GPU_VARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown GPU variant(s) {', '.join(unknown)}; one of {', '.join(GPU_VARIANTS)}"
        )
    return text


def _scale_pair(text: str) -> tuple[float, float]:
    try:
        cpu, gpu = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected CPU,GPU factors, got {text!r}") from None
    if not (cpu > 0 and gpu > 0 and math.isfinite(cpu) and math.isfinite(gpu)):
        raise argparse.ArgumentTypeError(f"factors must be positive and finite, got {text!r}")
    return cpu, gpu


def cmd_compile(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    models_dir = out / "models"
    models_dir.mkdir(exist_ok=True)
    index = {
        "preset": args.preset,
        "cost_model": args.cost_model,
        "oracle": args.oracle,
        "models": {},
    }
    if (out / "index.json").exists():  # a later call adds models or modes
        earlier = json.loads((out / "index.json").read_text())
        index["models"] = earlier["models"]
        index["onnx"] = earlier.get("onnx", {})
    if any(_tag_mode(m).streaming for m in args.modes.split(",") if m) and not args.weight_gbps:
        sys.exit(f"bench_planner compile: a mode ending {STREAMING_SUFFIX} needs --weight-gbps")
    jobs = []
    cache = Path(args.build_cache) if args.build_cache else out / "build_cache"
    model_dir = Path(args.model_dir) if args.model_dir else None
    for name in args.models.split(","):
        path = _model_file(name, models_dir, model_dir)
        if model_dir is not None and path.parent == model_dir:
            # kept by its owner (the ten's files are removed below and made again by `run`)
            index.setdefault("onnx", {})[name] = str(path.resolve())
        todo = [("cpu", "cpu", None, None, 0), ("gpu", "opencl", None, None, 0)]
        todo += [
            (m, "coexec", _tag_mode(m).mode, args.cost_model, 0) for m in args.modes.split(",") if m
        ]
        if args.oracle:
            todo.append(("oracle", "coexec", "codl_no_chain", args.oracle, 0))
        gpu_variants = {f"gpu_{v}": GPU_VARIANTS[v] for v in args.gpu_variants.split(",") if v}
        todo += [(tag, "opencl", None, None, 0) for tag in gpu_variants]
        for vmode in args.verify_mode.split(",") if args.verify else ():
            todo.append((f"{vmode}_verify", "coexec", vmode, args.cost_model, args.verify))
        modes = tuple(m for m in args.verify_modes.split(",") if m)
        for tag, device, mode, cost_model, verify in todo:
            target = out / name / tag
            if not (target / "manifest.json").exists():
                jobs.append(
                    _Job(
                        name,
                        tag,
                        path,
                        target,
                        device,
                        mode,
                        cost_model,
                        args.preset,
                        verify,
                        modes if verify else (),
                        cache,
                        args.verify_refine if verify else 0,
                        args.weight_gbps,
                        args.processor_scale,
                        *gpu_variants.get(tag, ()),
                        measure=gpu_variants.get(tag, ("",))[0] == "auto",
                    )
                )
            else:
                index["models"].setdefault(name, {})[tag] = f"{name}/{tag}"
        target = out / name / DEFAULT_TAG
        if args.default and not (target / "manifest.json").exists():
            # what a user's `codl-tvm compile` keeps: it plans like `codl`, times the plan and
            # each processor alone here and keeps the fastest (timed one at a time, below)
            jobs.append(
                _Job(
                    name,
                    DEFAULT_TAG,
                    path,
                    target,
                    "coexec",
                    "codl",
                    args.cost_model,
                    args.preset,
                    0,
                    (),
                    cache,
                    0,
                    None,
                    args.processor_scale,
                    measure=True,
                )
            )
    failed: dict[str, str] = {}
    index.setdefault("failed", {})
    index.setdefault("compile_s", {})

    def record(result: tuple[str, str, str | None, float]) -> None:
        # The index is written after every build: a run stopped by a timeout keeps the builds
        # it finished.
        name, tag, err, seconds = result
        index["compile_s"][f"{name}/{tag}"] = round(seconds, 2)
        print(f"== {name} {tag}: {err or 'ok'} ({seconds:.1f} s)", flush=True)
        if err:
            failed[f"{name}/{tag}"] = err
        else:
            index["models"].setdefault(name, {})[tag] = f"{name}/{tag}"
        index["failed"] = {**index.get("failed", {}), **failed}
        (out / "index.json").write_text(json.dumps(index, indent=2))

    # --verify builds time themselves: one at a time, after the parallel builds, whose
    # libraries (each mode's plan, each processor alone) they take from the build cache.
    timed = [j for j in jobs if j.verify or j.measure]
    jobs = [j for j in jobs if not (j.verify or j.measure)]
    if args.jobs > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # Spawned workers: TVM's state is not fork-safe. Biggest models first.
        jobs.sort(key=lambda j: -Path(j.path).stat().st_size)
        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
            for future in as_completed([pool.submit(_compile_job, j) for j in jobs]):
                record(future.result())
    else:
        for j in jobs:
            record(_compile_job(j))
    if timed and args.tvm_cpus:
        from codl_tvm.runtime.threads import pin_tvm_threads

        pin_tvm_threads(args.tvm_cpus)  # --verify times the builds as `run` would
    for j in timed:
        record(_compile_job(j))
    (out / "index.json").write_text(json.dumps(index, indent=2))
    # The ONNX files and cached libraries are not needed to run (artifacts are self-contained).
    shutil.rmtree(models_dir, ignore_errors=True)
    if not args.keep_build_cache:
        shutil.rmtree(cache, ignore_errors=True)


def _stats(manifest: dict, art_dir: Path) -> dict:
    plan = manifest.get("plan") or {}
    out = {
        "device": manifest["device"],
        "fallback": plan.get("fallback"),
        "planning_s": plan.get("planning_s"),
        # the library's SHA-256: two tags with the same one ran the same code (their latencies
        # differ by the machine's noise only)
        "library_sha256": (manifest.get("files") or {}).get("model.so"),
    }
    if manifest.get("verify"):
        out["verify"] = manifest["verify"]
    for key in ("calibration", "calibrated", "mode", "predicted_fallback", "source", "refine"):
        if key in plan:
            out[f"plan_{key}"] = plan[key]
    summary = plan.get("summary")
    if summary:
        out["predicted_ms"] = summary["predicted_ms"]
        out["plan"] = {
            k: summary[k]
            for k in (
                "n_ops",
                "n_split_h",
                "n_split_oc",
                "n_whole_cpu",
                "n_whole_gpu",
                "chain_lengths",
            )
        }
    return out


def _trace_tag(entries: dict, manifests: dict) -> str | None:
    """The variant whose timeline is drawn: codl, else (codl fell back) the first co-executed."""
    for tag in (
        "codl",
        "codl_verify",
        "codl_no_chain",
        "oracle",
        "h_only",
        "oc_only",
        "ulayer_like",
    ):
        if tag in entries and manifests[tag]["device"] == "coexec":
            return tag
    return None


def _warm_job(job: tuple) -> tuple[str, float, str | None]:
    root, rel, platform = job
    from codl_tvm import runtime
    from codl_tvm.artifact import load_artifact
    from codl_tvm.frontend.importer import random_inputs

    t0 = time.perf_counter()
    try:
        runtime.load(platform=platform or None)
        art = load_artifact(Path(root) / rel, verify=False)
        values = random_inputs(art.model, 0)
        art([values[s.name] for s in art.model.inputs])
    except Exception as exc:  # reported; `run` checks every artifact again
        return rel, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"
    return rel, time.perf_counter() - t0, None


def cmd_warm(args: argparse.Namespace) -> None:
    """Run every artifact once, in parallel processes, so that the OpenCL program caches
    (codl's and the driver's, both on disk) hold every kernel before anything is timed:
    PoCL compiles each program for tens of seconds on first use, which otherwise dominates
    `run` and `--verify` (one model's kernels built one after the other)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    root = Path(args.dir)
    index = json.loads((root / "index.json").read_text())
    wanted = args.models.split(",") if args.models else list(index["models"])
    jobs = [(str(root), rel, args.platform) for n in wanted for rel in index["models"][n].values()]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
        for future in as_completed([pool.submit(_warm_job, j) for j in jobs]):
            rel, seconds, err = future.result()
            print(f"== warm {rel}: {seconds:.1f} s {err or 'ok'}", flush=True)
    print(f"warmed {len(jobs)} artifacts in {time.perf_counter() - t0:.0f} s", flush=True)


OK_TOLERANCE = 1e-3


def _tolerance(manifest: dict) -> float:
    from codl_tvm.cli.run import CHECK_TOLERANCE

    dtype = (manifest.get("gpu") or {}).get("dtype", "float32")
    return max(OK_TOLERANCE, CHECK_TOLERANCE.get(dtype, OK_TOLERANCE))


#: The row of onnxruntime on TVM's cores (``run --onnxruntime``): what a user runs instead.
ORT_TAG = "onnxruntime"
#: Seconds of quiet before each onnxruntime sample: both runtimes' thread pools spin after a
#: run, and onnxruntime timed right after TVM measured 2-3x slower than alone
#: (scripts/bench_cpu_models.py).
ORT_SWITCH_S = 0.2


def _onnxruntime(index: dict, name: str, ref_inputs: dict, ref_outputs: list, threads: int):
    """onnxruntime's CPU session of ``name`` on the calling thread's cores with ``threads``
    intra-op threads (TVM's CPU stand-in's): a function timing ``number`` runs (median ms,
    after a pause and a warm-up run) and the row, checked against the CPU build's reference."""
    import tempfile

    import onnxruntime as ort

    from codl_tvm.build.runner import max_abs_difference

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    with tempfile.TemporaryDirectory() as tmp:
        path = index.get("onnx", {}).get(name)
        if path is None or not Path(path).is_file():
            if path is not None:
                sys.exit(f"bench_planner run: the ONNX file of {name} is gone ({path})")
            path = _model_file(name, Path(tmp))  # seeded: the model the builds were made of
        # the pool's threads start here and inherit this thread's cores (pin_tvm_threads)
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    feeds = (
        {n: ref_inputs[n] for n in names}
        if set(names) <= set(ref_inputs)
        else dict(zip(names, ref_inputs.values()))
    )
    err = max_abs_difference(sess.run(None, feeds), ref_outputs)

    def run(number: int) -> float:
        time.sleep(ORT_SWITCH_S)
        sess.run(None, feeds)  # warm-up after the switch
        ms = []
        for _ in range(number):
            t0 = time.perf_counter()
            sess.run(None, feeds)
            ms.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(ms))

    scale = max(1.0, *(float(np.max(np.abs(r[np.isfinite(r)]), initial=0.0)) for r in ref_outputs))
    row = {
        "max_abs_err": err,
        "ok": err <= OK_TOLERANCE * scale,
        "device": "onnxruntime",
        "threads": threads,
    }
    return run, row


def cmd_run(args: argparse.Namespace) -> None:
    import tvm  # noqa: F401  (runtime-only TVM is enough)
    from bench_util import envelope, write_json

    from codl_tvm import runtime
    from codl_tvm.artifact import load_artifact
    from codl_tvm.build.runner import max_abs_difference
    from codl_tvm.profiling.bound import gap_breakdown, ideal_bound_ms
    from codl_tvm.profiling.stats import concurrent_bound, paired_ratios
    from codl_tvm.runtime.threads import pin_tvm_threads

    root = Path(args.dir)
    index = json.loads((root / "index.json").read_text())
    runtime.load(platform=args.platform or None)
    info = runtime.info()
    from codl_tvm.runtime import sync

    sync.set_sync_mode(args.sync_mode)
    cpus = pin_tvm_threads(args.tvm_cpus) if args.tvm_cpus else list(range(os.cpu_count() or 1))
    results = {
        "platform": info.platform,
        "device": info.devices[0].name,
        "compute_units": info.devices[0].compute_units,
        "svm": info.svm_mode,
        "preset": index["preset"],
        "rounds": args.rounds,
        "number": args.number,
        "failed_builds": index.get("failed", {}),
        "models": {},
    }
    if args.out and Path(args.out).exists() and args.append:
        results["models"] = json.loads(Path(args.out).read_text())["results"]["models"]
    wanted = args.models.split(",") if args.models else list(index["models"])
    env = {
        k: os.environ.get(k)
        for k in (
            "POCL_CPU_MAX_CU_COUNT",
            "POCL_AFFINITY",
            "TVM_NUM_THREADS",
            "CODL_OPENCL_PLATFORM",
        )
    }
    for name in wanted:
        entries = index["models"][name]
        t0 = time.perf_counter()
        ref_inputs, ref_outputs = load_artifact(root / entries["cpu"]).reference()
        arts, inputs, rows = {}, {}, {}
        for tag, rel in entries.items():
            art = load_artifact(root / rel)
            inputs[tag] = [ref_inputs[s.name] for s in art.model.inputs]
            outs = art(inputs[tag])
            err = max_abs_difference(outs, ref_outputs)
            scale = max(
                1.0, *(float(np.max(np.abs(r[np.isfinite(r)]), initial=0.0)) for r in ref_outputs)
            )
            arts[tag] = art
            rows[tag] = {
                "max_abs_err": err,
                # 1e-3 of the output's scale: float32 reductions reorder with thread counts and
                # splits (FST's 16 instance norms: 1.4e-4 to 2.7e-4 on its tanh output, the
                # single-processor builds included); a wrong halo or region is off by 1e-1 or more;
                # a half-precision GPU gets `run --check`'s half tolerance
                "ok": err <= _tolerance(art.manifest) * scale,
                **_stats(art.manifest, root / rel),
            }
        ort_run = None
        if args.onnxruntime:
            ort_run, rows[ORT_TAG] = _onnxruntime(index, name, ref_inputs, ref_outputs, len(cpus))
        # Round-robin: every variant is timed once per round, so drift (clocks, other load)
        # spreads over all of them instead of favouring whichever ran first.
        samples: dict[str, list[float]] = {tag: [] for tag in arts}
        if ort_run is not None:
            samples[ORT_TAG] = []
        # T*c (each processor's whole model while the other runs its own whole model in a
        # loop: the same kernels and memory traffic a co-execution makes, so the bound two
        # independent inferences reach together) is measured in every round, beside the builds
        # it bounds: paired per round, and its spread over rounds is its noise.
        contended: list = []
        for _ in range(args.rounds):
            for tag, art in arts.items():
                lat = art.time(inputs[tag], number=args.number, repeat=1)
                samples[tag].append(lat.median_ms)
            if ort_run is not None:
                samples[ORT_TAG].append(ort_run(args.number))
            if args.concurrent_s > 0:
                contended.append(
                    concurrent_bound(
                        arts["cpu"].runner(inputs["cpu"]),
                        arts["gpu"].runner(inputs["gpu"]),
                        seconds=args.concurrent_s,
                    )
                )
        for tag, ms in samples.items():
            rows[tag].update(
                median_ms=float(np.median(ms)),
                min_ms=float(np.min(ms)),
                max_ms=float(np.max(ms)),
                samples_ms=[round(v, 4) for v in ms],
            )
            print(
                f"{name:14s} {tag:14s} {rows[tag]['median_ms']:10.3f} ms  "
                f"err {rows[tag]['max_abs_err']:.1e}  {rows[tag]['device']}",
                flush=True,
            )
        t_star_c = float(np.median([c.t_star_ms for c in contended])) if contended else None
        trace_tag = _trace_tag(entries, {t: a.manifest for t, a in arts.items()})
        # co-executed builds named by --trace-also, beside codl's
        also = [
            t
            for t in args.trace_also.split(",")
            if t in arts and t != trace_tag and arts[t].device == "coexec"
        ]
        if args.trace_dir and (trace_tag or also):
            from codl_tvm.profiling.trace import trace_inference

            tdir = Path(args.trace_dir)
            tdir.mkdir(parents=True, exist_ok=True)
            # and the refined builds, beside the one they refine
            refined = [
                t
                for t, a in arts.items()
                if t.startswith("codl_refined") and t != trace_tag and a.device == "coexec"
            ]
            tags = [*([trace_tag] if trace_tag else []), *refined, *also]
            # one timeline thrown away first: the first one taken in a process enqueued its
            # first GPU kernel 0.1-0.2 ms late on every model (the same IR in two issue orders)
            trace_inference(arts[tags[0]], inputs[tags[0]])
            for tag in tags:
                trace = trace_inference(arts[tag], inputs[tag])
                trace.save_chrome(tdir / f"{name}_{tag}.json")
                trace.save_png(tdir / f"{name}_{tag}.png")
                rows[tag]["trace"] = trace.summary()
                # Where the time above the bound goes: the same kernels alone (serial trace)
                # against the run's, and the idle time of each lane, term by term.
                alone = trace_inference(arts[tag], inputs[tag], serial=True)
                tc_, tg_ = rows["cpu"]["median_ms"], rows["gpu"]["median_ms"]
                bound = t_star_c if t_star_c is not None else ideal_bound_ms(tc_, tg_)
                rows[tag]["gap"] = {
                    "bound": "T*c" if t_star_c is not None else "T*",
                    **gap_breakdown(trace, bound, alone=alone).to_dict(),
                }
        if "codl" in arts:
            # the planning-time bound (a 60-operator model in under a second), timed on its own
            rows["codl"]["planning_alone_s"] = _planning_alone_s(
                name, arts["codl"].manifest, index["preset"], args.plan_repeat
            )
        del arts
        tc, tg = rows["cpu"]["median_ms"], rows["gpu"]["median_ms"]
        t_star = tc * tg / (tc + tg)
        best = min(tc, tg)
        summary = {
            "t_cpu_ms": tc,
            "t_gpu_ms": tg,
            "t_star_ms": t_star,
            "cpu_gpu_ratio": max(tc, tg) / min(tc, tg),
            "trace": trace_tag,
            "run_s": round(time.perf_counter() - t0, 1),
        }
        # The same figures from each variant's fastest round: interference on a shared machine
        # only slows runs down, and identical builds agreed within 0.97-1.10x by their fastest
        # round against 0.8-1.27x by their median (in one three-round run).
        fc, fg = rows["cpu"]["min_ms"], rows["gpu"]["min_ms"]
        summary["t_star_fastest_ms"] = fc * fg / (fc + fg)
        for tag, row in rows.items():
            row["speedup_vs_best_single"] = best / row["median_ms"]
            row["of_t_star"] = t_star / row["median_ms"]
            row["speedup_vs_best_single_fastest"] = min(fc, fg) / row["min_ms"]
            if row.get("predicted_ms"):
                # the plan's predicted makespan against this build's measured latency
                row["measured_over_predicted"] = row["median_ms"] / row["predicted_ms"]
            row["of_t_star_fastest"] = summary["t_star_fastest_ms"] / row["min_ms"]
            if "ulayer_like" in rows:
                row["speedup_vs_ulayer"] = rows["ulayer_like"]["median_ms"] / row["median_ms"]
            # Round by round (drift that slows a whole round cancels): the median ratio, and the
            # rounds in which this build lost to that round's faster processor alone.
            paired = paired_ratios(samples[tag], samples["cpu"], samples["gpu"])
            row["paired"] = {
                "speedup_vs_best_single": paired.median_speedup,
                "of_t_star": paired.median_of_t_star,
                "rounds_slower_than_best_single": paired.rounds_slower,
            }
        if contended:
            # T* assumes each processor keeps its solo speed; T*c measures both busy at once
            # (two independent inferences), so the gap between the two is contention.
            c_ms = float(np.median([c.cpu_ms for c in contended]))
            g_ms = float(np.median([c.gpu_ms for c in contended]))
            per_round = [c.t_star_ms for c in contended]
            summary["concurrent"] = {
                "cpu_ms": c_ms,
                "gpu_ms": g_ms,
                "cpu_slowdown": c_ms / tc,
                "gpu_slowdown": g_ms / tg,
                "t_star_ms": t_star_c,
                "t_star_c_over_t_star": t_star_c / t_star,
                # the bound's own noise: its spread over the rounds
                "t_star_ms_rounds": [round(v, 4) for v in per_round],
                "t_star_spread": (max(per_round) - min(per_round)) / t_star_c,
                "runs": [[c.cpu_runs, c.gpu_runs] for c in contended],
                "seconds": [c.seconds for c in contended],
            }
            for tag, row in rows.items():
                row["of_t_star_concurrent"] = t_star_c / row["median_ms"]
                # round by round: each round's build against that round's T*c
                row["paired"]["of_t_star_concurrent"] = float(
                    np.median([b / s for b, s in zip(per_round, samples[tag])])
                )
        results["models"][name] = {"summary": summary, "rows": rows}
        if contended:
            print(
                f"{name:14s} concurrent: CPU {c_ms:.3f} ms ({c_ms / tc:.2f}x solo), GPU "
                f"{g_ms:.3f} ms ({g_ms / tg:.2f}x solo), T*c {t_star_c:.3f} ms "
                f"({t_star_c / t_star:.2f}x T*); codl "
                f"{rows.get('codl', {}).get('of_t_star_concurrent', 0):.0%} of T*c",
                flush=True,
            )
        if rows.get("codl", {}).get("planning_alone_s") is not None:
            print(
                f"{name:14s} planning alone {rows['codl']['planning_alone_s']:.3f} s "
                f"({rows['codl'].get('plan', {}).get('n_ops')} operators)",
                flush=True,
            )
        print(
            f"{name:14s} T* {t_star:.3f} ms; codl {rows.get('codl', {}).get('of_t_star', 0):.0%}"
            f" of T* (fastest rounds: {rows.get('codl', {}).get('of_t_star_fastest', 0):.0%};"
            f" round by round: {rows.get('codl', {}).get('paired', {}).get('of_t_star', 0):.0%})",
            flush=True,
        )
        # How the co-executed builds synchronised ("auto" is measured on first use; a slow
        # mechanism shows as waits in the timelines).
        results["sync"] = {"requested": args.sync_mode, "mode": sync.sync_mode()}
        results["sync"]["calibration"] = sync.calibration()
        # Written after every model: a run cut short by its time limit keeps what it measured.
        write_json(args.out, envelope(sys.argv, results, tvm_cpus=args.tvm_cpus, env=env))


def _refine_job(job: tuple) -> tuple[str, str, str | None]:
    from codl_tvm.core.plan import PartitionPlan
    from codl_tvm.objectives.refine import compile_refined

    name, tag, src, target, model, plan_json, record = job
    try:
        compile_refined(
            src,
            PartitionPlan.from_json(plan_json),
            record,
            target,
            model_path=model,
            force=True,
        )
    except Exception as exc:  # reported per build; the others go on
        return name, tag, f"{type(exc).__name__}: {exc}"
    return name, tag, None


def cmd_refine(args: argparse.Namespace) -> None:
    """Refine every model's ``--from`` artifact into ``--tag`` (see the module docstring)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from codl_tvm import runtime
    from codl_tvm.core.errors import ArtifactError
    from codl_tvm.objectives.refine import refined_plan
    from codl_tvm.planner.split.refine import moves
    from codl_tvm.runtime.artifact import load_artifact

    root = Path(args.dir)
    index = json.loads((root / "index.json").read_text())
    wanted = args.models.split(",") if args.models else list(index["models"])
    runtime.load(platform=args.platform or None)
    if args.tvm_cpus:
        from codl_tvm.runtime.threads import pin_tvm_threads

        pin_tvm_threads(args.tvm_cpus)
    models_dir = root / "models"
    models_dir.mkdir(exist_ok=True)
    jobs = []
    for name in wanted:
        rel = index["models"].get(name, {}).get(args.source)
        if rel is None or load_artifact(root / rel, verify=False).device != "coexec":
            print(f"== {name} {args.tag}: skipped ({args.source} is not co-executed)", flush=True)
            continue
        try:
            plan, record = refined_plan(root / rel, traces=args.traces, step=args.step)
        except ArtifactError as exc:
            print(f"== {name} {args.tag}: {exc}", flush=True)
            continue
        moved = moves(record["splits"])
        spans = ", ".join(f"{v:.1f}" for v in record["span_ms"])
        print(f"== {name}: {len(moved)} splits, spans {spans} ms; {', '.join(moved)}", flush=True)
        model = _model_file(name, models_dir)
        jobs.append(
            (name, args.tag, root / rel, root / name / args.tag, model, plan.to_json(), record)
        )
    with ProcessPoolExecutor(max(1, args.jobs), mp_context=mp.get_context("spawn")) as pool:
        for future in as_completed([pool.submit(_refine_job, j) for j in jobs]):
            name, tag, err = future.result()
            print(f"== {name} {tag}: {err or 'ok'}", flush=True)
            if err:
                index.setdefault("failed", {})[f"{name}/{tag}"] = err
            else:
                index["models"][name][tag] = f"{name}/{tag}"
            (root / "index.json").write_text(json.dumps(index, indent=2))
    shutil.rmtree(models_dir, ignore_errors=True)


def cmd_compare(args: argparse.Namespace) -> None:
    """Build A against build B, round by round, pooled over run JSONs (A/B of a default)."""
    from bench_util import envelope, write_json

    from codl_tvm.profiling.stats import paired_ab

    paths = [p for p in args.results.split(",") if p]
    if len(set(paths)) != len(paths):
        sys.exit("bench_planner compare: a run JSON is named twice (its rounds would count twice)")
    if args.a == args.b:
        sys.exit(f"bench_planner compare: --a and --b are both {args.a}")
    wanted = [m for m in args.models.split(",") if m]
    table: dict[str, dict] = {}
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
            models = data["results"]["models"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            sys.exit(f"bench_planner compare: {path} is no `bench_planner.py run` JSON ({exc!r})")
        for name, model in models.items():
            if wanted and name not in wanted:
                continue
            rows = model.get("rows", {})
            missing = [t for t in (args.a, args.b) if "samples_ms" not in rows.get(t, {})]
            if missing:
                print(f"{path}: {name} has no {' or '.join(missing)}: skipped", file=sys.stderr)
                continue
            entry = table.setdefault(name, {"runs": [], "pairs": []})
            a, b = rows[args.a]["samples_ms"], rows[args.b]["samples_ms"]
            try:
                one = paired_ab([(a, b)])
            except ValueError as exc:
                sys.exit(f"bench_planner compare: {path}, {name}: {exc}")
            entry["pairs"].append((a, b))
            entry["runs"].append({"file": path, "commit": data.get("commit"), **one.to_json()})
    absent = [m for m in wanted if m not in table]
    if absent:
        sys.exit(
            f"bench_planner compare: no run of {args.results} has {', '.join(absent)} (--models) "
            f"with both {args.a} and {args.b}"
        )
    if not table:
        sys.exit(
            f"bench_planner compare: no model of {args.results} has both {args.a} and {args.b}"
        )
    out = {}
    print(f"{'model':14s} {args.a}/{args.b}: per run; pooled (rounds A slower/faster, sign p)")
    for name, entry in table.items():
        pooled = paired_ab(entry["pairs"])
        out[name] = {"pooled": pooled.to_json(), "runs": entry["runs"]}
        per_run = " ".join(f"{r['median_ratio']:.3f}" for r in entry["runs"])
        print(
            f"{name:14s} {per_run}; pooled {pooled.median:.3f} "
            f"({pooled.rounds_a_slower}/{pooled.rounds_a_faster} of {len(pooled.ratios)}, "
            f"p={pooled.sign_test_p:.3g})"
        )
    if args.out:
        write_json(args.out, envelope(sys.argv, {"a": args.a, "b": args.b, "models": out}))
        print(f"wrote {args.out}")


def cmd_plot(args: argparse.Namespace) -> None:
    """Plan statistics (CoDL Figs. 17, 19) and latencies of every baseline, from run JSONs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = [
        "cpu",
        "gpu",
        "ulayer_like",
        "h_only",
        "oc_only",
        "codl_no_chain",
        "codl",
        "codl_refined",
        "codl_verify",
        "oracle",
    ]
    files = args.results.split(",")
    fig, axes = plt.subplots(len(files), 2, figsize=(14, 4.2 * len(files)), squeeze=False)
    for row_axes, path in zip(axes, files):
        data = json.loads(Path(path).read_text())
        res = data["results"]
        models = list(res["models"])
        label = f"{res['preset']} ({res['device'][:40]})"
        ax = row_axes[0]
        width = 0.8 / len(order)
        for i, tag in enumerate(order):
            vals = [res["models"][m]["rows"].get(tag, {}).get("of_t_star", np.nan) for m in models]
            ax.bar(np.arange(len(models)) + i * width, vals, width, label=tag)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(np.arange(len(models)) + 0.4 - width / 2, models, rotation=30, ha="right")
        ax.set_ylabel("T* / latency (1 = ideal bound)")
        ax.set_title(f"latency against T*: {label}")
        ax.legend(fontsize=7, ncol=4)
        ax = row_axes[1]
        kinds = ["n_split_h", "n_split_oc", "n_whole_gpu", "n_whole_cpu"]
        bottom = np.zeros(len(models))
        for kind in kinds:
            shares = []
            for m in models:
                plan = res["models"][m]["rows"].get("codl", {}).get("plan") or {}
                n = plan.get("n_ops") or 0
                shares.append(plan.get(kind, 0) / n if n else np.nan)
            ax.bar(models, shares, bottom=bottom, label=kind.removeprefix("n_"))
            bottom = bottom + np.nan_to_num(shares)
        for x, m in enumerate(models):
            plan = res["models"][m]["rows"].get("codl", {}).get("plan") or {}
            chains = plan.get("chain_lengths") or []
            codl = res["models"][m]["rows"].get("codl", {})
            note = (
                f"built for {codl['device']} alone"
                if codl.get("fallback")
                else f"chains {chains}"[:24]
            )
            ax.text(x, 1.02, note, ha="center", fontsize=6, rotation=20)
        ax.set_ylim(0, 1.15)
        ax.set_ylabel("share of partitionable operators")
        ax.set_title(f"codl plan statistics: {label}")
        ax.tick_params(axis="x", rotation=30)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


def balance_rows(runs: list[dict], tag: str = "codl") -> list[dict]:
    """One row per (run, model) of ``run`` JSONs: the processors' balance Tcpu/Tgpu and the
    gain of build ``tag`` over the best single processor, with its share of T* and of T*c.

    The best single processor and the bounds come from the same run's rounds (one k of the
    emulated SoC per run). Runs without ``tag`` for a model are skipped."""
    rows = []
    for data in runs:
        res = data["results"]
        k = (data.get("env") or {}).get("POCL_CPU_MAX_CU_COUNT")
        for name, entry in res["models"].items():
            row = entry["rows"].get(tag)
            if row is None:
                continue
            summary = entry["summary"]
            tc, tg = summary["t_cpu_ms"], summary["t_gpu_ms"]
            concurrent = summary.get("concurrent") or {}
            gap = row.get("gap") or {}
            rows.append(
                {
                    "k": int(k) if k else None,
                    "model": name,
                    "t_cpu_ms": tc,
                    "t_gpu_ms": tg,
                    "cpu_over_gpu": tc / tg,
                    "gain": row["paired"]["speedup_vs_best_single"],
                    "of_t_star": row["paired"]["of_t_star"],
                    "of_t_star_c": row["paired"].get("of_t_star_concurrent"),
                    "t_star_c_over_t_star": concurrent.get("t_star_c_over_t_star"),
                    "device": row["device"],
                    "gap_terms_ms": gap.get("terms_ms"),
                }
            )
    return rows


def cmd_balance(args: argparse.Namespace) -> None:
    """Gain against the CPU/GPU balance over runs at several k (CoDL's when-does-it-pay)."""
    from bench_util import envelope, write_json

    runs = [json.loads(Path(p).read_text()) for p in args.results.split(",")]
    rows = balance_rows(runs, args.tag)
    if not rows:
        sys.exit(f"bench_planner balance: no model of {args.results} has {args.tag}")
    print(f"{'k':>3s} {'model':14s} {'Tcpu/Tgpu':>9s} {'gain':>6s} {'of T*':>6s} {'of T*c':>6s}")
    for r in rows:
        of_c = "-" if r["of_t_star_c"] is None else f"{r['of_t_star_c']:.0%}"
        print(
            f"{r['k'] or '-':>3} {r['model']:14s} {r['cpu_over_gpu']:9.2f} {r['gain']:6.2f} "
            f"{r['of_t_star']:6.0%} {of_c:>6s}"
        )
    if args.out:
        write_json(args.out, envelope(sys.argv, {"tag": args.tag, "rows": rows}))
        print(f"wrote {args.out}")
    if args.plot:
        import matplotlib  # deferred: plotting only

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, k in enumerate(sorted({r["k"] for r in rows}, key=lambda v: v or 0)):
            c = colors[i % len(colors)]
            # Hollow: the build fell back to one processor, so its "gain" is that build against
            # the same processor's build in the same rounds: the run's noise, not co-execution.
            for co, style in (
                (True, {"color": c}),
                (False, {"facecolors": "none", "edgecolors": c}),
            ):
                sel = [r for r in rows if r["k"] == k and (r["device"] == "coexec") == co]
                label = f"k={k}" + ("" if co else " (fell back to one processor)")
                if sel:
                    ax.scatter(
                        [r["cpu_over_gpu"] for r in sel],
                        [r["gain"] for r in sel],
                        label=label,
                        **style,
                    )
        x = np.logspace(-1.3, 1.3, 100)
        # the ideal gain at a balance b = Tcpu/Tgpu: best single / T* = 1 + min(b, 1/b)
        ax.plot(x, 1 + np.minimum(x, 1 / x), "k--", lw=0.8, label="T* (ideal)")
        ax.axhline(1.0, color="k", lw=0.5)
        ax.set_xscale("log")
        ax.set_xlabel("Tcpu / Tgpu (each processor alone)")
        ax.set_ylabel(f"{args.tag}: speedup over the best single processor")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"wrote {args.plot}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("--preset", required=True)
    c.add_argument("--models", required=True)
    c.add_argument("--modes", default=",".join(PLANNER_MODES))
    c.add_argument("--cost-model", required=True)
    c.add_argument("--oracle", help="a 'measured' cost model of the models' parts")
    c.add_argument("--out", required=True)
    c.add_argument("--jobs", type=int, default=1, help="parallel builds (spawned processes)")
    c.add_argument(
        "--verify",
        type=int,
        default=0,
        help="also build codl with `compile --verify N` (codl_verify; timed one at a time)",
    )
    c.add_argument(
        "--verify-modes",
        default="",
        help="with --verify: `compile --verify-modes` for codl_verify (e.g. codl_no_chain,h_only)",
    )
    c.add_argument(
        "--verify-mode",
        default="codl",
        help="with --verify: the planner modes built with it, comma list (tag MODE_verify)",
    )
    c.add_argument(
        "--verify-refine",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="with --verify: `compile --refine ROUNDS` for codl_verify (refined candidates, "
        "from timelines taken here)",
    )
    c.add_argument("--tvm-cpus", default="", help="TVM's cores for --verify's timing, e.g. 8-15")
    c.add_argument(
        "--default",
        action="store_true",
        help=f"also build tag {DEFAULT_TAG!r}: a default `codl-tvm compile` (plans, times the "
        "plan and each processor alone here, keeps the fastest; timed one at a time)",
    )
    c.add_argument(
        "--gpu-variants",
        default="",
        type=_gpu_variants,
        help=f"also build the GPU alone as these, comma list of {', '.join(GPU_VARIANTS)} "
        "(tag gpu_VARIANT: images, half precision or both; the GPU's data type A/B)",
    )
    c.add_argument("--model-dir", help="ONNX files NAME.onnx for models outside the ten")
    c.add_argument("--build-cache", help="the build cache (default OUT/build_cache)")
    from codl_tvm.cli.plan import weight_gbps

    c.add_argument(
        "--weight-gbps",
        type=weight_gbps,
        metavar="CPU,GPU",
        help=f"rates for the modes ending {STREAMING_SUFFIX} (compile --weight-gbps)",
    )
    c.add_argument(
        "--processor-scale",
        type=_scale_pair,
        default=(1.0, 1.0),
        metavar="CPU,GPU",
        help="factors on the cost model's CPU and GPU predictions of the co-executed modes: "
        "planning for other core counts than the profiled split (compile_artifact's "
        "processor_scale)",
    )
    c.add_argument(
        "--keep-build-cache",
        action="store_true",
        help="keep OUT/build_cache (the libraries a later call's --verify reuses)",
    )
    c.set_defaults(func=cmd_compile)
    r = sub.add_parser("run")
    r.add_argument("--dir", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--platform", default="")
    r.add_argument("--tvm-cpus", default="")
    r.add_argument("--models", default="", help="comma list; default every model of the index")
    r.add_argument("--append", action="store_true", help="keep models already in --out")
    r.add_argument("--number", type=int, default=5, help="runs averaged per sample")
    r.add_argument("--rounds", type=int, default=5, help="round-robin samples per variant")
    r.add_argument("--trace-dir")
    r.add_argument(
        "--onnxruntime",
        action="store_true",
        help="time onnxruntime's CPU session of each model on TVM's cores (--tvm-cpus) with "
        "as many threads, in the same rounds",
    )
    r.add_argument(
        "--trace-also",
        default="",
        help="comma list of more variants to trace beside codl's (e.g. hope,codl_hope)",
    )
    r.add_argument(
        "--plan-repeat",
        type=int,
        default=3,
        help="plan each model's codl build again this many times, one at a time, and record "
        "the median as planning_alone_s (0: skip)",
    )
    r.add_argument(
        "--concurrent-s",
        type=float,
        default=2.0,
        help="seconds of the CPU and GPU builds running at once (T* under contention); 0: skip",
    )
    from codl_tvm.runtime.sync import MODES as SYNC_MODES

    r.add_argument(
        "--sync-mode",
        default="auto",
        choices=SYNC_MODES,
        help="the co-execution synchronisation (codl_tvm.runtime.sync.set_sync_mode)",
    )
    r.set_defaults(func=cmd_run)
    f = sub.add_parser("refine", help="rebalance artifacts from timelines taken here")
    f.add_argument("--dir", required=True)
    f.add_argument("--from", dest="source", default="codl", help="the variant to refine")
    f.add_argument("--tag", default="codl_refined", help="the refined variant's tag")
    f.add_argument("--models", default="", help="comma list; default every model of the index")
    f.add_argument("--platform", default="")
    f.add_argument("--tvm-cpus", default="")
    f.add_argument("--traces", type=int, default=5, help="timelines per model (median)")
    f.add_argument("--step", type=float, default=1.0)
    f.add_argument("--jobs", type=int, default=8, help="parallel refined builds")
    f.set_defaults(func=cmd_refine)
    w = sub.add_parser("warm", help="run every artifact once in parallel (fills program caches)")
    w.add_argument("--dir", required=True)
    w.add_argument("--platform", default="")
    w.add_argument("--models", default="", help="comma list; default every model of the index")
    w.add_argument("--jobs", type=int, default=8)
    w.set_defaults(func=cmd_warm)
    a = sub.add_parser(
        "compare", help="build A against build B round by round, pooled over run JSONs"
    )
    a.add_argument("--results", required=True, help="comma list of run JSONs")
    a.add_argument("--a", required=True, help="tag of build A (e.g. codl)")
    a.add_argument("--b", required=True, help="tag of build B (e.g. codl_streaming)")
    a.add_argument("--models", default="", help="comma list; default every model with both")
    a.add_argument("--out", default="", help="JSON with every round's ratio")
    a.set_defaults(func=cmd_compare)
    g = sub.add_parser("plot")
    g.add_argument("--results", required=True, help="comma list of run JSONs")
    g.add_argument("--out", required=True, help="PNG")
    g.set_defaults(func=cmd_plot)
    bal = sub.add_parser("balance", help="gain against the CPU/GPU balance, runs at several k")
    bal.add_argument("--results", required=True, help="comma list of run JSONs (one per k)")
    bal.add_argument("--tag", default="codl")
    bal.add_argument("--out", help="the table as JSON")
    bal.add_argument("--plot", help="a PNG of gain against Tcpu/Tgpu")
    bal.set_defaults(func=cmd_balance)
    args = p.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
