"""``codl-tvm cost-model fit``, ``eval``, ``decisions`` and ``lomo``.

::

    codl-tvm cost-model fit DATA.jsonl -o MODEL.json [--kind codl|gbdt|flops|measured]
        [--holdout 0.3] [--seed 0] [--preset NAME] [--trees N]
        [--recipe codl|wave|wave-share|wave-guards|wave-tir|wave-tir-nv]
        [--kernel-info NVINFO.json]
        [--drop-inconsistent 3]
    codl-tvm cost-model eval MODEL.json DATA.jsonl [--json] [--plot OUT.png] [--all] [--no-lomo]
        [--kernel-info NVINFO.json]
    codl-tvm cost-model decisions MODEL.json ORACLE.json DATA.jsonl [--lomo] [--tolerance 0.05]
        [--split-margin novel|lomo|none] [--json] [--kernel-info NVINFO.json]
    codl-tvm cost-model lomo MODEL.json [DATA.jsonl ...] [--write] [--json]
        [--kernel-info NVINFO.json]

``wave-tir-nv`` joins what NVIDIA's compiler measured of each kernel (``--kernel-info``, the JSON
of ``scripts/nv_kernel_info.py measure``); its model files need the same file to score recorded
parts.

``eval`` prints the model's held-out report and the full assessment
(:mod:`codl_tvm.cost_model.assessment`: random split and leave-one-model-out, per processor,
implementation and latency band, CoDL's model and FLOPs beside, the repeatability ceiling).
The metrics and the fitting live in :mod:`codl_tvm.cost_model.evaluate`.

``lomo`` computes the model's leave-one-model-out error and the ranges of its data
(:mod:`codl_tvm.cost_model.uncertainty`) on its datasets (default: ``meta["dataset"]``, with its
``meta["dropped_groups"]`` left out as ``fit`` did) and with ``--write`` stores them in the
model file's ``meta`` (``lomo_error``, ``data_ranges``), nothing else of the file changed: the
planner's split margin and the plan report's expected errors read them.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from codl_tvm.core.errors import CliError
from codl_tvm.cost_model.assessment import assess, format_assessment
from codl_tvm.cost_model.base import CostModel
from codl_tvm.cost_model.dataset import Dataset, OpRecord
from codl_tvm.cost_model.decisions import decide, format_decisions
from codl_tvm.cost_model.evaluate import (
    drop_groups,
    evaluate,
    fit_model,
    format_report,
    infer_preset,
    load_datasets,
    plot_scatter,
    split_records,
    training_split,
)
from codl_tvm.cost_model.fitted_device import merge_devices, record_devices
from codl_tvm.cost_model.gbdt import GbdtConfig, GbdtModel
from codl_tvm.cost_model.uncertainty import DataRanges, LomoError, compute_lomo_error
from codl_tvm.planner import PlannerConfig
from codl_tvm.planner.split.config import SPLIT_MARGINS

__all__ = ["cmd_decisions", "cmd_eval", "cmd_fit", "cmd_lomo", "register"]


def _names(paths) -> str:
    return ", ".join(str(p) for p in paths)


def _kernel_reader(feature_set: str = "tir", kernel_info: str | None = None):
    """The reader of built parts' kernels that the ``"tir"`` (``"tir-nv"``: with the measured
    ``kernel_info``) feature set needs."""
    # deferred: reading kernels imports TVM's compiler, which the other recipes and commands
    # do not need
    from codl_tvm.cost_model import kernel_counts

    if feature_set == "tir":
        return kernel_counts.part_kernel_counts
    if not kernel_info:
        raise CliError(
            f"the {feature_set!r} features need --kernel-info NVINFO.json "
            "(scripts/nv_kernel_info.py measure)"
        )
    try:
        info = kernel_counts.load_kernel_info(kernel_info)
    except (OSError, ValueError) as exc:
        raise CliError(f"--kernel-info: {exc}") from None
    return kernel_counts.nv_kernel_reader(info)


def _load(path, kernel_info: str | None = None) -> CostModel:
    """A model file, with the kernel reader its recipe needs to score recorded parts."""
    model = CostModel.load(path)
    if isinstance(model, GbdtModel) and model.config.feature_set in ("tir", "tir-nv"):
        model.kernel_reader = _kernel_reader(model.config.feature_set, kernel_info)
    return model


def cmd_fit(args: argparse.Namespace) -> int:
    """Fit a cost model on one or more datasets and write it."""
    data = load_datasets(args.data)
    n_groups_dropped = 0
    if args.drop:
        records, n_groups_dropped = drop_groups(data.records, args.drop)
        data = Dataset(records, data.meta)
    drop = args.drop_inconsistent
    if drop is None:
        drop = 0.0 if args.kind == "measured" else 3.0  # the oracle keeps every measurement
    train, test, dropped = training_split(data.records, args.holdout, args.seed, drop)
    options = {}
    if args.kind == "codl":
        options["config"] = args.preset or infer_preset(data.records)
    elif args.kind == "gbdt":
        trees = {} if args.trees is None else {"n_estimators": args.trees}
        if args.recipe == "wave":
            options["config"] = GbdtConfig.wave(**trees)
        elif args.recipe == "wave-share":
            options["config"] = GbdtConfig.wave(feature_set="dispatch-share", **trees)
        elif args.recipe == "wave-guards":
            options["config"] = GbdtConfig.wave(feature_set="guards", **trees)
        elif args.recipe == "wave-tir":
            options["config"] = GbdtConfig.wave(feature_set="tir", **trees)
            options["kernel_reader"] = _kernel_reader()
        elif args.recipe == "wave-tir-nv":
            options["config"] = GbdtConfig.wave(feature_set="tir-nv", **trees)
            options["kernel_reader"] = _kernel_reader("tir-nv", args.kernel_info)
        elif trees:
            options["config"] = GbdtConfig(**trees)
    model = fit_model(args.kind, train, **options)
    if data.meta.get("cpu_alone_settings"):
        # Its Winograd/packed CPU kernels are those of builds for the CPU alone: co-executed
        # builds planned with it use them (codl_tvm.objectives.latency).
        model.meta["cpu_alone_settings"] = True
    model.meta.update(
        {
            "dataset": str(args.data[0]) if len(args.data) == 1 else [str(p) for p in args.data],
            "holdout": args.holdout,
            "seed": args.seed,
            "n_train": sum(isinstance(r, OpRecord) for r in train),
            "n_test": sum(isinstance(r, OpRecord) for r in test),
            "drop_inconsistent": drop,
            "n_dropped_inconsistent": len(dropped),
            # what it describes: a compile for another device says so
            "device": merge_devices(record_devices(data.records)),
        }
    )
    if args.drop:
        model.meta["dropped_groups"] = list(args.drop)
        model.meta["n_dropped_groups"] = n_groups_dropped
    model.save(args.output)
    print(
        f"fitted a {args.kind} cost model on {model.meta['n_train']} operator records "
        f"({args.holdout:.0%} held out, seed {args.seed}); wrote {args.output} "
        f"({len(model.dumps().encode())} bytes)"
    )
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Print (or plot) a cost model's accuracy on a dataset's held-out part."""
    model = _load(args.model, args.kernel_info)
    data = load_datasets(args.data)
    holdout = float(model.meta.get("holdout", 0.0))
    seed = int(model.meta.get("seed", 0))
    if args.all or holdout == 0.0:
        records, split = data.records, f"all records of {_names(args.data)}"
    else:
        _, records = split_records(data.records, holdout, seed)
        split = f"held-out {holdout:.0%} of {_names(args.data)} (seed {seed})"
    report = evaluate(model, records, split)
    # The full assessment refits the model's recipe on folds of its own dataset; on a dataset
    # the model was not fitted on (--all) only the plain report means something.
    full = None
    if not args.all and model.kind != "measured":  # a lookup table is not refitted on folds
        full = assess(model, data.records, _names(args.data), not args.no_lomo)
    if args.json:
        out = report.to_json()
        if full is not None:
            out["assessment"] = full.to_json()
        print(json.dumps(out, indent=2))
    else:
        print(format_report(report))
        if full is not None:
            print(format_assessment(full))
    if args.plot:
        plot_scatter(report, args.plot, title=f"{args.model} on {split}")
        if not args.json:
            print(f"wrote {args.plot}")
    return 0


