"""What NVIDIA's OpenCL compiler makes of each GPU kernel of a profiling dataset: registers,
spills, shared and constant memory (``ptxas``'s lines in the build log under
``-cl-nv-verbose``) and ``clGetKernelWorkGroupInfo``, for the ``"tir-nv"`` features of the
GBDT cost model (``cost_model.kernel_counts.nv_kernel_reader``). Two steps on two machines::

    # here (TVM's compiler): the OpenCL C of every distinct GPU kernel of the dataset
    python scripts/nv_kernel_info.py export --dataset DATA.jsonl.gz --out .device/nvinfo
    # on the device (pyopencl and the NVIDIA platform only, no TVM): compile and read them
    python scripts/nv_kernel_info.py measure --dir .device/nvinfo --out nvinfo.json
    # here again: the recipes with and without it over seeds (GPU records alone)
    python scripts/nv_kernel_info.py compare --dataset DATA.jsonl.gz --kernel-info nvinfo.json \
        --out compare.json

``export`` rebuilds each GPU part's kernel exactly as the ``"tir"`` features read it
(``kernel_counts.kernel_source``: the profiler's part builder under the campaign's settings)
and stores its source under ``kernel_counts.kernel_key``, once per distinct kernel, in
``sources.json.xz`` with ``index.json`` beside it; a second run rebuilds only the keys missing.
Records whose rebuild fails or launches other work-groups than recorded (not the kernel that was
measured) are skipped and counted in the index.

``measure`` builds each source on the chosen platform (NVIDIA's when there is one) and writes
``{"meta": ..., "kernels": {key: {"kernels": {name: fields}, "error": ...}}}``. On another
platform (PoCL here) the build log has no ``ptxas`` lines: those fields are null and the meta
says so once; the work-group info is still read.
"""

from __future__ import annotations

import argparse
import json
import lzma
import multiprocessing
import os
import re
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

SOURCES = "sources.json.xz"
INDEX = "index.json"
# the reader's check (cost_model.kernel_counts.load_kernel_info); measure imports no codl_tvm
FORMAT = "codl-nv-kernel-info"
VERSION = 1

#: What ``measure`` reports per kernel: ``ptxas``'s (null off NVIDIA) then the work-group info.
PTXAS_FIELDS = (
    "registers",
    "stack_bytes",
    "spill_stores",
    "spill_loads",
    "smem_bytes",
    "lmem_bytes",
    "cmem_bytes",
    "barriers",
)
WG_FIELDS = ("work_group_size", "preferred_multiple", "local_mem_size", "private_mem_size")

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_LMEM = re.compile(r"(\d+)(?:\+(\d+))? bytes lmem")
_CMEM = re.compile(r"(\d+) bytes cmem\[(\d+)\]")
_BARRIERS = re.compile(r"used (\d+) barriers")


class NvInfoError(Exception):
    """Bad input of this script (printed as one ``nv_kernel_info: error:`` line, exit 2)."""


def parse_ptxas_log(log: str) -> dict[str, dict[str, int | None]]:
    """``ptxas``'s per-kernel lines of a ``-cl-nv-verbose`` build log, by kernel name::

        ptxas info    : Compiling entry function 'conv2d_kernel' for 'sm_90'
        ptxas info    : Function properties for conv2d_kernel
            0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
        ptxas info    : Used 40 registers, 4096 bytes smem, 400 bytes cmem[0]

    (the line after "Function properties" may also stand on the same line). ``cmem_bytes`` sums
    the constant banks; a field a log does not give is None. Empty for a log without such lines.
    """
    out: dict[str, dict[str, int | None]] = {}
    current: str | None = None

    def entry(name: str) -> dict[str, int | None]:
        return out.setdefault(name, dict.fromkeys(PTXAS_FIELDS))

    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = m.group(1)
            entry(current)
        elif m := _PROPS.search(line):
            current = m.group(1)
            entry(current)
        if current is None:
            continue
        if m := _FRAME.search(line):
            e = entry(current)
            e["stack_bytes"], e["spill_stores"], e["spill_loads"] = map(int, m.groups())
        if m := _USED.search(line):
            e = entry(current)
            e["registers"] = int(m.group(1))
            e["smem_bytes"] = int(s.group(1)) if (s := _SMEM.search(line)) else 0
            lm = _LMEM.search(line)
            e["lmem_bytes"] = sum(int(g) for g in lm.groups() if g) if lm else 0
            e["cmem_bytes"] = sum(int(b) for b, _ in _CMEM.findall(line))
            if b := _BARRIERS.search(line):
                e["barriers"] = int(b.group(1))
    return out


