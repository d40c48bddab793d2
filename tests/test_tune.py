"""``compile --tune`` / ``plan --tune``: the operators outside the cost model's data measured on
this machine's OpenCL device and CPU before planning, cached and resumed, planned on the
measurements and reported as ``measured``.

The cost model is fitted on synthetic records of an imaginary device pair
(``codl_tvm.cost_model.synthetic``) with a stored error and data ranges set by hand, so that a
known set of the bundled CNN's operators is novel. Measurements are real (the profiler on the
local OpenCL device); no test compares a latency: where a decision must follow measured costs,
the cache is fed with records that make one choice clearly cheaper.
"""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import replace

import pytest

from codl_tvm.build.targets import get_preset
from codl_tvm.cli import main
from codl_tvm.core.plan import partitionable_ops
from codl_tvm.cost_model import OpRecord
from codl_tvm.cost_model.dataset import load_dataset
from codl_tvm.cost_model.measured import MeasuredModel
from codl_tvm.cost_model.synthetic import SyntheticDevice, synthetic_cost_model, synthetic_records
from codl_tvm.cost_model.uncertainty import DataRanges, ErrorStats, LomoError
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.frontend.models import bundled_model_path
from codl_tvm.objectives.tune import (
    TUNE_TIMING,
    tune_cache_dir,
    tune_cache_file,
    tune_candidates,
    tune_operators,
)
from codl_tvm.planner import PlannerConfig, plan_model
from codl_tvm.planner.policy import planning_context
from codl_tvm.profiling.profile import open_dataset
from codl_tvm.profiling.sessions import LocalSession, device_description

PRESET = "opencl"


@pytest.fixture(scope="module")
def model():
    return load_onnx(bundled_model_path())


def novel_cost_model():
    """The synthetic pair with a stored error (20% at p80) and the synthetic data's ranges:
    some of the bundled CNN's operators lie outside them (novel). Also tests/test_tune_rpc.py's."""
    fitted = synthetic_cost_model(SyntheticDevice())
    stats = ErrorStats(1000, {"p80": 0.2, "p90": 0.4})
    roles = {"whole": stats, "split": stats, "all": stats}
    out = copy.copy(fitted)
    out.meta = {
        **fitted.meta,
        "lomo_error": LomoError((0.8, 0.9), {"cpu": roles, "gpu": roles}, {}, ("a", "b")).to_json(),
        "data_ranges": DataRanges.of(synthetic_records(SyntheticDevice())).to_json(),
    }
    return out


@pytest.fixture(scope="module")
def cost_model():
    return novel_cost_model()


