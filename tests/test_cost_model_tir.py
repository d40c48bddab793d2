"""The ``"tir"`` feature set of the GBDT: counts read from each GPU part's scheduled kernel
(``cost_model.kernel_counts``), the kernel rebuilt from the part's shapes as the profiler builds
it, and the ``wave-tir`` recipe's file round trip."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from codl_tvm.cost_model import (
    DispatchFeatures,
    OpParams,
    OpRecord,
    Partition,
    load_model,
    op_features,
)
from codl_tvm.cost_model.gbdt import KERNEL_FEATURE_NAMES, GbdtConfig, GbdtModel
from codl_tvm.cost_model.kernel_counts import kernel_counts, part_kernel_counts
from codl_tvm.cost_model.tiling_features import direct_settings

# The GPU target of the H100 campaign (its records' device description).
NVIDIA = tvm.target.Target(
    {
        "kind": "opencl",
        "device": "nvidia",
        "keys": ["nvidia", "opencl", "gpu"],
        "max_num_threads": 256,
        "thread_warp_size": 1,
    }
)
NVIDIA_JSON = str(NVIDIA)


# One launch of 4 x 32 work-items, each scaling an element into two rows (unrolled), as is and
# bounds-checked to the first 100 elements: identical but for the check.
@T.prim_func(private=True, s_tir=True)
def scale(
    a: T.Buffer((T.int64(128),), "float32"), b: T.Buffer((T.int64(2), T.int64(128)), "float32")
):
    for bx in T.thread_binding(T.int64(4), thread="blockIdx.x"):
        for tx in T.thread_binding(T.int64(32), thread="threadIdx.x"):
            for k in T.unroll(T.int64(2)):
                with T.sblock("b"):
                    vk = T.axis.spatial(T.int64(2), k)
                    v = T.axis.spatial(T.int64(128), bx * T.int64(32) + tx)
                    b[vk, v] = a[v] * T.float32(2.0) + T.float32(1.0)


@T.prim_func(private=True, s_tir=True)
def scale_checked(
    a: T.Buffer((T.int64(128),), "float32"), b: T.Buffer((T.int64(2), T.int64(128)), "float32")
):
    for bx in T.thread_binding(T.int64(4), thread="blockIdx.x"):
        for tx in T.thread_binding(T.int64(32), thread="threadIdx.x"):
            for k in T.unroll(T.int64(2)):
                with T.sblock("b"):
                    vk = T.axis.spatial(T.int64(2), k)
                    v = T.axis.spatial(T.int64(128), bx * T.int64(32) + tx)
                    T.where(bx * T.int64(32) + tx < T.int64(100))
                    b[vk, v] = a[v] * T.float32(2.0) + T.float32(1.0)


def test_kernel_counts_see_bounds_checks():
    plain = dict(zip(KERNEL_FEATURE_NAMES, kernel_counts([scale]), strict=True))
    checked = dict(zip(KERNEL_FEATURE_NAMES, kernel_counts([scale_checked]), strict=True))
    # identical kernels, identical counts
    assert kernel_counts([scale_checked]) == kernel_counts([scale_checked.with_attr("x", 1)])
    assert plain["k_threads"] == 32 and plain["k_groups"] == 4 and plain["k_unroll"] == 2
    assert plain["k_global_loads"] == 2 and plain["k_global_stores"] == 2
    assert plain["k_flops"] == 4 and plain["k_guarded"] == 0
    # the check is all that differs: two guarded block executions of one comparison each
    assert checked["k_guarded"] == 2 and checked["k_guard_terms"] == 2
    assert {k: v for k, v in checked.items() if not k.startswith("k_guard")} == {
        k: v for k, v in plain.items() if not k.startswith("k_guard")
    }


# SqueezeNet's conv2d_25 (13x13, 512 -> 64, 1x1) on the H100 at OC:0.2 (13 channels, 19.1 us)
# and a 16-channel conv of the same rows (33.7 us): the same 104 x 28 work-groups, one kernel
# but for its bounds checks (the 13-channel part checks channels and rows, the 16-channel one
# rows alone; docs/benchmarks.md).
CONV25 = OpParams("conv2d", 13, 13, 512, 64)
CONV25_16 = OpParams("conv2d", 13, 13, 512, 16)


def _conv_features(params: OpParams, partition: Partition) -> list[float]:
    f = op_features(params, "gpu", "direct", partition, DispatchFeatures(104, 28))
    settings = direct_settings(f)
    assert settings, "no NVIDIA setting of the campaign reproduces 104 x 28 work-groups"
    return part_kernel_counts(f, NVIDIA_JSON, settings)


def test_conv2d_25_parts_differ_in_their_bounds_checks_alone():
    thirteen = dict(zip(KERNEL_FEATURE_NAMES, _conv_features(CONV25, Partition("OC", 0.2))))
    sixteen = dict(zip(KERNEL_FEATURE_NAMES, _conv_features(CONV25_16, Partition())))
    assert not any(math.isnan(v) for v in thirteen.values())
    same = ("k_threads", "k_groups", "k_flops", "k_shared_loads", "k_serial_iters", "k_unroll")
    assert {k: thirteen[k] for k in same} == {k: sixteen[k] for k in same}
    assert (thirteen["k_threads"], thirteen["k_groups"]) == (104, 28)
    assert thirteen["k_guard_terms"] > sixteen["k_guard_terms"] > 0
    assert thirteen["k_compute_guard_terms"] == 2 and sixteen["k_compute_guard_terms"] == 1
    # the same part twice reads the same kernel
    assert _conv_features(CONV25, Partition("OC", 0.2)) == list(thirteen.values())
    # a record whose work-groups are not the kernel's, and a part without dispatch, read nothing
    other = op_features(CONV25, "gpu", "direct", Partition("OC", 0.2), DispatchFeatures(104, 29))
    assert all(math.isnan(v) for v in part_kernel_counts(other, NVIDIA_JSON))
    blind = op_features(CONV25, "gpu", "direct", Partition("OC", 0.2))
    assert all(math.isnan(v) for v in part_kernel_counts(blind, NVIDIA_JSON))


def _built_records(n: int) -> list[OpRecord]:
    """GPU conv parts with the work-groups of the kernel the NVIDIA rules build now and a
    latency from its counts (launch + multiply-adds per work-item, slower when checked)."""
    rng = np.random.default_rng(0)
    device = {"gpu": "synthetic GPU", "compute_units": 132, "gpu_target": NVIDIA_JSON}
    out = []
    while len(out) < n:
        h = int(rng.integers(6, 20))
        params = OpParams("conv2d", h, h, int(rng.choice([32, 64])), int(rng.integers(4, 40)))
        partition = Partition("OC", float(rng.choice([0.3, 0.5, 0.7])))
        blind = op_features(params, "gpu", "direct", partition)
        # deferred: the test builds the parts' kernels to know their work-groups
        from codl_tvm.cost_model.kernel_counts import _cached

        counts, (size, count) = _cached(blind.params, blind.part, NVIDIA_JSON, ())
        c = dict(zip(KERNEL_FEATURE_NAMES, counts, strict=True))
        latency = 0.004 + 1e-5 * c["k_flops"] * (1.5 if c["k_compute_guard_terms"] else 1.0)
        out.append(
            OpRecord(
                params,
                partition,
                "gpu",
                "direct",
                latency,
                3,
                dispatch=DispatchFeatures(size, count),
                device=device,
            )
        )
    return out


def test_wave_tir_recipe_saves_and_reloads(tmp_path):
    recs = _built_records(16)
    model = GbdtModel(GbdtConfig.wave(feature_set="tir", n_estimators=20), part_kernel_counts)
    model.fit(recs)
    assert model.kernel_target == NVIDIA_JSON
    feats = [r.features() for r in recs]
    x = model._x(feats)
    tir = x[:, -len(KERNEL_FEATURE_NAMES) :]
    assert not np.isnan(tir).any()  # every record's kernel was rebuilt and read
    path = tmp_path / "m.json"
    model.save(path)
    back = load_model(path)
    assert back.config == GbdtConfig.wave(feature_set="tir", n_estimators=20)
    assert back.kernel_target == NVIDIA_JSON
    # a built part's kernel features need the reader; the planner's parts (no dispatch) do not
    with pytest.raises(ValueError, match="kernel_reader"):
        back.predict_many(feats)
    blind = [dataclasses.replace(f, dispatch=DispatchFeatures()) for f in feats]
    np.testing.assert_array_equal(back.predict_many(blind), model.predict_many(blind))
    back.kernel_reader = part_kernel_counts
    np.testing.assert_array_equal(back.predict_many(feats), model.predict_many(feats))


def test_cli_fits_and_evaluates_the_wave_tir_recipe(tmp_path, capsys):
    from codl_tvm.cost_model import save_dataset
    from tests.test_cost_model import run_cli

    data = tmp_path / "d.jsonl"
    save_dataset(_built_records(16), data)
    out = tmp_path / "m.json"
    argv = ["cost-model", "fit", str(data), "-o", str(out), "--kind", "gbdt"]
    assert run_cli([*argv, "--recipe", "wave-tir", "--trees", "10", "--holdout", "0.25"]) == 0
    model = load_model(out)
    assert model.config == GbdtConfig.wave(n_estimators=10, feature_set="tir")
    capsys.readouterr()
    # eval scores the held-out built parts, which needs the kernel reader the CLI supplies
    assert run_cli(["cost-model", "eval", str(out), str(data), "--no-lomo"]) == 0
    assert "within" in capsys.readouterr().out


def test_opencl_overrides_rebuild_with_earlier_settings():
    from codl_tvm.schedules.settings import opencl_config, opencl_overrides

    assert opencl_config(NVIDIA).conv_threads_oh == 4
    with opencl_overrides(conv_threads_oh=2, conv_reg_oc=8):
        cfg = opencl_config(NVIDIA)
        assert (cfg.name, cfg.conv_threads_oh, cfg.conv_reg_oc) == ("nvidia", 2, 8)
    assert opencl_config(NVIDIA).conv_threads_oh == 4
    with pytest.raises(ValueError, match="not OpenCLConfig fields"), opencl_overrides(rows=2):
        pass
