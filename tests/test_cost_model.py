"""Cost models: features, dataset files, CoDL's Eq. 3 fit, GBDT, FLOPs baseline, evaluation.

Data is synthetic and generated here from known functions (Eq. 3 with Table 1's work sizes written
out independently of the package, FLOPs counted by brute force), so the tests check that fitting
recovers the generating coefficients, not how accurate a model is on real hardware.
"""

from __future__ import annotations

import argparse
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from codl_tvm.cli.cost_model import register as register_cli
from codl_tvm.core.errors import CodlError
from codl_tvm.cost_model import (
    CodlConfig,
    CodlModel,
    CostModel,
    CostModelFallbackWarning,
    DatasetError,
    DatasetWriter,
    DispatchFeatures,
    FeatureError,
    FlopsModel,
    ModelFileError,
    OpParams,
    OpRecord,
    Partition,
    PartShape,
    ProcessorBlocking,
    SharingModel,
    SharingRecord,
    load_dataset,
    load_model,
    op_features,
    part_shape,
    save_dataset,
)
from codl_tvm.cost_model.evaluate import (
    accuracy,
    evaluate,
    split_records,
)
from codl_tvm.cost_model.fitted_device import merge_devices, record_devices
from codl_tvm.cost_model.linalg import nnls

DEVICE = {"gpu": "synthetic gpu", "cpu": "synthetic cpu"}
CFG = CodlConfig(
    cpu=ProcessorBlocking(4, 64, 8), gpu=ProcessorBlocking(8, 256, 64), winograd_tile=2
)


# ---------------------------------------------------------------------------------------------
# Independent references.


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def rows_read(params: OpParams, rows: range) -> int:
    """Input rows a direct convolution reads for output ``rows`` (brute force)."""
    read = set()
    for r in rows:
        for i in range(params.kernel):
            x = r * params.stride - params.padding[0] + i * params.dilation
            if 0 <= x < params.h:
                read.add(x)
    return len(read)


