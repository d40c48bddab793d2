"""The cost-model assessment: random split and leave-one-model-out, slices by processor,
implementation and latency band, CoDL's model and FLOPs beside, the repeatability ceiling, and
the datasets ``fit`` refuses to mix.

Data is synthetic (``tests.test_cost_model.synth_records``: Eq. 3 with known coefficients), with
records named after made-up benchmark models so that folds exist.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from codl_tvm.core.errors import CodlError
from codl_tvm.cost_model import (
    CodlModel,
    FlopsModel,
    OpRecord,
    Partition,
    load_model,
    part_shape,
    save_dataset,
)
from codl_tvm.cost_model.assessment import (
    LATENCY_BANDS,
    assess,
    band_of,
    format_assessment,
    model_of,
    refit_like,
    repeatability,
    slice_labels,
    smoothness,
)
from codl_tvm.cost_model.decisions import decide, format_decisions
from codl_tvm.cost_model.evaluate import accuracy, training_split
from codl_tvm.cost_model.in_model import summary, whole_model_table
from codl_tvm.cost_model.measured import MeasuredModel
from tests.test_cost_model import CFG, run_cli, synth_records


def named(records: list[OpRecord], models: tuple[str, ...]) -> list[OpRecord]:
    """``records`` with names ``MODEL/op_i``, the models taking turns."""
    return [
        dataclasses.replace(r, name=f"{models[i % len(models)]}/op_{i}")
        for i, r in enumerate(records)
    ]


def dataset(seed: int = 0) -> list[OpRecord]:
    rng = np.random.default_rng(seed)
    recs = synth_records(rng, 60, "direct", noise=0.02) + synth_records(
        rng, 40, "direct", "cpu", noise=0.02
    )
    return named(recs[:80], ("mA", "mB", "mC")) + recs[80:]


def test_bands_and_slices():
    assert [band_of(x) for x in (0.0099, 0.1, 0.99, 1.0, 25.0)] == [
        "<0.1ms",
        "0.1-1ms",
        "0.1-1ms",
        ">1ms",
        ">1ms",
    ]
    assert LATENCY_BANDS[0][0] == "<0.1ms"
    r = dataset()[0]
    assert model_of(r) == "mA" and model_of(dataclasses.replace(r, name="conv_1")) is None
    labels = slice_labels(r)
    assert labels[0] == "overall" and labels[1] == r.processor
    assert labels[2] == f"{r.processor} {band_of(r.latency_ms)}"
    assert labels[3] == f"conv2d/{r.processor}/direct"


def test_repeatability_pairs_identical_parts_per_band():
    base = dataset()[0]
    fast = dataclasses.replace(base, latency_ms=0.05)
    recs = [
        fast,
        dataclasses.replace(fast, latency_ms=0.052),  # 4% apart: within
        dataclasses.replace(fast, latency_ms=0.07),  # 40% apart: outside
        dataclasses.replace(base, latency_ms=5.0, params=dataclasses.replace(base.params, h=99)),
    ]
    ceil = repeatability(recs)
    band = f"{base.processor} <0.1ms"
    # 3 records of one part: 6 ordered pairs, 2 of them (0.05 <-> 0.052) within +-10%
    assert ceil[band]["pairs"] == 6 and ceil[band]["parts"] == 1
    assert ceil[band]["acc10"] == pytest.approx(2 / 6)
    assert f"{base.processor} >1ms" not in ceil  # measured once: no ceiling


def test_assessment_scores_folds_against_direct_fits():
    recs = dataset()
    model = CodlModel(CFG)
    train, test, _ = training_split(recs, 0.3, 0, 3.0)
    model.fit(train)
    model.meta.update({"holdout": 0.3, "seed": 0, "drop_inconsistent": 3.0})
    a = assess(model, recs, "synthetic")

    # random split: the model's own held-out part, with CoDL's model and FLOPs on its training
    test_ops = [r for r in test if isinstance(r, OpRecord)]
    meas = [r.latency_ms for r in test_ops]
    feats = [r.features() for r in test_ops]
    assert a.random["overall"].model == accuracy(model.predict_many(feats), meas)
    flops = FlopsModel().fit(train)
    assert a.random["overall"].references["flops"] == accuracy(flops.predict_many(feats), meas)
    assert set(a.random["overall"].references) == {"codl", "flops"}
    assert "conv2d/cpu/direct" in a.random and "gpu" in a.random

    # leave-one-model-out: mB's parts predicted by the recipe refitted without them
    held = [r for r in recs if model_of(r) == "mB"]
    rest = [r for r in recs if model_of(r) != "mB"]
    refit = refit_like(model, rest)
    expect = accuracy(
        refit.predict_many([r.features() for r in held]), [r.latency_ms for r in held]
    )
    assert a.lomo_models["mB"]["overall"].model == expect
    assert set(a.lomo_models) == {"mA", "mB", "mC"}
    assert a.lomo["overall"].n == sum(model_of(r) is not None for r in recs)
    text = format_assessment(a)
    assert "leave-one-model-out (3 models" in text and "mB overall" in text

    # a model fitted on everything is scored by refitting its recipe on a 70/30 split
    whole = CodlModel(CFG).fit(recs)
    whole.meta.update({"holdout": 0.0})
    b = assess(whole, recs, "synthetic", lomo=False)
    assert "refitted on the other 70%" in b.split and not b.lomo
    assert b.random["overall"].n == len(test_ops)


def test_cli_eval_reports_the_assessment_and_unseen_kernels(tmp_path, capsys):
    recs = dataset()
    data = tmp_path / "d.jsonl"
    save_dataset(recs, data)
    model_path = tmp_path / "m.json"
    assert (
        run_cli(["cost-model", "fit", str(data), "-o", str(model_path), "--preset", "mobile"]) == 0
    )
    capsys.readouterr()
    assert run_cli(["cost-model", "eval", str(model_path), str(data), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    slices = out["assessment"]["random_split"]["slices"]
    assert {"overall", "cpu", "gpu"} <= set(slices)
    assert set(slices["overall"]) >= {"model", "codl", "flops", "ceiling_acc10", "n"}
    assert set(out["assessment"]["leave_one_model_out"]["models"]) == {"mA", "mB", "mC"}

    # a kernel the model never saw (the winograd implementation) is counted and named
    other = synth_records(np.random.default_rng(5), 6, "winograd")
    data2 = tmp_path / "d2.jsonl"
    save_dataset(recs + other, data2)
    assert run_cli(["cost-model", "eval", str(model_path), str(data2), "--all"]) == 0
    text = capsys.readouterr().out
    assert "6 operator records are of kernels the model never saw" in text
    assert "conv2d/gpu/winograd (6)" in text


def test_fit_refuses_datasets_of_another_device_or_protocol(tmp_path):
    recs = dataset()
    a = tmp_path / "a.jsonl"
    save_dataset(recs, a, meta={"timing": {"repeats": 10, "number": 1}})
    other = [
        dataclasses.replace(r, device={"gpu": "another gpu", "cpu": r.device["cpu"]}) for r in recs
    ]
    b = tmp_path / "b.jsonl"
    save_dataset(other, b)
    out = str(tmp_path / "m.json")
    with pytest.raises(CodlError, match=r"b\.jsonl was measured on another device.*field 'gpu'"):
        run_cli(["cost-model", "fit", str(a), str(b), "-o", out])
    c = tmp_path / "c.jsonl"
    save_dataset(recs, c, meta={"timing": {"repeats": 5, "number": 1}})
    with pytest.raises(CodlError, match=r"c\.jsonl .*another timing protocol.*'repeats' is 5"):
        run_cli(["cost-model", "fit", str(a), str(c), "-o", out])
    # same device, one file without a stated protocol: fitted together
    d = tmp_path / "d.jsonl"
    save_dataset(recs, d)
    assert run_cli(["cost-model", "fit", str(a), str(d), "-o", out, "--preset", "mobile"]) == 0
    assert load_model(out).meta["n_train"] > 0


def decision_records() -> list:
    """Two benchmark models of two conv operators each, measured whole and split at H:0.5 and
    OC:0.5 on both processors (Eq. 3 latencies, so the best split is what a model predicts)."""
    rng = np.random.default_rng(9)
    out = []
    for i in range(4):
        params = synth_records(rng, 1, "direct")[0].params
        name = f"{('mA', 'mB')[i % 2]}/conv_{i}"
        for part in (
            Partition("none", 0.0),
            Partition("none", 1.0),
            Partition("H", 0.5),
            Partition("OC", 0.5),
        ):
            for proc in ("cpu", "gpu"):
                if part.dim == "none" and (part.ratio == 1.0) != (proc == "gpu"):
                    continue
                shape = part_shape(params, part, proc)
                gpu_fast = 0.25 if proc == "gpu" else 1.0
                lat = gpu_fast * (0.01 + 1e-9 * 2 * shape.out_h * shape.out_w * shape.oc * shape.ic)
                out.append(OpRecord(params, part, proc, "direct", lat, 5, name=name))
    return out


@pytest.mark.filterwarnings("ignore:.* cost model has no data-sharing")
def test_decisions_against_the_oracle(tmp_path, capsys):
    recs = decision_records()
    oracle = MeasuredModel().fit(recs)
    # the oracle picks its own best: every pick right, no loss
    report = decide(oracle, oracle, recs)
    assert len(report.ops) == 4 and report.within == 1.0
    assert all(s["loss"] == 0.0 for s in report.per_model().values())

    # a model that thinks the GPU is 100x slower runs everything on the CPU
    slow_gpu = oracle.scaled(cpu=1.0, gpu=100.0)
    report = decide(slow_gpu, oracle, recs)
    assert all(d.picked == Partition("none", 0.0) for d in report.ops)
    parts = [
        Partition("none", 0.0),
        Partition("none", 1.0),
        Partition("H", 0.5),
        Partition("OC", 0.5),
    ]
    for d in report.ops:
        cands = [
            c.total_ms
            for c in oracle.predict_coexec_many(
                next(r.params for r in recs if r.name == f"{d.model}/{d.name}"), parts, "direct"
            )
        ]
        assert d.best_ms == pytest.approx(min(cands)) and d.picked_ms == pytest.approx(cands[0])
    m = report.per_model()["mA"]
    ds = [d for d in report.ops if d.model == "mA"]
    assert m["loss"] == pytest.approx(sum(d.picked_ms for d in ds) / sum(d.best_ms for d in ds) - 1)
    assert report.within < 1.0 and "worst picks" in format_decisions(report)
    # CoDL's model and the FLOPs line take the same decisions beside it, scored alike
    assert set(report.references) == {"codl", "flops"}
    flops = FlopsModel().fit(recs)
    for d in report.references["flops"]:
        params = next(r.params for r in recs if r.name == f"{d.model}/{d.name}")
        preds = [c.total_ms for c in flops.predict_coexec_many(params, parts, "direct")]
        assert d.picked == parts[int(np.argmin(preds))]
    assert "FLOPs line:" in format_decisions(report)

    # the command: model, oracle, dataset; a non-oracle oracle is refused
    data = tmp_path / "d.jsonl"
    save_dataset(recs, data)
    oracle_path = tmp_path / "oracle.json"
    oracle.save(oracle_path)
    assert (
        run_cli(
            ["cost-model", "decisions", str(oracle_path), str(oracle_path), str(data), "--json"]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["within"] == 1.0
    codl = tmp_path / "codl.json"
    CodlModel(CFG).fit(recs).save(codl)
    with pytest.raises(CodlError, match="the oracle is a measured model"):
        run_cli(["cost-model", "decisions", str(codl), str(codl), str(data)])
    unnamed = tmp_path / "u.jsonl"
    save_dataset([dataclasses.replace(r, name=None) for r in recs], unnamed)
    with pytest.raises(CodlError, match="no records of benchmark models"):
        run_cli(["cost-model", "decisions", str(codl), str(oracle_path), str(unnamed)])


def test_whole_model_table_and_leave_one_model_out_factors():
    predicted = {"a": {"cpu": 10.0, "gpu": 4.0}, "b": {"cpu": 20.0, "gpu": 5.0}, "c": {"cpu": 5.0}}
    measured = {"a": {"cpu": 12.0, "gpu": 4.0}, "b": {"cpu": 30.0, "gpu": 5.5}, "c": {"cpu": 6.0}}
    rows = {(r.model, r.processor): r for r in whole_model_table(predicted, measured)}
    assert set(rows) == {("a", "cpu"), ("a", "gpu"), ("b", "cpu"), ("b", "gpu"), ("c", "cpu")}
    a = rows[("a", "cpu")]
    assert a.error == pytest.approx(10 / 12 - 1)
    # a's CPU factor: geometric mean of b's and c's measured/predicted, never a's own
    assert a.factor == pytest.approx(math.sqrt(1.5 * 1.2))
    assert a.calibrated_error == pytest.approx(10 * math.sqrt(1.8) / 12 - 1)
    assert rows[("a", "gpu")].factor == pytest.approx(1.1)
    s = summary(list(rows.values()))
    assert s["gpu"]["models"] == 2 and s["gpu"]["within_raw"] == 1.0
    assert s["cpu"]["factor_all"] == pytest.approx((1.2 * 1.5 * 1.2) ** (1 / 3))
    with pytest.raises(ValueError, match="b on gpu: measured latency must be > 0"):
        whole_model_table(predicted, {"b": {"gpu": 0.0}})


def test_smoothness_interpolates_between_neighbouring_parts():
    base = next(r for r in dataset() if r.processor == "gpu")
    params = dataclasses.replace(base.params, h=64, padding=(0, 0, 0, 0), kernel=1, stride=1)

    def recs(lats):
        # GPU parts of 16, 32, 48, 64 rows: FLOPs 1 : 2 : 3 : 4
        return [
            dataclasses.replace(
                base, params=params, partition=Partition("H", q), part=None, latency_ms=lat
            )
            for q, lat in zip((0.25, 0.5, 0.75, 1.0), lats)
        ]

    # latency proportional to FLOPs: both inner parts sit on the interpolation
    s = smoothness(recs([1.0, 2.0, 3.0, 4.0]))
    assert s["overall"] == {"acc10": 1.0, "parts": 2}
    # 2.5 where the neighbours say 2.0 (25% off); then 3.0 where 2.5 and 4.0 say 3.29 (9.7%)
    assert smoothness(recs([1.0, 2.5, 3.0, 4.0]))["overall"]["acc10"] == 0.5


def test_assessment_of_a_tiny_dataset_says_it_cannot_split():
    recs = dataset()[:1]
    model = CodlModel(CFG).fit(recs)
    a = assess(model, recs, "one record")
    assert not a.random and "too few records" in a.split and not a.lomo
    assert "too few records" in format_assessment(a)
