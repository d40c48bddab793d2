"""One plan resolution for ``compile`` and ``run --plan auto``
(:func:`codl_tvm.planner.policy.resolve_plan`): a model that ``compile`` keeps on one processor
(the plan's predicted gain is under ``MIN_PREDICTED_SPEEDUP``) is run on that processor by
``run --plan auto`` too, with the same numerics.

The cost models are fitted on synthetic records (``codl_tvm.cost_model.synthetic``), so the
planner's decisions do not depend on this machine's speed.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from codl_tvm.cli import main
from codl_tvm.core.errors import PlannerError
from codl_tvm.cost_model.synthetic import SyntheticDevice, synthetic_cost_model
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.frontend.models import bundled_model_path
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.options import CompileOptions
from codl_tvm.planner.policy import MIN_PREDICTED_SPEEDUP, resolve_plan
from codl_tvm.runtime.artifact import load_artifact

pytestmark = pytest.mark.opencl


@pytest.fixture(scope="module")
def marginal_model(tmp_path_factory):
    """A GPU five times faster than the CPU: the planner still gives the CPU a tenth of some
    operators, for a predicted gain under the co-execution threshold."""
    path = tmp_path_factory.mktemp("cm") / "marginal.json"
    device = SyntheticDevice(cpu_gflops=8.0, gpu_gflops=40.0, share_ms_per_mb=0.05)
    synthetic_cost_model(device).save(path)
    return path


def test_resolve_plan_falls_back_under_the_threshold(marginal_model):
    mod = load_onnx(bundled_model_path()).mod
    choice = resolve_plan(mod, cost_model=marginal_model)
    s = choice.report.summary
    assert any(0.0 < e.ratio < 1.0 for e in choice.plan.entries())  # the plan does split
    assert s.predicted_ms < s.gpu_only_ms < s.predicted_ms * MIN_PREDICTED_SPEEDUP
    assert choice.device == "opencl" and "co-execution needs a predicted" in choice.reason


def test_run_plan_auto_runs_where_compile_builds(marginal_model, tmp_path, capsys):
    """``compile`` builds the GPU alone; ``run --plan auto`` with the same cost model runs the
    GPU alone too (it co-executed before), and both match the unpartitioned model."""
    out = tmp_path / "art"
    # unmeasured: the prediction's choice, which run --plan auto shares
    options = CompileOptions(cost_model=marginal_model, measure=False)
    compile_artifact(bundled_model_path(), out, options)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["device"] == "opencl"
    saved = tmp_path / "run.npz"
    argv = ["run", "--device", "coexec", "--plan", "auto", "--cost-model", str(marginal_model)]
    argv += ["--save-outputs", str(saved), "--number", "1", "--repeat", "1"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"not co-executing: {manifest['plan']['fallback']}" in text
    assert "device: opencl" in text and "device: coexec" not in text
    _, expected = load_artifact(out).reference()
    model = load_onnx(bundled_model_path())
    with np.load(saved) as got:
        for spec, want in zip(model.outputs, expected):
            np.testing.assert_allclose(got[spec.name], want, rtol=1e-4, atol=1e-5)


def test_given_and_uniform_plans_follow_the_same_rule():
    """A plan that keeps every operator whole on one processor runs there, whichever way it
    was given; a split plan co-executes; a plan and --dim/--ratio together are refused."""
    mod = load_onnx(bundled_model_path()).mod
    assert resolve_plan(mod, dim="OC", ratio=0.0).device == "cpu"
    assert resolve_plan(mod, dim="H", ratio=1.0).device == "opencl"
    split = resolve_plan(mod, dim="H", ratio=0.5)
    assert split.device == "coexec" and split.reason is None and split.source == "uniform"
    given = resolve_plan(mod, plan=split.plan)
    assert given.source == "given" and given.plan.to_json() == split.plan.to_json()
    with pytest.raises(PlannerError, match="not both"):
        resolve_plan(mod, plan=split.plan, ratio=0.5)
    with pytest.raises(PlannerError, match="planner mode 'fastest'"):
        resolve_plan(mod, mode="fastest")