def cmd_decisions(args: argparse.Namespace) -> int:
    """Score the splits a cost model picks for the benchmark models' operators against the
    oracle's measurements."""
    if not 0.0 <= args.tolerance < 1.0:
        raise CliError(f"--tolerance {args.tolerance!r}: must be in [0, 1)")
    model = _load(args.model, args.kernel_info)
    if args.lomo and model.kind == "measured":
        raise CliError(
            f"--lomo: {args.model} is a lookup table of measurements; it cannot be refitted"
        )
    oracle = CostModel.load(args.oracle)
    if oracle.kind != "measured":
        raise CliError(
            f"{args.oracle} holds a {oracle.kind!r} model; the oracle is a measured model "
            "(`codl-tvm cost-model fit DATA --kind measured --holdout 0`)"
        )
    data = load_datasets(args.data)
    report = decide(model, oracle, data.records, args.tolerance, args.lomo, args.split_margin)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(format_decisions(report))
    return 0


def _format_lomo(error: LomoError) -> str:
    qs = [f"p{round(100 * q)}" for q in error.quantiles]
    lines = [
        f"leave-one-model-out relative error |predicted/measured - 1| ({len(error.models)} "
        f"folds: {', '.join(error.models)})",
        f"  {'slice':<34} {'role':<6} {'n':>5} " + " ".join(f"{q:>6}" for q in qs),
    ]
    rows = [*error.processors.items(), *error.by_kind.items()]
    for name, roles in rows:
        for role, st in roles.items():
            cells = " ".join(f"{100 * st.quantiles[q]:5.1f}%" for q in qs)
            lines.append(f"  {name:<34} {role:<6} {st.n:5d} {cells}")
    return "\n".join(lines)