def brute_flops(op: str, oh: int, ow: int, oc: int, ic: int, groups: int, k: int) -> int:
    """Count multiply-adds (x2) / window elements by enumerating them."""
    count = 0
    for _ in range(oh * ow * oc):
        per_out = k * k if op == "pool" else (ic // groups) * k * k
        count += per_out
    return count if op == "pool" else 2 * count


def eq3(size: int, blk: ProcessorBlocking) -> int:
    return cdiv(size, blk.block_size * blk.cores) * cdiv(blk.block_size, blk.unit_size)


def true_latency(params, part, processor, impl, coefs, dispatch=None) -> float:
    """Eq. 3 with Table 1's sizes, written out here; ``coefs[kernel]`` over (1,H,W,IC,OC,K)."""
    oh, ow, ic, oc, g, f = part.out_h, part.out_w, part.ic, part.oc, part.groups, params.kernel
    u = np.array([1.0, oh, ow, ic, oc, (ic // g) * f * f])
    blk = CFG.gpu if processor == "gpu" else CFG.cpu
    if impl == "direct":
        steps = {"direct": eq3(oh * ow * oc, blk)}
        main, main_size = "direct", oh * ow * oc
    elif impl == "gemm":
        steps = {
            "packing": eq3(oh * ow * ic * f * f, blk),
            "mm": eq3(oh * ow * (ic // g) * oc * f * f, blk),
        }
        main, main_size = "mm", oh * ow * (ic // g) * oc * f * f
    else:
        m = CFG.winograd_tile
        a = m + f - 1
        psi = cdiv(oh, m) * cdiv(ow, m)
        steps = {
            "input_transform": eq3(ic * psi * a * a, blk),
            "gemm": a * a * eq3(psi * ic * oc, blk),
            "output_transform": eq3(oc * psi * m * m, blk),
        }
        main, main_size = "gemm", psi * ic * oc
    if dispatch is not None and processor == "gpu" and dispatch.wg_count:
        steps[main] = cdiv(dispatch.wg_count, blk.cores) * cdiv(dispatch.wg_size, blk.unit_size)
    if dispatch is not None and processor == "cpu" and dispatch.cpu_parallel_blocks:
        b = dispatch.cpu_parallel_blocks
        steps[main] = cdiv(b, dispatch.threads) * cdiv(cdiv(main_size, b), dispatch.vector_width)
    return float(sum(steps[k] * (np.asarray(coefs[k]) @ u) for k in steps))


COEFS = {
    "direct": {"direct": [2e-5, 1e-7, 2e-7, 3e-7, 1e-7, 4e-7]},
    "gemm": {
        "packing": [1e-5, 2e-8, 2e-8, 1e-8, 1e-8, 1e-8],
        "mm": [3e-6, 1e-9, 1e-9, 2e-9, 3e-9, 1e-9],
    },
    "winograd": {
        "input_transform": [1e-5, 2e-8, 1e-8, 3e-8, 1e-8, 0.0],
        "gemm": [4e-6, 1e-9, 2e-9, 1e-9, 2e-9, 1e-9],
        "output_transform": [2e-5, 1e-8, 1e-8, 1e-8, 2e-8, 0.0],
    },
}


def random_params(rng, impl: str) -> OpParams:
    h = int(rng.integers(6, 80))
    w = int(rng.integers(6, 80))
    if impl == "winograd":
        k, s = 3, 1
    else:
        k, s = int(rng.choice([1, 3, 5])), int(rng.choice([1, 2]))
    ic = int(rng.integers(3, 200))
    oc = int(rng.integers(4, 300))
    return OpParams("conv2d", h, w, ic, oc, k, s, k // 2)


def random_partition(rng) -> Partition:
    dim = str(rng.choice(["H", "OC", "none"]))
    return Partition(dim, float(rng.choice([0.2, 0.5, 0.7, 1.0])) if dim != "none" else 1.0)


def synth_records(rng, n, impl, processor="gpu", noise=0.0, dispatch=False, coefs=None):
    coefs = coefs or COEFS[impl]
    out = []
    while len(out) < n:
        params = random_params(rng, impl)
        part_ = random_partition(rng)
        if processor == "cpu" and part_.dim != "none":
            part_ = Partition(part_.dim, min(part_.ratio, 0.7))
        part = part_shape(params, part_, processor)
        if part.empty:
            continue
        disp = None
        if dispatch and processor == "gpu":
            size = part.out_h * part.out_w * part.oc
            wg = int(rng.choice([32, 64, 100, 128, 256]))
            disp = DispatchFeatures(wg_size=wg, wg_count=cdiv(size, wg))
        elif dispatch:
            disp = DispatchFeatures(
                cpu_parallel_blocks=int(rng.integers(1, 64)),
                vector_width=int(rng.choice([4, 8, 16])),
                threads=int(rng.choice([1, 2, 4])),
            )
        lat = true_latency(params, part, processor, impl, coefs, disp)
        if noise:
            lat *= float(np.exp(rng.normal(0.0, noise)))
        out.append(
            OpRecord(
                params,
                part_,
                processor,
                impl,
                lat,
                5,
                dispatch=disp or DispatchFeatures(),
                device=DEVICE,
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# Features.


@pytest.mark.parametrize(
    ("h", "k", "s", "pad", "dil"),
    [
        (17, 3, 1, 1, 1),
        (17, 3, 2, 1, 1),
        (20, 5, 2, 2, 1),
        (9, 1, 1, 0, 1),
        (15, 3, 1, 2, 2),
        (16, 7, 2, 3, 1),
        (11, 2, 2, 0, 1),
    ],
)
@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.3, 0.5, 0.99, 1.0])
def test_h_split_rows_and_halo(h, k, s, pad, dil, ratio):
    params = OpParams("conv2d", h, 10, 4, 8, k, s, pad, dil)
    gpu = part_shape(params, Partition("H", ratio), "gpu")
    cpu = part_shape(params, Partition("H", ratio), "cpu")
    n = params.out_h
    assert gpu.out_h == math.floor(ratio * n + 0.5) and gpu.out_h + cpu.out_h == n
    assert (gpu.row0, cpu.row0) == (0, gpu.out_h)
    assert gpu.in_h == rows_read(params, range(0, gpu.out_h))
    assert cpu.in_h == rows_read(params, range(gpu.out_h, n))
    assert gpu.oc == cpu.oc == 8 and gpu.ic == cpu.ic == 4


def test_split_matches_the_partitioning_passes():
    """The cost model predicts the parts the passes really cut (same rounding, rows, groups)."""
    from codl_tvm.core.geometry import ChannelMap, SlidingWindow, Span, split_point

    for n in (1, 2, 3, 7, 10, 56, 113):
        for ratio in np.linspace(0.0, 1.0, 41):
            assert part_shape(
                OpParams("conv2d", n, 4, 2, 2), Partition("H", ratio), "gpu"
            ).out_h == split_point(n, float(ratio))
    for params in (
        OpParams("conv2d", 23, 9, 4, 8, 3, 2, (1, 0, 1, 0)),
        OpParams("conv2d", 30, 9, 4, 8, 5, 1, 2, dilation=2),
        OpParams("pool", 21, 9, 4, 4, 3, 2, (1, 1, 1, 1), ceil_mode=True),
    ):
        win = SlidingWindow(
            params.h,
            params.kernel,
            params.stride,
            params.dilation,
            params.padding[0],
            params.padding[2],
            params.ceil_mode,
        )
        assert win.out_extent == params.out_h
        for ratio in (0.1, 0.35, 0.5, 0.8):
            cut = split_point(params.out_h, ratio)
            for proc, span in (("gpu", Span(0, cut)), ("cpu", Span(cut, params.out_h))):
                part = part_shape(params, Partition("H", ratio), proc)
                assert (part.row0, part.out_h) == (span.start, len(span))
                assert part.in_h == len(win.input_span(span).inp)
    grouped = OpParams("conv2d", 8, 8, 12, 24, 3, 1, 1, groups=6)
    cmap = ChannelMap(12, 24, 6)
    for ratio in (0.2, 0.5, 0.7):
        cut = split_point(24, ratio, granularity=4)
        part = part_shape(grouped, Partition("OC", ratio), "cpu")
        assert (part.oc0, part.oc) == (cut, 24 - cut)
        assert part.ic == len(cmap.input_span(Span(cut, 24)).inp)


def test_oc_split_plain_grouped_depthwise():
    plain = OpParams("conv2d", 8, 8, 16, 10, 3, 1, 1)
    assert (
        part_shape(plain, Partition("OC", 0.3), "gpu").oc,
        part_shape(plain, Partition("OC", 0.3), "cpu").oc,
    ) == (3, 7)
    assert part_shape(plain, Partition("OC", 0.3), "cpu").ic == 16
    grouped = OpParams("conv2d", 8, 8, 16, 32, 3, 1, 1, groups=4)
    g = part_shape(grouped, Partition("OC", 0.5), "gpu")
    assert (g.oc, g.ic, g.groups) == (16, 8, 2)
    dw = OpParams("conv2d", 8, 8, 12, 12, 3, 1, 1, groups=12)
    c = part_shape(dw, Partition("OC", 0.25), "cpu")
    assert (c.oc, c.ic, c.groups, c.oc0) == (9, 9, 9, 3)


@pytest.mark.parametrize(
    ("params", "dim"),
    [
        (OpParams("conv2d", 9, 7, 6, 8, 3, 2, 1), "H"),
        (OpParams("conv2d", 9, 7, 6, 8, 3, 1, 1, groups=2), "OC"),
        (OpParams("dense", 5, 1, 12, 9), "OC"),
        (OpParams("pool", 10, 10, 6, 6, 2, 2), "H"),
    ],
)
def test_flops_against_brute_force(params, dim):
    for proc in ("gpu", "cpu"):
        f = op_features(params, proc, "direct", Partition(dim, 0.4))
        q = f.part
        assert f.flops == brute_flops(
            params.op, q.out_h, q.out_w, q.oc, q.ic, q.groups, params.kernel
        )


def test_bad_operator_descriptions_name_the_problem():
    with pytest.raises(FeatureError, match="operator kind 'conv3d'"):
        OpParams("conv3d", 8, 8, 3, 3)
    with pytest.raises(FeatureError, match=r"conv2d\(H=8.*kernel must be an integer >= 1, got 0"):
        OpParams("conv2d", 8, 8, 3, 3, kernel=0)
    with pytest.raises(FeatureError, match="groups=2 must divide IC=3"):
        OpParams("conv2d", 8, 8, 3, 4, groups=2)
    with pytest.raises(FeatureError, match="empty output"):
        OpParams("conv2d", 2, 2, 3, 4, kernel=5)
    with pytest.raises(FeatureError, match="ratio must be a number in"):
        Partition("H", 1.5)
    with pytest.raises(FeatureError, match="processor 'npu'"):
        part_shape(OpParams("conv2d", 8, 8, 3, 4), Partition("H", 0.5), "npu")


# ---------------------------------------------------------------------------------------------
# CoDL's Eq. 3 model.


def fitted_coefs(model: CodlModel, impl: str, processor: str = "gpu") -> dict:
    return model.groups[("conv2d", processor, impl)].coef


@pytest.mark.parametrize("impl", ["direct", "gemm", "winograd"])
def test_codl_recovers_coefficients_noise_free(impl):
    rng = np.random.default_rng(1)
    recs = synth_records(rng, 120, impl)
    model = CodlModel(CFG).fit(recs)
    group = model.groups[("conv2d", "gpu", impl)]
    assert group.formula == impl and not group.nonneg
    for kernel, true in COEFS[impl].items():
        got = list(group.coef[kernel])
        if impl == "winograd":
            # F is always 3, so K = 9 * IC: only IC's coefficient + 9 * K's is identifiable.
            got, true = (
                [*got[:3], got[3] + 9 * got[5], got[4]],
                [*true[:3], true[3] + 9 * true[5], true[4]],
            )
        np.testing.assert_allclose(got, true, rtol=1e-6, atol=1e-13)
    test = synth_records(np.random.default_rng(2), 30, impl)
    pred = model.predict_many([r.features() for r in test])
    np.testing.assert_allclose(pred, [r.latency_ms for r in test], rtol=1e-6)


@pytest.mark.parametrize("processor", ["gpu", "cpu"])
def test_codl_uses_real_dispatch_features(processor):
    rng = np.random.default_rng(3)
    recs = synth_records(rng, 120, "direct", processor, dispatch=True)
    model = CodlModel(CFG).fit(recs)
    np.testing.assert_allclose(
        fitted_coefs(model, "direct", processor)["direct"],
        COEFS["direct"]["direct"],
        rtol=1e-6,
        atol=1e-13,
    )
    # The configured blocking alone cannot explain dispatch-driven steps.
    no_dispatch = [
        OpRecord(
            r.params, r.partition, r.processor, r.impl, r.latency_ms, r.repeats, device=r.device
        )
        for r in recs
    ]
    blind = CodlModel(CFG).fit(no_dispatch)
    blind_pred = blind.predict_many([r.features() for r in no_dispatch])
    assert accuracy(blind_pred, [r.latency_ms for r in recs]).mape > 1.0


def test_codl_small_noise_stays_close():
    rng = np.random.default_rng(4)
    recs = synth_records(rng, 300, "direct", noise=0.01)
    model = CodlModel(CFG).fit(recs)
    test = synth_records(np.random.default_rng(5), 60, "direct")  # noise-free truth
    pred = model.predict_many([r.features() for r in test])
    acc = accuracy(pred, [r.latency_ms for r in test])
    assert acc.mape < 1.5 and acc.acc10 == 1.0
    # The dominant coefficients (reduction length, channels) come back within a few percent.
    got = fitted_coefs(model, "direct")["direct"]
    true = COEFS["direct"]["direct"]
    for i in (3, 5):
        assert abs(got[i] - true[i]) / true[i] < 0.1


def test_nnls_satisfies_kkt():
    rng = np.random.default_rng(6)
    for _ in range(20):
        a = rng.normal(size=(30, 5)) * np.array([1, 1e3, 1e-3, 1, 10])
        b = rng.normal(size=30)
        x = nnls(a, b)
        grad = a.T @ (a @ x - b)
        scale = np.abs(a).max(axis=0)
        assert np.all(x >= 0)
        # KKT: zero gradient where x > 0, non-negative gradient where x == 0.
        np.testing.assert_allclose(grad[x > 0] / scale[x > 0], 0.0, atol=1e-8)
        assert np.all(grad[x == 0] / scale[x == 0] >= -1e-8)
    x_true = np.array([1.0, 0.0, 2.0])
    a = rng.uniform(size=(10, 3))
    np.testing.assert_allclose(nnls(a, a @ x_true), x_true, atol=1e-10)


def test_codl_refits_nonnegative_when_t_unit_goes_negative():
    rng = np.random.default_rng(7)
    recs = synth_records(rng, 80, "direct")
    # t_unit falls with OC and floors at 1e-9: an unweighted least-squares line through it goes
    # negative for the widest parts, so the fit must switch to non-negative coefficients.
    recs = [
        OpRecord(
            r.params,
            r.partition,
            r.processor,
            r.impl,
            eq3(r.part.out_h * r.part.out_w * r.part.oc, CFG.gpu)
            * max(1e-7 * (150 - r.part.oc), 1e-9),
            r.repeats,
            device=r.device,
        )
        for r in recs
    ]
    plain = CodlConfig(cpu=CFG.cpu, gpu=CFG.gpu, relative_fit=False)
    a = np.array([CodlModel(plain)._design_row("direct", r.features())[0] for r in recs])
    coef = np.linalg.lstsq(a, [r.latency_ms for r in recs], rcond=None)[0]
    units = np.array([CodlModel(plain)._design_row("direct", r.features())[1] for r in recs])
    assert np.any(units @ coef < 0)  # the premise: plain least squares is negative somewhere
    model = CodlModel(plain).fit(recs)
    group = model.groups[("conv2d", "gpu", "direct")]
    assert group.nonneg and all(c >= 0 for c in group.coef["direct"])
    assert all(t >= 0 for r in recs for t in model.t_unit(r.features()).values())


def test_codl_model_file_round_trip_and_size(tmp_path):
    rng = np.random.default_rng(8)
    recs = (
        synth_records(rng, 60, "direct")
        + synth_records(rng, 60, "gemm")
        + synth_records(rng, 60, "winograd")
        + synth_records(rng, 60, "direct", "cpu")
    )
    model = CodlModel(CFG).fit(recs)
    path = tmp_path / "codl.json"
    model.save(path)
    assert path.stat().st_size < 8192  # four sub-models and the FLOPs fallback
    again = load_model(path)
    assert isinstance(again, CodlModel) and again.config == CFG
    feats = [r.features() for r in recs]
    assert np.array_equal(model.predict_many(feats), again.predict_many(feats))


# ---------------------------------------------------------------------------------------------
# Sharing costs and Eq. 2.


def sharing_records(rng):
    out = []
    for nb in rng.integers(1_000, 5_000_000, size=20):
        nb = int(nb)
        out.append(SharingRecord("transform", nb, 0.01 + 2e-7 * nb, 3, DEVICE))
        out.append(SharingRecord("map", nb, 0.02 + 1e-7 * nb, 3, DEVICE))
    out += [SharingRecord("presync", 0, v, 3, DEVICE) for v in (0.2, 0.5, 0.9, 0.4)]
    return out


def test_sharing_model_recovers_lines_and_presync_bound():
    sm = SharingModel.fit(sharing_records(np.random.default_rng(9)))
    assert sm.linear["transform"].intercept_ms == pytest.approx(0.01, rel=1e-9)
    assert sm.linear["transform"].ms_per_byte == pytest.approx(2e-7, rel=1e-9)
    assert sm.linear["map"].ms_per_byte == pytest.approx(1e-7, rel=1e-9)
    assert sm.constant_ms["presync"] == 0.9  # the measured upper bound, as in CoDL
    assert sm.predict("unmap", 1000) == 0.0


def test_eq2_composition_and_chains():
    rng = np.random.default_rng(10)
    recs = (
        synth_records(rng, 80, "direct")
        + synth_records(rng, 80, "direct", "cpu")
        + sharing_records(rng)
    )
    model = CodlModel(CFG).fit(recs)
    params = OpParams("conv2d", 56, 56, 64, 64, 3, 1, 1)
    plan = Partition("H", 0.5)
    got = model.predict_coexec(params, plan, "direct")
    gpu = model.predict(op_features(params, "gpu", "direct", plan))
    cpu = model.predict(op_features(params, "cpu", "direct", plan))
    # CPU part: output rows 28..55 read input rows 27..55 (29 rows with the halo).
    nbytes = 4 * (29 * 56 * 64 + 28 * 56 * 64)
    expect = (0.01 + 2e-7 * nbytes) + (0.02 + 1e-7 * nbytes) + 0.9 + max(cpu, gpu)
    assert got.shared_nbytes == nbytes
    assert got.total_ms == pytest.approx(expect, rel=1e-9)
    chained = model.predict_coexec(params, plan, "direct", chained=True)
    assert chained.total_ms == pytest.approx(max(cpu, gpu), rel=1e-12)
    gpu_only = model.predict_coexec(params, Partition("H", 1.0), "direct")
    whole = model.predict(op_features(params, "gpu", "direct", Partition("H", 1.0)))
    assert (gpu_only.cpu_ms, gpu_only.total_ms) == (0.0, whole)


@pytest.mark.parametrize("preset", ["emulated-soc", "device-h100"])
def test_predict_coexec_many_equals_one_by_one(preset):
    """The planner predicts all splits of an operator in one call: every latency must equal the
    one-partition prediction exactly (a shipped GBDT over the CodlModel base; an unknown
    implementation mixes in FLOPs fallbacks)."""
    from codl_tvm.cost_model.defaults import default_model_path

    model = load_model(default_model_path(preset))
    parts = [Partition(d, r) for d in ("H", "OC") for r in (0.1, 0.3, 0.5, 0.9)]
    parts += [Partition("none", 0.0), Partition("none", 1.0), Partition("H", 1.0)]
    for params, impl in (
        (OpParams("conv2d", 56, 56, 64, 64, 3, 1, 1), "direct"),
        (OpParams("conv2d", 17, 17, 512, 512, 1, 1, 0), "gemm"),
        (OpParams("conv2d", 28, 28, 32, 48, 3, 1, 1), {"cpu": "direct", "gpu": "winograd"}),
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fallback warnings are tested elsewhere
            many = model.predict_coexec_many(params, parts, impl)
            one = [model.predict_coexec(params, p, impl) for p in parts]
        assert many == one
        assert all(lat.total_ms > 0 for lat in many)


# ---------------------------------------------------------------------------------------------
# FLOPs baseline and fallback.


def test_flops_model_recovers_lines():
    rng = np.random.default_rng(11)
    recs = []
    for proc, (a, b) in (("gpu", (0.05, 0.8)), ("cpu", (0.02, 2.5))):
        for r in synth_records(rng, 40, "direct", proc):
            q = r.part
            fl = brute_flops("conv2d", q.out_h, q.out_w, q.oc, q.ic, q.groups, r.params.kernel)
            recs.append(
                OpRecord(r.params, r.partition, proc, "direct", a + b * fl * 1e-9, 3, device=DEVICE)
            )
    model = FlopsModel().fit(recs)
    gpu, cpu = model.lines[("conv2d", "gpu")], model.lines[("conv2d", "cpu")]
    assert (gpu.intercept_ms, gpu.ms_per_gflop) == pytest.approx((0.05, 0.8), rel=1e-8)
    assert (cpu.intercept_ms, cpu.ms_per_gflop) == pytest.approx((0.02, 2.5), rel=1e-8)
    # An operator kind it never saw uses its processor's line.
    dense = op_features(OpParams("dense", 4, 1, 256, 512), "cpu", "direct")
    assert model.predict(dense) == pytest.approx(model.per_processor["cpu"](dense.flops))


def test_unknown_operator_falls_back_to_flops_with_a_warning():
    rng = np.random.default_rng(12)
    model = CodlModel(CFG).fit(synth_records(rng, 60, "direct"))
    params = OpParams("conv2d", 32, 32, 16, 32, 3, 1, 1)
    feats = op_features(params, "gpu", "fft", Partition("OC", 0.5), name="layer3.conv2")
    with pytest.warns(CostModelFallbackWarning, match=r"'layer3.conv2' conv2d\(H=32 .*'fft'"):
        got = model.predict(feats)
    assert got == model.fallback.predict(feats)
    on_cpu = op_features(params, "cpu", "direct", name="conv_cpu")
    with pytest.warns(CostModelFallbackWarning, match="'conv_cpu'.* on cpu"):
        model.predict(on_cpu)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.predict(op_features(params, "gpu", "direct"))  # covered: no warning


# ---------------------------------------------------------------------------------------------
# GBDT.


def test_gbdt_fits_and_reloads_bit_identically(tmp_path):
    from codl_tvm.cost_model.gbdt import GbdtConfig, GbdtModel

    rng = np.random.default_rng(13)
    recs = synth_records(rng, 150, "direct", dispatch=True)
    model = GbdtModel(GbdtConfig(n_estimators=30, max_depth=4, learning_rate=0.3)).fit(recs)
    path = tmp_path / "gbdt.json"
    model.save(path)
    again = CostModel.load(path)
    assert isinstance(again, GbdtModel)
    test = synth_records(np.random.default_rng(14), 40, "direct", dispatch=True)
    test += synth_records(np.random.default_rng(15), 10, "direct")  # NaN dispatch features
    feats = [r.features() for r in recs + test]
    assert np.array_equal(model.predict_many(feats), again.predict_many(feats))
    # It learned the data (in log space): training error far below the FLOPs line's.
    train = [r.features() for r in recs]
    meas = [r.latency_ms for r in recs]
    assert (
        accuracy(model.predict_many(train), meas).mape
        < accuracy(model.fallback.predict_many(train), meas).mape / 2
    )


# ---------------------------------------------------------------------------------------------
# Model files.


@pytest.fixture
def model_json(tmp_path):
    rng = np.random.default_rng(16)
    model = CodlModel(CFG).fit(synth_records(rng, 40, "direct"))
    return model.to_json()


def write(tmp_path, obj_or_text, name="m.json"):
    path = tmp_path / name
    path.write_text(obj_or_text if isinstance(obj_or_text, str) else json.dumps(obj_or_text))
    return path


def test_corrupt_and_mismatched_model_files(tmp_path, model_json):
    path = write(tmp_path, json.dumps(model_json)[:-40])
    with pytest.raises(ModelFileError, match=rf"{path}: corrupt cost model file, not valid JSON"):
        load_model(path)
    with pytest.raises(ModelFileError, match="no such cost model file"):
        load_model(tmp_path / "missing.json")
    with pytest.raises(ModelFileError, match="not a codl-tvm cost model file"):
        load_model(write(tmp_path, {"learner": {}}))
    bad = dict(model_json, version=2)
    with pytest.raises(
        ModelFileError,
        match=r"m.json: cost model format version 2 is not "
        r"supported \(this codl-tvm reads version 1\)",
    ):
        load_model(write(tmp_path, bad))
    with pytest.raises(ModelFileError, match="unknown cost model kind 'svm'"):
        load_model(write(tmp_path, dict(model_json, kind="svm")))
    with pytest.raises(ModelFileError, match="holds a 'codl' model, not a 'flops' model"):
        FlopsModel.load(write(tmp_path, model_json))
    body = json.loads(json.dumps(model_json))
    del body["model"]["groups"][0]["coef"]
    with pytest.raises(ModelFileError, match=r"corrupt 'codl' cost model \(missing field"):
        load_model(write(tmp_path, body))
    body = json.loads(json.dumps(model_json))
    body["model"]["groups"][0]["coef"]["direct"] = [1.0, 2.0]
    with pytest.raises(ModelFileError, match="coefficients of 'direct'/direct must be 6 finite"):
        load_model(write(tmp_path, body))
    body = json.loads(json.dumps(model_json))
    body["fallback"]["version"] = 0
    with pytest.raises(ModelFileError, match=r"\(fallback\): cost model format version 0"):
        load_model(write(tmp_path, body))


def test_corrupt_gbdt_booster(tmp_path):
    from codl_tvm.cost_model.gbdt import GbdtConfig, GbdtModel

    recs = synth_records(np.random.default_rng(17), 20, "direct")
    obj = GbdtModel(GbdtConfig(n_estimators=3, max_depth=2)).fit(recs).to_json()
    obj["model"]["groups"][0]["booster"]["learner"] = {"junk": 1}
    with pytest.raises(
        ModelFileError,
        match=r"corrupt 'gbdt' cost model \(xgboost cannot load "
        r"the booster of \('conv2d', 'gpu', 'direct'\)",
    ):
        load_model(write(tmp_path, obj))


def test_gbdt_model_without_xgboost_names_the_package(tmp_path, monkeypatch):
    """A GBDT file read where xgboost cannot be imported is not called corrupt: the error names
    the file and the missing package."""
    import sys

    from codl_tvm.cost_model.gbdt import GbdtConfig, GbdtModel

    recs = synth_records(np.random.default_rng(17), 20, "direct")
    path = write(tmp_path, GbdtModel(GbdtConfig(n_estimators=3, max_depth=2)).fit(recs).to_json())
    monkeypatch.setitem(sys.modules, "xgboost", None)  # what an absent package looks like
    with pytest.raises(ModelFileError) as info:
        load_model(path)
    msg = str(info.value)
    assert str(path) in msg and "needs the 'xgboost' package" in msg and "corrupt" not in msg


# ---------------------------------------------------------------------------------------------
# Dataset files.


def test_dataset_round_trip_and_resume(tmp_path):
    rng = np.random.default_rng(18)
    recs = synth_records(rng, 10, "direct", dispatch=True) + sharing_records(rng)[:5]
    other = OpRecord(
        OpParams("dense", 8, 1, 64, 32),
        Partition("OC", 0.5),
        "cpu",
        "gemm",
        0.3,
        7,
        device={"cpu": "other"},
        name="fc1",
    )
    recs.append(other)
    # A part shape the profiler really built, off the default convention, is kept as recorded.
    params = OpParams("conv2d", 20, 20, 8, 8, 3, 1, 1)
    odd = PartShape(out_h=9, out_w=20, oc=8, in_h=11, in_w=20, ic=8, row0=0)
    assert odd != part_shape(params, Partition("H", 0.5), "gpu")
    recs.append(OpRecord(params, Partition("H", 0.5), "gpu", "direct", 0.5, 3, part=odd))
    path = tmp_path / "data.jsonl"
    save_dataset(recs, path, meta={"sampler": "test"})
    data = load_dataset(path)
    assert data.records == recs and data.meta == {"sampler": "test"}
    assert data.op_records[-2].device == {"cpu": "other"} and data.op_records[-2].name == "fc1"
    assert data.op_records[-1].part == odd and data.op_records[-1].features().part == odd
    # Devices are stored once.
    assert path.read_text().count("synthetic gpu") == 1

    # Resume: an interrupted run left half a line; the writer drops it and appends.
    text = path.read_text()
    path.write_text(text + '{"type": "op", "dev')
    with pytest.raises(DatasetError, match="incomplete last line"):
        load_dataset(path)
    new = synth_records(rng, 2, "gemm")
    with pytest.warns(UserWarning, match="dropping an incomplete last line"):
        writer = DatasetWriter(path)
    with writer:
        assert recs[0].key() in writer and new[0].key() not in writer
        writer.extend(new)
    assert load_dataset(path).records == recs + new


def test_dataset_spread_fields_are_optional_and_checked(tmp_path):
    """``number``/``min_ms``/``max_ms`` (how the profiler took a median and how far its samples
    spread) round-trip where given, are absent from older records, and must hold the median."""
    params = OpParams("conv2d", 12, 12, 8, 8, 3, 1, 1)
    new = OpRecord(
        params,
        Partition("H", 0.5),
        "gpu",
        "direct",
        0.5,
        10,
        device=DEVICE,
        number=4,
        min_ms=0.45,
        max_ms=0.75,
    )
    old = OpRecord(params, Partition("H", 0.5), "cpu", "direct", 0.8, 3, device=DEVICE)
    path = tmp_path / "spread.jsonl"
    save_dataset([new, old], path)
    lines = [json.loads(x) for x in path.read_text().splitlines()[2:]]
    assert (lines[0]["number"], lines[0]["min_ms"], lines[0]["max_ms"]) == (4, 0.45, 0.75)
    assert not {"number", "min_ms", "max_ms"} & set(lines[1])  # old records stay as they were
    back = load_dataset(path).op_records
    assert back == [new, old]
    assert back[0].spread == pytest.approx(0.6) and back[1].spread is None
    # The spread is not part of a measurement's identity (a resume skips by key).
    same = OpRecord(params, Partition("H", 0.5), "gpu", "direct", 0.9, 3, device=DEVICE)
    assert new.key() == same.key()
    with pytest.raises(DatasetError, match=r"min_ms <= latency_ms <= max_ms"):
        OpRecord(params, Partition("H", 0.5), "gpu", "direct", 0.5, 10, min_ms=0.6)
    with pytest.raises(DatasetError, match=r"min_ms <= latency_ms <= max_ms"):
        OpRecord(params, Partition("H", 0.5), "gpu", "direct", 0.5, 10, max_ms=0.4)
    with pytest.raises(DatasetError, match=r"number must be an integer >= 1"):
        OpRecord(params, Partition("H", 0.5), "gpu", "direct", 0.5, 10, number=0)
    obj = dict(lines[0], min_ms="fast")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([*path.read_text().splitlines()[:2], json.dumps(obj)]) + "\n")
    with pytest.raises(DatasetError, match=r"bad.jsonl:3: field 'min_ms': expected"):
        load_dataset(bad)


def lines_of(recs, tmp_path):
    path = tmp_path / "ok.jsonl"
    save_dataset(recs, path)
    return path.read_text().splitlines()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda o: o.pop("latency_ms"), r":3: field 'latency_ms': missing"),
        (lambda o: o.update(latency_ms="fast"), r":3: field 'latency_ms': expected"),
        (
            lambda o: o.update(latency_ms=-1.0),
            r":3: record .* latency_ms must be a finite "
            r"number > 0, got -1.0",
        ),
        (lambda o: o["params"].update(kernel=0), r":3: field 'params': .*kernel must be"),
        (lambda o: o["params"].update(colour=3), r":3: field 'params': unknown keys \['colour'\]"),
        (lambda o: o["partition"].update(dim="W"), r":3: field 'partition': partition dim 'W'"),
        (lambda o: o.update(device="d7"), r":3: field 'device': device id 'd7' is not defined"),
        (lambda o: o["dispatch"].update(wg_size=0), r":3: field 'dispatch': .*wg_size"),
        (lambda o: o.update(type="banana"), r":3: field 'type': expected 'op'"),
    ],
)
def test_dataset_schema_errors(tmp_path, mutate, message):
    recs = synth_records(np.random.default_rng(19), 1, "direct", dispatch=True)
    lines = lines_of(recs, tmp_path)
    obj = json.loads(lines[2])
    mutate(obj)
    lines[2] = json.dumps(obj)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=rf"bad.jsonl{message}"):
        load_dataset(bad)


def test_dataset_header_errors(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"format": "codl-tvm-latency-dataset", "version": 99}\n')
    with pytest.raises(
        DatasetError,
        match=r"x.jsonl:1: dataset format version 99 is not "
        r"supported \(this codl-tvm reads version 1\)",
    ):
        load_dataset(path)
    path.write_text('{"hello": 1}\n')
    with pytest.raises(DatasetError, match="not a codl-tvm latency dataset"):
        load_dataset(path)
    path.write_text('{"format": "codl-tvm-latency-dataset", "version": 1}\nnot json\n')
    with pytest.raises(DatasetError, match=r"x.jsonl:2: not valid JSON"):
        load_dataset(path)
    with pytest.raises(DatasetError, match="sharing record: kind 'flush'"):
        SharingRecord("flush", 10, 0.1, 1)


# ---------------------------------------------------------------------------------------------
# Evaluation and the CLI.


def test_accuracy_on_a_hand_made_case():
    acc = accuracy([1.05, 1.2, 0.5, 1.1, 2.0], [1.0, 1.0, 1.0, 1.0, 2.0])
    assert acc.n == 5
    assert acc.acc10 == pytest.approx(3 / 5)  # 5%, 10% (inclusive) and 0% are within +-10%
    assert acc.mape == pytest.approx((5 + 20 + 50 + 10 + 0) / 5)
    with pytest.raises(ValueError, match="2 predictions for 3 measurements"):
        accuracy([1, 2], [1, 2, 3])


def test_split_is_seeded_disjoint_and_order_independent():
    recs = synth_records(np.random.default_rng(20), 400, "direct")
    train, test = split_records(recs, 0.3, seed=0)
    assert len(train) + len(test) == 400 and 0.22 < len(test) / 400 < 0.38
    assert {r.key() for r in train}.isdisjoint({r.key() for r in test})
    _, test2 = split_records(list(reversed(recs)), 0.3, seed=0)
    assert {r.key() for r in test2} == {r.key() for r in test}
    _, test3 = split_records(recs, 0.3, seed=1)
    assert {r.key() for r in test3} != {r.key() for r in test}


def test_evaluate_report_matches_metrics():
    rng = np.random.default_rng(21)
    recs = synth_records(rng, 60, "direct") + synth_records(rng, 60, "gemm", noise=0.05)
    model = CodlModel(CFG).fit(recs[:40] + recs[60:100])
    held = recs[40:60] + recs[100:]
    report = evaluate(model, held, timing=False)
    feats = [r.features() for r in held]
    meas = [r.latency_ms for r in held]
    assert report.overall == accuracy(model.predict_many(feats), meas)
    assert report.per_group["conv2d/gpu/gemm"] == accuracy(
        model.predict_many(feats[20:]), meas[20:]
    )
    assert report.per_group["conv2d/gpu/direct"].mape < 1e-3
    assert report.baseline["overall"] == accuracy(model.fallback.predict_many(feats), meas)
    assert report.model_bytes == len(model.dumps().encode()) and report.n_fallback == 0


def run_cli(argv):
    parser = argparse.ArgumentParser(prog="codl-tvm")
    register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_fit_eval_json_and_plot(tmp_path, capsys):
    rng = np.random.default_rng(22)
    recs = (
        synth_records(rng, 80, "direct")
        + synth_records(rng, 60, "direct", "cpu")
        + sharing_records(rng)
    )
    data = tmp_path / "d.jsonl"
    save_dataset(recs, data)
    model_path = tmp_path / "m.json"
    assert (
        run_cli(
            [
                "cost-model",
                "fit",
                str(data),
                "-o",
                str(model_path),
                "--kind",
                "codl",
                "--preset",
                "mobile",
            ]
        )
        == 0
    )
    model = load_model(model_path)
    assert model.meta["holdout"] == 0.3
    # the device of the dataset's records, for compiles to compare with theirs
    assert model.meta["device"] == {"gpu": DEVICE["gpu"]}
    assert model.meta["device"] == merge_devices(record_devices(recs))
    capsys.readouterr()
    png = tmp_path / "scatter.png"
    assert (
        run_cli(["cost-model", "eval", str(model_path), str(data), "--json", "--plot", str(png)])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    _, test = split_records(recs, 0.3, 0)
    test_ops = [r for r in test if isinstance(r, OpRecord)]
    assert report["n_eval"] == len(test_ops) == model.meta["n_test"]
    expect = accuracy(
        model.predict_many([r.features() for r in test_ops]), [r.latency_ms for r in test_ops]
    )
    assert report["overall"]["mape"] == pytest.approx(expect.mape)
    assert set(report["per_processor"]) == {"cpu", "gpu"} and "transform" in report["sharing"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert run_cli(["cost-model", "eval", str(model_path), str(data)]) == 0
    text = capsys.readouterr().out
    assert "FLOPs-linear baseline" in text and "conv2d/cpu/direct" in text


def test_cli_errors_are_one_line(tmp_path):
    bad = write(tmp_path, "{", "bad.json")
    data = tmp_path / "d.jsonl"
    save_dataset(synth_records(np.random.default_rng(23), 5, "direct"), data)
    with pytest.raises(CodlError, match=r"bad\.json: corrupt cost model file"):
        run_cli(["cost-model", "eval", str(bad), str(data)])
    with pytest.raises(CodlError, match="no such dataset file"):
        run_cli(["cost-model", "fit", str(tmp_path / "none.jsonl"), "-o", str(bad)])


# ---------------------------------------------------------------------------------------------
# Dispatch features read from scheduled TIR.


def test_dispatch_features_from_tir():
    import tvm
    from tvm.script import tirx as T

    from codl_tvm.cost_model.dispatch import KernelLaunch, dispatch_features, kernel_launches

    @T.prim_func(check_well_formed=False)
    def gpu(a: T.Buffer((4096,), "float32")):
        for bx in T.thread_binding(7, thread="blockIdx.x"):
            for by in T.thread_binding(3, thread="blockIdx.y"):
                for tx in T.thread_binding(64, thread="threadIdx.x"):
                    a[bx * 192 + by * 64 + tx] = T.float32(1)
        for bx in T.thread_binding(2, thread="blockIdx.x"):
            for tx in T.thread_binding(32, thread="threadIdx.x"):
                a[bx * 32 + tx] = T.float32(2)

    @T.prim_func(check_well_formed=False)
    def cpu(a: T.Buffer((64, 64), "float32"), b: T.Buffer((64, 64), "float32")):
        for i in T.parallel(12):
            for j in range(5):
                for k in T.vectorized(8):
                    b[i, j * 8 + k] = a[i, j * 8 + k] * T.float32(2)
        for i in T.parallel(3):
            b[i, 0] = T.float32(0)

    assert kernel_launches(gpu) == [KernelLaunch(64, 21), KernelLaunch(32, 2)]
    assert dispatch_features([gpu]) == DispatchFeatures(wg_size=64, wg_count=21, num_kernels=2)
    # After lowering, bindings are thread_extent attributes: same answer.
    lowered = tvm.s_tir.transform.LowerOpaqueBlock()(tvm.IRModule({"main": gpu}))["main"]
    assert kernel_launches(lowered) == kernel_launches(gpu)
    assert kernel_launches(cpu) == [KernelLaunch(None, None, 12, 8), KernelLaunch(None, None, 3)]
    assert dispatch_features([cpu], threads=4) == DispatchFeatures(
        cpu_parallel_blocks=12, vector_width=8, threads=4, num_kernels=2
    )


def test_dispatch_features_of_a_dlight_schedule():
    import tvm
    from tvm import relax
    from tvm.s_tir import dlight as dl
    from tvm.script import relax as R

    from codl_tvm.cost_model.dispatch import dispatch_features

    @tvm.script.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((1, 16, 20, 20), "float32"), w: R.Tensor((32, 16, 3, 3), "float32")):
            with R.dataflow():
                y = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
                R.output(y)
            return y

    target = tvm.target.Target({"kind": "opencl"}, host={"kind": "llvm"})
    mod = relax.transform.LegalizeOps()(Mod)
    with target:
        mod = dl.ApplyDefaultSchedule(dl.gpu.Fallback())(mod)
    d = dispatch_features([mod["conv2d"]])
    # dlight's fallback: one thread per output element in work-groups of 256 threads.
    assert (d.wg_size, d.wg_count, d.num_kernels) == (256, cdiv(32 * 20 * 20, 256), 1)


# ---------------------------------------------------------------------------------------------
# Sampling of shapes to profile.


def test_codl_sampling_ranges_and_determinism():
    from codl_tvm.cost_model.sampling import CODL_SPACE, sample_conv2d

    shapes = sample_conv2d(np.random.default_rng(30), 300, CODL_SPACE, max_gflops=5.0)
    assert shapes == sample_conv2d(np.random.default_rng(30), 300, CODL_SPACE, max_gflops=5.0)
    for p in shapes:
        assert 1 <= p.h == p.w <= 640 and 3 <= p.ic <= 4096 and 32 <= p.oc <= 4096
        assert p.kernel in (1, 3, 5, 7) and p.stride in (1, 2) and p.padding[0] == p.kernel // 2
        flops = 2 * p.out_h * p.out_w * p.oc * p.ic * p.kernel**2
        assert flops <= 5e9
    assert {p.kernel for p in shapes} == {1, 3, 5, 7} and {p.stride for p in shapes} == {1, 2}


def test_pow2_sampling_picks_an_interval_then_uniform():
    from codl_tvm.cost_model.sampling import POW2_SPACE, sample_dense

    shapes = sample_dense(np.random.default_rng(31), 2000, POW2_SPACE, max_gflops=None)
    ks = np.array([int(math.log2(p.oc)) for p in shapes])
    assert ks.min() == 2 and ks.max() == 9
    # Each of the 8 intervals is picked about equally often (expected 250 each).
    counts = np.bincount(ks, minlength=10)[2:]
    assert counts.min() > 180 and counts.max() < 320
    # Inside [256, 512) values are uniform: the lower and upper halves are about equal.
    inside = np.array([p.oc for p in shapes if 256 <= p.oc < 512])
    assert abs(np.mean(inside < 384) - 0.5) < 0.12
    assert all(p.w == 1 and p.op == "dense" for p in shapes)


# ---------------------------------------------------------------------------------------------
# The work-per-unit form of Eq. 3 (block structure from the dispatch features).

WORK_CFG = CodlConfig(
    cpu=ProcessorBlocking(4, 64, 8),
    gpu=ProcessorBlocking(8, 256, 16),
    unit_model="work",
    item_terms=True,
)
# Coefficients of (kernels, steps, steps*O*K, steps*O, In, Out, MACs, MACs[F=1],
# steps*O*K[F=1], MACs[S>1], In[F=1], item*K, item), written out independently below.
WORK_COEFS = [8e-3, 2e-4, 3e-7, 1e-6, 2e-7, 1e-7, 1e-9, 5e-10, 1e-7, 4e-10, 1e-7, 2e-6, 3e-5]


def work_reference(params, part, processor, disp, coefs) -> float:
    """The work form written out from the module docstring's definition."""
    out = part.out_h * part.out_w * part.oc
    red = (part.ic // part.groups) * params.kernel**2
    n_in = part.in_h * part.in_w * part.ic
    if processor == "gpu":
        blk = WORK_CFG.gpu
        blocks, block = disp.wg_count, disp.wg_size
        unit = min(blk.unit_size, block)
        steps = cdiv(blocks, blk.cores) * cdiv(block, unit)
    else:
        blocks, block, unit = disp.cpu_parallel_blocks, 1, 1
        steps = cdiv(blocks, disp.threads)
    item = cdiv(out, blocks * block)
    per_step = unit * item
    f1 = float(params.kernel == 1)
    s2 = float(params.stride > 1)
    terms = [
        disp.num_kernels or 1,
        steps,
        steps * per_step * red,
        steps * per_step,
        n_in,
        out,
        out * red,
        out * red * f1,
        steps * per_step * red * f1,
        out * red * s2,
        n_in * f1,
        item * red,
        item,
    ]
    return float(np.dot(terms, coefs))


def work_records(rng, n, processor="gpu", coefs=None, kernels=(1, 3, 5), noise=0.0):
    coefs = coefs or WORK_COEFS
    out = []
    while len(out) < n:
        params = random_params(rng, "direct")
        if params.kernel not in kernels:
            continue
        part_ = random_partition(rng)
        part = part_shape(params, part_, processor)
        if part.empty:
            continue
        size = part.out_h * part.out_w * part.oc
        if processor == "gpu":
            # Work-items with register tiles of 1..16 outputs, as the OpenCL schedules build.
            wg = int(rng.choice([4, 16, 64, 128, 256]))
            tile = int(rng.choice([1, 4, 16]))
            disp = DispatchFeatures(
                wg_size=wg,
                wg_count=max(1, cdiv(size, wg * tile)),
                num_kernels=int(rng.choice([1, 2])),
            )
        else:
            disp = DispatchFeatures(
                cpu_parallel_blocks=int(rng.integers(1, 4000)),
                threads=int(rng.choice([4, 8])),
                num_kernels=int(rng.choice([1, 2])),
            )
        lat = work_reference(params, part, processor, disp, coefs)
        if noise:
            lat *= float(np.exp(rng.normal(0.0, noise)))
        out.append(
            OpRecord(params, part_, processor, "direct", lat, 3, dispatch=disp, device=DEVICE)
        )
    return out


@pytest.mark.parametrize("processor", ["gpu", "cpu"])
@pytest.mark.parametrize("robust", [False, True])
def test_work_form_recovers_coefficients_noise_free(processor, robust):
    import dataclasses

    recs = work_records(np.random.default_rng(30), 250, processor)
    cfg = dataclasses.replace(WORK_CFG, robust_fit=robust)
    model = CodlModel(cfg).fit(recs)
    group = model.groups[("conv2d", processor, "direct")]
    assert not group.nonneg and list(group.coef) == ["eq3"]
    got = np.array(group.coef["eq3"])
    # Every term is identifiable on this data: relative error tiny on each coefficient.
    np.testing.assert_allclose(got, WORK_COEFS, rtol=1e-5)
    test = work_records(np.random.default_rng(31), 40, processor)
    pred = model.predict_many([r.features() for r in test])
    np.testing.assert_allclose(pred, [r.latency_ms for r in test], rtol=1e-8)
    # t_unit of the work form: time of one step, (T - the terms outside steps) / steps.
    f = test[0].features()
    terms = np.array(
        [work_reference(f.params, f.part, processor, f.dispatch, list(e)) for e in np.eye(13)]
    )
    per_step = (
        WORK_COEFS[1] * terms[1]
        + WORK_COEFS[2] * terms[2]
        + WORK_COEFS[3] * terms[3]
        + WORK_COEFS[8] * terms[8]
    ) / terms[1]
    assert model.t_unit(f)["eq3"] == pytest.approx(per_step, rel=1e-5)


def test_work_form_follows_tiles_that_the_hwc_form_cannot():
    """Work per work-item varies 16x between records: CoDL's t_unit linear in (H, W, IC, OC, K)
    cannot follow it, the work form (reading the tiles from the dispatch) fits it exactly."""
    recs = work_records(np.random.default_rng(32), 250, "gpu")
    test = work_records(np.random.default_rng(33), 60, "gpu")
    meas = [r.latency_ms for r in test]
    work = CodlModel(WORK_CFG).fit(recs)
    hwc = CodlModel(CodlConfig(cpu=WORK_CFG.cpu, gpu=WORK_CFG.gpu)).fit(recs)
    assert accuracy(work.predict_many([r.features() for r in test]), meas).mape < 1e-4
    assert accuracy(hwc.predict_many([r.features() for r in test]), meas).mape > 10.0


def test_work_form_filter_variants_and_file_round_trip(tmp_path):
    import dataclasses

    f3 = [c * (3.0 if i in (2, 6) else 1.0) for i, c in enumerate(WORK_COEFS)]
    rng = np.random.default_rng(34)
    recs = work_records(rng, 200, kernels=(5,)) + work_records(rng, 200, coefs=f3, kernels=(3,))
    cfg = dataclasses.replace(WORK_CFG, filter_variants=30)
    model = CodlModel(cfg).fit(recs)
    group = model.groups[("conv2d", "gpu", "direct")]
    # Strides 1 and 2 of each filter size are separate variants, each with its generator's
    # coefficients. Inside one variant the [F == 1] and [S > 1] columns repeat (or zero) their
    # base columns, so only the sums are identifiable: compare those.
    keys = {"F5S1", "F5S2", "F3S1", "F3S2"}
    assert set(group.variants) == keys | {"blind"} | {f"blind/{k}" for k in keys}

    def effective(c, f1, s2):
        c = list(c)
        return [
            c[0],
            c[1],
            c[2] + f1 * c[8],
            c[3],
            c[4] + f1 * c[10],
            c[5],
            c[6] + f1 * c[7] + s2 * c[9],
            c[11],
            c[12],
        ]

    for key, true in (("F5S1", WORK_COEFS), ("F5S2", WORK_COEFS), ("F3S1", f3), ("F3S2", f3)):
        f1, s2 = 0.0, float(key[3] == "2")
        np.testing.assert_allclose(
            effective(group.variants[key], f1, s2), effective(true, f1, s2), rtol=1e-5
        )
    test = work_records(np.random.default_rng(35), 30, coefs=f3, kernels=(3,))
    pred = model.predict_many([r.features() for r in test])
    np.testing.assert_allclose(pred, [r.latency_ms for r in test], rtol=1e-6)
    # One set for both filter sizes cannot fit both (no [F == 3] terms).
    single = CodlModel(WORK_CFG).fit(recs)
    assert (
        accuracy(
            single.predict_many([r.features() for r in test]), [r.latency_ms for r in test]
        ).mape
        > 5.0
    )
    path = tmp_path / "work.json"
    model.save(path)
    assert path.stat().st_size < 8192
    again = load_model(path)
    assert again.config == cfg and again.groups[("conv2d", "gpu", "direct")].variants
    feats = [r.features() for r in recs + test]
    assert np.array_equal(model.predict_many(feats), again.predict_many(feats))
    body = json.loads(path.read_text())
    body["model"]["groups"][0]["variants"]["F3S1"] = [1.0]
    with pytest.raises(ModelFileError, match="variant 'F3S1' must be 13 finite numbers"):
        load_model(write(tmp_path, body))


def test_robust_fit_ignores_gross_outliers():
    from codl_tvm.cost_model.analytical import _irls_relative

    rng = np.random.default_rng(36)
    a = np.column_stack([np.ones(60), rng.uniform(1, 100, 60), rng.uniform(1, 1e4, 60)])
    x_true = np.array([0.5, 0.02, 3e-4])
    y = a @ x_true
    y[[3, 7, 11, 19, 23, 41]] *= 5.0  # 10% of the measurements 5x too slow (interference)
    robust = _irls_relative(a, y)
    np.testing.assert_allclose(robust, x_true, rtol=2e-3)
    from codl_tvm.cost_model.linalg import weighted_lstsq

    plain = weighted_lstsq(a, y, 1.0 / y)
    assert np.max(np.abs(plain - x_true) / x_true) > 0.03  # 10x further off at least


def test_inconsistent_records_flags_only_contradicted_parts():
    from codl_tvm.cost_model.evaluate import inconsistent_records

    params = OpParams("conv2d", 40, 40, 16, 32, 3, 1, 1)

    def rec(dim, ratio, proc, lat):
        return OpRecord(params, Partition(dim, ratio), proc, "direct", lat, 3, device=DEVICE)

    whole = rec("none", 0.0, "cpu", 1.0)
    slow = rec("OC", 0.3, "cpu", 3.5)  # 70% of the FLOPs, 3.5x the time of the whole op
    fine = rec("H", 0.7, "cpu", 0.4)  # 30% of the FLOPs
    gpu_whole = rec("none", 1.0, "gpu", 0.1)  # another processor: never compared
    gpu_part = rec("H", 0.3, "gpu", 0.25)  # 30% of the rows: fewer FLOPs, 2.5x: kept at 3
    recs = [whole, slow, fine, gpu_whole, gpu_part]
    assert inconsistent_records(recs, 3.0) == [slow]
    assert inconsistent_records(recs, 2.0) == [slow, gpu_part]
    assert inconsistent_records(recs, 4.0) == []
    with pytest.raises(ValueError, match=r"inconsistency factor must be > 1, got 0\.5"):
        inconsistent_records(recs, 0.5)


def test_cli_fit_drops_inconsistent_training_records(tmp_path):
    recs = work_records(np.random.default_rng(37), 200, "gpu")
    train, _ = split_records(recs, 0.3, 0)
    # Make one training part 10x slower than its own whole operator (if it has one) or than a
    # copy of itself measured as the whole operator.
    victim = train[0]
    bad = OpRecord(
        victim.params,
        victim.partition,
        victim.processor,
        victim.impl,
        victim.latency_ms * 10,
        3,
        dispatch=victim.dispatch,
        device=DEVICE,
    )
    twin = OpRecord(
        victim.params,
        Partition("none", 1.0),
        "gpu",
        "direct",
        victim.latency_ms * 1.0,
        3,
        part=victim.part,
        dispatch=victim.dispatch,
        device=DEVICE,
    )
    data = tmp_path / "d.jsonl"
    save_dataset([bad if r is victim else r for r in recs] + [twin], data)
    out = tmp_path / "m.json"
    assert run_cli(["cost-model", "fit", str(data), "-o", str(out), "--preset", "mobile"]) == 0
    meta = load_model(out).meta
    in_train = [r for r in split_records(load_dataset(data).records, 0.3, 0)[0]]
    n_bad = meta["n_dropped_inconsistent"]
    assert n_bad >= 1 and meta["n_train"] == len(in_train) - n_bad
    assert (
        run_cli(["cost-model", "fit", str(data), "-o", str(out), "--drop-inconsistent", "0"]) == 0
    )
    assert load_model(out).meta["n_train"] == len(in_train)


def test_gbdt_derived_features_by_hand():
    from codl_tvm.cost_model.gbdt import FEATURE_NAMES, derived_features

    params = OpParams("conv2d", 20, 20, 8, 24, 3, 1, 1, groups=2)
    gpu = op_features(
        params,
        "gpu",
        "direct",
        Partition("H", 0.5),
        DispatchFeatures(wg_size=16, wg_count=25),
    )
    # GPU part: 10 rows x 20 x 24 outputs, reads 11 rows x 20 x 8, K = 8/2 * 9 = 36;
    # 400 work-items -> ceil(4800 / 400) = 12 outputs and 432 MACs each.
    assert derived_features(gpu) == [4800.0, 1760.0, 36.0, 172800.0, 400.0, 12.0, 432.0]
    cpu = op_features(
        params, "cpu", "direct", Partition("OC", 0.5), DispatchFeatures(cpu_parallel_blocks=7)
    )
    # CPU part: 1 group = 12 channels of 20 x 20, all 4 input channels of that group.
    assert derived_features(cpu)[:5] == [4800.0, 1600.0, 36.0, 172800.0, 7.0]
    assert derived_features(cpu)[5:] == [686.0, 686.0 * 36]
    blind = derived_features(op_features(params, "cpu", "direct"))
    assert blind[:4] == [9600.0, 3200.0, 36.0, 345600.0] and all(map(math.isnan, blind[4:]))
    assert FEATURE_NAMES[-7:] == (
        "out_elems",
        "in_elems",
        "reduction",
        "macs",
        "items",
        "outputs_per_item",
        "macs_per_item",
    )


def test_infer_preset_from_the_device_description():
    from codl_tvm.cost_model.evaluate import infer_preset

    params = OpParams("conv2d", 8, 8, 4, 4)

    def rec(device):
        return OpRecord(params, Partition(), "gpu", "direct", 1.0, 1, device=device)

    assert infer_preset([rec({"gpu": "NVIDIA H100 80GB HBM3"})]) == "nvidia-h100"
    assert infer_preset([rec({"platform": "Portable Computing Language (PoCL 5.0)"})]) == (
        "emulated-soc"
    )
    assert infer_preset([rec({"gpu": "Adreno 740"})]) == "mobile"
    assert infer_preset([]) == "mobile"


def test_gbdt_on_the_analytical_base_extrapolates():
    """Trees alone cannot predict past the largest training latency; started from CoDL's model
    (the default ``analytical_base``) they keep its extrapolation."""
    from codl_tvm.cost_model.gbdt import GbdtConfig, GbdtModel

    recs = work_records(np.random.default_rng(38), 300, "gpu")
    recs.sort(key=lambda r: r.latency_ms)
    train, far = recs[:240], recs[-30:]  # the test latencies lie beyond every training one
    meas = [r.latency_ms for r in far]
    feats = [r.features() for r in far]
    plain = GbdtModel(GbdtConfig(analytical_base="none")).fit(train)
    based = GbdtModel(GbdtConfig(analytical_base="emulated-soc")).fit(train)
    assert based.base is not None and based.base.config.unit_model == "work"
    assert accuracy(plain.predict_many(feats), meas).mape > 20.0
    assert accuracy(based.predict_many(feats), meas).mape < 5.0
    assert plain.base is None and "base" in based.to_json()["model"]


def test_stripped_training_stats_predict_identically():
    import xgboost as xgb

    from codl_tvm.cost_model.gbdt import strip_training_stats

    rng = np.random.default_rng(39)
    x = rng.uniform(size=(300, 5))
    y = np.sin(4 * x[:, 0]) + x[:, 1] * x[:, 2] + rng.normal(0, 0.01, 300)
    booster = xgb.train({"max_depth": 4, "nthread": 1}, xgb.DMatrix(x, label=y), 30)
    full = json.loads(bytes(booster.save_raw(raw_format="json")))
    stripped = strip_training_stats(json.loads(json.dumps(full)))
    assert len(json.dumps(stripped)) < 0.9 * len(json.dumps(full))
    again = xgb.Booster()
    again.load_model(bytearray(json.dumps(stripped).encode()))
    probe = rng.uniform(-0.5, 1.5, size=(500, 5))
    assert np.array_equal(booster.inplace_predict(probe), again.inplace_predict(probe))


def test_noise_floor_pairs_identical_parts_only():
    from codl_tvm.cost_model.evaluate import noise_floor

    params = OpParams("conv2d", 12, 12, 8, 8, 3, 1, 1, groups=2)

    def rec(ratio, proc, lat):
        return OpRecord(params, Partition("OC", ratio), proc, "direct", lat, 3, device=DEVICE)

    # OC 0.3 and 0.4 both give the GPU one of the two groups: identical parts on each side.
    recs = [rec(0.3, "cpu", 1.0), rec(0.4, "cpu", 1.2), rec(0.3, "gpu", 2.0)]
    recs.append(rec(0.4, "gpu", 2.1))
    # The whole operator on the CPU is another part: never paired.
    recs.append(OpRecord(params, Partition("none", 0.0), "cpu", "direct", 5.0, 3, device=DEVICE))
    floor = noise_floor(recs)
    cpu, gpu = floor["cpu"], floor["gpu"]
    assert (cpu["groups"], cpu["records"], cpu["pairs"]) == (1, 2, 2)
    # 1.0 predicted by 1.2 is 20% off, 1.2 predicted by 1.0 is 16.7% off.
    assert cpu["acc10"] == 0.0 and cpu["mape"] == pytest.approx(100 * (0.2 + 0.2 / 1.2) / 2)
    assert cpu["log_sigma"] == pytest.approx(math.log(1.2) / math.sqrt(2))
    assert gpu["acc10"] == 1.0 and gpu["mape"] == pytest.approx(100 * (0.1 / 2.0 + 0.1 / 2.1) / 2)
    assert floor["overall"]["pairs"] == 4


def test_work_form_blind_set_serves_features_without_dispatch():
    """The planner predicts parts it has not built (no dispatch features): those use the set
    fitted on the same records without dispatch features, the others the dispatch set."""
    import dataclasses

    recs = work_records(np.random.default_rng(40), 250, "gpu")
    blind_recs = [dataclasses.replace(r, dispatch=DispatchFeatures()) for r in recs]
    model = CodlModel(WORK_CFG).fit(recs)
    blind_only = CodlModel(WORK_CFG).fit(blind_recs)
    group = model.groups[("conv2d", "gpu", "direct")]
    assert group.variants["blind"] == blind_only.groups[("conv2d", "gpu", "direct")].coef["eq3"]
    assert "blind" not in blind_only.groups[("conv2d", "gpu", "direct")].variants
    test = work_records(np.random.default_rng(41), 30, "gpu")
    with_d = [r.features() for r in test]
    without = [dataclasses.replace(f, dispatch=DispatchFeatures()) for f in with_d]
    np.testing.assert_allclose(model.predict_many(with_d), [r.latency_ms for r in test], rtol=1e-8)
    assert np.array_equal(model.predict_many(without), blind_only.predict_many(without))
    off = dataclasses.replace(WORK_CFG, blind_set=False)
    assert "blind" not in CodlModel(off).fit(recs).groups[("conv2d", "gpu", "direct")].variants


def test_work_form_never_predicts_below_half_the_fastest_training_record():
    recs = work_records(np.random.default_rng(42), 200, "gpu")
    model = CodlModel(WORK_CFG).fit(recs)
    group = model.groups[("conv2d", "gpu", "direct")]
    assert group.floor_ms == 0.5 * min(r.latency_ms for r in recs)
    # Negative coefficients everywhere: the linear form goes below zero, the floor holds.
    group.coef["eq3"] = [-1.0] * len(group.coef["eq3"])
    group.variants.clear()
    assert model.predict(recs[0].features()) == group.floor_ms


def test_dispatch_features_are_the_conv_kernels_not_the_padding_copys():
    """A padded conv is two launches: the padding copy (one thread per padded input element)
    and the conv. The features describe the conv even where the copy launches more threads
    (the profiler once recorded the copy for 553 of 882 PoCL records)."""
    from codl_tvm.cost_model.dispatch import dispatch_features, kernel_launches

    from .test_schedules_cpu import conv_module, prim_funcs
    from .test_schedules_opencl import DEVICE_TARGETS, schedule

    mod = schedule(
        conv_module((1, 64, 32, 32), (8, 64, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, True),
        DEVICE_TARGETS["pocl"],
    )
    (func,) = [f for name, f in prim_funcs(mod).items() if "conv2d" in name]
    launches = kernel_launches(func)
    assert len(launches) == 2
    conv = next(k for k in launches if k.reduces)
    pad = next(k for k in launches if not k.reduces)
    assert pad.work > conv.work  # the case that went wrong
    d = dispatch_features([func])
    assert (d.wg_size, d.wg_count, d.num_kernels) == (conv.wg_size, conv.wg_count, 2)
    assert d.wg_size == int(func.attrs["codl.workgroup_size"])
    assert d.wg_count == int(func.attrs["codl.workgroup_count"])


@pytest.mark.parametrize(
    "path",
    sorted(
        Path(__file__).resolve().parents[1].glob("codl_tvm/data/cost_models/datasets/*.jsonl.gz")
    ),
    ids=lambda p: p.name,
)
def test_committed_datasets_still_load(path):
    """Every committed device dataset reads with today's code (aligning matmul cuts once made old
    dense records empty parts): dense OC records measured before the alignment keep the
    unaligned cut they were measured with, later ones the aligned cut the build makes."""
    from codl_tvm.cost_model.features import RECORD_MATMUL_ALIGN, part_shape

    data = load_dataset(path)
    ops = data.op_records
    assert len(ops) > 100 and not any(r.part.empty for r in ops)
    dense = [r for r in ops if r.params.op == "dense" and r.partition.dim == "OC"]
    for r in dense:
        assert r.part in (
            part_shape(r.params, r.partition, r.processor, RECORD_MATMUL_ALIGN),
            part_shape(r.params, r.partition, r.processor),
        )
    # each dataset has one convention (mixed cuts would mean a record was misread)
    unaligned = [
        r.part == part_shape(r.params, r.partition, r.processor, RECORD_MATMUL_ALIGN)
        for r in dense
        if part_shape(r.params, r.partition, r.processor, RECORD_MATMUL_ALIGN)
        != part_shape(r.params, r.partition, r.processor)
    ]
    assert len(set(unaligned)) <= 1


def test_cli_fit_drops_a_changed_kernel_group(tmp_path):
    """``fit --drop OP:PROC[:IMPL]`` leaves out the records of a kernel that changed since they
    were measured (PoCL's dense rule replaced dlight's GEMV), and nothing else."""
    recs = work_records(np.random.default_rng(5), 120, "gpu")
    recs += work_records(np.random.default_rng(6), 40, "cpu")
    dense = [
        OpRecord(
            OpParams("dense", 1, 1, 256 * (i + 1), 64, 1),
            Partition("none", 1.0),
            "gpu",
            "reduction" if i % 2 else "matmul",
            1.0 + i,
            3,
            device=DEVICE,
        )
        for i in range(10)
    ]
    data = tmp_path / "d.jsonl"
    save_dataset(recs + dense, data)
    out = tmp_path / "m.json"
    argv = ["cost-model", "fit", str(data), "-o", str(out), "--kind", "flops", "--holdout", "0"]
    assert run_cli([*argv, "--drop", "dense:gpu:reduction"]) == 0
    meta = load_model(out).meta
    assert meta["n_dropped_groups"] == 5 and meta["dropped_groups"] == ["dense:gpu:reduction"]
    assert meta["n_train"] == len(recs) + 5
    assert run_cli([*argv, "--drop", "dense:gpu", "--drop", "conv2d:cpu"]) == 0
    assert load_model(out).meta["n_train"] == 120
    with pytest.raises(CodlError, match=r"--drop 'dense': expected OP:PROCESSOR\[:IMPL\]"):
        run_cli([*argv, "--drop", "dense"])
