"""Cold inference: process start to first output, broken down (NNV12's Table 1 and Fig. 13).

Each measurement is a fresh process (``python -m codl_tvm.profiling.cold_start``) started after the
artifact's files, the program caches it will read and (``--evict-libs``) TVM's and the plugin's
libraries were dropped from the page cache (:func:`codl_tvm.profiling.cold_start.evict`).
Scenarios, per
artifact with OpenCL kernels (a CPU build has only ``cold`` and ``warm``):

``nocache``
    today's cold start: no program binaries used, empty codl-tvm and driver program caches
    (``POCL_CACHE_DIR``, ``CUDA_CACHE_PATH``), each program created at its kernel's first launch;
``cache``
    the same with the program caches the ``nocache`` run filled;
``aot``
    the artifact's program binaries, empty caches, programs created on threads at load while
    the run goes on (the default path of ``codl-tvm run``);
``beside``
    ``aot`` on the artifact's ``-beside`` sibling (``bench_cold.py beside``: the same build with
    its weights in ``weights.bin`` beside the library), its weights read on a thread while the
    first run goes on, each awaited before its first use: read, upload, program creation and
    execution in one pipeline;
``aot_lazy``, ``overlap_only``, ``aot_warm_pages``, ``beside_sequential``, ``context_sequential``
    the ablation: binaries without the overlap; the overlap without binaries; ``aot`` with the
    files left in the page cache (the cost of the cold read); ``beside`` with every weight
    loaded before the first run (its placement without its overlap); ``aot`` with the OpenCL
    context created before the library loads instead of beside it; ``aot`` (``cpu``) with
    TVM's thread pool started by the first run instead of beside the library load;
``compiler_lib``
    ``aot`` (a CPU build: ``cpu``) with TVM's compiler library loaded too, as a plain
    ``import tvm`` does: every other scenario loads ``libtvm_runtime`` alone
    (``TVM_USE_RUNTIME_LIB=1``, unless ``--no-runtime-lib``);
``warm``
    the median of further runs in the ``aot`` process.

Each row carries the process's counters per phase (page faults, blocks read, context
switches, threads: ``codl_tvm.profiling.cold_start``).

``onnxruntime``: importing it, creating the session and the first run of the same ONNX model,
in a fresh process with its model file evicted, on ``--ort-threads`` threads.

    python scripts/bench_cold.py beside --dir DIR         # the weights-beside siblings
    python scripts/bench_cold.py binaries --dir DIR       # add this device's binaries
                                                          # (on PoCL: after one run)
    python scripts/bench_cold.py run --dir DIR --models vgg16,fst --builds gpu,codl \\
        --platform portable --out cold.json --plot cold.png
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_util import envelope, write_json

from codl_tvm.profiling.cold_start import PHASES, artifact_files, evict
from codl_tvm.profiling.cold_start import cold_ms as _cold_ms

SCENARIOS = (
    "nocache",
    "cache",
    "aot",
    "beside",
    "aot_lazy",
    "overlap_only",
    "aot_warm_pages",
    "beside_sequential",
    "context_sequential",
    "pool_lazy",
    "compiler_lib",
)
#: The scenarios that measure an artifact's weights-beside sibling.
BESIDE = ("beside", "beside_sequential")
#: The scenarios a CPU build has besides ``cpu`` (its ``aot``).
CPU_TOO = (*BESIDE, "pool_lazy", "compiler_lib")
#: The sibling of an artifact ``DIR/model/build``, with its weights beside its library.
BESIDE_SUFFIX = "-beside"


def _compile_beside(root: str, rel: str) -> str:
    """Compile ``root/rel`` again as ``root/rel-beside`` with its weights beside the library:
    the same model, device, preset, planner mode and cost model (or its given plan) and block
    settings as its manifest records, so the two differ in weight placement only."""
    from codl_tvm.core.plan import PartitionPlan
    from codl_tvm.objectives.latency import compile_artifact
    from codl_tvm.options import CompileOptions

    src, dst = Path(root) / rel, Path(root) / f"{rel}{BESIDE_SUFFIX}"
    if (dst / "manifest.json").exists():
        return f"{dst}: exists"
    m = json.loads((src / "manifest.json").read_text())
    record = m.get("plan") or {}
    kwargs: dict = {"preset": m["preset"], "device": m["device"]}
    if "plan" in m and (record.get("source") != "planner" or "verify" in m):
        # a given plan, or one --verify chose: build that plan (not re-planned)
        kwargs["device"] = "coexec"
        kwargs["plan"] = PartitionPlan.from_json((src / "plan.json").read_text())
    elif record.get("source") == "planner":
        kwargs.update(device="coexec", mode=record["mode"], cost_model=record["cost_model"]["file"])
    if kwargs["device"] == "coexec":
        kwargs["split_channel_blocks"] = m.get("split_channel_blocks", True)
        kwargs["split_row_blocks"] = m.get("split_row_blocks", False)
        if m.get("coexec_cpu_alone_kernels"):
            kwargs["coexec_cpu_alone"] = True
    try:
        options = CompileOptions(weights="beside", build_cache=Path(root) / "build_cache", **kwargs)
        compile_artifact(m["model"]["file"], dst, options)
    except Exception as exc:  # one line per failed build; the others go on
        return f"{dst}: failed: {exc}"
    built = json.loads((dst / "manifest.json").read_text())["device"]
    same = "" if built == m["device"] else f" (device {built}, the original {m['device']})"
    return f"{dst}: {built}{same}"


def cmd_beside(args: argparse.Namespace) -> None:
    """Compile every artifact of the index (``--builds``) again with its weights beside its
    library, as ``<artifact>-beside`` (``--jobs`` at a time, spawned processes)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    index = json.loads((Path(args.dir) / "index.json").read_text())["models"]
    models = args.models.split(",") if args.models else list(index)
    rels = [
        index[m][b] for m in models if m in index for b in args.builds.split(",") if b in index[m]
    ]
    made, failed = _restore_models(Path(args.dir), rels)
    for rel, why in failed.items():
        print(f"{Path(args.dir) / rel}{BESIDE_SUFFIX}: failed: {why}", flush=True)
    rels = [r for r in rels if r not in failed]
    try:
        # spawned workers: TVM's state is not fork-safe
        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
            for line in pool.map(_compile_beside, [args.dir] * len(rels), rels):
                print(line, flush=True)
    finally:
        for path in made:  # as bench_planner.py compile leaves the folder: no ONNX files
            path.unlink(missing_ok=True)


