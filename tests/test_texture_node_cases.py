"""ONNX's conv and pool node cases on OpenCL images (codl_tvm.build.node_tests, the
``opencl-image`` path; docs/onnx-node-tests.md, "On images").

No node case as generated reaches an image (one output channel per conv, pools straight on the
graph input), so each runs as its :func:`~codl_tvm.build.node_tests.image_variant`: channels
widened to whole pixels, expected outputs derived exactly from ONNX's. Each variant must build
with image kernels and equal ONNX's expected outputs (the case's tolerances) and onnxruntime's
within rtol 1e-4: an image build that computes wrong numbers fails here. The whole selection:
``scripts/onnx_node_report.py run --gpu-data-type image``.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from codl_tvm.build.node_tests import (
    IMAGE_PATH,
    IMAGE_VARIANT_SUFFIX,
    MISMATCH,
    NOT_APPLICABLE,
    PASS,
    NodeCase,
    image_variant,
    node_cases,
    run_case,
)

# Padding, strides with asymmetric pads, a pool window past the edge with ceil_mode, average
# pools counting pads or not, a global pool: the texture schedules' edge handling. Each with
# the kernel of its operator that must read or write an image.
CASES = {
    "test_basic_conv_with_padding": "conv2d_NCHWc_OIHWo",
    "test_conv_with_strides_and_asymmetric_padding": "conv2d_NCHWc_OIHWo",
    "test_maxpool_2d_same_upper": "max_pool2d_opencl",
    "test_averagepool_2d_pads_count_include_pad": "avg_pool2d_opencl",
    "test_averagepool_2d_ceil_last_window_starts_on_pad": "avg_pool2d_opencl",
    "test_globalaveragepool": "adaptive_avg_pool2d_opencl",
}


@pytest.mark.opencl
@pytest.mark.parametrize("name", sorted(CASES))
def test_node_case_on_images(opencl, name):
    case = image_variant(node_cases([name])[0])
    assert case is not None and case.name == name + IMAGE_VARIANT_SUFFIX
    result = run_case(case, (IMAGE_PATH,))
    assert result.imported.outcome == PASS, result.imported
    res = result.paths[IMAGE_PATH]
    assert res.outcome == PASS, res
    # the operator itself ran on images, not only the conversions around it
    images = res.detail.split(";")[0].removeprefix("image kernels: ").split(", ")
    assert CASES[name] in images, res.detail


@pytest.mark.opencl
def test_case_as_generated_is_not_on_images(opencl):
    # one output channel: the texture layout covers no kernel, which is n/a, not a failure
    result = run_case(node_cases(["test_basic_conv_with_padding"])[0], (IMAGE_PATH,))
    assert result.paths[IMAGE_PATH].outcome == NOT_APPLICABLE


@pytest.mark.opencl
def test_wrong_numbers_on_images_fail(opencl):
    # the image build's outputs against expected ones 1% off: the comparison must catch it
    # (not only report the build as one with image kernels)
    case = image_variant(node_cases(["test_maxpool_2d_same_upper"])[0])
    assert case is not None
    off = case.expected[0] * np.float32(1.01)
    wrong = NodeCase(case.name, case.op_type, case.model, case.inputs, (off,), case.rtol, case.atol)
    assert run_case(wrong, (IMAGE_PATH,)).paths[IMAGE_PATH].outcome == MISMATCH


def test_variant_expected_outputs_follow_the_case():
    conv = node_cases(["test_basic_conv_with_padding"])[0]
    wide = image_variant(conv)
    assert wide is not None
    # weights widened to 4 output channels, now constants; only the data input is left
    assert len(wide.inputs) == 1 and len(wide.model.graph.initializer) == 1
    assert wide.expected[0].shape == (1, 4, *conv.expected[0].shape[2:])
    for c in range(4):
        np.testing.assert_array_equal(wide.expected[0][:, c], conv.expected[0][:, 0])
    pool = image_variant(node_cases(["test_maxpool_2d_default"])[0])
    assert pool is not None
    assert [n.op_type for n in pool.model.graph.node] == ["Conv", "MaxPool"]
    onnx.checker.check_model(pool.model, full_check=True)
    # 3-D pools, uint8 inputs, GlobalMaxPool (not packed) and other operators get no variant
    for name in (
        "test_maxpool_3d_default",
        "test_maxpool_2d_uint8",
        "test_globalmaxpool",
        "test_relu",
    ):
        assert image_variant(node_cases([name])[0]) is None
