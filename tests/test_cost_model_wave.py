"""The dispatch-shape recipe of the GBDT (``GbdtConfig.wave``): the wave base, the dispatch-shape
features, their file round trip, and the dispatch-shape slices of ``cost-model eval``.

Data is synthetic with a known answer: GPU latency quantised in waves of work-items over the
device's compute units (``THREADS_PER_CU`` work-items each), the serial chain of the busiest
work-item in each wave, plus a launch cost.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from codl_tvm.core.errors import ModelFileError
from codl_tvm.cost_model import (
    DispatchFeatures,
    FlopsModel,
    OpParams,
    OpRecord,
    Partition,
    load_model,
    op_features,
    part_shape,
)
from codl_tvm.cost_model.assessment import (
    WAVE_BANDS,
    assess,
    dispatch_labels,
    format_assessment,
    slice_labels,
)
from codl_tvm.cost_model.dispatch_shape import (
    SHAPE_FEATURE_NAMES,
    THREADS_PER_CU,
    dispatch_shape,
    shape_features,
)
from codl_tvm.cost_model.evaluate import accuracy
from codl_tvm.cost_model.gbdt import FEATURE_NAMES, GbdtConfig, GbdtModel, WaveBase
from codl_tvm.cost_model.tiling_features import (
    DIRECT_TILINGS,
    GUARD_FEATURE_NAMES,
    conv_guards,
    direct_tile,
)

CU = 2  # compute units of the synthetic GPU: a wave is 4096 work-items
LAUNCH_MS = 0.004
MS_PER_MAC = 2e-6


def wave_latency(params: OpParams, partition: Partition, disp: DispatchFeatures) -> float:
    """The known answer: launch + the busiest work-item's multiply-adds in each wave."""
    q = part_shape(params, partition, "gpu")
    out = q.out_h * q.out_w * q.oc
    items = disp.wg_size * disp.wg_count
    chain = math.ceil(out / items) * q.ic * params.kernel**2
    return LAUNCH_MS + MS_PER_MAC * chain * math.ceil(items / (CU * THREADS_PER_CU))


