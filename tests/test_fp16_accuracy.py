"""The error metrics of ``scripts/fp16_accuracy.py`` (pure functions; no build, no device)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.scripts_util import script_module


@pytest.fixture(scope="module")
def fp16():
    with script_module("fp16_accuracy") as module:
        yield module


def test_classifier_outputs(fp16):
    assert fp16.is_classifier_output((1, 1000))
    assert fp16.is_classifier_output((1, 1000, 1, 1))
    assert not fp16.is_classifier_output((1, 16, 7, 7))  # a feature map
    assert not fp16.is_classifier_output((1, 4))  # too few classes to rank


def test_errors_of_a_close_classifier_output(fp16):
    want = np.zeros((1, 12), dtype=np.float32)
    want[0, :6] = [8.0, 7.0, 6.0, 5.0, 4.0, 3.0]
    got = want.copy()
    got[0, 5] = 4.5  # the 5th and 6th swap places: top-1 kept, 4 of the top five
    row = fp16.output_errors(got, want)
    assert row["max_abs_error"] == pytest.approx(1.5)
    assert row["ref_max_abs"] == 8.0
    assert row["max_rel_error"] == pytest.approx(1.5 / 8.0)
    assert row["top1_match"] and row["top5_overlap"] == 4
    # 1.5 > 5% of max(1, 8): outside run --check's float16 tolerance
    assert not row["within_check_tolerance"] and row["finite"]


def test_errors_of_a_feature_map(fp16):
    want = np.full((1, 2, 3, 3), 0.5, dtype=np.float32)
    got = want + np.float32(0.01)
    row = fp16.output_errors(got, want)
    # the tolerance scale is max(1, largest magnitude): 0.01 <= 0.05
    assert row["within_check_tolerance"]
    assert row["max_rel_error"] == pytest.approx(0.02, rel=1e-5)
    assert "top1_match" not in row


def test_non_finite_outputs_are_infinitely_wrong(fp16):
    want = np.ones((1, 3), dtype=np.float32)
    got = np.array([[1.0, np.nan, 1.0]], dtype=np.float32)
    row = fp16.output_errors(got, want)
    assert not row["finite"] and math.isinf(row["max_abs_error"])
    assert not row["within_check_tolerance"]
    zeros = np.zeros((1, 3), dtype=np.float32)
    assert fp16.output_errors(zeros, zeros)["max_rel_error"] == 0.0
    assert math.isinf(fp16.output_errors(zeros + 1, zeros)["max_rel_error"])


def test_shapes_must_match(fp16):
    with pytest.raises(ValueError, match="shape"):
        fp16.output_errors(np.zeros((1, 3)), np.zeros((1, 4)))


def test_combine_keeps_the_worst(fp16):
    rows = [
        {"max_abs_error": 0.1, "max_rel_error": 0.01, "within_check_tolerance": True,
         "finite": True, "top1_match": True, "top5_overlap": 5},
        {"max_abs_error": 0.3, "max_rel_error": 0.02, "within_check_tolerance": False,
         "finite": True, "top1_match": False, "top5_overlap": 3},
    ]  # fmt: skip
    summary = fp16.combine(rows)
    assert summary == {
        "max_abs_error": 0.3,
        "max_rel_error": 0.02,
        "within_check_tolerance": False,
        "finite": True,
        "top1_agree": 1,
        "top1_of": 2,
        "top5_min_overlap": 3,
    }
    feature_map = {k: v for k, v in rows[0].items() if k not in ("top1_match", "top5_overlap")}
    assert "top1_agree" not in fp16.combine([feature_map])
    with pytest.raises(ValueError, match="rows"):
        fp16.combine([])
