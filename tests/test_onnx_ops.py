"""ONNX operator test cases run on OpenCL through the codl-tvm runtime, against ONNX's stored
expected outputs (and the same model built for TVM's CPU path)."""

from __future__ import annotations

import numpy as np
import pytest

from codl_tvm.build.runner import build
from codl_tvm.frontend.importer import load_onnx
from tests.onnx_data import DATA, case_dir, load_case

CONVERTED = sorted(
    p.name
    for p in (DATA / "pytorch-converted").iterdir()
    if p.name.startswith(("test_Conv2d", "test_MaxPool2d", "test_AvgPool2d", "test_Linear"))
    or p.name in ("test_BatchNorm2d_eval", "test_BatchNorm2d_momentum_eval", "test_ReLU")
)
OPERATORS = [
    "test_operator_conv",
    "test_operator_maxpool",
    "test_operator_addmm",
    "test_operator_mm",
    "test_operator_clip",
    "test_operator_add_broadcast",
    "test_operator_add_size1_broadcast",
    "test_operator_addconstant",
    "test_operator_basic",
    "test_operator_flatten",
    "test_operator_concat2",
    "test_operator_reduced_mean",
    "test_operator_params",
    "test_operator_view",
]
# fp32 kernels with a different summation order than PyTorch's.
RTOL, ATOL = 1e-4, 1e-5


def _run_case(group: str, name: str, device: str) -> None:
    model_proto, inputs, expected = load_case(case_dir(group, name))
    model = load_onnx(model_proto)
    assert len(model.inputs) == len(inputs)
    outputs = build(model.mod, device)(inputs)
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(
            got, want.reshape(got.shape) if want.size == got.size else want, rtol=RTOL, atol=ATOL
        )


def test_case_lists_are_complete():
    # The acceptance list names these families; losing one from the data would be silent.
    names = set(CONVERTED)
    for required in (
        "test_Conv2d",
        "test_Conv2d_depthwise",
        "test_Conv2d_groups",
        "test_Conv2d_dilated",
        "test_Conv2d_strided",
        "test_MaxPool2d",
        "test_AvgPool2d",
        "test_Linear",
        "test_BatchNorm2d_eval",
        "test_ReLU",
    ):
        assert required in names


@pytest.mark.opencl
@pytest.mark.parametrize("name", CONVERTED)
def test_pytorch_converted_on_opencl(opencl, name):
    _run_case("pytorch-converted", name, "opencl")


@pytest.mark.opencl
@pytest.mark.parametrize("name", OPERATORS)
def test_pytorch_operator_on_opencl(opencl, name):
    _run_case("pytorch-operator", name, "opencl")


@pytest.mark.parametrize("name", ["test_Conv2d_groups", "test_MaxPool2d", "test_Linear"])
def test_pytorch_converted_on_cpu(name):
    _run_case("pytorch-converted", name, "cpu")