def cmd_lomo(args: argparse.Namespace) -> int:
    """Compute a cost model's leave-one-model-out error and data ranges; with ``--write``,
    store them in its file's ``meta``."""
    model = _load(args.model, args.kernel_info)
    if model.kind == "measured":
        raise CliError(f"{args.model} is a lookup table of measurements; it cannot be refitted")
    paths = args.data or model.meta.get("dataset")
    if not paths:
        raise CliError(f"{args.model} names no dataset (meta.dataset): give DATA")
    paths = [paths] if isinstance(paths, str) else list(paths)
    data = load_datasets(paths)
    records = data.records
    if not args.data and model.meta.get("dropped_groups"):
        records, _ = drop_groups(records, model.meta["dropped_groups"])
    try:
        error = compute_lomo_error(model, records)
    except ValueError as exc:
        raise CliError(f"{_names(paths)}: {exc}") from None
    ranges = DataRanges.of(records)
    if args.json:
        print(json.dumps({"lomo_error": error.to_json(), "data_ranges": ranges.to_json()}))
    else:
        print(_format_lomo(error))
    if args.write:
        # Only the meta changes: the file is rewritten from its own JSON, not re-serialised
        # from the loaded model, so the fitted trees stay byte for byte.
        path = Path(args.model)
        obj = json.loads(path.read_text(encoding="utf-8"))
        obj["meta"]["lomo_error"] = error.to_json()
        obj["meta"]["data_ranges"] = ranges.to_json()
        tmp = path.with_name(path.name + ".tmp")
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, path)
        if not args.json:
            print(f"wrote meta.lomo_error and meta.data_ranges to {path}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``cost-model fit``, ``eval``, ``decisions`` and ``lomo`` to the ``codl-tvm``
    subcommands."""
    p = sub.add_parser("cost-model", help="fit and evaluate latency cost models")
    group = p.add_subparsers(dest="cost_model_command", required=True)
    _register_fit(group)
    _register_eval(group)
    _register_decisions(group)
    _register_lomo(group)


def _register_lomo(group: argparse._SubParsersAction) -> None:
    m = group.add_parser(
        "lomo",
        help="a cost model's leave-one-model-out error and data ranges (--write: into its meta, "
        "where the planner's split margin reads them)",
    )
    m.add_argument("model", help="model file (.json)")
    m.add_argument(
        "data",
        nargs="*",
        help="datasets (.jsonl) it was fitted on (default: the model's meta.dataset)",
    )
    m.add_argument(
        "--write", action="store_true", help="store them in the model file's meta (only)"
    )
    m.add_argument("--json", action="store_true", help="print them as JSON")
    _add_kernel_info(m)
    m.set_defaults(func=cmd_lomo)


def _add_kernel_info(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kernel-info",
        metavar="NVINFO.json",
        help="registers, spills and occupancy of each GPU kernel measured on an NVIDIA GPU "
        "(scripts/nv_kernel_info.py measure): the wave-tir-nv recipe's input",
    )


def _register_fit(group: argparse._SubParsersAction) -> None:
    f = group.add_parser("fit", help="fit a cost model on a latency dataset")
    f.add_argument(
        "data", nargs="+", help="datasets (.jsonl) written by `codl-tvm profile`, fitted together"
    )
    f.add_argument("-o", "--output", required=True, help="model file to write (.json)")
    f.add_argument(
        "--kind",
        choices=("codl", "gbdt", "flops", "measured"),
        default="codl",
        help="measured: a lookup table of the measurements (the oracle; use --holdout 0)",
    )
    f.add_argument(
        "--preset",
        default=None,
        help="blocking preset of the codl model (mobile, pocl-local, emulated-soc, "
        "nvidia-h100; default: from the dataset's device, see infer_preset)",
    )
    f.add_argument("--trees", type=int, help="boosting rounds of the gbdt model")
    f.add_argument(
        "--recipe",
        choices=("codl", "wave", "wave-share", "wave-guards", "wave-tir", "wave-tir-nv"),
        default="codl",
        help="gbdt recipe: trees on CoDL's analytical model (codl, default) or on the "
        "dispatch-shape wave base with dispatch-shape features (wave; GbdtConfig.wave), "
        "wave-share adds the part's share of its operator (the emulated SoC's k = 12 split "
        "decisions), wave-guards adds the GPU direct conv's bounds checks, wave-tir counts read "
        "from each GPU part's scheduled kernel (loads, stores, flops, guards per thread), "
        "wave-tir-nv adds what NVIDIA's compiler says of it (--kernel-info)",
    )
    f.add_argument(
        "--holdout",
        type=float,
        default=0.3,
        help="fraction of records held out for `eval` (default 0.3; 0 = fit on all)",
    )
    f.add_argument("--seed", type=int, default=0, help="seed of the held-out split")
    f.add_argument(
        "--drop-inconsistent",
        type=float,
        default=None,
        metavar="FACTOR",
        help="leave out of training a part that took FACTOR times longer than a part of the "
        "same operator with at least 1/1.25 of its FLOPs (interference; default 3, 0 for "
        "--kind measured; 0 = keep all)",
    )
    f.add_argument(
        "--drop",
        action="append",
        default=[],
        metavar="OP:PROCESSOR[:IMPL]",
        help="leave the records of this group out (e.g. dense:gpu:reduction, measured with a "
        "kernel that has changed since); repeatable",
    )
    _add_kernel_info(f)
    f.set_defaults(func=cmd_fit)


def _register_eval(group: argparse._SubParsersAction) -> None:
    e = group.add_parser("eval", help="accuracy of a cost model on a dataset's held-out part")
    e.add_argument("model", help="model file (.json)")
    e.add_argument("data", nargs="+", help="datasets (.jsonl), evaluated together")
    e.add_argument("--json", action="store_true", help="print the report as JSON")
    e.add_argument("--plot", help="write a predicted-vs-measured scatter plot (PNG)")
    e.add_argument(
        "--all",
        action="store_true",
        help="evaluate on every record (e.g. a dataset the model was not fitted on)",
    )
    e.add_argument(
        "--no-lomo",
        action="store_true",
        help="skip leave-one-model-out (it refits the model once per benchmark model named in "
        "the records)",
    )
    _add_kernel_info(e)
    e.set_defaults(func=cmd_eval)


def _register_decisions(group: argparse._SubParsersAction) -> None:
    d = group.add_parser(
        "decisions",
        help="the splits a cost model picks for the benchmark models' operators, against the "
        "measured best",
    )
    d.add_argument("model", help="model file (.json)")
    d.add_argument(
        "oracle", help="the measured model of the same measurements (`fit --kind measured`)"
    )
    d.add_argument(
        "data", nargs="+", help="datasets (.jsonl) whose MODEL/OPERATOR records are the operators"
    )
    d.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="a pick within this fraction of the measured best counts as right (default 0.05)",
    )
    d.add_argument(
        "--lomo",
        action="store_true",
        help="refit the model's recipe without each benchmark model before it picks that "
        "model's splits",
    )
    d.add_argument(
        "--split-margin",
        choices=SPLIT_MARGINS,
        default=PlannerConfig().split_margin,
        help="novel (default, as the planner): a novel operator's split is picked only where "
        "its predicted gain exceeds the leave-one-model-out error; lomo: every split; none: "
        "the least predicted latency (the picks without a margin are reported beside)",
    )
    d.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_kernel_info(d)
    d.set_defaults(func=cmd_decisions)
