"""The ``"tir-nv"`` feature set: what NVIDIA's compiler says of each GPU kernel
(``scripts/nv_kernel_info.py``: the kernels' OpenCL C exported here, ``ptxas``'s lines parsed
from the build log there), the occupancy arithmetic, and the join into the GBDT's features."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest

from codl_tvm.cost_model import DispatchFeatures, Partition, load_model, op_features
from codl_tvm.cost_model.gbdt import (
    FEATURE_SETS,
    KERNEL_FEATURE_NAMES,
    NV_FEATURE_NAMES,
    GbdtConfig,
    GbdtModel,
)
from codl_tvm.cost_model.kernel_counts import (
    H100,
    kernel_key,
    kernel_source,
    load_kernel_info,
    nv_features,
    nv_kernel_reader,
    occupancy,
    part_kernel_counts,
)
from codl_tvm.cost_model.tiling_features import direct_settings
from tests.scripts_util import script_module
from tests.test_cost_model_tir import CONV25, NVIDIA_JSON, _built_records

# A -cl-nv-verbose build log of two kernels as NVIDIA's OpenCL prints it: ptxas's verbose lines
# (the format of `ptxas -v`, e.g. "Used 40 registers, 128 bytes cmem[0], 128 bytes cmem[14]"
# on NVIDIA's forums), a CUDA 12 line with barriers and a kernel that spills.
NV_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'conv2d_kernel' for 'sm_90'
ptxas info    : Function properties for conv2d_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 4096 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'conv2d_kernel_1' for 'sm_90'
ptxas info    : Function properties for conv2d_kernel_1
    72 bytes stack frame, 40 bytes spill stores, 48 bytes spill loads
ptxas info    : Used 255 registers, 4+0 bytes lmem, 176 bytes cmem[0], 16 bytes cmem[2]
"""


def test_ptxas_log_is_parsed_per_kernel():
    with script_module("nv_kernel_info") as nv:
        parsed = nv.parse_ptxas_log(NV_LOG)
        assert parsed == {
            "conv2d_kernel": {
                "registers": 40,
                "stack_bytes": 0,
                "spill_stores": 0,
                "spill_loads": 0,
                "smem_bytes": 4096,
                "lmem_bytes": 0,
                "cmem_bytes": 400,
                "barriers": 1,
            },
            "conv2d_kernel_1": {
                "registers": 255,
                "stack_bytes": 72,
                "spill_stores": 40,
                "spill_loads": 48,
                "smem_bytes": 0,
                "lmem_bytes": 4,
                "cmem_bytes": 192,
                "barriers": None,
            },
        }
        # another platform's log (PoCL's is empty) says nothing
        assert nv.parse_ptxas_log("") == {}
        assert nv.parse_ptxas_log("warning: unused variable 'x'\n") == {}


def test_occupancy_on_the_h100():
    # 256 work-items (8 warps): 32 registers fill the SM (8 blocks by threads and registers)
    assert occupancy(32, 256) == (8.0, 1.0)
    # 64 registers: 2048 per warp, 32 warps' worth, 4 blocks
    assert occupancy(64, 256) == (4.0, 0.5)
    # 33 registers round up to 1280 per warp (units of 256): 51 warps, 6 blocks of 8
    assert occupancy(33, 256) == (6.0, 0.75)
    # one warp per block: 32 blocks at most, half the SM's 64 warps
    assert occupancy(16, 32) == (32.0, 0.5)
    # 48 KB of shared memory (+1 KB reserved per block) leaves 4 blocks in 228 KB
    assert occupancy(32, 256, 48 * 1024) == (4.0, 0.5)
    # 104 work-items are 4 warps: 16 blocks by threads
    assert occupancy(32, 104) == (16.0, 1.0)
    assert all(math.isnan(v) for v in occupancy(math.nan, 256))
    assert all(math.isnan(v) for v in occupancy(32, 0))
    assert H100.registers == 65536 and H100.smem_bytes == 228 * 1024