@pytest.fixture(scope="module")
def cost_model_file(cost_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("tune_model") / "synthetic.json"
    cost_model.save(path)
    return path


def _table(records) -> MeasuredModel:
    return MeasuredModel().fit(records)


def _fake_records(candidate, whole_cpu_ms, whole_gpu_ms, split_ms, device=None):
    """Records of every part of ``candidate``: its whole parts at the given latencies, every
    split part at ``split_ms``."""
    impls = {"conv2d": "direct", "dense": "matmul", "pool": "pool"}
    out = []
    for job in candidate.jobs:
        if job.partition.dim == "none":
            ms = whole_gpu_ms if job.processor == "gpu" else whole_cpu_ms
        else:
            ms = split_ms
        out.append(
            OpRecord(
                job.params,
                job.partition,
                job.processor,
                impls[job.params.op],
                ms,
                10,
                device=device or {},
                name=job.name,
            )
        )
    return out


def _decision(report, name):
    return next(d for d in report.decisions if d.ops == (name,))


# -- which operators, which parts (no device) --------------------------------------------------


def test_candidates_are_the_novel_operators_most_expensive_first(model, cost_model):
    _, report = plan_model(model.mod, cost_model, "codl_no_chain")
    novel = {d.ops[0] for d in report.decisions if d.novel}
    found = tune_candidates(model.mod, cost_model, PlannerConfig())
    assert found and {c.name for c in found} <= novel
    # every novel operator the profiler builds as the model has it (not average pooling)
    kinds = {i.name: i.kind for i in partitionable_ops(model.mod)}
    assert {c.name for c in found} == {n for n in novel if kinds[n] != "avg_pool2d"}
    assert [c.predicted_ms for c in found] == sorted((c.predicted_ms for c in found), reverse=True)
    for c in found:
        whole = [(j.partition.dim, j.processor) for j in c.jobs[:2]]
        assert sorted(whole) == [("none", "cpu"), ("none", "gpu")]
        assert {j.partition.ratio for j in c.jobs[2:]} <= {0.3, 0.5, 0.7}
    # the shares are the planner's own: the nearest of its grid
    grid = PlannerConfig(ratios=(0.0, 0.25, 0.5, 0.75, 1.0))
    snapped = tune_candidates(model.mod, cost_model, grid)
    assert {j.partition.ratio for c in snapped for j in c.jobs[2:]} <= {0.25, 0.5, 0.75}


def test_measured_costs_decide_a_tuned_operator(model, cost_model):
    """Fed measurements that make one choice clearly cheaper, the planner takes it, reports it
    as measured and holds it to no margin; the other operators stay predicted."""
    first = tune_candidates(model.mod, cost_model, PlannerConfig())[0]
    cases = {
        1.0: _fake_records(first, 100.0, 0.01, 50.0),  # the GPU alone is far cheaper
        0.0: _fake_records(first, 0.01, 100.0, 50.0),  # the CPU alone is far cheaper
    }
    for ratio, records in cases.items():
        config = PlannerConfig(tuned_parts=_table(records))
        plan, report = plan_model(model.mod, cost_model, "codl_no_chain", config)
        d = _decision(report, first.name)
        assert (d.ratio, d.provenance, d.source, d.margin_ms) == (
            ratio,
            "measured",
            "measured",
            None,
        )
        assert d.novel  # why it was tuned stays on record
        assert next(p for p in plan.ops if p.op == first.name).ratio == ratio
        others = [x for x in report.decisions if x.ops != (first.name,) and x.ratio is not None]
        assert others and all(x.provenance == "predicted" for x in others)
        assert any("planned on their measured parts" in n for n in report.notes)
    # both processors slow alone, the measured splits cheap: split at a measured share, with
    # no margin although the operator is novel (the other shares were not measured)
    config = PlannerConfig(tuned_parts=_table(_fake_records(first, 100.0, 100.0, 0.01)))
    _, report = plan_model(model.mod, cost_model, "codl_no_chain", config)
    d = _decision(report, first.name)
    assert 0.0 < d.ratio < 1.0 and d.ratio in {j.partition.ratio for j in first.jobs}
    assert d.provenance == "measured" and d.margin_ms is None and d.reason.startswith("split")


def test_a_tuned_operator_leaves_its_chain(model, cost_model):
    """A chain's parts (with their halos) were never measured: a tuned operator is planned on
    its own measured parts, outside any chain."""
    every = PlannerConfig(split_margin="none", chain_min_gain=0.0)  # chains wherever they gain
    _, before = plan_model(model.mod, cost_model, "codl", every)
    chained = {n for d in before.decisions if d.is_chain for n in d.ops}
    found = tune_candidates(model.mod, cost_model, every)
    cand = next(c for c in found if c.name in chained)
    table = _table(_fake_records(cand, 100.0, 100.0, 0.01))
    _, after = plan_model(model.mod, cost_model, "codl", replace(every, tuned_parts=table))
    assert all(cand.name not in d.ops for d in after.decisions if d.is_chain)
    d = _decision(after, cand.name)
    assert d.provenance == "measured" and d.reason.startswith("split")


# -- measuring here (the local OpenCL device) --------------------------------------------------


@pytest.fixture(scope="module")
def tuned(opencl, model, cost_model, cost_model_file, tmp_path_factory):
    """One tuning run of the bundled CNN (one share per dimension, to keep it short) into a
    fresh cache directory."""
    cache = tmp_path_factory.mktemp("tune_cache")
    with planning_context(PRESET, cost_model_file) as config:
        result = tune_operators(model.mod, cost_model, config, 600, cache, PRESET, ratios=(0.5,))
    return cache, config, result


@pytest.mark.opencl
def test_tune_writes_its_cache_and_a_rerun_measures_nothing_new(tuned, model, cost_model):
    cache, config, first = tuned
    found = tune_candidates(model.mod, cost_model, config, (0.5,))
    assert first.tuned == tuple(c.name for c in found) and not first.left and not first.failed
    assert first.parts_measured == sum(len(c.jobs) for c in found) and first.cached == ()
    data = load_dataset(first.cache)
    assert first.cache.parent == cache and len(data.op_records) == first.parts_measured
    here = device_description(LocalSession())
    assert all(r.latency_ms > 0 and dict(r.device)["gpu"] == here["gpu"] for r in data.op_records)
    assert data.meta["timing"] == TUNE_TIMING.to_meta()
    before = first.cache.read_bytes()
    again = tune_operators(model.mod, cost_model, config, 600, cache, PRESET, ratios=(0.5,))
    assert again.parts_measured == 0 and again.cached == again.tuned == first.tuned
    assert again.table.table == first.table.table
    assert first.cache.read_bytes() == before  # nothing appended, nothing rewritten


@pytest.mark.opencl
def test_a_run_killed_mid_write_resumes(tuned, model, cost_model, tmp_path):
    """A line cut short by a killed run is dropped (with a warning); what was measured before it
    stays measured."""
    _, config, first = tuned
    copy_dir = tmp_path / "cache"
    copy_dir.mkdir()
    kept = first.cache.read_bytes()
    (copy_dir / first.cache.name).write_bytes(kept + b'{"type": "op", "device": "d0", "op')
    with pytest.warns(UserWarning, match="incomplete last line"):
        again = tune_operators(model.mod, cost_model, config, 600, copy_dir, PRESET, ratios=(0.5,))
    assert again.parts_measured == 0 and again.tuned == first.tuned
    assert (copy_dir / first.cache.name).read_bytes() == kept


@pytest.mark.opencl
def test_plan_report_marks_tuned_operators_measured(tuned, model, cost_model):
    _, config, result = tuned
    plan_config = PlannerConfig(cpu=config.cpu, gpu=config.gpu, tuned_parts=result.table)
    # without chains each operator keeps a row of its own: which chains the measured parts
    # make depends on this machine's timings
    _, report = plan_model(model.mod, cost_model, "codl_no_chain", plan_config)
    for name in result.tuned:
        d = _decision(report, name)
        assert d.provenance == "measured" and d.expected_error is None and d.margin_ms is None
        assert math.isfinite(d.coexec_ms)
    rows = {d.ops[0]: d for d in report.decisions if not d.is_chain}
    assert any(d.provenance == "predicted" for n, d in rows.items() if n not in result.tuned)
    text = report.table()
    assert re.search(rf"^{result.tuned[0]} .* measured ", text, re.M), text
    assert f"{len(result.tuned)} decision(s) measured" in text


@pytest.mark.opencl
def test_a_spent_budget_leaves_operators_predicted_for_a_later_run(
    opencl, model, cost_model, cost_model_file, tmp_path
):
    with planning_context(PRESET, cost_model_file) as config:
        result = tune_operators(model.mod, cost_model, config, 1e-9, tmp_path, PRESET)
    assert result.tuned == () and result.table is None and result.parts_measured == 0
    assert result.left == tuple(c.name for c in tune_candidates(model.mod, cost_model, config))


@pytest.mark.opencl
def test_plan_tune_follows_a_fed_cache(
    opencl, model, cost_model, cost_model_file, tmp_path, monkeypatch, capsys
):
    """The cache holds every part of every novel operator, the first's making the GPU alone far
    cheaper: ``plan --tune`` measures nothing and places that operator whole on the GPU."""
    monkeypatch.setenv("CODL_TVM_CACHE_DIR", str(tmp_path / "cache"))
    with planning_context(PRESET, cost_model_file) as config:
        found = tune_candidates(model.mod, cost_model, config)
        path = tune_cache_file(tune_cache_dir())
        preset = get_preset(PRESET)
        device = device_description(LocalSession(), preset.target("gpu"), preset.target("cpu"))
    writer, _ = open_dataset(path, {"command": "test"}, TUNE_TIMING)
    with writer:
        writer.extend(_fake_records(found[0], 100.0, 0.01, 50.0, device))
        for c in found[1:]:
            writer.extend(_fake_records(c, 1.0, 2.0, 1.5, device))
    before = path.read_bytes()
    out_plan, out_report = tmp_path / "plan.json", tmp_path / "report.json"
    args = ["plan", str(bundled_model_path()), "--cost-model", str(cost_model_file)]
    args += ["--tune", "5", "-o", str(out_plan), "--report", str(out_report)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert printed.count("measured before") == len(found) and "parts measured in" not in printed
    assert path.read_bytes() == before
    plan = json.loads(out_plan.read_text())
    ratios = {e["op"]: e["ratio"] for e in plan["ops"]}
    assert ratios[found[0].name] == 1.0
    decisions = json.loads(out_report.read_text())["decisions"]
    measured = {d["ops"][0] for d in decisions if d["provenance"] == "measured"}
    assert measured == {c.name for c in found}


# -- what a compile records (manifest.json "tune") ---------------------------------------------


def _fed_cache(config, cost_model, model, build_cache, skip_last: bool = True):
    """The tune cache of a compile with ``build_cache``, fed with records of every part of every
    flagged operator but the last (the cheapest: the compile measures it), the first's making
    the GPU alone far cheaper. Returns the flagged operators and the fed records."""
    found = tune_candidates(model.mod, cost_model, config)
    path = tune_cache_file(tune_cache_dir(build_cache))
    preset = get_preset(PRESET)
    device = device_description(LocalSession(), preset.target("gpu"), preset.target("cpu"))
    fed = {found[0].name: _fake_records(found[0], 100.0, 0.01, 50.0, device)}
    for c in found[1:-1] if skip_last else found[1:]:
        fed[c.name] = _fake_records(c, 1.0, 2.0, 1.5, device)
    writer, _ = open_dataset(path, {"command": "test"}, TUNE_TIMING)
    with writer:
        for records in fed.values():
            writer.extend(records)
    return found, fed


def _check_record(record, found, plan_ops):
    """The counts of a manifest's "tune" add up, and each measured operator is the plan's."""
    assert record["flagged"] == len(found)
    assert record["measured"] + record["predicted"] == record["flagged"]
    assert record["measured_fresh"] + record["measured_cached"] == record["measured"]
    assert len(record["left"]) == record["predicted"]
    assert record["on"] == "this machine" and record["device"]["remote"] is False
    assert record["budget_s"] == 600 and 0 <= record["spent_s"]
    names = [o["name"] for o in record["operators"]]
    assert len(names) == record["measured"] and set(names) <= plan_ops
    for o in record["operators"]:
        assert o["whole_cpu_ms"] > 0 and o["whole_gpu_ms"] > 0 and o["splits"]
        assert all(s["cpu_ms"] or s["gpu_ms"] for s in o["splits"])
    return {o["name"]: o for o in record["operators"]}


@pytest.mark.slow  # about 50 s on 2 cores; the record's fast test is the plan report's below
@pytest.mark.opencl
def test_compile_records_tuning_in_its_manifest(
    opencl, model, cost_model, cost_model_file, tmp_path, capsys
):
    """``compile --tune``'s manifest says what was flagged, measured (here, from the cache)
    and left predicted, and the part times the plan was made on; a second compile with the
    same cache takes every operator from it; a compile without --tune records nothing."""
    cache = tmp_path / "build_cache"
    with planning_context(PRESET, cost_model_file) as config:
        found, fed = _fed_cache(config, cost_model, model, cache)
    common = [str(bundled_model_path()), "--cost-model", str(cost_model_file)]
    common += ["--build-cache", str(cache)]
    art = tmp_path / "art"
    assert main(["compile", *common, "-o", str(art), "--tune", "600"]) == 0
    capsys.readouterr()
    record = json.loads((art / "manifest.json").read_text())["tune"]
    plan_ops = {e["op"] for e in json.loads((art / "plan.json").read_text())["ops"]}
    ops = _check_record(record, found, plan_ops)
    assert (record["measured_cached"], record["measured_fresh"]) == (len(fed), 1)
    assert record["parts_measured"] == len(found[-1].jobs) and record["predicted"] == 0
    assert record["cache"] == str(tune_cache_file(tune_cache_dir(cache)).resolve())
    assert [n for n, o in ops.items() if not o["from_cache"]] == [found[-1].name]
    # the fed times are the ones the plan was made on
    first = ops[found[0].name]
    assert (first["whole_cpu_ms"], first["whole_gpu_ms"]) == (100.0, 0.01)
    assert {s[f"{p}_ms"] for s in first["splits"] for p in ("cpu", "gpu")} <= {50.0, None}
    # the same cache again: nothing measured, every operator from it
    again = tmp_path / "again"
    assert main(["compile", *common, "-o", str(again), "--tune", "600"]) == 0
    record = json.loads((again / "manifest.json").read_text())["tune"]
    ops = _check_record(record, found, plan_ops)
    assert record["measured_cached"] == len(found) and record["parts_measured"] == 0
    assert all(o["from_cache"] for o in ops.values())
    # no --tune, no record
    plain = tmp_path / "plain"
    assert main(["compile", *common, "-o", str(plain), "--no-measure"]) == 0
    assert "tune" not in json.loads((plain / "manifest.json").read_text())


@pytest.mark.opencl
def test_plan_tune_report_records_tuning(
    opencl, model, cost_model, cost_model_file, tmp_path, monkeypatch, capsys
):
    """``plan --tune --report R.json`` writes the record a compile's manifest gets; a budget
    spent at once leaves every flagged operator predicted."""
    monkeypatch.setenv("CODL_TVM_CACHE_DIR", str(tmp_path / "cache"))
    with planning_context(PRESET, cost_model_file) as config:
        found = tune_candidates(model.mod, cost_model, config)
    out_report = tmp_path / "report.json"
    args = ["plan", str(bundled_model_path()), "--cost-model", str(cost_model_file)]
    assert main([*args, "--tune", "1e-9", "--report", str(out_report)]) == 0
    assert "decision(s) measured" in capsys.readouterr().out
    report = json.loads(out_report.read_text())
    record = report["tune"]
    counts = (record["flagged"], record["measured"], record["predicted"])
    assert counts == (len(found), 0, len(found))
    assert record["left"] == [c.name for c in found] and record["operators"] == []
    assert all(d["provenance"] == "predicted" for d in report["decisions"])
    assert main([*args, "--report", str(out_report)]) == 0
    assert "tune" not in json.loads(out_report.read_text())


# -- the command line ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--tune", "0"], "--tune must be a time budget in seconds > 0, got 0.0"),
        (["--tune", "-5"], "--tune must be a time budget in seconds > 0, got -5.0"),
        (["--tune", "5", "--no-measure"], "--tune times operator parts on this machine; drop"),
        (["--tune", "5", "--preset", "linux-arm64-mali"], "'linux-arm64-mali' cross-compiles"),
        (["--tune", "5", "--device", "cpu"], "--device is 'cpu', not 'coexec'"),
        (["--tune", "5", "--dim", "H"], "a --plan is given"),
        (["--tune", "5", "--objective", "throughput", "--groups", "gpu"], "--tune apply to"),
        (["--tune", "5", "--objective", "cold"], "--tune applies to --objective latency"),
    ],
)
def test_compile_tune_bad_input_is_one_line(extra, says, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compile", "-o", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("codl-tvm: error: --tune"), err
    assert says in err[0]
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--tune", "0"], "--tune must be a time budget in seconds > 0, got 0"),
        (["--tune", "-1"], "--tune must be a time budget in seconds > 0, got -1"),
        (["--tune", "5", "--preset", "linux-arm64-mali"], "'linux-arm64-mali' cross-compiles"),
    ],
)
def test_plan_tune_bad_input_is_one_line(extra, says, capsys):
    assert main(["plan", str(bundled_model_path()), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("codl-tvm: error: --tune"), err
    assert says in err[0]


@pytest.mark.slow
@pytest.mark.opencl
def test_compile_tune_end_to_end(opencl, cost_model_file, tmp_path, capsys):
    """A tuned compile reports its tuned operators as measured and checks out against the
    CPU reference; the tuned plan built co-executed does too; a second tuned compile with the
    same build cache measures nothing."""
    model = str(bundled_model_path())
    cache = tmp_path / "build_cache"
    common = ["--cost-model", str(cost_model_file), "--build-cache", str(cache)]
    art = tmp_path / "art"
    assert main(["compile", model, "-o", str(art), "--tune", "600", *common]) == 0
    printed = capsys.readouterr().out
    tuned = re.findall(r"^tune \[\d+/\d+\] (\S+) .*parts measured in", printed, re.M)
    assert tuned, printed
    assert list(cache.glob("tune/tune-*.jsonl"))
    decisions = json.loads((art / "plan_report.json").read_text())["decisions"]
    measured = {d["ops"][0] for d in decisions if d["provenance"] == "measured"}
    assert measured == set(tuned)
    assert main(["run", str(art)]) == 0
    assert "-> OK" in capsys.readouterr().out
    # the tuned plan itself, co-executed, whichever build the measurement kept
    plan = json.loads((art / "plan.json").read_text())
    assert any(0.0 < e["ratio"] < 1.0 for e in plan["ops"])  # the model's other operators split
    coexec = tmp_path / "coexec"
    args = ["compile", model, "-o", str(coexec), "--plan", str(art / "plan.json"), "--no-measure"]
    assert main(args) == 0
    assert json.loads((coexec / "manifest.json").read_text())["device"] == "coexec"
    assert main(["run", str(coexec)]) == 0
    assert "-> OK" in capsys.readouterr().out
    # resumed from the build cache's measurements: nothing new measured
    again = tmp_path / "again"
    assert main(["compile", model, "-o", str(again), "--tune", "600", *common]) == 0
    printed = capsys.readouterr().out
    assert printed.count("measured before") == len(tuned) and "parts measured in" not in printed
