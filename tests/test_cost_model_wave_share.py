"""The ``wave-share`` recipe of the GBDT (``GbdtConfig.wave(feature_set="dispatch-share")``,
``cost-model fit --recipe wave-share``): the part's share of its operator as a feature, its
column in the feature matrix, the file round trip and the CLI recipe.

Data is synthetic with a known answer: a conv's whole latency on each processor is linear in
its multiply-adds (the GPU three times as fast, plus a launch cost), and a part takes its
share of the whole, a little more for small shares (the fixed cost of a part).
"""

from __future__ import annotations

import numpy as np
import pytest

from codl_tvm.cost_model import (
    DispatchFeatures,
    OpParams,
    OpRecord,
    Partition,
    load_model,
    op_features,
    part_shape,
    save_dataset,
)
from codl_tvm.cost_model.gbdt import (
    FEATURE_SETS,
    SHARE_FEATURE_NAMES,
    GbdtConfig,
    GbdtModel,
    part_share,
)

CU = 2
MS_PER_MAC = {"cpu": 3e-6, "gpu": 1e-6}
LAUNCH_MS = {"cpu": 0.002, "gpu": 0.01}


def share_latency(params: OpParams, partition: Partition, processor: str) -> float:
    """The known answer: the whole operator's time times the part's share, plus a fixed
    cost of a part."""
    whole = part_shape(params, Partition(), processor)
    macs = whole.out_h * whole.out_w * whole.oc * params.ic * params.kernel**2
    share = part_share(op_features(params, processor, "direct", partition))
    return LAUNCH_MS[processor] + MS_PER_MAC[processor] * macs * (0.1 + 0.9 * share)


def share_records(rng: np.random.Generator, n_ops: int) -> list[OpRecord]:
    """Each operator whole on both processors and split along H and OC at a few shares."""
    out = []
    for i in range(n_ops):
        k = int(rng.choice([1, 3]))
        h = int(rng.integers(8, 40))
        params = OpParams(
            "conv2d", h, h, int(rng.integers(4, 64)), int(rng.integers(8, 96)), k, 1, k // 2
        )
        parts = [Partition("none", 0.0), Partition("none", 1.0)] + [
            Partition(dim, r) for dim in ("H", "OC") for r in (0.2, 0.4, 0.6, 0.8)
        ]
        for partition in parts:
            for proc in ("cpu", "gpu"):
                if partition.dim == "none" and (partition.ratio >= 1.0) != (proc == "gpu"):
                    continue
                if part_shape(params, partition, proc).empty:
                    continue
                out.append(
                    OpRecord(
                        params,
                        partition,
                        proc,
                        "direct",
                        share_latency(params, partition, proc),
                        3,
                        dispatch=DispatchFeatures(),
                        device={"gpu": "synthetic GPU", "compute_units": CU},
                        name=f"m{i % 3}/op_{i}",
                    )
                )
    return out


def test_part_share_by_hand():
    params = OpParams("conv2d", 20, 20, 8, 24, 3, 1, 1)
    assert part_share(op_features(params, "gpu", "direct", Partition("H", 0.4))) == 0.4
    assert part_share(op_features(params, "cpu", "direct", Partition("H", 0.4))) == 0.6
    assert part_share(op_features(params, "cpu", "direct", Partition("OC", 0.8))) == (
        pytest.approx(0.2)
    )
    # a whole operator is all of itself on either processor
    assert part_share(op_features(params, "gpu", "direct", Partition("none", 1.0))) == 1.0
    assert part_share(op_features(params, "cpu", "direct", Partition("none", 0.0))) == 1.0


def test_the_share_column_follows_the_dispatch_features():
    assert FEATURE_SETS["dispatch-share"] == FEATURE_SETS["dispatch"] + SHARE_FEATURE_NAMES
    config = GbdtConfig.wave(feature_set="dispatch-share", n_estimators=5)
    assert config.analytical_base == "wave" and config.max_depth == 5
    params = OpParams("conv2d", 20, 20, 8, 24, 3, 1, 1)
    feats = [
        op_features(params, proc, "direct", Partition(dim, 0.3))
        for proc in ("cpu", "gpu")
        for dim in ("H", "OC")
    ]
    shared = GbdtModel(config)._x(feats)
    plain = GbdtModel(GbdtConfig.wave(n_estimators=5))._x(feats)
    assert shared.shape == (4, len(FEATURE_SETS["dispatch-share"]))
    np.testing.assert_array_equal(shared[:, :-1], plain)
    np.testing.assert_allclose(shared[:, -1], [0.7, 0.7, 0.3, 0.3])


def test_fit_orders_an_operators_parts_by_share_and_round_trips(tmp_path):
    recs = share_records(np.random.default_rng(0), 60)
    model = GbdtModel(GbdtConfig.wave(feature_set="dispatch-share", n_estimators=60)).fit(recs)
    assert model.compute_units == CU
    assert set(model.boosters) == {("conv2d", "cpu", "direct"), ("conv2d", "gpu", "direct")}
    # an operator none of the records has: its parts rise with their share on each processor
    params = OpParams("conv2d", 28, 28, 32, 48, 3, 1, 1)
    for proc in ("cpu", "gpu"):
        feats = [
            op_features(params, proc, "direct", Partition("H", r)) for r in (0.2, 0.4, 0.6, 0.8)
        ]
        pred = model.predict_many(feats)
        assert (np.diff(pred) > 0).all() if proc == "gpu" else (np.diff(pred) < 0).all()
    # within 25% of the known answer on the training records
    measured = np.array([r.latency_ms for r in recs])
    predicted = model.predict_many([r.features() for r in recs])
    assert np.median(np.abs(predicted / measured - 1)) < 0.25
    model.save(tmp_path / "m.json")
    back = load_model(tmp_path / "m.json")
    assert back.config == GbdtConfig.wave(feature_set="dispatch-share", n_estimators=60)
    assert back.feature_names[-1] == "share"
    np.testing.assert_array_equal(back.predict_many([r.features() for r in recs]), predicted)


def test_cli_fit_with_the_wave_share_recipe(tmp_path, capsys):
    from tests.test_cost_model import run_cli

    data = tmp_path / "d.jsonl"
    save_dataset(share_records(np.random.default_rng(1), 20), data)
    out = tmp_path / "m.json"
    argv = ["cost-model", "fit", str(data), "-o", str(out), "--kind", "gbdt", "--holdout", "0"]
    assert run_cli([*argv, "--recipe", "wave-share", "--trees", "20"]) == 0
    model = load_model(out)
    assert model.config == GbdtConfig.wave(feature_set="dispatch-share", n_estimators=20)
    capsys.readouterr()