def test_nv_features_aggregate_a_parts_kernels():
    entry = {
        "kernels": {
            "a": {"registers": 40, "spill_stores": 0, "spill_loads": 0, "stack_bytes": 0,
                  "smem_bytes": 4096, "private_mem_size": 0, "work_group_size": 1024},
            "b": {"registers": 64, "spill_stores": 8, "spill_loads": 16, "stack_bytes": 24,
                  "smem_bytes": 0, "private_mem_size": 24, "work_group_size": 512},
        },
        "error": None,
    }  # fmt: skip
    got = dict(zip(NV_FEATURE_NAMES, nv_features(entry, 256), strict=True))
    assert got == {
        "nv_registers": 64.0,
        "nv_spill_bytes": 24.0,
        "nv_stack_bytes": 24.0,
        "nv_smem_bytes": 4096.0,
        "nv_private_bytes": 24.0,
        "nv_max_wg": 512.0,
        "nv_blocks_per_sm": 4.0,  # b: 64 registers x 256 work-items
        "nv_occupancy": 0.5,
    }
    # PoCL's entry: work-group info alone, the compiler's fields null
    pocl = {"kernels": {"a": {"registers": None, "smem_bytes": None, "work_group_size": 4096}}}
    got = dict(zip(NV_FEATURE_NAMES, nv_features(pocl, 256), strict=True))
    assert got["nv_max_wg"] == 4096.0
    assert all(math.isnan(v) for k, v in got.items() if k != "nv_max_wg")
    assert all(math.isnan(v) for v in nv_features(None, 256))
    assert all(math.isnan(v) for v in nv_features({"kernels": {}, "error": "build"}, 256))


def _conv25_part():
    f = op_features(CONV25, "gpu", "direct", Partition("OC", 0.2), DispatchFeatures(104, 28))
    return f, direct_settings(f)


def test_reader_joins_the_measured_kernel_by_its_key():
    f, settings = _conv25_part()
    key = kernel_key(f, NVIDIA_JSON, settings)
    assert key == kernel_key(f, NVIDIA_JSON, dict(settings))  # stable, order-free
    assert key != kernel_key(f, NVIDIA_JSON, {})  # other settings, another kernel
    entry = {"kernels": {"conv2d_kernel": {"registers": 40, "smem_bytes": 0}}, "error": None}
    read = nv_kernel_reader({key: entry})
    row = read(f, NVIDIA_JSON, settings)
    assert len(row) == len(KERNEL_FEATURE_NAMES) + len(NV_FEATURE_NAMES)
    assert row[: len(KERNEL_FEATURE_NAMES)] == part_kernel_counts(f, NVIDIA_JSON, settings)
    nv = dict(zip(NV_FEATURE_NAMES, row[len(KERNEL_FEATURE_NAMES) :], strict=True))
    assert nv["nv_registers"] == 40 and nv["nv_occupancy"] == occupancy(40, 104)[1]
    # a part the info does not hold, and a record whose work-groups are not the kernel's
    assert all(math.isnan(v) for v in nv_kernel_reader({})(f, NVIDIA_JSON, settings)[-8:])
    other = op_features(CONV25, "gpu", "direct", Partition("OC", 0.2), DispatchFeatures(104, 29))
    assert all(math.isnan(v) for v in read(other, NVIDIA_JSON, settings))


def test_wave_tir_nv_recipe_fits_with_the_joined_features(tmp_path):
    recs = _built_records(12)
    feats = [r.features() for r in recs]
    info = {
        kernel_key(f, NVIDIA_JSON, direct_settings(f)): {
            "kernels": {"k": {"registers": 32 + 8 * i, "smem_bytes": 0}},
            "error": None,
        }
        for i, f in enumerate(feats)
    }
    model = GbdtModel(
        GbdtConfig.wave(feature_set="tir-nv", n_estimators=10), nv_kernel_reader(info)
    )
    model.fit(recs)
    x = model._x(feats)
    assert x.shape[1] == len(FEATURE_SETS["tir-nv"])
    regs = x[:, FEATURE_SETS["tir-nv"].index("nv_registers")]
    # records of one kernel share its entry; every record found one
    assert not np.isnan(regs).any()
    assert np.isfinite(model.predict_many(feats)).all()


