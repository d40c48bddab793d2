"""scripts/profile_campaign.py --only: a campaign of one operator kind on one processor (to
measure a kernel again after it changed), compiled for real."""

from __future__ import annotations

import json

import pytest

from tests.scripts_util import script_module


@pytest.fixture(scope="module")
def campaign():
    with script_module("profile_campaign") as module:
        yield module


def test_only_keeps_one_group(campaign, tmp_path):
    out = tmp_path / "prof"
    argv = ["--preset", "opencl", "--threads", "2", "--models", "codl_small_cnn"]
    argv += ["--model-ratios", "0.5", "--out", str(out)]
    assert campaign.main([*argv, "--only", "dense:gpu"]) == 0
    parts = json.loads((out / "manifest.json").read_text())["parts"]
    # the bundled CNN's one dense layer: whole and its OC half, on the GPU only
    assert sorted((p["op"], p["processor"], p["partition"]["dim"]) for p in parts) == [
        ("dense", "gpu", "OC"),
        ("dense", "gpu", "none"),
    ]
    assert all((out / p["library"]).is_file() for p in parts)
    assert (tmp_path / "prof.tar.xz").is_file()
    with pytest.raises(SystemExit, match="expected conv2d"):
        campaign.main([*argv, "--only", "dense"])
