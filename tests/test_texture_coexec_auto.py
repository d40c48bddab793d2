"""``compile --device coexec --gpu-data-type auto``: the plan built with its GPU parts in
buffers and on images, both timed in verify's round-robin (real builds, PoCL or Intel's CPU
OpenCL); the kept library matches the manifest's ``gpu`` record and onnxruntime. Which type
wins on this machine says nothing about a phone: only the record's consistency is checked.
And the planner's OC cuts rounded to whole image pixels (``PlannerConfig.gpu_channels``):
structure of the plan, numerics of its image build.
"""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from codl_tvm.passes.texture_parts import OUTSIDE
from onnx import TensorProto, helper

from codl_tvm.build.coexec import compile_coexec
from codl_tvm.build.texture_coexec import VM_DEVICES
from codl_tvm.cli import bundled_model_path, main
from codl_tvm.core.geometry import split_point
from codl_tvm.core.plan import PartitionDim, PartitionPlan, partitionable_ops, uniform_plan
from codl_tvm.cost_model import load_model
from codl_tvm.cost_model.defaults import default_model_path
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.objectives.measure import MEASURE_ROUNDS
from codl_tvm.options import CompileOptions
from codl_tvm.planner import PlannerConfig, plan_model
from codl_tvm.planner.split.pixels import rounded_ratio
from codl_tvm.runtime.artifact import load_artifact

RTOL = 1e-4


def _error(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))


def _onnxruntime(proto: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(proto.SerializeToString()).run(None, inputs)[0]


def _compile_small(capsys, tmp_path: Path, *flags: str) -> tuple[int, str, dict | None]:
    """The bundled small CNN co-executed under a given OC plan (half the channels each)."""
    model = load_onnx(bundled_model_path())
    plan = tmp_path / "plan.json"
    plan.write_text(uniform_plan(model.mod, "OC", 0.5).to_json())
    out = tmp_path / "art"
    argv = ["compile", str(bundled_model_path()), "-o", str(out), "--device", "coexec"]
    code = main([*argv, "--plan", str(plan), "--gpu-data-type", "auto", *flags])
    err = capsys.readouterr().err
    manifest = out / "manifest.json"
    return code, err, json.loads(manifest.read_text()) if manifest.exists() else None


def _check_against_onnxruntime(artifact: Path) -> None:
    proto = onnx.load(bundled_model_path())
    model = load_onnx(proto)
    x = random_inputs(model, seed=2)
    got = load_artifact(artifact)([x[s.name] for s in model.inputs])[0]
    assert _error(got, _onnxruntime(proto, x)) <= RTOL


@pytest.mark.slow  # 20 s on 2 cores; CI keeps test_default_compile_measures_auto
@pytest.mark.opencl
def test_measured_auto_times_both_types_and_keeps_the_record(opencl, tmp_path, capsys, caplog):
    """``--verify 2`` measures a given plan: the buffer build, the image build and each
    processor alone in one round-robin; the record holds both types' samples and the artifact
    is the build the record says."""
    caplog.set_level(logging.INFO, logger="codl_tvm")
    code, err, manifest = _compile_small(capsys, tmp_path, "--verify", "2")
    assert code == 0, err
    gpu = manifest["gpu"]
    ms = gpu["measured_ms"]
    assert set(ms) == {"buffer", "image"} and all(v > 0 for v in ms.values())
    assert gpu["asked"] == "auto" and gpu["dtype"] == "float32"
    assert gpu["measured_on"] == "this machine" and gpu["rounds"] == 2
    assert all(len(gpu["samples_ms"][t]) == 2 for t in ms)
    assert ms == {t: float(np.median(v)) for t, v in gpu["samples_ms"].items()}
    assert "unchecked" not in gpu and "dropped" not in gpu
    # one round-robin: verify timed the pair beside the processors alone
    assert {"coexec", "coexec:image", "cpu", "opencl"} <= set(manifest["verify"]["median_ms"])
    images = gpu["data_type"] == "image"
    if manifest["device"] == "coexec":
        assert gpu["data_type"] == min(ms, key=ms.get)
        assert manifest["vm_devices"] == (list(VM_DEVICES) if images else ["opencl", "cpu"])
        assert ("gpu_parts" in manifest["kernel_splits"]) == images
    else:  # a processor alone was faster than both: its build keeps buffers
        assert not images
    assert (b"write_imagef" in (tmp_path / "art" / "model.so").read_bytes()) == images
    lines = [m for m in caplog.messages if "GPU data type of the co-executed plan" in m]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert (
        f"buffers {ms['buffer']:.3f} ms" in lines[0] and f"images {ms['image']:.3f} ms" in lines[0]
    )
    _check_against_onnxruntime(tmp_path / "art")


@pytest.mark.opencl
@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (("--no-measure",), "not measured: measuring was switched off"),
        # 25 s each on 2 cores: CI keeps the first
        pytest.param(
            (), "not measured: the plan was given (verify measures it)", marks=pytest.mark.slow
        ),
    ],
)
def test_unmeasured_auto_takes_images_unchecked(opencl, tmp_path, capsys, flags, why):
    """Without measuring, the capability rule stands (images on a device that has them), as
    for the GPU alone, recorded as unchecked."""
    code, err, manifest = _compile_small(capsys, tmp_path, *flags)
    assert code == 0, err
    gpu = manifest["gpu"]
    assert gpu["unchecked"] == why
    assert gpu["data_type"] == "image" and "measured_ms" not in gpu
    assert manifest["vm_devices"] == list(VM_DEVICES)
    assert b"write_imagef" in (tmp_path / "art" / "model.so").read_bytes()
    _check_against_onnxruntime(tmp_path / "art")


