"""The image conversions of CoDL's hybrid data type in the cost model and the planner.

A GPU part on images packs its input into an image and unpacks its output
(:class:`~codl_tvm.passes.texture_parts.PackGpuParts`): the cost model predicts them as the
sharing kinds ``image_pack`` / ``image_unpack`` (linear in bytes, measured by ``codl-tvm
profile --data-type``), and the planner charges them to the GPU parts where
``PlannerConfig.images`` is on. Cost models are synthetic (nothing is measured) except in the
last test, which runs the profile on the local OpenCL device and checks the record's structure
only (no timing is asserted).
"""

from __future__ import annotations

import copy
import json
from itertools import pairwise
from pathlib import Path

import pytest

from codl_tvm.cli import bundled_model_path
from codl_tvm.core.errors import PlannerError
from codl_tvm.core.plan import PartitionDim, partitionable_ops
from codl_tvm.cost_model.base import (
    GPU_DATA_TYPE_META,
    IMAGE_SHARING_KINDS,
    SharingModel,
)
from codl_tvm.cost_model.synthetic import SyntheticDevice, synthetic_cost_model
from codl_tvm.planner import PlannerConfig, chain_parts, plan_model
from codl_tvm.planner.split.codl import SplitPlanner
from codl_tvm.planner.split.predict import image_conversion_model, on_images
from codl_tvm.profiling.data_type import DataTypeRecord, operators_named, profile_data_type
from codl_tvm.profiling.image_conversion import ConversionTiming
from codl_tvm.runtime.images import PIXEL_CHANNELS

PACK, UNPACK = IMAGE_SHARING_KINDS


@pytest.fixture(scope="module")
def mod():
    from codl_tvm.frontend.importer import load_onnx

    return load_onnx(bundled_model_path()).mod


@pytest.fixture(scope="module")
def base_model():
    return synthetic_cost_model(SyntheticDevice())


def _with_conversion(model, intercept_ms: float, ms_per_byte: float = 0.0, in_meta: bool = False):
    """A copy of ``model`` whose image conversions cost ``intercept + slope * bytes`` each way:
    in its sharing model, or (``in_meta``) only in a data-type record of its ``meta``."""
    fit = {"intercept_ms": intercept_ms, "ms_per_byte": ms_per_byte, "n": 3}
    out = copy.copy(model)
    out.meta = dict(model.meta)
    if in_meta:
        out.meta[GPU_DATA_TYPE_META] = {
            "data_type": "image",
            "conversion": {"pack": fit, "unpack": fit},
        }
    else:
        out.sharing = model.sharing.with_conversion({"pack": fit, "unpack": fit})
    return out


def _split_convs(plan, mod) -> set[str]:
    """The convs ``plan`` splits, alone or in a chain."""
    convs = {i.name for i in partitionable_ops(mod) if i.kind == "conv2d"}
    split = {o.op for o in plan.ops if 0.0 < o.ratio < 1.0}
    split |= {name for c in plan.chains for name in c.ops}
    return split & convs


# -- the sharing model --------------------------------------------------------------------------


def test_sharing_model_fits_predicts_and_round_trips_the_conversions():
    samples = {PACK: [(1000, 0.2), (2000, 0.3), (4000, 0.5)], UNPACK: [(1000, 0.1)]}
    model = SharingModel.fit_samples(samples)
    assert model.predict(PACK, 3000) == pytest.approx(0.4)
    assert model.linear[PACK].n == 3 and model.linear[PACK].ms_per_byte >= 0
    assert model.predict(UNPACK, 10**6) == pytest.approx(0.1)  # one sample: a constant
    assert model.predict("transform", 1000) == 0.0  # not measured: 0, as other kinds
    again = SharingModel.from_json(json.loads(json.dumps(model.to_json())))
    assert again.to_json() == model.to_json()
    assert again.predict(PACK, 3000) == model.predict(PACK, 3000)
    # never negative: a falling line is clipped to a constant
    falling = SharingModel.fit_samples({PACK: [(1000, 0.5), (2000, 0.3)]})
    assert falling.linear[PACK].ms_per_byte == 0.0 and falling.linear[PACK].intercept_ms > 0
    with pytest.raises(ValueError, match="linear sharing kind"):
        SharingModel.fit_samples({"presync": [(1, 0.1)]})
    with pytest.raises(ValueError, match="not one of"):
        model.predict("image_copy", 1)


