"""The built wheel holds every data file the package reads at run time.

An editable install reads them from the source tree, so a missing ``package-data`` pattern only
shows after ``pip install .`` (the README's first command): the shipped cost models were once
left out that way and ``codl-tvm demo`` failed on a fresh machine.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from codl_tvm.cost_model.defaults import SHIPPED

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> set[str]:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    # A copy without build/ or *.egg-info: setuptools would reuse files a previous build left.
    src = build / "src"
    anywhere = shutil.ignore_patterns(".git", "*.egg-info", "__pycache__")
    # build outputs and local data at the top only: codl_tvm/build/ is a package
    top = {"build", ".whl", ".device", "out", "results", ".models", ".venv"}

    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = set(anywhere(folder, names))
        return skipped | (top & set(names) if Path(folder) == ROOT else set())

    shutil.copytree(ROOT, src, ignore=ignore)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        cwd=build,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (whl,) = out.glob("codl_tvm-*.whl")
    with zipfile.ZipFile(whl) as zf:
        return set(zf.namelist())


def test_wheel_has_shipped_cost_models(wheel_names):
    for name in SHIPPED:
        assert f"codl_tvm/data/cost_models/{name}.json" in wheel_names


def test_wheel_has_bundled_model_and_plugin_sources(wheel_names):
    assert "codl_tvm/data/codl_small_cnn.onnx" in wheel_names
    for src in (ROOT / "codl_tvm" / "runtime" / "src").iterdir():
        assert f"codl_tvm/runtime/src/{src.name}" in wheel_names


def test_wheel_has_every_package_module(wheel_names):
    # passes/ and schedules/ are mapped into the package by setuptools' package-dir.
    for top, pkg in (
        ("codl_tvm", "codl_tvm"),
        ("passes", "codl_tvm/passes"),
        ("schedules", "codl_tvm/schedules"),
    ):
        for py in (ROOT / top).rglob("*.py"):
            rel = py.relative_to(ROOT / top).as_posix()
            assert f"{pkg}/{rel}" in wheel_names, f"{pkg}/{rel} missing from the wheel"
