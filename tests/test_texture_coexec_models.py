"""Co-executed builds whose GPU parts compute on OpenCL images, against onnxruntime.

The bundled small CNN under OC, H and a mixed plan (an H chain, a whole-GPU operator, a GPU
part of 10 channels, the CPU as home), a MobileNet-like block (its depthwise conv's GPU part
on images under OC and H splits, its global average pool packed behind a whole-GPU part),
three benchmark models' logits (SqueezeNet and ResNet-50 split on channels, AlexNet on rows,
SqueezeNet whole on the GPU; ``--runslow``), and ``codl-tvm compile --device coexec
--gpu-data-type image`` end to end: the manifest's record of which GPU parts ran on images,
``run --check``, and what cannot be done (``float16`` buffers) falling back with its reason;
coarse-grained SVM and buffer mode (forced, in a process of their own). Each split's record
comes from the build (:func:`codl_tvm.build.texture_coexec.image_record`).

Tolerance: float32 with different summation orders, ``1e-4`` of the output's scale (a wrong
row or channel is off by ``O(1)``).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from codl_tvm.passes.texture_parts import OUTSIDE

from codl_tvm.build.coexec import compile_coexec
from codl_tvm.build.texture_coexec import VM_DEVICES
from codl_tvm.cli import bundled_model_path, main
from codl_tvm.core.plan import (
    ChainPlan,
    OpPartition,
    PartitionPlan,
    model_fingerprint,
    uniform_plan,
)
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.frontend.models import light_model, without_final_softmax

pytestmark = pytest.mark.opencl

REPO = Path(__file__).resolve().parent.parent

RTOL = 1e-4


def _error(built, proto: onnx.ModelProto, model) -> float:
    """Max abs difference from onnxruntime over the output's scale."""
    ort = pytest.importorskip("onnxruntime")
    x = random_inputs(model, seed=1)
    want = ort.InferenceSession(proto.SerializeToString()).run(None, x)[0]
    got = built([x[s.name] for s in model.inputs])[0]
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))


def _small():
    proto = onnx.load(bundled_model_path())
    return proto, load_onnx(proto)


def _mixed_plan(mod) -> PartitionPlan:
    """Every case the GPU parts meet in the small CNN: a whole-GPU operator (ratio 1), a GPU
    part of 10 channels (no whole pixels), H chains through a pool and a depthwise conv, and
    the CPU as the home of the operators outside the plan."""
    return PartitionPlan(
        ops=(
            OpPartition("conv2d_0", "OC", 1.0),
            OpPartition("conv2d_1", "OC", 0.3),
            OpPartition("conv2d_6", "OC", 0.25),
        ),
        chains=(
            ChainPlan(("conv2d_2", "max_pool2d_3"), "H", 0.6),
            ChainPlan(("conv2d_4", "conv2d_5"), "H", 0.4),
        ),
        model_fingerprint=model_fingerprint(mod),
        home="cpu",
    )


@pytest.mark.parametrize("dim", ["OC", "H"])
def test_small_cnn_uniform_plan_matches_onnxruntime(opencl, dim):
    proto, model = _small()
    built = compile_coexec(model.mod, uniform_plan(model.mod, dim, 0.5), gpu_data_type="image")
    assert built.vm_devices == VM_DEVICES
    assert _error(built, proto, model) <= RTOL
    parts = {r["split"]: r for r in built.kernel_splits["gpu_parts"]}
    # dense and depthwise convs' GPU parts on images; the pools at a part's start (packed only
    # behind a packed producer) in buffers, each with its reason
    assert parts["conv2d_0"]["data_type"] == "image" and parts["conv2d_0"]["images"] >= 1
    assert parts["conv2d_4"]["data_type"] == "image" and parts["conv2d_4"]["packed_ops"] == "3/3"
    assert parts["max_pool2d_3"]["why"].startswith("max_pool2d: packed only behind")
    if dim == "OC":  # the dense layer splits on its output features only
        assert parts["matmul_8"]["why"] == "matmul: not covered by the texture layout"


