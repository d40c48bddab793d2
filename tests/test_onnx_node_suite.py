"""ONNX's backend node tests as a peer suite (codl_tvm.build.node_tests,
docs/onnx-node-tests.md).

Each case runs through codl-tvm's import, CPU build, OpenCL build, co-executed builds (every
conv/pool/matmul split on H, then on OC, where the plan rules allow) and the CPU build with its
constants fetched from a weights file beside the library (``beside``) against ONNX's expected
outputs. The rules:

- a case that imports passes on every path (the CPU build, OpenCL, both co-executed builds and
  the beside build);
- a case that does not import is refused with a :class:`~codl_tvm.core.errors.CodlError`, never a
  crash: either TVM's frontend cannot import it (the message says so), or codl-tvm's own checks
  refuse it for a reason listed in :data:`CODL_REFUSALS`;
- a failure that plain TVM shares is listed in :data:`KNOWN_TVM_FAILURES` with its reason.

A representative subset runs by default (the beside path only on :data:`BESIDE_SUBSET`);
every selected operator's cases on every path with ``--runslow``.
The whole selection with the counts of the docs: ``python scripts/onnx_node_report.py run``.
"""

from __future__ import annotations

import functools

import pytest

from codl_tvm.build.node_tests import (
    NOT_APPLICABLE,
    PASS,
    PATHS,
    REFUSED,
    SELECTED_OPS,
    CaseResult,
    node_cases,
    plain_tvm_status,
    run_case,
)

# Why codl-tvm's own checks refuse a case (a fragment of the message): each guards against a
# crash or a silently wrong result of TVM's. Any other refusal must come from TVM's frontend.
CODL_REFUSALS: dict[str, str] = {
    # axes/shape given as a graph input: output shapes depend on input values (Squeeze,
    # Unsqueeze); codl-tvm's schedules and the OpenCL build crashed on them
    "has no static shape": "static shapes only",
    # TVM imports them with wrong running mean/variance outputs (Y is right)
    "training_mode=1": "TVM's BatchNormalization training outputs are wrong",
    "zero-sized dimension": "empty tensors",
    # TVM's Resize ignores antialias, cannot build half_pixel_symmetric, and maps coordinates
    # by the size ratio where ONNX uses a scale that gives a fractional size
    "antialias=1": "TVM ignores Resize antialias",
    "half_pixel_symmetric": "TVM cannot build it",
    "give a fractional output size": "TVM's Resize coordinates differ from ONNX's",
}
TVM_REFUSAL = "TVM's ONNX frontend cannot import"

# Cases that import and fail on some path in plain TVM the same way (``plain_tvm_status``);
# each entry flips (the test fails) once the path passes, so it can be removed.
KNOWN_TVM_FAILURES: dict[str, dict[str, str]] = {
    # OpenCL C contracts a*b-c into an fma (FP_CONTRACT is on by default); the source coordinate
    # of a nearest-neighbour pixel then lands a rounding error above a whole number and ceil()
    # picks the next pixel. TVM's plain OpenCL build does the same.
    "test_resize_upsample_sizes_nearest_initializers": {"opencl": "fma contraction in OpenCL"},
}