def _restore_models(root: Path, rels: list[str]) -> tuple[list[Path], dict[str, str]]:
    """Write again the ONNX file each artifact's manifest names where it is gone
    (``bench_planner.py compile`` removes its ``models/`` folder once the artifacts are
    built), from the benchmark model of the artifact's folder name, and check it is the file
    the artifact was built from (its SHA-256). Done here, before the builds start, so that
    parallel builds of one model never write the same file.

    Returns
    -------
    tuple
        The files written (to remove afterwards) and, per artifact that cannot be rebuilt,
        why.
    """
    made: list[Path] = []
    failed: dict[str, str] = {}
    for rel in rels:
        record = json.loads((root / rel / "manifest.json").read_text())["model"]
        path = Path(record["file"])
        if not path.exists():
            # deferred: onnx and the model builders, only where a model file is gone
            import onnx

            from codl_tvm.frontend.models import benchmark_model

            name = Path(rel).parts[0]
            try:
                model = benchmark_model(name)
            except Exception as exc:  # a model that is no benchmark model: that build fails
                failed[rel] = f"{path}: no such model file, and no benchmark model {name!r} ({exc})"
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            onnx.save(model, str(path))
            made.append(path)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != record["sha256"]:
            failed[rel] = (
                f"{path}: not the model {rel} was built from (SHA-256 {digest[:12]}..., the "
                f"manifest's {record['sha256'][:12]}...)"
            )
    return made, failed


