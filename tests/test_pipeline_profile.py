"""Per-layer latency for every (processor group, core count): the layers' GEMM shapes (Pipe-it
Eq. 4), the measured time matrix and its records for the Pipe-it model."""

from __future__ import annotations

import platform
import threading

import numpy as np
import pytest
import tvm

from codl_tvm.core.errors import PlannerError
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.objectives.stage_build import layer_shapes
from codl_tvm.planner.stages.layer_model import LayerShape
from codl_tvm.planner.stages.search import HandOff, ProcessorGroup, search_pipeline
from codl_tvm.profiling.layers import (
    _busy,
    _layer_inputs,
    _loads_beside,
    build_layer_libraries,
    layer_records,
    measure_handoff,
    measure_layers,
    profile_layers,
)
from tests.test_transform_stages import _depthwise_cnn, _residual_cnn


def test_layer_shapes_are_gemm_shapes():
    shapes = layer_shapes(load_onnx(_residual_cnn()).mod)
    got = [(s.layer_type, s.out_pixels, s.filter_size, s.out_maps) for s in shapes]
    # three 3x3 convs on 8x8 (3 then 8 input channels), then Gemm 128 -> 5
    assert got == [
        ("conv2d", 64, 27, 8),
        ("conv2d", 64, 72, 8),
        ("conv2d", 64, 72, 8),
        ("dense", 1, 128, 5),
    ]
    dw = layer_shapes(load_onnx(_depthwise_cnn()).mod)
    assert [s.layer_type for s in dw] == ["conv2d", "depthwise_conv2d", "conv2d"]
    assert (dw[1].out_pixels, dw[1].filter_size, dw[1].out_maps) == (25, 9, 6)


def test_profile_layers_measures_every_group_and_core_count(tmp_path):
    model = load_onnx(_residual_cnn())
    groups = (ProcessorGroup("big", "cpu", (0,)), ProcessorGroup("little", "cpu", (1,)))
    table = profile_layers(
        model, groups, isa={"little": "x86-64-v2"}, number=1, repeat=1, work_dir=tmp_path
    )
    assert sorted(table.keys()) == [("big", 1), ("little", 1)]
    for key in table.keys():
        assert table[key].shape == (4,) and np.all(table[key] > 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "layers_big.so",
        "layers_host.so",
        "layers_little.so",
    ]
    records = layer_records(table, layer_shapes(model.mod))
    assert len(records) == 8 and all(isinstance(r.layer, LayerShape) for r in records)
    plan = search_pipeline(table, groups, available=[0, 1])
    assert plan.stages[-1].stop_layer == 4


def test_measure_handoff_gives_a_cost_the_search_takes():
    # what it measures depends on the machine: only its form is checked here
    handoff = measure_handoff(stages=2, frames=10, repeat=1)
    assert isinstance(handoff, HandOff) and handoff.stage_ms >= 0
    with pytest.raises(PlannerError, match="measure_handoff needs"):
        measure_handoff(stages=0)


@pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 instruction sets"
)
def test_little_isa_without_fma_emits_avx2_and_no_fma():
    # the emulated little cluster's default preset: 8-wide AVX2 vectors, no fused multiply-add
    # (LLVM's "-fma"), which sets its per-core gap to the AVX-512 big cluster
    from tvm import s_tir, te

    from codl_tvm.build.stage_targets import group_target

    def asm(isa: str) -> str:
        a = te.placeholder((32, 32), name="A")
        b = te.placeholder((32, 32), name="B")
        k = te.reduce_axis((0, 32))
        c = te.compute((32, 32), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k))
        sch = s_tir.Schedule(te.create_prim_func([a, b, c]))
        i, j, kk = sch.get_loops(sch.get_sblock("compute"))
        sch.reorder(i, kk, j)
        sch.vectorize(j)
        little = ProcessorGroup("little", "cpu", (0,))
        return tvm.compile(sch.mod, target=group_target(little, isa)).mod.inspect_source("asm")

    nofma, v3 = asm("x86-64-v3-nofma"), asm("x86-64-v3")
    assert "ymm" in nofma and "zmm" not in nofma and "vfmadd" not in nofma
    assert "vfmadd" in v3


def test_loads_beside_cover_every_other_core():
    groups = (
        ProcessorGroup("gpu", "gpu", (0,)),
        ProcessorGroup("big", "cpu", (1, 2, 3)),
        ProcessorGroup("little", "cpu", (4, 5)),
    )
    libs = {g.name: f"layers_{g.name}.so" for g in groups}
    # big on 2 cores: the GPU and little whole, big's third core with big's kernels
    loads = _loads_beside(groups, libs, [1, 2])
    assert [(lib, dev.dlpack_device_type(), cores) for lib, dev, cores in loads] == [
        ("layers_gpu.so", tvm.opencl(0).dlpack_device_type(), [0]),
        ("layers_big.so", tvm.cpu(0).dlpack_device_type(), [3]),
        ("layers_little.so", tvm.cpu(0).dlpack_device_type(), [4, 5]),
    ]
    # the GPU measured: every CPU core busy, no GPU load
    assert [cores for _, _, cores in _loads_beside(groups, libs, [0])] == [[1, 2, 3], [4, 5]]


def test_profile_under_load_runs_the_other_group_while_timing(tmp_path):
    model = load_onnx(_residual_cnn())
    groups = (ProcessorGroup("big", "cpu", (0,)), ProcessorGroup("little", "cpu", (1,)))
    libs = build_layer_libraries(model, groups, tmp_path, isa={"little": "x86-64-v2"})
    inputs = _layer_inputs(model, libs["host"])
    with _busy(_loads_beside(groups, libs, [0]), inputs) as passes:
        deadline = 600
        while passes[0] < 2 and deadline:  # the load keeps going while the block runs
            threading.Event().wait(0.05)
            deadline -= 1
        assert passes[0] >= 2
    stopped = list(passes)
    threading.Event().wait(0.2)
    assert passes == stopped  # and stops with it
    table = measure_layers(model, groups, libs, number=1, repeat=1, under_load=True)
    alone = measure_layers(model, groups, libs, number=1, repeat=1)
    assert table.keys() == alone.keys()
    assert all(np.all(table[k] > 0) for k in table.keys())


def test_a_failing_load_is_reported(tmp_path):
    # the timing of big runs little's library beside it: a broken one fails there, named
    model = load_onnx(_residual_cnn())
    groups = (ProcessorGroup("big", "cpu", (0,)), ProcessorGroup("little", "cpu", (1,)))
    libs = build_layer_libraries(model, groups[:1], tmp_path)
    libs["little"] = tmp_path / "layers_little.so"
    libs["little"].write_bytes(b"not a library")
    with pytest.raises(PlannerError, match="a load beside the layer timing failed"):
        measure_layers(model, groups, libs, number=1, repeat=1, under_load=True)