# ---------------------------------------------------------------------------------------------
# export (here, with TVM's compiler)


def _read_sources(folder: Path) -> dict[str, str]:
    path = folder / SOURCES
    if not path.exists():
        return {}
    with lzma.open(path, "rt") as fh:
        return json.load(fh)


def _write_sources(folder: Path, sources: Mapping[str, str]) -> None:
    tmp = folder / (SOURCES + ".tmp")
    with lzma.open(tmp, "wt", preset=9) as fh:
        json.dump(dict(sorted(sources.items())), fh)
    tmp.replace(folder / SOURCES)


def _map(fn, items: list, jobs: int, init=None, initargs: tuple = ()) -> Iterator:
    """``fn`` over ``items`` in this process (``jobs == 1``) or in ``jobs`` spawned processes
    (TVM and OpenCL drivers hold threads: never forked), results in completion order. A worker
    that cannot start raises ``BrokenProcessPool`` instead of being restarted forever, as
    ``multiprocessing.Pool`` restarts a failing initializer."""
    if jobs == 1:
        if init is not None:
            init(*initargs)
        yield from map(fn, items)
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, ctx, init, initargs) as pool:
        futures = [pool.submit(fn, item) for item in items]
        for fut in as_completed(futures):
            yield fut.result()


def _build_one(task):
    key, f, target, settings = task
    # deferred: the worker processes import TVM's compiler, the measure side never does
    from codl_tvm.cost_model.kernel_counts import kernel_source

    try:
        src, launch = kernel_source(f, target, settings)
    except Exception as exc:  # a part the rules or TVM refuse: counted, never fatal
        return key, None, None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return key, src, launch, None