def test_small_cnn_mixed_plan_matches_onnxruntime(opencl):
    proto, model = _small()
    built = compile_coexec(model.mod, _mixed_plan(model.mod), gpu_data_type="image")
    assert _error(built, proto, model) <= RTOL
    parts = {r["split"]: r for r in built.kernel_splits["gpu_parts"]}
    assert {k: r["data_type"] for k, r in parts.items()} == {
        "conv2d_0": "image",
        "conv2d_1": "buffer",
        "conv2d_2..max_pool2d_3": "image",
        "conv2d_4..conv2d_5": "image",
        "conv2d_6": "image",
    }
    assert parts["conv2d_1"]["why"] == "conv2d: 10 output channels, not a multiple of 4"
    # the chain's GPU part: conv, bias, ReLU, residual add, ReLU and the pool all packed
    assert parts["conv2d_2..max_pool2d_3"]["packed_ops"] == "5/5"
    # the depthwise conv and the pointwise conv after it: one packed chain
    assert parts["conv2d_4..conv2d_5"]["packed_ops"] == "6/6"


def _mobile_block() -> onnx.ModelProto:
    """MobileNet's block and head (as ``tests/test_texture_depthwise.py``'s): pointwise conv-relu
    16 -> 32, depthwise 3x3 conv-relu, global average pool, pointwise conv 32 -> 8."""
    rng = np.random.default_rng(5)
    values = {
        "w1": rng.standard_normal((32, 16, 1, 1)) / 4,
        "b1": rng.standard_normal(32),
        "wd": rng.standard_normal((32, 1, 3, 3)) / 3,
        "bd": rng.standard_normal(32),
        "w2": rng.standard_normal((8, 32, 1, 1)) / 6,
        "b2": rng.standard_normal(8),
    }
    make = onnx.helper.make_node
    nodes = [
        make("Conv", ["x", "w1", "b1"], ["c1"]),
        make("Relu", ["c1"], ["r1"]),
        make("Conv", ["r1", "wd", "bd"], ["d"], pads=[1] * 4, group=32),
        make("Relu", ["d"], ["r2"]),
        make("GlobalAveragePool", ["r2"], ["g"]),
        make("Conv", ["g", "w2", "b2"], ["y"]),
    ]
    info = onnx.helper.make_tensor_value_info
    graph = onnx.helper.make_graph(
        nodes,
        "mobile_block",
        [info("x", onnx.TensorProto.FLOAT, (1, 16, 14, 14))],
        [info("y", onnx.TensorProto.FLOAT, (1, 8, 1, 1))],
        [onnx.numpy_helper.from_array(v.astype("float32"), k) for k, v in values.items()],
    )
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    proto.ir_version = 8
    return proto


@pytest.mark.parametrize(
    ("dim", "ratio", "depthwise"),
    [
        ("OC", 0.5, "image"),  # 16 of 32 channels: whole pixels
        ("H", 0.5, "image"),  # 7 rows and the halo row above them
        ("OC", 0.3, "buffer"),  # 10 channels: a pixel's zero channels would reach the output
        ("OC", 1.0, "image"),  # whole on the GPU: the global pool behind it packed too
    ],
)
def test_mobile_block_depthwise_gpu_part_on_images(opencl, dim, ratio, depthwise):
    proto = _mobile_block()
    model = load_onnx(proto)
    built = compile_coexec(model.mod, uniform_plan(model.mod, dim, ratio), gpu_data_type="image")
    assert _error(built, proto, model) <= RTOL
    parts = {r["split"]: r for r in built.kernel_splits["gpu_parts"]}
    assert parts["conv2d_1"]["data_type"] == depthwise, parts["conv2d_1"]
    if depthwise == "buffer":
        assert parts["conv2d_1"]["why"] == "conv2d: grouped or depthwise (groups=10)"
    else:
        assert parts["conv2d_1"]["packed_ops"] == "3/3"  # conv, bias, ReLU
    if ratio == 1.0:  # the mean reads only the GPU part's packed result
        assert parts[OUTSIDE]["packed_ops"] == "1"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "dim", "ratio"),
    [
        ("squeezenet", "OC", 0.5),
        ("bvlc_alexnet", "H", 0.5),
        ("resnet50", "OC", 0.5),
        # every operator whole on the GPU: the fire modules' concats, outside the plan, join
        # packed results on images
        ("squeezenet", "OC", 1.0),
    ],
)
def test_benchmark_models_match_onnxruntime(opencl, name, dim, ratio):
    proto = without_final_softmax(light_model(name, seed=3))
    model = load_onnx(proto)
    plan = uniform_plan(model.mod, dim, ratio)
    built = compile_coexec(model.mod, plan, gpu_data_type="image")
    assert _error(built, proto, model) <= RTOL
    rows = built.kernel_splits["gpu_parts"]
    assert any(r["data_type"] == "image" for r in rows)
    # every part left in buffers says why
    assert all(r.get("why") for r in rows if r["data_type"] == "buffer")
    if ratio == 1.0:
        outside = {r["split"]: r for r in rows}[OUTSIDE]
        assert outside["images"] > 0


