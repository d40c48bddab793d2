"""onnx's light models on OpenCL (through the codl-tvm runtime) against TVM's CPU build of the
same model and against onnxruntime, on the same seeded random input."""

from __future__ import annotations

import numpy as np
import pytest

from codl_tvm.build.runner import build
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.frontend.models import light_model

# AlexNet (about 30 s on 2 cores) runs with --runslow; SqueezeNet keeps the CI check
FAST = ["squeezenet"]
SLOW = ["bvlc_alexnet", "vgg19", "resnet50", "inception_v1"]
# Tolerance relative to the output's scale (fp32, different summation orders).
RTOL = 1e-4


def _compare(name: str) -> None:
    ort = pytest.importorskip("onnxruntime")
    # Seeded random weights: the stored constant weights make every output uniform.
    proto = light_model(name, seed=3)
    model = load_onnx(proto)
    feeds = random_inputs(model, seed=7)
    inputs = [feeds[s.name] for s in model.inputs]
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = sess.run(None, feeds)
    got_cl = build(model.mod, "opencl")(inputs)
    got_cpu = build(model.mod, "cpu")(inputs)
    for cl_out, cpu_out, ref in zip(got_cl, got_cpu, expected):
        scale = max(float(np.max(np.abs(ref))), 1e-6)
        assert np.max(np.abs(cl_out - ref)) <= RTOL * scale + 1e-6
        assert np.max(np.abs(cl_out - cpu_out)) <= RTOL * scale + 1e-6


@pytest.mark.opencl
@pytest.mark.parametrize("name", FAST)
def test_light_model(opencl, name):
    _compare(name)


@pytest.mark.opencl
@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_light_model_slow(opencl, name):
    _compare(name)
