"""Pipe-it's layer model (Eq. 5 and Eq. 8) fitted on synthetic records of known coefficients.

The records are generated from the equations themselves on Pipe-it's micro-benchmark grid
(section V-B), so a correct fit recovers the coefficients exactly and predicts held-out layers.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from codl_tvm.core.errors import CodlError, DatasetError, ModelFileError, PlannerError
from codl_tvm.planner.stages.layer_model import (
    LayerShape,
    PipeModel,
    PipeRecord,
    amdahl_table,
    eq5_features,
    on_demand_table,
    piecewise_amdahl_table,
)
from codl_tvm.planner.stages.search import (
    HandOff,
    LatencyTable,
    optimal_pipeline,
    parse_groups,
    recost_plan,
)

# b1..b8 of Eq. 5 in ms (N, K, M, NK, KM, NM, NMK, 1): big cores, little cores ~3x slower.
BETA = {
    "big": np.array([2e-5, 1e-5, 3e-5, 4e-9, 6e-9, 2e-8, 1.5e-9, 0.04]),
    "little": np.array([6e-5, 3e-5, 9e-5, 1.2e-8, 1.8e-8, 6e-8, 4.5e-9, 0.1]),
    "gpu": np.array([1e-5, 1e-5, 1e-5, 1e-9, 1e-9, 5e-9, 6e-10, 0.3]),
}
# Eq. 8's (a1, a2/ts, a3) in ms.
ALPHA = {"big": (0.03, 2e-6, 0.05), "little": (0.05, 5e-6, 0.08)}
GROUPS = {"big": 4, "little": 4, "gpu": 1}


def grid_layers() -> list[LayerShape]:
    """Pipe-it's micro-benchmark grid: stride 1, 'same' padding, so O_w = I_w."""
    layers = []
    for i_w, f_w, i_d, ofm in itertools.product(
        (7, 14, 28, 56, 112), (1, 3, 5, 7, 11), (32, 64, 92, 128, 192, 256), (32, 64, 128, 256)
    ):
        layers.append(
            LayerShape(f"c{i_w}_{f_w}_{i_d}_{ofm}", "conv2d", i_w * i_w, f_w * f_w * i_d, ofm)
        )
    return layers


def true_latency(layer: LayerShape, group: str, cores: int) -> float:
    t1 = float(
        eq5_features(
            np.array(layer.out_pixels), np.array(layer.filter_size), np.array(layer.out_maps)
        )
        @ BETA[group]
    )
    if cores == 1:
        return t1
    a1, a2_ts, a3 = ALPHA[group]
    return (t1 - a1) / cores + a2_ts * layer.out_pixels / cores + a3


def records(layers, noise: float = 0.0, seed: int = 0) -> list[PipeRecord]:
    rng = np.random.default_rng(seed)
    out = []
    for layer in layers:
        for group, most in GROUPS.items():
            for cores in range(1, most + 1):
                t = true_latency(layer, group, cores) * (1 + noise * rng.standard_normal())
                out.append(PipeRecord(layer, group, cores, t))
    return out


def sample_layers(n: int, seed: int = 3) -> list[LayerShape]:
    layers = grid_layers()
    return [layers[i] for i in np.random.default_rng(seed).permutation(len(layers))[:n]]


@pytest.fixture(scope="module")
def split_layers():
    layers = grid_layers()
    rng = np.random.default_rng(1)
    order = rng.permutation(len(layers))
    train = [layers[i] for i in order[:300]]
    held = [layers[i] for i in order[300:]]
    return train, held


def test_fit_recovers_known_coefficients(split_layers):
    train, _ = split_layers
    model = PipeModel(GROUPS).fit(records(train))
    for group in GROUPS:
        fit = model.fits[(group, "conv2d")]
        np.testing.assert_allclose(fit.beta, BETA[group], rtol=1e-6, atol=1e-12)
        if group in ALPHA:
            np.testing.assert_allclose(fit.alpha, ALPHA[group], rtol=1e-6, atol=1e-12)
        else:
            # one "core": Eq. 8 has nothing to fit
            assert fit.alpha is None