# --- OC cuts of whole image pixels --------------------------------------------------------------


def test_rounded_ratio():
    def cut32(r: float) -> int:
        return split_point(32, r)

    assert rounded_ratio(0.5, 32, cut32, 4) == 0.5  # 16 channels: already whole pixels
    assert split_point(32, rounded_ratio(0.3, 32, cut32, 4)) == 8  # 10 -> 8 (tie: lower)
    assert split_point(32, rounded_ratio(0.35, 32, cut32, 4)) == 12  # 11 -> 12
    # both processors keep work: 0.05 of 32 is 2 channels, never 0
    assert split_point(32, rounded_ratio(0.05, 32, cut32, 4)) == 4
    assert rounded_ratio(0.5, 4, lambda r: split_point(4, r), 4) is None

    def cut10(r: float) -> int:
        return split_point(10, r)

    assert split_point(10, rounded_ratio(0.9, 10, cut10, 4)) == 8


def _convs(h: int = 112, channels: tuple[int, ...] = (3, 36, 44, 60)) -> onnx.ModelProto:
    """Dense 3x3 convs and ReLUs whose channel counts the grid's shares cut into parts of
    no whole pixels (0.7 of 44 is 31)."""
    rng = np.random.default_rng(0)
    inits, nodes, x = [], [], "x"
    for i, (c_in, c_out) in enumerate(itertools.pairwise(channels)):
        w = (rng.standard_normal((c_out, c_in, 3, 3)) / (3 * c_in**0.5)).astype("float32")
        inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, w.shape, w.ravel()))
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        x = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, channels[0], h, h))],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, (1, channels[-1], h, h))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _gpu_channels(plan, mod) -> dict[str, int]:
    """The GPU's channels of each OC split of ``plan`` (a chain's: its last operator's), as
    the partitioning pass cuts them."""
    extents = {i.name: i.output_shape[1] for i in partitionable_ops(mod)}
    cuts = {
        o.op: split_point(extents[o.op], o.ratio)
        for o in plan.ops
        if o.dim == PartitionDim.OC and 0.0 < o.ratio < 1.0
    }
    for c in plan.chains:
        if c.dim == PartitionDim.OC:
            cuts[c.ops[-1]] = split_point(extents[c.ops[-1]], c.ratio)
    return cuts