def test_cli_wave_tir_nv_needs_a_kernel_info_file(tmp_path, capsys):
    from codl_tvm.cli import main
    from codl_tvm.cost_model import save_dataset

    data = tmp_path / "d.jsonl"
    save_dataset(_built_records(12), data)
    argv = ["cost-model", "fit", str(data), "-o", str(tmp_path / "m.json"), "--kind", "gbdt"]
    argv += ["--recipe", "wave-tir-nv", "--trees", "5"]
    assert main(argv) == 2
    assert "--kernel-info" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"meta": {"format": "other"}, "kernels": {}}))
    assert main([*argv, "--kernel-info", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "meta.format" in err
    with pytest.raises(ValueError, match="not JSON"):
        bad.write_text("{")
        load_kernel_info(bad)
    good = tmp_path / "nvinfo.json"
    good.write_text(json.dumps({"meta": {"format": "codl-nv-kernel-info"}, "kernels": {}}))
    assert main([*argv, "--kernel-info", str(good)]) == 0
    assert load_model(tmp_path / "m.json").config.feature_set == "tir-nv"


@pytest.mark.opencl
def test_measure_on_a_platform_without_ptxas_leaves_its_fields_null(tmp_path):
    """The exported source of a real part compiled on the local platform (PoCL): the work-group
    info is read, the compiler's fields are null and one note says why."""
    with script_module("nv_kernel_info") as nv:
        f, settings = _conv25_part()
        src, launch = kernel_source(f, NVIDIA_JSON, settings)
        assert launch == (104, 28) and "__kernel" in src
        key = kernel_key(f, NVIDIA_JSON, settings)
        nv._write_sources(tmp_path, {key: src})
        out = tmp_path / "nvinfo.json"
        assert nv.main(["measure", "--dir", str(tmp_path), "--out", str(out), "--jobs", "1"]) == 0
        result = json.loads(out.read_text())
        meta, entry = result["meta"], result["kernels"][key]
        if "nvidia" in meta["platform"].lower():
            pytest.skip("an NVIDIA platform: its log has the ptxas lines")
        assert entry["error"] is None and entry["kernels"]
        for k in entry["kernels"].values():
            assert all(k[field] is None for field in nv.PTXAS_FIELDS)
            assert k["work_group_size"] >= 1
        assert len(meta["notes"]) == 1 and "null" in meta["notes"][0]
        assert load_kernel_info(out) == result["kernels"]
        packed = tmp_path / "nvinfo.json.gz"
        packed.write_bytes(gzip.compress(out.read_bytes()))
        assert load_kernel_info(packed) == result["kernels"]
        # bad input: a folder without the export
        assert nv.main(["measure", "--dir", str(tmp_path / "none"), "--out", str(out)]) == 2


def test_compare_scores_each_recipe_and_merges_by_recipe(tmp_path, capsys):
    from codl_tvm.cost_model import save_dataset

    recs = _built_records(16)
    data = tmp_path / "d.jsonl"
    save_dataset(recs, data)
    info = tmp_path / "nvinfo.json"
    kernels = {
        kernel_key(f, NVIDIA_JSON, direct_settings(f)): {
            "kernels": {"k": {"registers": 40, "smem_bytes": 0}},
            "error": None,
        }
        for f in (r.features() for r in recs)
    }
    info.write_text(json.dumps({"meta": {"format": "codl-nv-kernel-info"}, "kernels": kernels}))
    out = tmp_path / "cmp.json"
    argv = ["compare", "--dataset", str(data), "--kernel-info", str(info), "--seeds", "1"]
    with script_module("nv_kernel_info") as nv:
        assert nv.main([*argv, "--recipes", "wave,wave-tir-nv", "--out", str(out)]) == 0
        got = json.loads(out.read_text())
        assert sorted(got) == ["wave", "wave-tir-nv"]
        assert got["wave-tir-nv"]["nv_coverage"] == {"records": 16, "with_registers": 16}
        run = got["wave"]["random"][0]
        assert run["n"] > 0 and 0.0 <= run["acc10"] <= 1.0 and run["bands"]
        # a rerun keeps what it holds; an unknown recipe is refused
        assert nv.main([*argv, "--recipes", "wave", "--out", str(out)]) == 0
        assert "already" in capsys.readouterr().out
        assert nv.main([*argv, "--recipes", "wave-x", "--out", str(out)]) == 2
        assert "wave-x" in capsys.readouterr().err