def test_predicts_held_out_layers(split_layers):
    train, held = split_layers
    exact = PipeModel(GROUPS).fit(records(train))
    noisy = PipeModel(GROUPS).fit(records(train, noise=0.01, seed=2))
    for group, most in GROUPS.items():
        for cores in range(1, most + 1):
            truth = np.array([true_latency(layer, group, cores) for layer in held])
            pred = np.array([exact.predict(layer, group, cores) for layer in held])
            np.testing.assert_allclose(pred, truth, rtol=1e-6)
            # 1 % measurement noise (unweighted least squares, as in Pipe-it): layers over
            # 5 ms (those that decide a pipeline's bottleneck) within 5 %, those over 1 ms 1 %
            # in the median, the held-out set's total within 1 %.
            pred = np.array([noisy.predict(layer, group, cores) for layer in held])
            rel = np.abs(pred - truth) / truth
            assert rel[truth > 5.0].max() < 0.05
            assert np.median(rel[truth > 1.0]) < 0.01
            assert abs(pred.sum() - truth.sum()) / truth.sum() < 0.01


def test_latency_table_has_every_group_and_count(split_layers):
    train, held = split_layers
    model = PipeModel(GROUPS).fit(records(train))
    table = model.latency_table(held[:5])
    assert set(table) == {(g, c) for g, most in GROUPS.items() for c in range(1, most + 1)}
    assert all(v.shape == (5,) and np.all(v > 0) for v in table.values())


def test_save_load_round_trip(tmp_path, split_layers):
    train, held = split_layers
    model = PipeModel(GROUPS).fit(records(train[:100]))
    path = model.save(tmp_path / "pipe.json")
    loaded = PipeModel.load(path)
    assert loaded.groups == model.groups
    assert loaded.fits == model.fits
    for layer in held[:10]:
        assert loaded.predict(layer, "little", 3) == model.predict(layer, "little", 3)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not a JSON file"),
        ('{"format": "codl-tvm-cost-model", "version": 1}', "not a Pipe-it model"),
        ('{"format": "codl-tvm-pipe-model", "version": 99}', "version 99"),
        ('{"format": "codl-tvm-pipe-model", "version": 1, "groups": {"big": 4}}', "malformed"),
    ],
)
def test_load_refuses_bad_files(tmp_path, text, match):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ModelFileError, match=match) as err:
        PipeModel.load(path)
    assert str(path) in str(err.value)


def test_load_refuses_a_fit_of_an_unknown_group(tmp_path, split_layers):
    model = PipeModel(GROUPS).fit(records(split_layers[0][:50]))
    obj = model.to_json()
    obj["groups"] = {"little": 4, "gpu": 1}
    path = tmp_path / "m.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(ModelFileError, match="unknown group 'big'"):
        PipeModel.load(path)


LAYER = LayerShape("conv1", "conv2d", 3136, 576, 64)


@pytest.mark.parametrize("latency", [0.0, -1.0, float("nan"), float("inf")])
def test_non_positive_latency_refused(latency):
    with pytest.raises(DatasetError, match=r"conv1.*latency_ms must be > 0") as err:
        PipeRecord(LAYER, "big", 1, latency)
    assert isinstance(err.value, CodlError)


def test_unknown_group_and_too_many_cores_refused_before_fitting():
    good = records(sample_layers(20))
    model = PipeModel(GROUPS)
    with pytest.raises(DatasetError, match="unknown processor group 'mid'"):
        model.fit([*good, PipeRecord(LAYER, "mid", 1, 1.0)])
    with pytest.raises(DatasetError, match="5 cores on group 'big', which has 4"):
        model.fit([*good, PipeRecord(LAYER, "big", 5, 1.0)])
    assert model.fits == {}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"out_pixels": 0}, "out_pixels must be a positive integer"),
        ({"filter_size": 2.5}, "filter_size must be a positive integer"),
        ({"layer_type": ""}, "layer_type must be a non-empty string"),
    ],
)
def test_bad_layer_shapes_refused(kwargs, match):
    args = {"name": "l", "layer_type": "conv2d", "out_pixels": 1, "filter_size": 1, "out_maps": 1}
    with pytest.raises(DatasetError, match=match):
        LayerShape(**{**args, **kwargs})