# --- the command ---------------------------------------------------------------------------------


def _compile(capsys, tmp_path: Path, *flags: str) -> tuple[int, str, dict | None]:
    _, model = _small()
    plan = tmp_path / "plan.json"
    plan.write_text(uniform_plan(model.mod, "OC", 0.5).to_json())
    out = tmp_path / "art"
    argv = ["compile", str(bundled_model_path()), "-o", str(out), "--device", "coexec"]
    code = main([*argv, "--plan", str(plan), "--no-measure", *flags])
    err = capsys.readouterr().err
    manifest = out / "manifest.json"
    return code, err, json.loads(manifest.read_text()) if manifest.exists() else None


def test_compile_coexec_on_images(opencl, tmp_path, capsys):
    code, err, manifest = _compile(capsys, tmp_path, "--gpu-data-type", "image")
    assert code == 0, err
    assert manifest["gpu"] == {"asked": "image", "data_type": "image", "dtype": "float32"}
    assert manifest["vm_devices"] == list(VM_DEVICES)
    rows = manifest["kernel_splits"]["gpu_parts"]
    assert [r["split"] for r in rows][:2] == ["conv2d_0", "conv2d_1"]
    assert rows[0]["data_type"] == "image"
    assert b"write_imagef" in (tmp_path / "art" / "model.so").read_bytes()
    # run --check: the artifact's VM gets its devices from the manifest
    assert main(["run", str(tmp_path / "art"), "--check", "--repeat", "1", "--number", "1"]) == 0
    assert "-> OK" in capsys.readouterr().out


def test_what_coexec_cannot_do_falls_back_with_its_reason(opencl, tmp_path, capsys, caplog):
    """float16 buffer GPU parts are not built: float32, the reason in one line (half image GPU
    parts: tests/test_texture_coexec_fp16.py; auto: tests/test_texture_coexec_auto.py)."""
    caplog.set_level(logging.INFO, logger="codl_tvm")
    flags = ("--gpu-data-type", "buffer", "--gpu-dtype", "float16")
    code, err, manifest = _compile(capsys, tmp_path, *flags)
    assert code == 0, err
    why = "gpu_dtype 'float16' applies to co-executed GPU parts on images"
    gpu = manifest["gpu"]
    assert gpu["dtype"] == "float32" and why in gpu["why"]
    assert gpu["data_type"] == "buffer"
    notes = [r.getMessage() for r in caplog.records if why in r.getMessage()]
    assert len(notes) == 1 and "\n" not in notes[0]  # the note, one line


# --- devices without fine-grained SVM ----------------------------------------------------------

_OTHER_MEMORY = """
import json, sys
import numpy as np
import onnx
import onnxruntime as ort
from codl_tvm import runtime
from codl_tvm.build.coexec import compile_coexec
from codl_tvm.cli import bundled_model_path
from codl_tvm.frontend.importer import load_onnx, random_inputs
from tests.test_texture_coexec_models import _mixed_plan

proto = onnx.load(bundled_model_path())
model = load_onnx(proto)
x = random_inputs(model, seed=1)
want = ort.InferenceSession(proto.SerializeToString()).run(None, x)[0]
built = compile_coexec(model.mod, _mixed_plan(model.mod), gpu_data_type="image")
got = built([x[s.name] for s in model.inputs])[0]
err = float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
print(json.dumps({"svm": runtime.svm_mode(), "err": err}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("svm", ["coarse", "buffer"])
def test_images_beside_coarse_svm_and_buffers(opencl, tmp_path, svm):
    """NVIDIA's coarse-grained SVM and drivers without SVM (forced here: the mode is chosen
    once per process): the CPU's views are mappings, the GPU parts' images unaffected."""
    env = {
        **os.environ,
        "CODL_OPENCL_SVM": svm,
        "CODL_TVM_CACHE_DIR": str(tmp_path),
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    cmd = [sys.executable, "-c", _OTHER_MEMORY]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["svm"] == svm and result["err"] <= RTOL
