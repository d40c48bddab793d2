"""The planner's split margin and each decision's provenance (measured or predicted).

Cost models are fitted on synthetic records of an imaginary device pair
(``codl_tvm.cost_model.synthetic``); their stored leave-one-model-out error is set by hand, so
the margin's effect is known; nothing is measured.
"""

from __future__ import annotations

import copy
import json

import pytest

from codl_tvm.cli import bundled_model_path
from codl_tvm.core.plan import partitionable_ops
from codl_tvm.cost_model import OpRecord, Partition, op_features
from codl_tvm.cost_model.measured import MeasuredModel
from codl_tvm.cost_model.synthetic import SyntheticDevice, synthetic_cost_model, synthetic_records
from codl_tvm.cost_model.uncertainty import DataRanges, ErrorStats, LomoError
from codl_tvm.planner import PlannerConfig, PlannerError, op_params, plan_model


@pytest.fixture(scope="module")
def model():
    from codl_tvm.frontend.importer import load_onnx

    return load_onnx(bundled_model_path())


@pytest.fixture(scope="module")
def balanced():
    return synthetic_cost_model(SyntheticDevice())


def with_error(cost_model, error: float, ranges: DataRanges | None = None):
    """``cost_model`` with a stored leave-one-model-out error of ``error`` on every slice (p80)
    and twice that at p90."""
    stats = ErrorStats(1000, {"p80": error, "p90": 2 * error})
    roles = {"whole": stats, "split": stats, "all": stats}
    out = copy.copy(cost_model)
    out.meta = {
        **cost_model.meta,
        "lomo_error": LomoError((0.8, 0.9), {"cpu": roles, "gpu": roles}, {}, ("a", "b")).to_json(),
    }
    if ranges is not None:
        out.meta["data_ranges"] = ranges.to_json()
    return out


def _splits(plan) -> list[str]:
    return [p.op for p in plan.ops if 0.0 < p.ratio < 1.0]


def test_a_huge_margin_keeps_every_operator_whole_and_says_why(model, balanced):
    plain, _ = plan_model(model.mod, balanced, "codl_no_chain")
    assert len(_splits(plain)) >= 5  # the balanced pair splits every dense conv
    unsure = with_error(balanced, 5.0)  # predictions off by up to 500%
    every = PlannerConfig(split_margin="lomo")  # every operator held, novel or not
    plan, report = plan_model(model.mod, unsure, "codl_no_chain", every)
    assert _splits(plan) == []
    held = [d for d in report.decisions if d.ops[0] in _splits(plain)]
    for d in held:
        assert "predicted gain" in d.reason and "< margin" in d.reason, d.reason
        # p80 inside the data, p90 (here twice as large) for a novel operator
        assert f"LOMO error {1000 if d.novel else 500}%" in d.reason
        assert d.margin_ms is not None and d.gain_ms == 0.0
        assert d.coexec_ms == pytest.approx(min(d.cpu_ms, d.gpu_ms), rel=0.5)
    assert any("kept" in n and "whole" in n for n in report.notes)
    # turned off, CoDL's rule splits again
    off, _ = plan_model(model.mod, unsure, "codl_no_chain", PlannerConfig(split_margin="none"))
    assert _splits(off) == _splits(plain)


def test_a_small_margin_is_cleared_and_chains_are_held_too(model, balanced):
    plain, _ = plan_model(model.mod, balanced)
    every = PlannerConfig(split_margin="lomo")
    plan, report = plan_model(model.mod, with_error(balanced, 0.01), config=every)
    assert plan.to_json() == plain.to_json()
    assert any("clearing the margin" in d.reason for d in report.decisions)
    # a margin no chain clears plans the chains' operators one by one
    _, huge = plan_model(model.mod, with_error(balanced, 5.0), config=every)
    assert not huge.chains()


def test_by_default_only_novel_operators_are_held_to_the_margin(model, balanced):
    plain, _ = plan_model(model.mod, balanced, "codl_no_chain")
    # the bundled model's shapes partly outside the synthetic data: those operators are novel
    data = DataRanges.of(synthetic_records(SyntheticDevice()))
    plan, report = plan_model(model.mod, with_error(balanced, 5.0, data), "codl_no_chain")
    novel = {d.ops[0] for d in report.decisions if d.novel}
    inside = {d.ops[0] for d in report.decisions if not d.novel}
    assert novel & set(_splits(plain)) and inside & set(_splits(plain))
    # the novel ones run whole, the others split as CoDL's rule splits them
    assert set(_splits(plan)) == set(_splits(plain)) & inside


def test_provenance_predicted_with_expected_error(model, balanced, tmp_path):
    data = DataRanges.of(synthetic_records(SyntheticDevice()))
    _, report = plan_model(model.mod, with_error(balanced, 0.2, data), "codl_no_chain")
    rows = [d for d in report.decisions if d.provenance != "unmodelled"]
    assert rows and all(d.provenance == "predicted" for d in rows)
    for d in rows:
        # novel operators (the bundled model's shapes outside the synthetic data) take p90
        assert d.expected_error == pytest.approx(0.4 if d.novel else 0.2)
        assert d.source.startswith("pred +-") and d.source.endswith("*") == bool(d.novel)
    assert any(d.novel for d in rows)
    report.save(tmp_path / "plan_report.json")
    saved = json.loads((tmp_path / "plan_report.json").read_text())["decisions"]
    assert {"provenance", "expected_error", "novel", "margin_ms"} <= set(saved[0])
    assert "source:" in report.table() and "pred +-20%" in report.table()
    # without stored errors: predicted, no expected error, and a note says so
    _, bare = plan_model(model.mod, balanced, "codl_no_chain")
    assert all(d.expected_error is None for d in bare.decisions)
    assert any("stores no leave-one-model-out error" in n for n in bare.notes)


def _measured_table(mod) -> MeasuredModel:
    """A table of every whole and 0.5-split part of ``mod``'s operators on the synthetic pair,
    with its sharing costs."""
    dev = SyntheticDevice()
    impls = {"conv2d": "direct", "dense": "matmul", "pool": "pool"}
    recs = [r for r in synthetic_records(dev) if not isinstance(r, OpRecord)]
    for info in partitionable_ops(mod):
        params = op_params(info)
        parts = [Partition("none", 0.0), Partition("none", 1.0)]
        parts += [Partition(d.value, 0.5) for d in info.dims]
        for part in parts:
            for proc in ("cpu", "gpu"):
                f = op_features(params, proc, impls[params.op], part)
                if part.dim == "none" and (part.ratio == 1.0) != (proc == "gpu"):
                    continue
                if not f.part.empty:
                    lat = dev.latency_ms(f.flops, proc)
                    recs.append(OpRecord(params, part, proc, f.impl, lat, 1, name=info.name))
    return MeasuredModel().fit(recs)


def test_provenance_measured_from_a_table(model):
    table = _measured_table(model.mod)
    config = PlannerConfig(ratios=(0.0, 0.5, 1.0))
    _, report = plan_model(model.mod, table, "codl_no_chain", config)
    rows = [d for d in report.decisions if d.provenance != "unmodelled"]
    assert rows and all(d.provenance == "measured" for d in rows), [d.source for d in rows]
    assert all(d.expected_error is None and d.margin_ms is None for d in rows)
    assert "measured" in report.table()


def test_config_checks_the_margin_settings():
    with pytest.raises(PlannerError, match="split_margin"):
        PlannerConfig(split_margin="always")
    with pytest.raises(PlannerError, match="margin_quantiles"):
        PlannerConfig(margin_quantiles=(0.8,))
    assert PlannerConfig().split_margin == "novel"