def test_with_conversion_adds_the_record_fits_and_keeps_the_rest():
    base = SharingModel.fit_samples({"transform": [(10, 1.0), (20, 2.0)]})
    fit = {"intercept_ms": 0.01, "ms_per_byte": 1e-6, "n": 4}
    model = base.with_conversion({"pack": fit, "samples": []})  # other keys ignored
    assert model.predict(PACK, 1e6) == pytest.approx(1.01)
    assert model.predict(UNPACK, 1e6) == 0.0
    assert model.predict("transform", 10) == base.predict("transform", 10)
    assert PACK not in base.linear  # a copy
    with pytest.raises(ValueError, match="finite number"):
        base.with_conversion({"pack": {**fit, "intercept_ms": float("nan")}})


def test_conversion_timing_fits_each_direction():
    timing = ConversionTiming(((65536, 0.05, 0.03), (524288, 0.4, 0.2), (2097152, 1.6, 0.8)))
    obj = timing.to_json()
    assert set(obj) == {"pack", "unpack", "samples"}
    for direction in ("pack", "unpack"):
        assert obj[direction]["n"] == 3
        assert obj[direction]["intercept_ms"] >= 0 and obj[direction]["ms_per_byte"] > 0
    assert ConversionTiming.from_json(json.loads(json.dumps(obj))) == timing
    predicted = SharingModel().with_conversion(obj).predict(PACK, 524288)
    assert predicted == pytest.approx(0.4, rel=0.1)


# -- the planner --------------------------------------------------------------------------------


def test_buffers_plans_ignore_the_conversions(mod, base_model):
    """Images off (the default, gpu_channels 1): the plan and its report are the same bytes
    with or without conversions in the cost model, its sharing or its profile."""
    plan, report = plan_model(mod, base_model)
    assert _split_convs(plan, mod), "the synthetic device splits some convs"
    for costly in (
        _with_conversion(base_model, 100.0),
        _with_conversion(base_model, 100.0, in_meta=True),
    ):
        plan2, report2 = plan_model(mod, costly)
        assert plan2.to_json() == plan.to_json()
        assert report2.to_json() == report.to_json()
    assert all("conversion_ms" not in d.to_dict() for d in report.decisions)
    assert not PlannerConfig().images and PlannerConfig(gpu_channels=4).images
    assert not PlannerConfig(gpu_channels=4, gpu_images=False).images
    with pytest.raises(PlannerError, match="gpu_images"):
        PlannerConfig(gpu_images="yes")


def test_zero_conversion_cost_plans_as_today(mod, base_model):
    plan, report = plan_model(mod, base_model)
    images = PlannerConfig(gpu_images=True)
    for free in (base_model, _with_conversion(base_model, 0.0)):
        plan2, report2 = plan_model(mod, free, config=images)
        assert plan2.to_json() == plan.to_json()
        assert [d.reason for d in report2.decisions] == [d.reason for d in report.decisions]
        assert [d.coexec_ms for d in report2.decisions] == [d.coexec_ms for d in report.decisions]
    assert any("predicted 0 ms" in n for n in plan_model(mod, base_model, config=images)[1].notes)


def test_costly_conversions_leave_no_split_paying_them(mod, base_model):
    """Conversions dearer than any split's gain: no conv split pays them. The convs split
    before run whole or split by channels with a GPU part short of whole pixels (which stays
    in buffers, converting nothing), and the plan is predicted slower than without."""
    plan, _ = plan_model(mod, base_model)
    before = _split_convs(plan, mod)
    assert before, "some conv split without conversions"
    costly = _with_conversion(base_model, 5.0)
    plan2, report2 = plan_model(mod, costly, config=PlannerConfig(gpu_images=True))
    decided = [d for d in report2.decisions if d.ops[0] in before]
    assert decided
    for d in decided:
        if 0.0 < d.ratio < 1.0:
            assert d.dim == "OC" and d.conversion_ms == 0.0, d
    assert report2.summary.predicted_ms > plan_model(mod, base_model)[1].summary.predicted_ms
    # without the whole-pixel rule's way out (H splits only) every one of them runs whole
    h_only = PlannerConfig(gpu_images=True, dims=("H",))
    plan_h, report_h = plan_model(mod, costly, config=h_only)
    assert not _split_convs(plan_h, mod)
    whole = [d for d in report_h.decisions if d.ops[0] in before]
    assert all("of it image conversions" in d.reason for d in whole), [d.reason for d in whole]
    # the same cost read from the profile's record in the cost model's meta
    in_meta = _with_conversion(base_model, 5.0, in_meta=True)
    plan3, report3 = plan_model(mod, in_meta, config=PlannerConfig(gpu_images=True))
    assert plan3.to_json() == plan2.to_json()
    assert any("profiled with --data-type" in n for n in report3.notes)