def test_records_that_do_not_determine_eq5_refused():
    # One shape measured ten times determines one point, not eight coefficients.
    recs = [PipeRecord(LAYER, "big", 1, 1.0 + 0.01 * i) for i in range(10)]
    with pytest.raises(DatasetError, match="determine only 1 of 8 coefficients"):
        PipeModel({"big": 4}).fit(recs)


def test_predict_refuses_what_it_was_not_fitted_for():
    recs = [r for r in records(sample_layers(60)) if r.cores == 1]
    model = PipeModel(GROUPS).fit(recs)
    with pytest.raises(PlannerError, match="no multi-core fit"):
        model.predict(LAYER, "big", 2)
    with pytest.raises(PlannerError, match="no fit for layer type 'dense'"):
        model.predict(LayerShape("fc", "dense", 1, 4096, 1000), "big", 1)
    with pytest.raises(PlannerError, match="unknown processor group 'npu'"):
        model.predict(LAYER, "npu", 1)
    with pytest.raises(PlannerError, match="has 1 cores, not 2"):
        model.predict(LAYER, "gpu", 2)


@pytest.mark.parametrize("loss", ["relative", "absolute"])
def test_both_losses_recover_exact_coefficients(loss):
    model = PipeModel(GROUPS).fit(records(grid_layers()), loss=loss)
    for group, beta in BETA.items():
        np.testing.assert_allclose(model.fits[(group, "conv2d")].beta, beta, rtol=1e-6, atol=1e-15)
    for group, alpha in ALPHA.items():
        np.testing.assert_allclose(model.fits[(group, "conv2d")].alpha, alpha, rtol=1e-6)


def test_relative_fit_keeps_coefficients_non_negative_and_small_layers_right():
    # A latency law with a term Eq. 5 lacks (a per-row overhead ~ sqrt(N)): least squares in
    # ms trades the small layers' error for the large ones' and gives negative coefficients;
    # the relative fit keeps every coefficient >= 0 and predicts small layers better.
    layers = grid_layers()
    recs = []
    for layer in layers:
        n, k, m = layer.out_pixels, layer.filter_size, layer.out_maps
        t = 1.5e-9 * n * k * m + 0.02 * np.sqrt(n) + 0.01
        recs.append(PipeRecord(layer, "big", 1, t))
    groups = {"big": 1}
    relative = PipeModel(groups).fit(recs, loss="relative")
    absolute = PipeModel(groups).fit(recs, loss="absolute")
    assert min(relative.fits[("big", "conv2d")].beta) >= 0
    assert min(absolute.fits[("big", "conv2d")].beta) < 0

    def small_error(model: PipeModel) -> float:
        small = [r for r in recs if r.latency_ms < np.quantile([r.latency_ms for r in recs], 0.2)]
        return float(
            np.median([abs(model.predict(r.layer, "big") / r.latency_ms - 1) for r in small])
        )

    assert small_error(relative) < small_error(absolute)


def test_unknown_loss_is_refused():
    with pytest.raises(DatasetError, match="unknown loss 'l1'"):
        PipeModel(GROUPS).fit(records(grid_layers()[:20]), loss="l1")


def test_amdahl_table_fills_core_counts_through_two_anchors():
    # layers with a known serial and parallel part (one slower on more cores: p < 0), and a
    # one-core GPU group: the columns between the anchors are exact, the anchors kept as given
    serial = np.array([0.5, 0.1, 2.0])
    parallel = np.array([4.0, 0.9, -0.4])
    measured = {
        ("big", 1): serial + parallel,
        ("big", 4): serial + parallel / 4,
        ("gpu", 1): np.array([3.0, 1.0, 2.0]),
    }
    table = amdahl_table(measured, {"big": 4, "gpu": 1})
    assert sorted(table) == [("big", 1), ("big", 2), ("big", 3), ("big", 4), ("gpu", 1)]
    for h in (2, 3):
        np.testing.assert_allclose(table[("big", h)], serial + parallel / h, rtol=1e-12)
    np.testing.assert_array_equal(table[("big", 4)], measured[("big", 4)])
    np.testing.assert_array_equal(table[("gpu", 1)], measured[("gpu", 1)])