def _add_binaries(manifest_path: Path, platform: str) -> str:
    """Add this machine's OpenCL device's program binaries to one artifact (on PoCL, taken
    after one run of it)."""
    from codl_tvm import runtime
    from codl_tvm.runtime.artifact import LIBRARY, load_artifact
    from codl_tvm.runtime.program_binaries import embed, embed_after_warm_up, is_pocl

    if platform:
        runtime.load(platform=platform)
    art = load_artifact(manifest_path.parent, verify=False, check_cpu=False)
    if "opencl" not in art.manifest["vm_devices"]:
        return f"{art.path}: no OpenCL kernels"
    prior = art.manifest.get("program_binaries")
    if is_pocl(runtime.info()):
        # PoCL compiles each kernel's work-group function at its first launch: binaries taken
        # after one run carry them (program_binaries.embed_after_warm_up)
        try:
            record = embed_after_warm_up(art.path, art.path / LIBRARY, prior)
        except Exception as exc:  # one line per failed artifact; the others go on
            return f"{art.path}: failed: {exc}"
    else:
        record = embed(art.path / LIBRARY, art.path, prior)
    manifest = {**art.manifest, "program_binaries": record}
    tmp = manifest_path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, manifest_path)
    kernels = sum(d.get("kernels", 0) for d in (record or {}).get("devices", []))
    return f"{art.path}: {kernels} program binaries"


