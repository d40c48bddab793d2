"""A cost model's stored uncertainty: leave-one-model-out error, data ranges, the split margin.

Records are synthetic (``codl_tvm.cost_model.synthetic``: an imaginary device pair), named after
made-up benchmark models so that leave-one-model-out folds exist; nothing is measured.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from codl_tvm.cost_model import CodlModel, OpParams, OpRecord, load_model, save_dataset
from codl_tvm.cost_model.assessment import model_of, refit_like
from codl_tvm.cost_model.evaluate import training_split
from codl_tvm.cost_model.synthetic import SyntheticDevice, synthetic_records
from codl_tvm.cost_model.uncertainty import (
    MIN_KIND_SAMPLES,
    DataRanges,
    ErrorStats,
    LomoError,
    compute_lomo_error,
    kernel_key,
    op_class,
    relative_errors,
    split_margin,
    uncertainty_of,
)
from tests.test_cost_model import run_cli

MODELS = ("mA", "mB", "mC")


def named_records(seed: int = 0) -> list:
    """Synthetic records, the operator records named ``MODEL/op_i`` taking turns."""
    out = []
    for i, r in enumerate(synthetic_records(SyntheticDevice(gpu_gflops=40.0), 40, seed)):
        if isinstance(r, OpRecord):
            r = dataclasses.replace(r, name=f"{MODELS[i % 3]}/op_{i}")
        out.append(r)
    return out


@pytest.fixture(scope="module")
def records():
    return named_records()


@pytest.fixture(scope="module")
def fitted(records):
    return CodlModel("pocl-local").fit(records)


def test_op_class_separates_kernels_of_different_costs():
    assert op_class(OpParams("conv2d", 8, 8, 16, 32, 3, 1, 1)) == "conv2d"
    assert op_class(OpParams("conv2d", 8, 8, 16, 16, 3, 1, 1, groups=16)) == "conv2d-depthwise"
    assert op_class(OpParams("conv2d", 8, 8, 16, 32, 3, 1, 1, groups=4)) == "conv2d-grouped"
    assert op_class(OpParams("conv2d", 9, 9, 16, 32, 3, 1, 2, dilation=2)) == "conv2d-dilated"
    assert op_class(OpParams("dense", 1, 1, 64, 10)) == "dense"
    p = OpParams("pool", 8, 8, 16, 16, 2, 2)
    assert kernel_key(p, "gpu", "pool") == "pool/gpu/pool"


def test_lomo_error_is_the_held_out_error_of_each_fold(records, fitted):
    error = compute_lomo_error(fitted, records)
    assert error.models == MODELS and error.quantiles == (0.8, 0.9)
    # recomputed by hand: each model's records predicted by the recipe fitted without them
    errs, held = [], []
    for name in MODELS:
        mine = [r for r in records if isinstance(r, OpRecord) and model_of(r) == name]
        rest = [r for r in records if not (isinstance(r, OpRecord) and model_of(r) == name)]
        rest, _, _ = training_split(rest, 0.0, 0, 3.0)
        errs.append(relative_errors(refit_like(fitted, rest), mine))
        held += mine
    errs = np.concatenate(errs)
    for proc in ("cpu", "gpu"):
        for role in ("whole", "split", "all"):
            sel = np.array(
                [
                    r.processor == proc
                    and (role == "all" or (r.partition.dim == "none") == (role == "whole"))
                    for r in held
                ]
            )
            s = error.processors[proc][role]
            assert s.n == sel.sum() > 0
            assert s.quantiles["p80"] == pytest.approx(np.quantile(errs[sel], 0.8))
            assert s.quantiles["p80"] <= s.quantiles["p90"]
    assert sum(s["all"].n for s in error.by_kind.values()) == len(held)
    # a JSON round trip keeps every number
    again = LomoError.from_json(json.loads(json.dumps(error.to_json())))
    assert again == error


def test_error_lookup_falls_back_to_the_processor_for_small_kernels():
    p = OpParams("conv2d", 8, 8, 16, 32, 3, 1, 1)
    few = ErrorStats(MIN_KIND_SAMPLES - 1, {"p80": 0.9, "p90": 1.0})
    many = ErrorStats(MIN_KIND_SAMPLES, {"p80": 0.3, "p90": 0.4})
    proc = ErrorStats(500, {"p80": 0.2, "p90": 0.25})
    error = LomoError(
        (0.8, 0.9),
        {"cpu": {"whole": proc, "split": proc}, "gpu": {"whole": proc, "split": proc}},
        {"conv2d/cpu/direct": {"whole": many, "split": few}},
        ("a", "b"),
    )
    assert error.error(p, "cpu", "direct", "whole", 0.8) == (0.3, "conv2d/cpu/direct whole")
    assert error.error(p, "cpu", "direct", "split", 0.9) == (0.25, "cpu split")
    with pytest.raises(ValueError, match="not stored"):
        error.error(p, "cpu", "direct", "whole", 0.5)
    # the margin: the larger of the whole's and the split's expected error, in ms
    m = split_margin(error, p, {"cpu": "direct", "gpu": "direct"}, "cpu", 2.0, 1.5, 0.8)
    assert m.margin_ms == pytest.approx(max(0.3 * 2.0, 0.2 * 1.5)) and m.error == 0.3
    assert "(LOMO error 30%, p80 of conv2d/cpu/direct whole parts)" in m.describe()


def test_data_ranges_name_what_is_novel(records):
    ranges = DataRanges.of(records)
    assert set(ranges.classes) >= {"conv2d", "dense", "pool"}
    lo, hi = ranges.classes["conv2d"]["ic"]
    inside = OpParams("conv2d", 16, 16, lo, 8, 3, 1, 1)
    assert ranges.novelty(inside) == []
    big = OpParams("conv2d", 16, 16, hi * 4, 8, 3, 1, 1)
    assert ranges.novelty(big) == [f"ic={hi * 4} outside the data's {lo}-{hi}"]
    dilated = OpParams("conv2d", 16, 16, 16, 8, 3, 1, 2, dilation=2)
    assert ranges.novelty(dilated) == ["no conv2d-dilated operator in the cost model's data"]
    assert DataRanges.from_json(json.loads(json.dumps(ranges.to_json()))) == ranges


def test_cli_lomo_writes_only_the_meta(tmp_path, records, fitted, capsys):
    data = tmp_path / "d.jsonl"
    save_dataset(records, data)
    path = tmp_path / "m.json"
    fitted.meta["dataset"] = str(data)
    fitted.save(path)
    before = json.loads(path.read_text())
    assert run_cli(["cost-model", "lomo", str(path)]) == 0  # meta.dataset by default
    assert "leave-one-model-out relative error" in capsys.readouterr().out
    assert json.loads(path.read_text()) == before  # no --write: unchanged
    assert run_cli(["cost-model", "lomo", str(path), str(data), "--write"]) == 0
    after = json.loads(path.read_text())
    meta = after.pop("meta")
    assert after == {k: v for k, v in before.items() if k != "meta"}
    lomo, ranges = uncertainty_of(load_model(path))
    assert lomo == compute_lomo_error(fitted, records)
    assert ranges == DataRanges.of(records)
    assert set(meta) == {*before["meta"], "lomo_error", "data_ranges"}
    assert not math.isnan(lomo.processors["gpu"]["split"].quantiles["p90"])