def cmd_export(args: argparse.Namespace) -> int:
    # deferred: only export needs the package (and TVM); measure runs without both
    from codl_tvm.cost_model.dataset import OpRecord, load_dataset
    from codl_tvm.cost_model.gbdt import device_gpu_target
    from codl_tvm.cost_model.kernel_counts import kernel_key
    from codl_tvm.cost_model.tiling_features import direct_settings

    try:
        data = load_dataset(args.dataset)
    except (OSError, ValueError) as exc:
        raise NvInfoError(f"{args.dataset}: {exc}") from None
    records = [r for r in data.records if isinstance(r, OpRecord)]
    target = device_gpu_target(records)
    if not target:
        raise NvInfoError(f"{args.dataset}: its device description names no gpu_target")
    # as gbdt._matrix: the NVIDIA preset's direct-conv settings that reproduce each record
    nvidia = json.loads(target).get("device") == "nvidia"
    tasks: dict[str, tuple] = {}
    wanted: dict[str, tuple[int, int]] = {}
    meta: dict[str, dict] = {}
    n_gpu = 0
    for r in records:
        f = r.features()
        d = f.dispatch
        if f.processor != "gpu" or not (d.wg_size and d.wg_count):
            continue
        n_gpu += 1
        settings = direct_settings(f) if nvidia else {}
        key = kernel_key(f, target, settings)
        wanted.setdefault(key, (d.wg_size, d.wg_count))
        m = meta.setdefault(key, {"op": f.op, "impl": f.impl, "records": 0})
        m["records"] += 1
        tasks.setdefault(key, (key, f, target, settings))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sources = _read_sources(out)
    old_index = json.loads((out / INDEX).read_text()) if (out / INDEX).exists() else {}
    launches = {k: tuple(v["launch"]) for k, v in old_index.get("kernels", {}).items()}
    failed = dict(old_index.get("failed", {}))
    todo = [t for k, t in sorted(tasks.items()) if k not in sources and k not in failed]
    done = len(tasks) - len(todo)
    if args.limit:
        todo = todo[: args.limit]
    print(
        f"{len(records)} records, {n_gpu} GPU records with dispatch, {len(tasks)} distinct "
        f"kernels, {done} already exported or failed, {len(todo)} to build with {args.jobs} "
        "processes",
        flush=True,
    )
    start = time.monotonic()
    for i, (key, src, launch, err) in enumerate(_map(_build_one, todo, args.jobs)):
        if err is not None:
            failed[key] = err
        else:
            sources[key] = src
            launches[key] = tuple(launch)
        if (i + 1) % 250 == 0:
            _write_sources(out, sources)  # resumable: a rerun builds only what is missing
            print(f"  {i + 1}/{len(todo)} ({time.monotonic() - start:.0f} s)", flush=True)
    _write_sources(out, sources)
    kernels, mismatched = {}, {}
    for key, m in sorted(meta.items()):
        if key not in sources:
            continue
        launch = list(launches[key])
        if tuple(launch) != tuple(wanted[key]):  # not the kernel that was measured
            mismatched[key] = {"recorded": list(wanted[key]), "rebuilt": launch}
            continue
        kernels[key] = {**m, "launch": launch}
    index = {
        "format": FORMAT,
        "version": VERSION,
        "dataset": str(args.dataset),
        "target": target,
        "n_records": len(records),
        "n_gpu_records": n_gpu,
        "n_kernels": len(kernels),
        "n_gpu_records_exported": sum(m["records"] for m in kernels.values()),
        "n_failed_kernels": len(failed),
        "n_failed_records": sum(meta[k]["records"] for k in failed if k in meta),
        "n_mismatched_kernels": len(mismatched),
        "n_mismatched_records": sum(meta[k]["records"] for k in mismatched),
        "kernels": kernels,
        "failed": dict(sorted(failed.items())),
        "mismatched": mismatched,
    }
    (out / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    size = sum(p.stat().st_size for p in (out / SOURCES, out / INDEX))
    print(
        f"wrote {out / SOURCES} and {out / INDEX} ({size / 1e6:.1f} MB): {len(kernels)} kernels "
        f"of {index['n_gpu_records_exported']} records; skipped {len(failed)} kernels that "
        f"failed to build ({index['n_failed_records']} records) and {len(mismatched)} whose "
        f"launch differs from the recorded one ({index['n_mismatched_records']} records)"
    )
    return 0


# ---------------------------------------------------------------------------------------------
# measure (on the device: pyopencl only)


def _pick_device(cl, platform: str | None):
    platforms = cl.get_platforms()
    if not platforms:
        raise NvInfoError("no OpenCL platform found (check OCL_ICD_VENDORS)")
    names = [p.name for p in platforms]
    if platform:
        chosen = [i for i, p in enumerate(platforms) if platform.lower() in p.name.lower()]
        if not chosen:
            raise NvInfoError(f"--platform {platform!r}: none of the platforms {names}")
        pi = chosen[0]
    else:  # NVIDIA's where there is one: only its log has ptxas's lines
        nv = [i for i, p in enumerate(platforms) if "nvidia" in p.name.lower()]
        pi = nv[0] if nv else 0
    if not platforms[pi].get_devices():
        raise NvInfoError(f"OpenCL platform {names[pi]!r} has no device")
    return pi


_WORKER: dict = {}


def _worker_init(pi: int, options: list[str]) -> None:
    import pyopencl as cl  # deferred: a worker's own context (contexts do not cross processes)

    # every -cl-nv-verbose build has a log: pyopencl would warn of each
    warnings.simplefilter("ignore", cl.CompilerWarning)
    dev = cl.get_platforms()[pi].get_devices()[0]
    _WORKER.update(cl=cl, dev=dev, ctx=cl.Context([dev]), options=options)


def _measure_one(item: tuple[str, str]) -> tuple[str, dict]:
    key, src = item
    cl, dev, ctx = _WORKER["cl"], _WORKER["dev"], _WORKER["ctx"]
    prg = cl.Program(ctx, src)
    try:
        prg.build(options=_WORKER["options"], devices=[dev])
    except cl.Error as exc:
        return key, {"kernels": {}, "error": str(exc).splitlines()[0][:300]}
    log = prg.get_build_info(dev, cl.program_build_info.LOG) or ""
    ptx = parse_ptxas_log(log)
    info = cl.kernel_work_group_info
    kernels = {}
    for k in prg.all_kernels():
        name = k.function_name
        entry = dict(ptx.get(name, dict.fromkeys(PTXAS_FIELDS)))
        for field, q in zip(
            WG_FIELDS,
            (
                info.WORK_GROUP_SIZE,
                info.PREFERRED_WORK_GROUP_SIZE_MULTIPLE,
                info.LOCAL_MEM_SIZE,
                info.PRIVATE_MEM_SIZE,
            ),
            strict=True,
        ):
            try:
                entry[field] = int(k.get_work_group_info(q, dev))
            except cl.Error:  # a query a platform does not answer
                entry[field] = None
        kernels[name] = entry
    return key, {"kernels": kernels, "error": None}


def measure(
    sources: Mapping[str, str], platform: str | None = None, jobs: int = 1
) -> dict[str, object]:
    """Build every source and read what the compiler says of each of its kernels (see the
    module docstring): ``{"meta": ..., "kernels": {key: {"kernels": ..., "error": ...}}}``."""
    import pyopencl as cl  # deferred: export (here) needs no OpenCL

    pi = _pick_device(cl, platform)
    plat = cl.get_platforms()[pi]
    dev = plat.get_devices()[0]
    nvidia = "nvidia" in plat.name.lower()
    options = ["-cl-nv-verbose"] if nvidia else []
    start = time.monotonic()
    items = sorted(sources.items())
    results = dict(_map(_measure_one, items, max(1, jobs), _worker_init, (pi, options)))
    wall = time.monotonic() - start
    n_err = sum(r["error"] is not None for r in results.values())
    n_k = sum(len(r["kernels"]) for r in results.values())
    n_ptx = sum(k["registers"] is not None for r in results.values() for k in r["kernels"].values())
    notes = []
    if not nvidia:
        notes.append(
            f"platform {plat.name!r} is not NVIDIA's: built without -cl-nv-verbose, its log has "
            "no ptxas lines, so registers, spills, smem, lmem, cmem and barriers are null"
        )
    elif n_ptx < n_k:
        notes.append(f"{n_k - n_ptx} of {n_k} kernels had no ptxas lines in their build log")
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "platform": plat.name,
        "device": dev.name,
        "driver": dev.driver_version,
        "options": options,
        "n_sources": len(sources),
        "n_build_errors": n_err,
        "n_kernels": n_k,
        "n_kernels_with_ptxas": n_ptx,
        "wall_s": round(wall, 1),
        "notes": notes,
    }
    return {"meta": meta, "kernels": dict(sorted(results.items()))}


