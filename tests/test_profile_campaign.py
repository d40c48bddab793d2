"""scripts/profile_campaign.py --only: a campaign of one operator kind on one processor (to
measure a kernel again after it changed), compiled for real."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def campaign():
    path = ROOT / "scripts" / "profile_campaign.py"
    spec = importlib.util.spec_from_file_location("profile_campaign", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["profile_campaign"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("profile_campaign", None)


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