# About thirty cases across the operator families, the co-executed ones (conv, pool, gemm,
# matmul) first; with the cases that found bugs (int16 inputs, a 0-d Gemm bias, a 1-D MatMul
# operand, SpaceToDepth CRD, training-mode batch norm, axes inputs, an empty tensor).
SUBSET = [
    "test_basic_conv_with_padding",
    "test_conv_with_strides_and_asymmetric_padding",
    "test_conv_with_autopad_same",
    "test_averagepool_2d_pads_count_include_pad",
    "test_averagepool_2d_ceil",
    "test_maxpool_2d_dilations",
    "test_maxpool_2d_same_lower",
    "test_globalaveragepool",
    "test_gemm_all_attributes",
    "test_gemm_default_scalar_bias",
    "test_matmul_2d",
    "test_matmul_4d",
    "test_matmul_1d_3d",
    "test_add_bcast",
    "test_add_uint16",
    "test_prelu_broadcast",
    "test_clip_splitbounds",
    "test_max_example",
    "test_hardswish",
    "test_softmax_axis_1",
    "test_concat_3d_axis_negative_2",
    "test_batchnorm_epsilon",
    "test_batchnorm_example_training_mode",
    "test_instancenorm_example",
    "test_lrn",
    "test_flatten_axis2",
    "test_transpose_all_permutations_3",
    "test_unsqueeze_axis_1",
    "test_reshape_allowzero_reordered",
    "test_resize_upsample_scales_nearest",
    "test_resize_downsample_scales_linear_initializers",
    "test_resize_downsample_sizes_linear_antialias_initializers",
    "test_resize_upsample_scales_linear_half_pixel_symmetric_initializers",
    "test_resize_upsample_sizes_nearest_initializers",
    "test_reshape_negative_dim_initializers",
    "test_spacetodepth_crd_mode_example",
    "test_depthtospace_crd_mode_example",
]


# The subset's cases that take the beside path by default: the only ones whose CPU build keeps
# a constant to fetch (Clip's 0-d bounds; a 0-d weight came back 1-d from the weights file).
# Every other subset case's constants fold into its kernels, so its beside build is its CPU
# build; the slow run takes the beside path on every case all the same.
BESIDE_SUBSET = {"test_clip_splitbounds"}
WITHOUT_BESIDE = tuple(p for p in PATHS if p != "beside")


@functools.cache
def _result(name: str, paths: tuple[str, ...] = PATHS) -> CaseResult:
    # the subset and the slow run share a session's builds of a case
    return run_case(node_cases([name])[0], paths)


def _check(name: str, paths: tuple[str, ...] = PATHS) -> None:
    result = _result(name, paths)
    imported = result.imported
    if imported.outcome != PASS:
        assert imported.outcome == REFUSED, (
            f"{name}: import crashed with {imported.error_type}: {imported.detail}"
        )
        reasons = [TVM_REFUSAL, *CODL_REFUSALS]
        assert any(r in imported.detail for r in reasons), (
            f"{name}: refused for a reason neither TVM's frontend nor in CODL_REFUSALS: "
            f"{imported.detail}"
        )
        return
    known = KNOWN_TVM_FAILURES.get(name, {})
    failures = {
        path: f"{r.outcome} {r.error_type} {r.detail}".strip()
        for path, r in result.paths.items()
        if r.outcome not in (PASS, NOT_APPLICABLE) and path not in known
    }
    assert not failures, f"{name}: {failures}"
    case = node_cases([name])[0]
    for path in known:
        assert result.paths[path].outcome != PASS, f"{name} passes on {path} now: unlist it"
        assert plain_tvm_status(case, path).outcome != PASS, f"{name}: plain TVM passes {path}"


@pytest.mark.opencl
@pytest.mark.parametrize("name", SUBSET)
def test_node_case(opencl, name):
    _check(name, PATHS if name in BESIDE_SUBSET else WITHOUT_BESIDE)


@pytest.mark.opencl
@pytest.mark.slow
@pytest.mark.parametrize("op_type", SELECTED_OPS)
def test_node_cases_of_operator(opencl, op_type):
    names = [c.name for c in node_cases() if c.op_type == op_type]
    assert names, f"no ONNX node case of {op_type}"
    errors = []
    for name in names:
        try:
            _check(name)
        except AssertionError as exc:
            errors.append(str(exc).splitlines()[0])
    assert not errors, "\n".join(errors)


def test_selection_covers_every_family():
    cases = node_cases()
    assert {c.op_type for c in cases} == set(SELECTED_OPS)
    assert set(SUBSET) <= {c.name for c in cases}
    assert BESIDE_SUBSET <= set(SUBSET)
    assert set(KNOWN_TVM_FAILURES) <= {c.name for c in cases}
