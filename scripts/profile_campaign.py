"""Compile the profiling campaign behind the shipped cost models and the planner's oracle.

One compile directory per device pair holds every part to measure:

- ``--codl N``: N conv2d shapes from CoDL's sampling space, ``--pow2 N`` from the SVM paper's
  (power-of-two interval, then uniform), ``--dense N`` dense layers; each as the whole operator on
  each processor plus the parts of ``--sample-ratios`` along H and OC;
- ``--models``: the partitionable operators of real models at every ratio of
  ``--model-ratios`` (0.1 steps by default), which is also what the oracle baseline of the planner
  benchmark needs (it picks each operator's measured best split).

Run here (compilation), then ship the directory to the device machine as a .tar.xz and measure
it there with ``codl-tvm profile --run-dir DIR -o DATA.jsonl``::

    python scripts/profile_campaign.py --preset emulated-soc --threads 8 --out .device/prof_soc

``--algorithms winograd,packed`` compiles the conv parts of the CPU only, as the builds for the
CPU alone make them (``codl-tvm profile --winograd --packed``), for a dataset of their own that
``codl-tvm cost-model fit`` takes beside the direct one::

    python scripts/profile_campaign.py --preset emulated-soc --threads 8 --codl 190 \
        --models vgg16,resnet50 --algorithms winograd,packed --out .device/prof_soc_algos

``--cpu-alone`` builds those kernels with the settings of builds for the CPU alone
(``CPU_ALONE_SETTINGS``); a cost model fitted with that dataset makes co-executed builds use
the CPU-alone kernels on every CPU function.

``--only OP:PROCESSOR`` keeps the parts of one operator kind on one processor, to re-measure a
kernel that changed (e.g. ``dense:gpu`` after PoCL's dense rule changed); fit with the old
rows of that group left out (``codl-tvm cost-model fit --drop dense:gpu``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tarfile
from pathlib import Path

from codl_tvm.profiling.profile import compile_jobs, make_jobs, model_ops, sampled_ops


def _ratios(text: str) -> tuple[float, ...]:
    return tuple(float(r) for r in text.split(",") if r.strip())


def _model(name: str):
    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.frontend.models import LIGHT_MODELS, bundled_model_path, light_model

    if name == "codl_small_cnn":
        return load_onnx(bundled_model_path())
    if name in LIGHT_MODELS:
        return load_onnx(light_model(name))
    try:
        from codl_tvm.frontend.zoo import ZOO_MODELS, build_model
    except ImportError:
        ZOO_MODELS = ()
    if name in ZOO_MODELS:
        return load_onnx(build_model(name))
    raise SystemExit(f"unknown model {name!r}")


def _algorithm_jobs(jobs: list, preset: str) -> list:
    """The jobs whose part gets a Winograd or packed kernel, decided before building (the
    same selection as the build); depthwise convs and parts below the thresholds stay direct."""
    from codl_tvm.schedules import cpu_config

    from codl_tvm.build.targets import get_preset
    from codl_tvm.cost_model.features import part_shape
    from codl_tvm.cost_model.part_ir import part_rewrite

    config = cpu_config(get_preset(preset).target("cpu"))
    kept = [
        j for j in jobs if part_rewrite(j.params, part_shape(j.params, j.partition, "cpu"), config)
    ]
    print(f"{len(kept)} of {len(jobs)} parts get an algorithm kernel", file=sys.stderr)
    return kept


def _keep_algorithm_parts(directory: Path, algorithms: set[str]) -> None:
    """Drop the parts that got a direct/GEMM kernel anyway (below the algorithms' thresholds):
    the direct dataset has them, and they would cost device time and transfer size twice."""
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    kept = []
    for part in manifest["parts"]:
        if set(part["impl"].split("+")) & algorithms:
            kept.append(part)
        else:
            (directory / part["library"]).unlink(missing_ok=True)
    print(f"kept {len(kept)} of {len(manifest['parts'])} parts ({', '.join(sorted(algorithms))})")
    manifest["parts"] = kept
    path.write_text(json.dumps(manifest, indent=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--out", required=True, help="compile directory (a .tar.xz is written beside)")
    p.add_argument("--codl", type=int, default=0)
    p.add_argument("--pow2", type=int, default=0)
    p.add_argument("--dense", type=int, default=0)
    p.add_argument("--max-gflops", type=float, default=2.0)
    p.add_argument("--sample-ratios", type=_ratios, default=(0.25, 0.5, 0.75))
    p.add_argument("--models", default="")
    p.add_argument("--model-ratios", type=_ratios, default=tuple(i / 10 for i in range(1, 10)))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--algorithms",
        default="",
        help="comma list of winograd, packed: CPU conv parts only, built with these switched on",
    )
    p.add_argument(
        "--cpu-alone",
        action="store_true",
        help="with --algorithms: their kernels with the settings of builds for the CPU alone",
    )
    p.add_argument(
        "--only",
        default="",
        metavar="OP:PROCESSOR",
        help="keep only the parts of this operator kind on this processor (e.g. dense:gpu)",
    )
    args = p.parse_args(argv)
    only = None
    if args.only:
        op, _, proc = args.only.partition(":")
        if op not in ("conv2d", "dense", "pool") or proc not in ("cpu", "gpu"):
            raise SystemExit(f"--only {args.only!r}: expected conv2d|dense|pool:cpu|gpu")
        only = (op, proc)
    algorithms = set(filter(None, args.algorithms.split(",")))
    if algorithms - {"winograd", "packed"}:
        raise SystemExit(f"--algorithms: unknown {sorted(algorithms - {'winograd', 'packed'})}")
    if args.cpu_alone and not algorithms:
        raise SystemExit("--cpu-alone changes only the algorithm kernels: add --algorithms")

    jobs = []
    sampled = []
    if args.codl:
        sampled += sampled_ops(args.codl, seed=args.seed, method="codl", max_gflops=args.max_gflops)
    if args.pow2:
        sampled += sampled_ops(
            args.pow2, seed=args.seed + 1, method="pow2", max_gflops=args.max_gflops
        )
    if args.dense:
        sampled += sampled_ops(
            args.dense,
            seed=args.seed + 2,
            method="codl",
            max_gflops=args.max_gflops,
            dense_fraction=1.0,
        )
    if sampled:
        jobs += make_jobs(sampled, ("none",), (1.0,))
        jobs += make_jobs(sampled, ("H", "OC"), args.sample_ratios)
    for name in filter(None, args.models.split(",")):
        ops = [(f"{name}/{op}", params) for op, params in model_ops(_model(name))]
        jobs += make_jobs(ops, ("none",), (1.0,))
        jobs += make_jobs(ops, ("H", "OC"), args.model_ratios)
    seen: set = set()
    jobs = [
        j
        for j in jobs
        if not (
            (j.params, j.partition, j.processor) in seen
            or seen.add((j.params, j.partition, j.processor))
        )
    ]
    if algorithms:  # dense, pooling and GPU parts are the kernels of the direct dataset
        jobs = [j for j in jobs if j.processor == "cpu" and j.params.op == "conv2d"]
    if only is not None:
        jobs = [j for j in jobs if (j.params.op, j.processor) == only]
    print(f"{len(jobs)} parts", file=sys.stderr)
    from codl_tvm.schedules import cpu_alone_settings, packed_enabled, winograd_enabled

    with (
        winograd_enabled("all") if "winograd" in algorithms else contextlib.nullcontext(),
        packed_enabled("all") if "packed" in algorithms else contextlib.nullcontext(),
        cpu_alone_settings(args.cpu_alone),
    ):
        if algorithms:
            jobs = _algorithm_jobs(jobs, args.preset)
        compile_jobs(jobs, args.out, threads=args.threads, preset=args.preset)
    out = Path(args.out)
    if algorithms:
        _keep_algorithm_parts(out, algorithms)
    archive = Path(str(out).rstrip("/") + ".tar.xz")
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(out, arcname=out.name)
    print(f"{out} -> {archive} ({archive.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