@pytest.mark.opencl
def test_oc_cuts_give_the_gpu_whole_pixels(opencl):
    """The planner with ``gpu_channels=4`` (set by ``compile`` where the GPU parts may take
    images) cuts every OC split in multiples of 4 GPU channels, says so in its notes, and the
    plan's GPU parts all compute on images, matching onnxruntime. (A calibration that makes
    both processors worth using; the ratios are the cost model's, never asserted.)"""
    proto = _convs()
    model = load_onnx(proto)
    cost_model = load_model(default_model_path("opencl"))
    config = PlannerConfig(gpu_channels=4, processor_scale=(1.0, 0.5))
    plan, report = plan_model(model.mod, cost_model, "oc_only", config)
    cuts = _gpu_channels(plan, model.mod)
    assert cuts, "the plan splits nothing: no cut to check"
    assert all(c % 4 == 0 for c in cuts.values()), cuts
    grid, _ = plan_model(
        model.mod, cost_model, "oc_only", PlannerConfig(processor_scale=(1.0, 0.5))
    )
    if any(c % 4 for c in _gpu_channels(grid, model.mod).values()):
        assert any("rounded to whole image pixels" in n for n in report.notes), report.notes

    built = compile_coexec(model.mod, plan, gpu_data_type="image")
    # the splits with a GPU part (an operator whole on the CPU has none)
    rows = [
        r
        for r in built.kernel_splits["gpu_parts"]
        if r["split"] != OUTSIDE and r["data_type"] != "none"
    ]
    assert rows and all(r["data_type"] == "image" for r in rows), rows
    x = random_inputs(model, seed=1)
    got = built([x[s.name] for s in model.inputs])[0]
    assert _error(got, _onnxruntime(proto, x)) <= RTOL


@pytest.mark.opencl
def test_compile_with_images_plans_whole_pixels(opencl, tmp_path):
    """``compile`` sets the planner's ``gpu_channels`` where the GPU parts take images: the
    manifest records it, the written plan's OC cuts give the GPU multiples of 4 channels, and
    the artifact matches onnxruntime."""
    proto = _convs()
    path = tmp_path / "convs.onnx"
    onnx.save(proto, path)
    options = CompileOptions(
        device="coexec",
        mode="oc_only",
        processor_scale=(1.0, 0.5),
        gpu_data_type="image",
        measure=False,
    )
    out = compile_artifact(path, tmp_path / "art", options)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["plan"]["gpu_channels"] == 4
    model = load_onnx(proto)
    plan = PartitionPlan.from_json((out / "plan.json").read_text())
    cuts = _gpu_channels(plan, model.mod)
    assert manifest["device"] == "coexec" and cuts, "the plan splits nothing: no cut to check"
    assert all(c % 4 == 0 for c in cuts.values()), cuts
    x = random_inputs(model, seed=2)
    got = load_artifact(out)([x[s.name] for s in model.inputs])[0]
    assert _error(got, _onnxruntime(proto, x)) <= RTOL


@pytest.mark.opencl
def test_default_compile_measures_auto(opencl, tmp_path, capsys):
    """A default compile (planned, measured): the plan's two builds are timed where it
    co-executes, else the record says the plan was not timed; either way the kept library
    is the record's and matches onnxruntime."""
    out = tmp_path / "art"
    argv = ["compile", str(bundled_model_path()), "-o", str(out), "--device", "coexec"]
    code = main([*argv, "--gpu-data-type", "auto"])
    assert code == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    gpu = manifest["gpu"]
    assert "unchecked" not in gpu
    if "measured_ms" in gpu:
        assert set(gpu["measured_ms"]) == {"buffer", "image"} and gpu["rounds"] == MEASURE_ROUNDS
    else:
        assert "the co-executed plan was not timed" in gpu["why"]
    images = gpu["data_type"] == "image"
    assert (b"write_imagef" in (out / "model.so").read_bytes()) == images
    _check_against_onnxruntime(out)