def test_amdahl_table_refuses_a_missing_anchor():
    with pytest.raises(PlannerError, match=r"group 'big': no measured latencies on 4 core"):
        amdahl_table({("big", 1): [1.0, 2.0]}, {"big": 4})
    with pytest.raises(PlannerError, match="different lengths"):
        amdahl_table({("big", 1): [1.0, 2.0], ("big", 2): [1.0]}, {"big": 2})


def two_regime_table(n_layers: int = 9, seed: int = 5) -> tuple[dict, dict]:
    """A time matrix whose layers follow Amdahl's law with one (serial, parallel) split on 1-4
    big cores and another on 4-8 (the two meet at 4: memory-bound past it), a one-core GPU."""
    rng = np.random.default_rng(seed)
    serial = rng.uniform(0.05, 0.5, n_layers)
    parallel = rng.uniform(1.0, 6.0, n_layers)
    at4 = serial + parallel / 4
    serial_hi = at4 * rng.uniform(0.4, 0.8, n_layers)  # more serial on 4-8 cores
    parallel_hi = (at4 - serial_hi) * 4
    table = {("gpu", 1): rng.uniform(0.3, 3.0, n_layers)}
    for h in range(1, 9):
        table[("big", h)] = serial + parallel / h if h <= 4 else serial_hi + parallel_hi / h
    for h in range(1, 5):
        table[("little", h)] = 3.0 * (serial + parallel / h)
    return table, {"gpu": 1, "big": 8, "little": 4}


def test_piecewise_amdahl_recovers_a_scaling_law_with_two_regimes():
    # through the anchors 1, 4 and 8 every column is exact; through 1 and 8 alone (amdahl_table)
    # the columns of the first regime are not
    truth, sizes = two_regime_table()
    anchors = {k: truth[k] for k in (("gpu", 1), ("big", 1), ("big", 4), ("big", 8))}
    anchors |= {k: truth[k] for k in (("little", 1), ("little", 4))}
    table = piecewise_amdahl_table(anchors, sizes)
    assert sorted(table) == sorted(truth)
    for k, v in truth.items():
        np.testing.assert_allclose(table[k], v, rtol=1e-12, err_msg=str(k))
    ends = {k: v for k, v in anchors.items() if k != ("big", 4)}
    two = amdahl_table(ends, sizes)
    assert np.max(np.abs(two[("big", 2)] / truth[("big", 2)] - 1)) > 0.05
    # with 1 and the group's size alone it is amdahl_table
    for k, v in piecewise_amdahl_table(ends, sizes).items():
        np.testing.assert_allclose(v, two[k], rtol=1e-12, err_msg=str(k))


def test_piecewise_amdahl_refuses_columns_outside_the_groups():
    cols = {("big", 1): [1.0], ("big", 2): [0.6]}
    with pytest.raises(PlannerError, match="measured column big:3 is not a core count"):
        piecewise_amdahl_table({**cols, ("big", 3): [0.5]}, {"big": 2})
    with pytest.raises(PlannerError, match="group 'little': no measured latencies on 1 core"):
        piecewise_amdahl_table(cols, {"big": 2, "little": 2})


def synthetic_groups():
    return parse_groups("gpu:0,big:1-8,little:9-12", range(13))


def on_demand(truth: dict, sizes: dict, gs) -> tuple:
    """:func:`on_demand_table` on ``truth`` with the planner's optimum as the choice, and the
    columns it measured."""
    asked = []

    def measure(g, c):
        asked.append((g, c))
        return truth[(g, c)]

    def used(table):
        plan = optimal_pipeline(table, gs, available=range(16))
        return [(s.group, s.core_count) for s in plan.stages]

    return on_demand_table(measure, sizes, used), asked


