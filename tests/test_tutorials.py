"""Every tutorial runs to the end (they compare numerics themselves)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"


@pytest.mark.opencl
def test_coexec_quickstart(opencl, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(TUTORIALS / "coexec_quickstart.py"), run_name="__main__")


@pytest.mark.slow
@pytest.mark.rpc
@pytest.mark.opencl  # the tutorial's server loads codl-tvm's OpenCL plugin
def test_deploy_rpc(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(TUTORIALS / "deploy_rpc.py"), run_name="__main__")


@pytest.mark.slow
@pytest.mark.opencl
def test_cost_model_tutorial(opencl, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(TUTORIALS / "cost_model.py"), run_name="__main__")


@pytest.mark.opencl
def test_hope_placement_tutorial(opencl, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(TUTORIALS / "hope_placement.py"), run_name="__main__")


@pytest.mark.opencl
def test_pipeline_stream_tutorial(opencl, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(TUTORIALS / "pipeline_stream.py"), run_name="__main__")


@pytest.mark.opencl
def test_gpu_images_tutorial(opencl, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(TUTORIALS / "gpu_images.py"), run_name="__main__")
