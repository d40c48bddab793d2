"""Run ONNX's backend node tests through codl-tvm and tabulate the results.

Runs every selected case (:data:`codl_tvm.build.node_tests.SELECTED_OPS`) through the import,
the CPU build, the OpenCL build and the co-executed builds (H and OC), attributes each failure to
TVM or to codl-tvm (plain TVM's build of the same case), and appends one JSON line per case to
``--out`` (a run that stops resumes where it was). ``summary`` prints the counts as the docs
show them (docs/onnx-node-tests.md).

``--gpu-data-type image`` runs the GPU alone on OpenCL images instead (the ``opencl-image``
path, float32, held to rtol 1e-4), over the cases and their widened variants that the texture
layout covers (:func:`codl_tvm.build.node_tests.image_variant`); a case with no image kernel is
``n/a``. Pick the OpenCL platform with ``CODL_OPENCL_PLATFORM`` (``pocl`` for the docs' numbers).

    python scripts/onnx_node_report.py run --out /tmp/onnx-node.jsonl
    python scripts/onnx_node_report.py summary /tmp/onnx-node.jsonl
    CODL_OPENCL_PLATFORM=pocl python scripts/onnx_node_report.py run --gpu-data-type image \
        --out benchmarks/onnx_node_images_pocl.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

from codl_tvm.build.node_tests import (
    IMAGE_PATH,
    NOT_APPLICABLE,
    PASS,
    PATHS,
    CaseResult,
    PathResult,
    attribute,
    image_variant,
    node_cases,
    run_case,
)

#: Every path a row can hold, in the order the tables show them.
ALL_PATHS = (*PATHS, IMAGE_PATH)


def _done(out: Path) -> set[str]:
    if not out.exists():
        return set()
    return {json.loads(line)["name"] for line in out.read_text().splitlines() if line.strip()}


def cmd_run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = _done(out)
    cases = node_cases(args.names.split(",") if args.names else None)
    if args.ops:
        ops = set(args.ops.split(","))
        cases = [c for c in cases if c.op_type in ops]
    paths = PATHS
    if args.gpu_data_type == "image":
        paths = (IMAGE_PATH,)
        # each case as generated, followed by its widened variant where it has one
        cases = [v for c in cases for v in (c, image_variant(c)) if v is not None]
    todo = [c for c in cases if c.name not in done]
    print(f"{len(cases)} cases, {len(cases) - len(todo)} already in {out}", flush=True)
    for i, case in enumerate(todo, 1):
        result = run_case(case, paths)
        row = result.to_json()
        row["owner"] = attribute(case, result)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        outcomes = " ".join(f"{p}={r.outcome}" for p, r in result.paths.items())
        print(
            f"[{i}/{len(todo)}] {case.name}: import={result.imported.outcome} {outcomes}",
            flush=True,
        )
    return 0


_NONE = PathResult(NOT_APPLICABLE)


def summarize(rows: list[dict]) -> str:
    """The markdown tables of the docs: totals per path, counts per operator, then every
    failure and refusal grouped by operator, step and reason."""
    results = [CaseResult.from_json(r) for r in rows]
    owners = {r["name"]: r.get("owner", {}) for r in rows}
    # the paths the rows hold (an image run holds the image path only)
    paths = [p for p in ALL_PATHS if any(p in r.paths for r in results)]
    imported = [r for r in results if r.imported.outcome == PASS]
    lines = [
        f"Cases: {len(results)}; imported: {len(imported)}",
        "",
        "| path | applicable | passed | failed (TVM's) | failed (ours) |",
        "|---|---:|---:|---:|---:|",
    ]
    for path in paths:
        # rows written before a path existed lack it: not applicable to them
        applicable = [r for r in imported if r.paths.get(path, _NONE).outcome != NOT_APPLICABLE]
        passed = [r for r in applicable if r.paths[path].outcome == PASS]
        failed = [r for r in applicable if r.paths[path].outcome != PASS]
        tvm = sum(owners[r.name].get(path) == "tvm" for r in failed)
        lines.append(
            f"| {path} | {len(applicable)} | {len(passed)} | {tvm} | {len(failed) - tvm} |"
        )
    refused = [r for r in results if r.imported.outcome != PASS]
    by_owner = Counter(owners[r.name].get("import", "?") for r in refused)
    lines += [
        "",
        f"Not imported: {len(refused)} (TVM's frontend or a TVM bug: {by_owner['tvm']}, "
        f"codl-tvm's own checks on cases plain TVM runs: {by_owner['ours']})",
        "",
        f"| operator | cases | imported | {' | '.join(paths)} |",
        "|---|---:|---:|" + "---:|" * len(paths),
    ]
    by_op: dict[str, list[CaseResult]] = defaultdict(list)
    for r in results:
        by_op[r.op_type].append(r)

    def cell(rs: list[CaseResult], path: str) -> str:
        applicable = [
            r for r in rs if r.paths.get(path, _NONE).outcome not in (NOT_APPLICABLE, "skipped")
        ]
        if not applicable:
            return "-"
        return f"{sum(r.paths[path].outcome == PASS for r in applicable)}/{len(applicable)}"

    for op in sorted(by_op):
        rs = by_op[op]
        n_imp = sum(r.imported.outcome == PASS for r in rs)
        cells = " | ".join(cell(rs, p) for p in paths)
        lines.append(f"| {op} | {len(rs)} | {n_imp} | {cells} |")
    lines += [
        "",
        "| operator | step | whose | cases | reason (first case's message) |",
        "|---|---|---|---:|---|",
    ]
    groups: dict[tuple, list[str]] = defaultdict(list)
    for r in results:
        steps = [("import", r.imported)] if r.imported.outcome != PASS else []
        steps += [
            (p, res)
            for p, res in r.paths.items()
            if res.outcome not in (PASS, NOT_APPLICABLE, "skipped")
        ]
        for step, res in steps:
            detail = (res.detail or res.error_type).replace("|", "/")
            detail = detail.split(": ", 1)[-1] if detail.startswith("<memory>") else detail
            key = (r.op_type, step, owners[r.name].get(step, "?"), _reason(detail))
            groups[key].append(r.name)
    for (op, step, whose, reason), names in sorted(groups.items()):
        lines.append(f"| {op} | {step} | {whose} | {len(names)} | {reason[:200]} |")
    return "\n".join(lines)


def _reason(detail: str) -> str:
    # one row per reason: drop the names of nodes and inputs, which differ per case
    return re.sub(r"\b(node|input|output) '[^']*'", r"\1 '…'", detail)


def cmd_summary(args: argparse.Namespace) -> int:
    rows = [json.loads(x) for x in Path(args.jsonl).read_text().splitlines() if x.strip()]
    print(summarize(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run the cases, one JSON line each")
    run.add_argument("--out", required=True, help="JSON-lines file (appended, resumed)")
    run.add_argument("--ops", help="comma-separated ONNX operator types (default: all selected)")
    run.add_argument("--names", help="comma-separated case names")
    run.add_argument(
        "--gpu-data-type",
        choices=("buffer", "image"),
        default="buffer",
        help="buffer: every path of the default run; image: the GPU alone on OpenCL images",
    )
    run.set_defaults(func=cmd_run)
    summary = sub.add_parser("summary", help="print the tables of a run")
    summary.add_argument("jsonl")
    summary.set_defaults(func=cmd_summary)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