def test_a_split_reports_its_conversions_in_its_sharing(mod, base_model):
    """A small conversion cost keeps the splits and shows in their sharing cost."""
    cheap = _with_conversion(base_model, 1e-4, 1e-12)
    _, report = plan_model(mod, cheap, config=PlannerConfig(gpu_images=True, chains=False))
    split = [d for d in report.decisions if d.sharing_ms is not None and d.conversion_ms]
    assert split, "a conv split on images pays its conversions"
    for d in split:
        assert 0 < d.conversion_ms <= d.sharing_ms
        assert d.to_dict()["conversion_ms"] == d.conversion_ms
        assert "of it image conversions" in d.reason


def test_a_chain_converts_at_its_ends_only(mod, base_model):
    """Conversions linear in bytes: a chain of two convs packs its first conv's GPU input and
    unpacks its last's output, less than the two convs split one by one."""
    slope = 1e-6
    model = _with_conversion(base_model, 0.0, slope)
    planner = SplitPlanner(mod, model, PlannerConfig(gpu_images=True), "codl")
    ops = [o for o in planner.ops if o.params is not None]
    pair = next(
        (a, b)
        for a, b in pairwise(ops)
        if on_images(a.params) and on_images(b.params) and b.info.index == a.info.index + 1
    )
    chain = planner.pred.chain(list(pair), "H", 0.5)
    parts = chain_parts([o.info for o in pair], [o.params for o in pair], PartitionDim.H, 0.5)
    first, last = parts.gpu[0], parts.gpu[-1]
    nbytes = 4 * (first.in_h * first.in_w * first.ic + last.out_h * last.out_w * last.oc)
    assert chain.conversion_ms == pytest.approx(slope * nbytes)
    one_by_one = sum(planner.pred.split(o, "H", 0.5).conversion_ms for o in pair)
    assert chain.conversion_ms < one_by_one
    assert chain.sharing_ms >= chain.conversion_ms


def test_an_oc_part_short_of_whole_pixels_converts_nothing(mod, base_model):
    """PackGpuParts leaves an OC part whose channels are not a multiple of 4 in buffers: the
    planner charges it no conversion, and a whole-pixel OC part its pack and unpack."""
    model = _with_conversion(base_model, 0.5)
    planner = SplitPlanner(mod, model, PlannerConfig(gpu_images=True), "codl")
    conv = next(o for o in planner.ops if o.params is not None and on_images(o.params))
    oc = conv.params.oc
    assert oc % PIXEL_CHANNELS == 0 and oc > PIXEL_CHANNELS
    whole = planner.pred.split(conv, "OC", PIXEL_CHANNELS / oc)
    short = planner.pred.split(conv, "OC", (PIXEL_CHANNELS + 1) / oc)
    assert whole.conversion_ms == pytest.approx(1.0)  # 0.5 ms each way
    assert short.conversion_ms == 0.0


def test_a_malformed_conversion_record_is_a_planner_error(base_model):
    broken = copy.copy(base_model)
    broken.meta = {GPU_DATA_TYPE_META: {"conversion": {"pack": {"intercept_ms": "x"}}}}
    with pytest.raises(PlannerError, match="conversion is malformed"):
        image_conversion_model(broken)


# -- the profile --------------------------------------------------------------------------------


@pytest.mark.opencl
def test_profile_records_the_conversion_fit(opencl, tmp_path: Path):
    sizes = [(4, 16, 16), (8, 32, 32), (16, 32, 32)]
    record = profile_data_type(
        operators_named(["conv1x1"]), rounds=2, work_dir=tmp_path, conversion_sizes=sizes
    )
    if record.ratio is None:  # a device without images: nothing built, nothing converted
        assert record.conversion is None
        return
    obj = record.to_json()["conversion"]
    assert set(obj) == {"pack", "unpack", "samples"}
    for direction in ("pack", "unpack"):
        fit = obj[direction]
        assert set(fit) == {"intercept_ms", "ms_per_byte", "n"}
        assert fit["n"] == len(sizes)
        assert fit["intercept_ms"] >= 0 and fit["ms_per_byte"] >= 0
    assert [s["nbytes"] for s in obj["samples"]] == [4 * c * h * w for c, h, w in sizes]
    assert all(s["pack_ms"] > 0 and s["unpack_ms"] > 0 for s in obj["samples"])
    assert DataTypeRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    # none asked: none recorded
    quiet = profile_data_type(operators_named(["conv1x1"]), 1, conversion_sizes=())
    assert quiet.conversion is None and "conversion" not in quiet.to_json()