def cmd_binaries(args: argparse.Namespace) -> None:
    """Add this machine's OpenCL device's program binaries to every artifact under ``--dir``
    (an artifact's binaries for several devices share its folder), ``--jobs`` at a time."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    paths = sorted(Path(args.dir).glob("*/*/manifest.json"))
    # spawned workers: TVM's state is not fork-safe
    with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
        for line in pool.map(_add_binaries, paths, [args.platform] * len(paths)):
            print(line, flush=True)


def _library_files() -> list[Path]:
    """TVM's and the OpenCL plugin's shared libraries (what the library-load phase reads).
    Found without importing TVM: pages this process mapped could not be evicted."""
    spec = importlib.util.find_spec("tvm")
    libs = sorted(Path(spec.origin).parent.rglob("*.so")) if spec and spec.origin else []
    plugin = os.environ.get("CODL_TVM_PLUGIN_LIB")
    return libs + ([Path(plugin)] if plugin else [])


def _child(
    artifact: Path,
    programs: str,
    env: dict,
    evict_paths: list[Path],
    warm: int = 0,
    timeout_s: float | None = None,
    weights: str = "overlap",
    context: str = "overlap",
    pool: str = "overlap",
) -> dict:
    evict(evict_paths)
    t0 = time.monotonic_ns()
    cmd = [sys.executable, "-m", "codl_tvm.profiling.cold_start", str(artifact)]
    cmd += ["--programs", programs]
    cmd += ["--weights", weights, "--context", context, "--pool", pool]
    try:
        proc = subprocess.run(
            [*cmd, "--warm", str(warm)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"error": [f"timed out after {timeout_s} s"]}
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:] or ["exit " + str(proc.returncode)]}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    marks = res.pop("marks_ns")
    res["phases_ms"] = {"process_start": (marks["main"] - t0) / 1e6, **res["phases_ms"]}
    res["first_output_ms"] = (marks["first_run"] - t0) / 1e6
    if res["warm_ms"]:
        res["warm_median_ms"] = statistics.median(res["warm_ms"])
    return res


def _scenario_env(name: str, base: dict, caches: Path, runtime_lib: bool = True) -> dict:
    env = dict(base)
    aot = name.startswith("aot") or name in (*BESIDE, *CPU_TOO, "context_sequential")
    env["CODL_OPENCL_AOT"] = "1" if aot else "0"
    # a run needs TVM's runtime library alone; a plain `import tvm` loads the compiler's too
    env["TVM_USE_RUNTIME_LIB"] = "1" if runtime_lib and name != "compiler_lib" else "0"
    fresh = name != "cache"
    root = caches / ("fresh-" + name if fresh else "fresh-nocache")
    if fresh and root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    env["CODL_TVM_CACHE_DIR"] = str(root / "codl")
    env["POCL_CACHE_DIR"] = str(root / "pocl")
    env["CUDA_CACHE_PATH"] = str(root / "cuda")
    return env


def _ort_child(model: Path, threads: int, evict_paths: list[Path]) -> dict:
    code = (
        "import time\n"
        "t0 = time.monotonic_ns()\n"
        "import json, sys, numpy as np, onnxruntime as ort\n"
        "t1 = time.monotonic_ns()\n"
        "o = ort.SessionOptions(); o.intra_op_num_threads = int(sys.argv[2])\n"
        "s = ort.InferenceSession(sys.argv[1], o, providers=['CPUExecutionProvider'])\n"
        "t2 = time.monotonic_ns()\n"
        "feed = {i.name: np.random.default_rng(0).random(i.shape, dtype=np.float32) "
        "for i in s.get_inputs()}\n"
        "s.run(None, feed)\n"
        "t3 = time.monotonic_ns()\n"
        "print(json.dumps([t0, t1, t2, t3]))\n"
    )
    evict(evict_paths)
    start = time.monotonic_ns()
    proc = subprocess.run(
        [sys.executable, "-c", code, str(model), str(threads)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:]}
    t0, t1, t2, t3 = json.loads(proc.stdout.strip().splitlines()[-1])
    phases = {
        "process_start": (t0 - start) / 1e6,
        "library_load": (t1 - t0) / 1e6,
        "session_creation": (t2 - t1) / 1e6,
        "first_run": (t3 - t2) / 1e6,
    }
    return {"phases_ms": phases, "first_output_ms": (t3 - start) / 1e6}


def cold_ms(row: dict) -> float:
    """A row's cold inference (:func:`codl_tvm.profiling.cold_start.cold_ms`; onnxruntime: session
    creation and first run)."""
    return _cold_ms(row["phases_ms"])


def _line(res: dict) -> str:
    if "error" in res:
        return f"failed: {res['error']}"
    text = f"{cold_ms(res):.1f} ms cold, {res['first_output_ms']:.1f} ms from process start"
    if "warm_median_ms" in res:
        text += f", warm {res['warm_median_ms']:.2f} ms"
    return text


def _onnx_file(model: str, folder: Path) -> Path:
    """The ONNX model of the baseline (the compile's own copies are removed)."""
    # deferred: onnx and the model builders, for the baseline only
    import onnx

    from codl_tvm.frontend.models import benchmark_model, bundled_model_path

    if model == "codl_small_cnn":
        return bundled_model_path()
    path = folder / f"{model}.onnx"
    if not path.exists():
        onnx.save(benchmark_model(model), str(path))
    return path


def cmd_run(args: argparse.Namespace) -> None:
    root = Path(args.dir)
    index = json.loads((root / "index.json").read_text())["models"]
    models = [m for m in (args.models.split(",") if args.models else index) if m in index]
    base = dict(os.environ)
    if args.platform:
        base["CODL_OPENCL_PLATFORM"] = args.platform
    libs = _library_files() if args.evict_libs else []
    scenarios = [s for s in args.scenarios.split(",") if s]
    rows = []
    with tempfile.TemporaryDirectory(prefix="codl-cold-") as tmp:
        caches = Path(tmp)
        for model in models:
            for build in args.builds.split(","):
                if build not in index[model]:
                    continue
                art = root / index[model][build]
                beside = art.with_name(art.name + BESIDE_SUFFIX)
                manifest = json.loads((art / "manifest.json").read_text())
                opencl = "opencl" in manifest["vm_devices"]
                todo = scenarios if opencl else ["cpu", *(s for s in scenarios if s in CPU_TOO)]
                if manifest["device"] == "opencl":  # runs no CPU kernel: no thread pool
                    todo = [s for s in todo if s != "pool_lazy"]
                for name in todo:
                    target = beside if name in BESIDE else art
                    if not (target / "manifest.json").exists():
                        res = {"error": [f"{target}: missing (run bench_cold.py beside)"]}
                        res.update(model=model, build=build, scenario=name, platform=args.platform)
                        rows.append(res)
                        print(f"{model} {build} {name}: {_line(res)}", flush=True)
                        continue
                    files = artifact_files(target)
                    env = _scenario_env(name, base, caches, args.runtime_lib)
                    cache_files = [p for p in caches.rglob("*") if p.is_file()]
                    evict_paths = [] if name == "aot_warm_pages" else files + cache_files + libs
                    programs = {"aot_lazy": "lazy", "nocache": "lazy", "cache": "lazy"}.get(
                        name, "overlap"
                    )
                    warm = args.warm if name in ("aot", "cpu", "beside") else 0
                    weights = "sequential" if name == "beside_sequential" else "overlap"
                    context = "sequential" if name == "context_sequential" else "overlap"
                    pool = "lazy" if name == "pool_lazy" else "overlap"
                    res = _child(
                        target,
                        programs,
                        env,
                        evict_paths,
                        warm,
                        args.timeout_s,
                        weights,
                        context,
                        pool,
                    )
                    res.update(model=model, build=build, scenario=name, platform=args.platform)
                    rows.append(res)
                    print(f"{model} {build} {name}: {_line(res)}", flush=True)
            if args.ort_threads:
                onnx_path = _onnx_file(model, caches)
                res = _ort_child(onnx_path, args.ort_threads, [onnx_path])
                res.update(model=model, build="onnxruntime", scenario="cold", platform="cpu")
                rows.append(res)
                print(f"{model} onnxruntime cold: {_line(res)}", flush=True)
    summary = summarize(rows)
    out = envelope(sys.argv, {"rows": rows, "summary": summary}, platform=args.platform)
    write_json(args.out, out)
    print(json.dumps(summary, indent=1))
    if args.plot:
        plot(rows, args.plot)


def summarize(rows: list[dict]) -> dict:
    """Per build: cold (aot) over warm, per model and on average; the library load with TVM's
    runtime library alone and with its compiler library too; the speed-up of ``aot`` over
    ``nocache``; ``aot`` against onnxruntime's cold start; the same for ``beside`` (weights
    beside the library, loaded while the run goes on) where it was measured, with its own
    warm runs."""
    by = {(r["model"], r["build"], r["scenario"]): r for r in rows if "error" not in r}
    out: dict = {}
    for (model, build, scenario), r in by.items():
        if scenario not in ("aot", "cpu") or "warm_median_ms" not in r:
            continue
        warm = r["warm_median_ms"]
        entry = {
            "cold_ms": cold_ms(r),
            "from_process_start_ms": r["first_output_ms"],
            "warm_ms": warm,
            "cold_over_warm": cold_ms(r) / warm,
            "library_load_ms": r["phases_ms"]["library_load"],
        }
        full = by.get((model, build, "compiler_lib"))
        if full is not None:  # what loading TVM's compiler library too costs
            entry["compiler_lib_library_load_ms"] = full["phases_ms"]["library_load"]
        for name in SCENARIOS:
            other = by.get((model, build, name))
            if other is not None and name != "aot":
                entry[f"{name}_cold_ms"] = cold_ms(other)
        if (model, build, "nocache") in by:
            entry["speedup_over_nocache"] = entry["nocache_cold_ms"] / entry["cold_ms"]
        side = by.get((model, build, "beside"))
        if side is not None and "warm_median_ms" in side:
            entry["beside_warm_ms"] = side["warm_median_ms"]
            entry["beside_cold_over_warm"] = cold_ms(side) / side["warm_median_ms"]
            entry["beside_speedup_over_embedded"] = entry["cold_ms"] / cold_ms(side)
            if "nocache_cold_ms" in entry:
                entry["beside_speedup_over_nocache"] = entry["nocache_cold_ms"] / cold_ms(side)
        ort = by.get((model, "onnxruntime", "cold"))
        if ort:
            entry["onnxruntime_cold_ms"] = cold_ms(ort)
            entry["speedup_over_onnxruntime"] = cold_ms(ort) / entry["cold_ms"]
        out.setdefault(build, {})[model] = entry
    for models in out.values():
        ratios = [e["cold_over_warm"] for e in models.values()]
        beside = [e["beside_cold_over_warm"] for e in models.values() if "beside_warm_ms" in e]
        models["_mean_cold_over_warm"] = statistics.mean(ratios)
        if beside:
            models["_mean_beside_cold_over_warm"] = statistics.mean(beside)
    return out


def plot(rows: list[dict], path: str) -> None:
    """Stacked bars: each row's phases, one bar per (model, build, scenario)."""
    import matplotlib  # deferred: optional, plotting only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred with matplotlib

    good = [r for r in rows if "phases_ms" in r]
    names = ["process_start", *PHASES, "session_creation"]
    fig, ax = plt.subplots(figsize=(max(8, 0.35 * len(good)), 5))
    bottom = [0.0] * len(good)
    for name in names:
        vals = [r["phases_ms"].get(name, 0.0) for r in good]
        if not any(vals):
            continue
        ax.bar(range(len(good)), vals, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(range(len(good)))
    ax.set_xticklabels(
        [f"{r['model']}/{r['build']}/{r['scenario']}" for r in good], rotation=90, fontsize=7
    )
    ax.set_ylabel("ms from process start")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("binaries", help="add this device's program binaries to the artifacts")
    b.add_argument("--dir", required=True, help="bench_planner.py compile's output folder")
    b.add_argument("--platform", default="", help="OpenCL platform name substring")
    b.add_argument("--jobs", type=int, default=1, help="artifacts at a time")
    b.set_defaults(func=cmd_binaries)
    s = sub.add_parser("beside", help="compile each artifact again with its weights beside it")
    s.add_argument("--dir", required=True, help="bench_planner.py compile's output folder")
    s.add_argument("--models", help="models (default: every model of the index)")
    s.add_argument("--builds", default="cpu,gpu,codl", help="index tags: cpu, gpu, codl, ...")
    s.add_argument("--jobs", type=int, default=1, help="builds at a time")
    s.set_defaults(func=cmd_beside)
    r = sub.add_parser("run", help="measure the cold starts")
    r.add_argument("--dir", required=True, help="bench_planner.py compile's output folder")
    r.add_argument("--models", help="models (default: every model of the index)")
    r.add_argument("--builds", default="cpu,gpu,codl", help="index tags: cpu, gpu, codl, ...")
    r.add_argument("--platform", default="", help="OpenCL platform name substring")
    r.add_argument("--scenarios", default=",".join(SCENARIOS))
    r.add_argument("--warm", type=int, default=5, help="warm runs after the aot run")
    r.add_argument("--timeout-s", type=float, default=180.0, help="per measured process")
    r.add_argument("--ort-threads", type=int, default=0, help="onnxruntime baseline threads")
    r.add_argument(
        "--evict-libs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also evict TVM's and the plugin's libraries before each run",
    )
    r.add_argument(
        "--runtime-lib",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="load TVM's runtime library alone (TVM_USE_RUNTIME_LIB=1) except in compiler_lib",
    )
    r.add_argument("--out", required=True)
    r.add_argument("--plot", help="stacked-bar PNG")
    r.set_defaults(func=cmd_run)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
