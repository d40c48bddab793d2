"""``codl-tvm run ARTIFACT --inputs X --check`` checks the outputs for the user's inputs against
the unpartitioned model built for this CPU (the artifact's stored reference holds its own inputs
only), and says in one line when it cannot.
"""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from codl_tvm.build.runner import build, max_abs_difference
from codl_tvm.cli import main
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.frontend.models import bundled_model_path
from codl_tvm.runtime.artifact import load_artifact


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """A CPU artifact of a copy of the bundled CNN (the copy can be taken away)."""
    root = tmp_path_factory.mktemp("check")
    model = root / "cnn.onnx"
    shutil.copy(bundled_model_path(), model)
    art = root / "art"
    assert main(["compile", str(model), "-o", str(art), "--device", "cpu"]) == 0
    return model, art


def test_check_with_user_inputs_compares_with_the_unpartitioned_build(artifact, tmp_path, capsys):
    model_path, art = artifact
    model = load_onnx(model_path)
    inputs = random_inputs(model, seed=7)  # not the reference's inputs (seed 0)
    x = tmp_path / "x.npz"
    np.savez(x, **inputs)
    out = tmp_path / "y.npz"
    capsys.readouterr()
    assert main(["run", str(art), "--inputs", str(x), "--check", "--save-outputs", str(out)]) == 0
    printed = capsys.readouterr().out
    m = re.search(r"against the reference \(unpartitioned, host CPU\): (\S+) -> OK", printed)
    assert m, printed
    # the printed difference is the artifact's outputs against an independent CPU build
    with np.load(out) as saved:
        outputs = [saved[spec.name] for spec in model.outputs]
    ref = build(model.mod, "cpu")([inputs[spec.name] for spec in model.inputs])
    assert float(m[1]) == pytest.approx(max_abs_difference(outputs, ref), abs=1e-6)
    stored_inputs, _ = load_artifact(art).reference()
    assert not np.array_equal(stored_inputs[model.inputs[0].name], inputs[model.inputs[0].name])


def test_check_with_user_inputs_says_why_it_cannot_without_the_model(artifact, tmp_path, capsys):
    model_path, art = artifact
    x = tmp_path / "x.npz"
    np.savez(x, **random_inputs(load_onnx(model_path), seed=1))
    moved = tmp_path / "elsewhere.onnx"
    shutil.move(model_path, moved)
    try:
        assert main(["run", str(art), "--inputs", str(x), "--check"]) == 2
    finally:
        shutil.move(moved, model_path)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--check with --inputs builds the unpartitioned model from" in err
    assert "stored reference inputs" in err