def test_on_demand_recovers_an_amdahl_law_table_from_its_anchors():
    # layers that follow Amdahl's law exactly: the two anchors per group predict every column,
    # so the choice on the predicted table is the measured optimum, and whatever columns it
    # asks for are measured once each
    rng = np.random.default_rng(2)
    serial, parallel = rng.uniform(0.05, 0.5, 10), rng.uniform(1.0, 6.0, 10)
    truth = {("gpu", 1): rng.uniform(0.5, 4.0, 10)}
    truth |= {("big", h): serial + parallel / h for h in range(1, 9)}
    truth |= {("little", h): 3.0 * (serial + parallel / h) for h in range(1, 5)}
    sizes = {"gpu": 1, "big": 8, "little": 4}
    gs = synthetic_groups()
    found, asked = on_demand(truth, sizes, gs)
    for k, v in truth.items():
        np.testing.assert_allclose(found.table[k], v, rtol=1e-9, err_msg=str(k))
    assert asked[:5] == [("gpu", 1), ("big", 1), ("big", 8), ("little", 1), ("little", 4)]
    assert len(asked) == len(set(asked)) == len(found.measured) < len(truth)
    chosen = optimal_pipeline(found.table, gs, available=range(16))
    best = optimal_pipeline(truth, gs, available=range(16))
    assert recost_plan(chosen, truth).bottleneck_ms == pytest.approx(best.bottleneck_ms)


def test_on_demand_measures_the_columns_amdahl_underestimates():
    # the two-regime table with big:2 and big:3 slower than the law (a column effect, as on
    # the device): amdahl's two anchors underestimate every big column between 1 and 8 and its
    # choice runs on them; on_demand measures what its choice runs on, so that choice's
    # predicted bottleneck is its measured one and no worse than amdahl's choice
    truth, sizes = two_regime_table(12, seed=7)
    for h in (2, 3):
        truth[("big", h)] = truth[("big", h)] * 1.3
    gs = synthetic_groups()
    found, _ = on_demand(truth, sizes, gs)
    assert len(found.measured) < len(truth)
    chosen = optimal_pipeline(found.table, gs, available=range(16))
    assert {(s.group, s.core_count) for s in chosen.stages} <= set(found.measured)
    costed = recost_plan(chosen, truth)
    assert costed.bottleneck_ms == pytest.approx(chosen.bottleneck_ms)
    anchors = {k: truth[k] for k in truth if k[1] in (1, sizes[k[0]])}
    by_amdahl = optimal_pipeline(amdahl_table(anchors, sizes), gs, available=range(16))
    best = optimal_pipeline(truth, gs, available=range(16)).bottleneck_ms
    assert recost_plan(by_amdahl, truth).bottleneck_ms > 1.04 * best
    assert costed.bottleneck_ms <= 1.01 * best


def test_on_demand_refuses_a_choice_outside_the_groups():
    truth = {("big", 1): [1.0, 2.0], ("big", 2): [0.6, 1.1]}
    with pytest.raises(PlannerError, match="runs on big:3, not a column of the groups"):
        on_demand_table(lambda g, c: truth[(g, c)], {"big": 2}, lambda table: [("big", 3)])


STORED_RUN = Path(__file__).parent / "data" / "pipe_tables_avx2.json"


def test_on_demand_choice_on_a_stored_table_is_the_measured_choice():
    # Inception v1 measured on the device (AVX2 run, 16 columns): planned as the benchmark
    # does (the optimum on the predicted table, costed on the measured one with the run's
    # hand-off, over the measured optimum), amdahl's choice streams 1.15x slower; on_demand's
    # is the measured choice (1.000, measured) from 8 of the 16 columns
    data = json.loads(STORED_RUN.read_text())
    gs = parse_groups(data["groups"], range(16))
    handoff = HandOff(data["handoff_ms_per_stage"])
    entry = data["models"]["inception_v1"]["table_ms"]
    truth = {(k.split(":")[0], int(k.split(":")[1])): np.asarray(v) for k, v in entry.items()}
    sizes = {g.name: g.most_stage_cores for g in gs}
    found, _ = on_demand(truth, sizes, gs)
    measured = LatencyTable(truth)
    best = optimal_pipeline(measured, gs, handoff=handoff, available=range(16)).bottleneck_ms

    def ratio(table) -> float:
        chosen = optimal_pipeline(table, gs, handoff=handoff, available=range(16))
        return recost_plan(chosen, measured, handoff=handoff).bottleneck_ms / best

    assert len(found.measured) <= 9
    assert ratio(found.table) <= 1.01
    anchors = {k: v for k, v in truth.items() if k[1] in (1, sizes[k[0]])}
    assert ratio(amdahl_table(anchors, sizes)) > 1.1