def wave_records(rng, n: int, models: tuple[str, ...] = ()) -> list[OpRecord]:
    out = []
    while len(out) < n:
        k = int(rng.choice([1, 3]))
        h = int(rng.integers(4, 48))
        params = OpParams(
            "conv2d", h, h, int(rng.integers(4, 64)), int(rng.integers(4, 96)), k, 1, k // 2
        )
        partition = Partition(str(rng.choice(["none", "H", "OC"])), float(rng.uniform(0.2, 0.9)))
        if partition.dim == "none":
            partition = Partition()
        q = part_shape(params, partition, "gpu")
        if q.empty:
            continue
        wg = int(rng.choice([32, 64, 128, 256]))
        tile = int(rng.choice([1, 2, 4]))
        disp = DispatchFeatures(
            wg_size=wg, wg_count=max(1, -(-q.out_h * q.out_w * q.oc // (wg * tile)))
        )
        name = f"{models[len(out) % len(models)]}/op_{len(out)}" if models else None
        out.append(
            OpRecord(
                params,
                partition,
                "gpu",
                "direct",
                wave_latency(params, partition, disp),
                3,
                dispatch=disp,
                device={"gpu": "synthetic GPU", "compute_units": CU},
                name=name,
            )
        )
    return out


def test_dispatch_shape_and_features_by_hand():
    params = OpParams("conv2d", 20, 20, 8, 24, 3, 1, 1, groups=2)
    f = op_features(params, "gpu", "direct", Partition("H", 0.5), DispatchFeatures(16, 25))
    s = dispatch_shape(f, 4)
    # 10 x 20 x 24 outputs, K = 4 x 9; 400 work-items on 4 x 2048 slots: 0.05 waves
    assert (s.outputs, s.reduction, s.units, s.slots) == (4800, 36, 400, 4 * THREADS_PER_CU)
    assert s.per_unit_macs == 12 * 36 and s.waves == pytest.approx(400 / 8192)
    feats = dict(zip(SHAPE_FEATURE_NAMES, shape_features(f, 4), strict=True))
    assert feats["tz_oc"] == 3 and feats["tz_out_h"] == 1 and feats["tz_out_w"] == 2
    assert feats["oc_mod16"] == 8 and feats["out_w_odd"] == 0
    assert feats["waves_ceil"] == 1 and feats["wave_tail"] == pytest.approx(400 / 8192)
    assert feats["wg_per_cu"] == 25 / 4 and feats["outputs_per_item_ceil"] == 12
    assert feats["weight_bytes"] == 4 * 24 * 4 * 9 and feats["out_bytes"] == 4 * 4800
    # a part nobody built: no dispatch-shape features, a unit per output up to one wave
    blind = op_features(params, "gpu", "direct", Partition("H", 0.5))
    values = dict(zip(SHAPE_FEATURE_NAMES, shape_features(blind, 4), strict=True))
    assert math.isnan(values["waves"]) and math.isnan(values["wg_per_cu"])
    assert dispatch_shape(blind, 4).units == 4800
    cpu = op_features(
        params, "cpu", "direct", dispatch=DispatchFeatures(cpu_parallel_blocks=7, threads=4)
    )
    assert dispatch_shape(cpu, 4).slots == 4 and dispatch_shape(cpu, 4).units == 7


def test_wave_base_recovers_a_wave_quantised_latency():
    """The wave term is the known answer: NNLS finds its coefficients exactly, and predicts
    parts of more waves than any training part; the FLOPs line cannot follow the steps."""
    rng = np.random.default_rng(1)
    recs = wave_records(rng, 300)
    waves = [
        math.ceil(r.dispatch.wg_size * r.dispatch.wg_count / (CU * THREADS_PER_CU)) for r in recs
    ]
    train = [r for r, w in zip(recs, waves, strict=True) if w <= 2]
    far = [r for r, w in zip(recs, waves, strict=True) if w > 2]
    assert len(train) > 50 and len(far) > 5
    base = WaveBase.fit(train, CU)
    coef = base.coef[("conv2d", "gpu", "direct")]
    assert coef[0] == pytest.approx(LAUNCH_MS, rel=1e-6)
    assert coef[1] == pytest.approx(MS_PER_MAC, rel=1e-6)
    meas = [r.latency_ms for r in far]
    pred = base.predict_many([r.features() for r in far])
    assert accuracy(pred, meas).mape < 1e-4
    flops = FlopsModel().fit(train)
    assert accuracy(flops.predict_many([r.features() for r in far]), meas).mape > 10.0
    assert WaveBase.from_json(json.loads(json.dumps(base.to_json()))).coef == base.coef


def test_wave_recipe_fits_saves_and_reloads(tmp_path):
    rng = np.random.default_rng(2)
    recs = wave_records(rng, 240)
    train, test = recs[:180], recs[180:]
    model = GbdtModel(GbdtConfig.wave(n_estimators=40)).fit(train)
    assert model.compute_units == CU and isinstance(model.base, WaveBase)
    feats = [r.features() for r in test]
    meas = [r.latency_ms for r in test]
    acc = accuracy(model.predict_many(feats), meas)
    assert acc.acc10 >= 0.95, acc
    path = tmp_path / "wave.json"
    model.save(path)
    back = load_model(path)
    assert back.config == model.config and back.compute_units == CU
    np.testing.assert_array_equal(back.predict_many(feats), model.predict_many(feats))
    body = json.loads(path.read_text())["model"]
    assert body["features"] == list(FEATURE_NAMES + SHAPE_FEATURE_NAMES)
    # a planner part without dispatch features is still predicted (trained blind too)
    blind = [dataclasses.replace(f, dispatch=DispatchFeatures()) for f in feats]
    assert np.all(np.isfinite(model.predict_many(blind)))


def test_files_of_the_codl_recipe_still_load(tmp_path):
    """A file without ``feature_set`` is the original recipe (v1 features)."""
    rng = np.random.default_rng(3)
    model = GbdtModel(GbdtConfig(n_estimators=5, analytical_base="none")).fit(wave_records(rng, 60))
    obj = model.to_json()
    del obj["model"]["config"]["feature_set"], obj["model"]["config"]["compute_units"]
    del obj["model"]["compute_units"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(obj))
    assert load_model(path).config.feature_set == "v1"
    obj["model"]["config"]["feature_set"] = "dispatch"  # names no longer match the set
    path.write_text(json.dumps(obj))
    with pytest.raises(ModelFileError, match="feature names differ"):
        load_model(path)
    obj["model"]["config"]["feature_set"] = "tiles"
    path.write_text(json.dumps(obj))
    with pytest.raises(ModelFileError, match="feature_set 'tiles'"):
        load_model(path)


def test_dispatch_slices_in_the_assessment():
    rng = np.random.default_rng(4)
    recs = wave_records(rng, 150, ("mA", "mB", "mC"))
    r = recs[0]
    per_cu = r.dispatch.wg_count / CU
    wave = next(lab for lab, lo, hi in WAVE_BANDS if lo <= per_cu < hi)
    assert dispatch_labels(r)[0] == f"gpu {wave}"
    assert slice_labels(r)[3:5] == dispatch_labels(r)
    assert slice_labels(r)[-1] == "conv2d/gpu/direct"
    assert dispatch_labels(dataclasses.replace(r, dispatch=DispatchFeatures())) == []
    model = GbdtModel(GbdtConfig.wave(n_estimators=20))
    model.fit(recs)
    a = assess(model, recs, "synthetic")
    shapes = {k for k in a.random if k.startswith("gpu wg")}
    assert shapes and all(a.random[k].n > 0 for k in shapes)
    assert sum(a.random[k].n for k in shapes if "/CU" in k) == a.random["gpu"].n
    assert "conv2d/gpu/direct" in a.lomo and "gpu <0.1ms" in a.random
    text = format_assessment(a)
    assert "gpu wg/CU" in text and "gpu wg" in text
    # the rows keep their order: processor, latency bands, dispatch shapes, implementations
    keys = list(a.random)
    assert (
        keys.index("gpu")
        < keys.index(next(iter(shapes & set(keys))))
        < keys.index("conv2d/gpu/direct")
    )


def test_cli_fit_with_the_wave_recipe(tmp_path, capsys):
    from codl_tvm.cost_model import save_dataset
    from tests.test_cost_model import run_cli

    data = tmp_path / "d.jsonl"
    save_dataset(wave_records(np.random.default_rng(5), 80), data)
    out = tmp_path / "m.json"
    argv = ["cost-model", "fit", str(data), "-o", str(out), "--kind", "gbdt"]
    assert run_cli([*argv, "--recipe", "wave", "--trees", "30"]) == 0
    model = load_model(out)
    assert model.config == GbdtConfig.wave(n_estimators=30) and model.compute_units == CU
    assert run_cli([*argv, "--recipe", "wave-guards", "--trees", "30"]) == 0
    guarded = load_model(out)
    assert guarded.config == GbdtConfig.wave(n_estimators=30, feature_set="guards")
    assert guarded.base.guards
    assert run_cli(argv) == 0  # the default recipe is unchanged
    assert load_model(out).config == GbdtConfig()
    capsys.readouterr()


# SqueezeNet's conv2d_25 (13x13, 512 -> 64, 1x1) on the H100: the direct-conv rule's tile is 4
# channels x 2 rows x 13 columns (104 work-items); the generated OpenCL guards the channels of
# a 13-channel part and the rows of any odd row count.
SQUEEZE_25 = OpParams("conv2d", 13, 13, 512, 64, 1, 1, 0)


def _guards(partition: Partition, wg_count: int, wg_size: int = 104) -> list[float]:
    f = op_features(SQUEEZE_25, "gpu", "direct", partition, DispatchFeatures(wg_size, wg_count))
    return conv_guards(f)


def test_conv_guards_of_squeezenet_conv2d_25():
    assert GUARD_FEATURE_NAMES == ("guard_oc", "guard_oh", "guard_ow", "guard_oh_not_oc")
    # 13 channels: channels and rows guarded (19 us on the H100)
    assert _guards(Partition("OC", 0.2), 28) == [1.0, 1.0, 0.0, 0.0]
    # 32 channels: rows alone (33 us)
    assert _guards(Partition("OC", 0.5), 56) == [0.0, 1.0, 0.0, 1.0]
    # 3 rows: rows alone (32 us); 4 rows: no guard (21 us)
    assert _guards(Partition("H", 0.2), 32) == [0.0, 1.0, 0.0, 1.0]
    assert _guards(Partition("H", 0.3), 32) == [0.0, 0.0, 0.0, 0.0]
    # a launch no setting of the rule makes, a pool, a part never built: unknown
    assert all(math.isnan(v) for v in _guards(Partition("OC", 0.2), 29))
    pool = op_features(
        OpParams("pool", 13, 13, 64, 64, 3, 2, 0),
        "gpu",
        "default",
        dispatch=DispatchFeatures(64, 9),
    )
    assert all(math.isnan(v) for v in conv_guards(pool))
    blind = op_features(SQUEEZE_25, "gpu", "direct", Partition("OC", 0.2))
    assert all(math.isnan(v) for v in conv_guards(blind))


def test_conv_guards_follow_the_nvidia_direct_rule():
    """The rule's arithmetic in ``conv_guards`` reproduces the work-groups the NVIDIA preset's
    direct-conv schedule records for fresh builds (the preset's current setting is one of
    ``DIRECT_TILINGS``)."""
    import tvm
    from tvm import tirx

    from codl_tvm.build.pipeline import legalize_passes, schedule_passes
    from codl_tvm.build.targets import get_preset
    from codl_tvm.cost_model.dispatch import dispatch_features
    from codl_tvm.cost_model.part_ir import part_module

    target = tvm.target.Target(get_preset("device-h100").target("gpu"))
    for params, partition in [
        (SQUEEZE_25, Partition("OC", 0.2)),
        (SQUEEZE_25, Partition("H", 0.2)),
        (OpParams("conv2d", 28, 28, 64, 96, 3, 1, 1), Partition("OC", 0.3)),
    ]:
        mod = part_module(params, part_shape(params, partition, "gpu"))
        with target:
            mod = tvm.transform.Sequential(legalize_passes(target) + schedule_passes(target))(mod)
        funcs = [f for _, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]
        f = op_features(params, "gpu", "direct", partition, dispatch_features(funcs))
        assert not any(math.isnan(v) for v in conv_guards(f)), (params, partition, f.dispatch)


def guard_records(rng, n: int) -> list[OpRecord]:
    """Direct-conv parts whose latency is the wave term, 1.6x its chain where only the rows
    are bounds-checked (the H100's pattern)."""
    out = []
    while len(out) < n:
        params = OpParams(
            "conv2d", int(rng.integers(5, 30)), int(rng.integers(5, 30)), 2048, 64, 1, 1, 0
        )
        partition = Partition(str(rng.choice(["H", "OC"])), float(rng.uniform(0.2, 0.9)))
        q = part_shape(params, partition, "gpu")
        if q.empty:
            continue
        blind = op_features(params, "gpu", "direct", partition)
        *_, size, count = direct_tile(blind, DIRECT_TILINGS[0])
        disp = DispatchFeatures(size, count)
        f = op_features(params, "gpu", "direct", partition, disp)
        latency = wave_latency(params, partition, disp)
        if conv_guards(f)[3] == 1.0:
            latency += 0.6 * (latency - LAUNCH_MS)
        out.append(
            OpRecord(
                params,
                partition,
                "gpu",
                "direct",
                latency,
                3,
                dispatch=disp,
                device={"gpu": "synthetic GPU", "compute_units": CU},
            )
        )
    return out


def test_wave_base_prices_the_row_guard():
    rng = np.random.default_rng(5)
    recs = guard_records(rng, 120)
    row_only = [conv_guards(r.features())[3] for r in recs]
    assert 10 < sum(row_only) < 110  # both kinds of kernel in the data
    base = WaveBase.fit(recs, CU, guards=True)
    coef = base.coef[("conv2d", "gpu", "direct")]
    assert coef[1] == pytest.approx(MS_PER_MAC, rel=1e-6)
    assert coef[4] == pytest.approx(0.6 * MS_PER_MAC, rel=1e-6)
    meas = [r.latency_ms for r in recs]
    assert accuracy(base.predict_many([r.features() for r in recs]), meas).mape < 1e-4
    # without the term the same data is missed by a tenth on average
    plain = WaveBase.fit(recs, CU)
    assert accuracy(plain.predict_many([r.features() for r in recs]), meas).mape > 10.0
    back = WaveBase.from_json(json.loads(json.dumps(base.to_json())))
    assert back.guards and back.coef == base.coef
    # a file written before the term: four coefficients, no guards
    old = plain.to_json()
    del old["guards"]
    assert not WaveBase.from_json(old).guards
    with pytest.raises(ValueError, match="wave base coefficients"):
        WaveBase.from_json({**base.to_json(), "guards": False})
    model = GbdtModel(GbdtConfig.wave(n_estimators=10, feature_set="guards")).fit(recs)
    assert model.base.guards
    assert model.feature_names[-len(GUARD_FEATURE_NAMES) :] == GUARD_FEATURE_NAMES