def cmd_measure(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    if not (folder / SOURCES).exists():
        raise NvInfoError(f"{folder}: no {SOURCES} (run `nv_kernel_info.py export` first)")
    try:
        sources = _read_sources(folder)
    except (OSError, lzma.LZMAError, json.JSONDecodeError) as exc:
        raise NvInfoError(f"{folder / SOURCES}: {exc}") from None
    if args.limit:
        sources = dict(sorted(sources.items())[: args.limit])
    # NVIDIA's compute cache and pyopencl's binary cache answer a build they have seen without
    # running ptxas (no log lines)
    os.environ.setdefault("CUDA_CACHE_DISABLE", "1")
    os.environ.setdefault("PYOPENCL_NO_CACHE", "1")
    result = measure(sources, args.platform, args.jobs)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    m = result["meta"]
    print(
        f"{m['platform']} / {m['device']}: {m['n_sources']} sources, {m['n_build_errors']} "
        f"build errors, {m['n_kernels']} kernels, {m['n_kernels_with_ptxas']} with ptxas lines, "
        f"{m['wall_s']} s; wrote {out}"
    )
    for note in m["notes"]:
        print(f"note: {note}")
    return 0


# ---------------------------------------------------------------------------------------------
# compare (here: the recipes over seeds)

#: ``compare``'s recipes: ``GbdtConfig.wave`` feature sets.
RECIPES = {"wave": "dispatch", "wave-tir": "tir", "wave-tir-nv": "tir-nv"}


def _score(accuracy, band_of, pred, recs) -> dict:
    meas = [r.latency_ms for r in recs]
    a = accuracy(pred, meas)
    bands: dict[str, list[int]] = {}
    for i, r in enumerate(recs):
        bands.setdefault(band_of(r.latency_ms), []).append(i)
    return {
        "n": a.n,
        "acc10": a.acc10,
        "mape": a.mape,
        "bands": {
            b: (lambda x: {"n": x.n, "acc10": x.acc10, "mape": x.mape})(
                accuracy([pred[i] for i in ix], [meas[i] for i in ix])
            )
            for b, ix in sorted(bands.items())
        },
    }


def cmd_compare(args: argparse.Namespace) -> int:
    """The recipes on the dataset's GPU records alone: tree seeds x random 70/30 splits, and
    leave-one-model-out per tree seed (each benchmark model's parts predicted by the recipe
    fitted without them), pooled; inconsistent training records dropped as ``cost-model fit``
    does. Results are merged into ``--out`` by recipe (a rerun skips the recipes it holds)."""

    # deferred: compare fits the cost models (and reads kernels with TVM's compiler)
    import numpy as np

    from codl_tvm.cost_model import kernel_counts
    from codl_tvm.cost_model.assessment import band_of, model_of
    from codl_tvm.cost_model.dataset import OpRecord, load_dataset
    from codl_tvm.cost_model.evaluate import accuracy, training_split
    from codl_tvm.cost_model.gbdt import (
        FEATURE_SETS,
        GbdtConfig,
        GbdtModel,
        device_gpu_target,
    )

    recipes = [r for r in args.recipes.split(",") if r]
    unknown = [r for r in recipes if r not in RECIPES]
    if unknown:
        raise NvInfoError(f"--recipes: {unknown} not among {sorted(RECIPES)}")
    readers = {"wave": None, "wave-tir": kernel_counts.part_kernel_counts}
    if "wave-tir-nv" in recipes:
        if not args.kernel_info:
            raise NvInfoError("--recipes wave-tir-nv needs --kernel-info NVINFO.json")
        try:
            info = kernel_counts.load_kernel_info(args.kernel_info)
        except (OSError, ValueError) as exc:
            raise NvInfoError(str(exc)) from None
        readers["wave-tir-nv"] = kernel_counts.nv_kernel_reader(info)
    data = load_dataset(args.dataset)
    recs = [r for r in data.records if isinstance(r, OpRecord) and r.processor == "gpu"]
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    seeds = range(args.seeds)
    names = sorted({m for m in map(model_of, recs) if m is not None})
    for recipe in recipes:
        if recipe in results and not args.force:
            print(f"{recipe}: in {out} already (--force to redo)")
            continue
        start = time.monotonic()

        def fit(train, seed, recipe=recipe):
            cfg = GbdtConfig.wave(feature_set=RECIPES[recipe], seed=seed)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return GbdtModel(cfg, readers[recipe]).fit(train)

        res: dict = {"random": [], "lomo": []}
        pooled: dict[str, tuple[list, list]] = {"random": ([], []), "lomo": ([], [])}
        for seed in seeds:
            for split in seeds:
                train, test, _ = training_split(recs, 0.3, split, args.drop)
                test = [r for r in test if isinstance(r, OpRecord)]
                pred = list(fit(train, seed).predict_many([r.features() for r in test]))
                res["random"].append(
                    {"seed": seed, "split": split, **_score(accuracy, band_of, pred, test)}
                )
                pooled["random"][0].extend(pred)
                pooled["random"][1].extend(test)
            preds, helds = [], []
            for name in names:
                held = [r for r in recs if model_of(r) == name]
                rest, _, _ = training_split(
                    [r for r in recs if model_of(r) != name], 0.0, 0, args.drop
                )
                preds.extend(fit(rest, seed).predict_many([r.features() for r in held]))
                helds.extend(held)
            res["lomo"].append({"seed": seed, **_score(accuracy, band_of, preds, helds)})
            pooled["lomo"][0].extend(preds)
            pooled["lomo"][1].extend(helds)
        for kind in ("random", "lomo"):
            runs = res[kind]
            res[f"{kind}_mean"] = {
                "acc10": float(np.mean([r["acc10"] for r in runs])),
                "mape": float(np.mean([r["mape"] for r in runs])),
            }
            res[f"{kind}_pooled"] = _score(accuracy, band_of, *pooled[kind])
        if recipe == "wave-tir-nv":  # how many GPU records the measured info reached
            x = GbdtModel(GbdtConfig.wave(feature_set="tir-nv"), readers[recipe])
            x.kernel_target = device_gpu_target(recs)
            col = FEATURE_SETS["tir-nv"].index("nv_registers")
            regs = x._x([r.features() for r in recs])[:, col]
            res["nv_coverage"] = {
                "records": len(recs),
                "with_registers": int(np.isfinite(regs).sum()),
            }
        res["wall_s"] = round(time.monotonic() - start, 1)
        results[recipe] = res
        out.write_text(json.dumps(results, indent=1) + "\n")
        rm, lm = res["random_mean"], res["lomo_mean"]
        print(
            f"{recipe}: random {rm['acc10']:.1%} / {rm['mape']:.1f}% (seeds x splits "
            f"{args.seeds}x{args.seeds}), leave-one-model-out {lm['acc10']:.1%} / "
            f"{lm['mape']:.1f}% "
            f"({res['wall_s']} s)",
            flush=True,
        )
    return 0


def main(argv: Iterable[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="write the OpenCL C of every distinct GPU kernel")
    e.add_argument("--dataset", required=True, help="profiling dataset (.jsonl or .jsonl.gz)")
    e.add_argument("--out", required=True, help="folder for sources.json.xz and index.json")
    e.add_argument("--jobs", type=int, default=2, help="build processes (default 2)")
    e.add_argument("--limit", type=int, default=0, help="build at most this many new kernels")
    e.set_defaults(func=cmd_export)
    m = sub.add_parser("measure", help="compile the exported kernels and read the compiler")
    m.add_argument("--dir", required=True, help="the folder `export` wrote")
    m.add_argument("--out", required=True, help="JSON to write")
    m.add_argument("--platform", help="OpenCL platform name part (default: NVIDIA's if any)")
    m.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="build processes")
    m.add_argument("--limit", type=int, default=0, help="measure only the first N kernels")
    m.set_defaults(func=cmd_measure)
    c = sub.add_parser("compare", help="the recipes with and without the info, over seeds")
    c.add_argument("--dataset", required=True, help="profiling dataset (.jsonl or .jsonl.gz)")
    c.add_argument("--kernel-info", help="`measure`'s JSON (for wave-tir-nv)")
    c.add_argument("--recipes", default="wave,wave-tir,wave-tir-nv", help="comma-separated")
    c.add_argument("--seeds", type=int, default=3, help="tree seeds and random splits (3)")
    c.add_argument("--drop", type=float, default=3.0, help="inconsistent-record factor (3)")
    c.add_argument("--force", action="store_true", help="redo recipes --out holds")
    c.add_argument("--out", required=True, help="JSON to write (merged by recipe)")
    c.set_defaults(func=cmd_compare)
    args = p.parse_args(list(argv) if argv is not None else None)
    if getattr(args, "jobs", 1) < 1:
        p.error(f"--jobs {args.jobs}: must be >= 1")
    try:
        return args.func(args)
    except NvInfoError as exc:
        print(f"nv_kernel_info: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
