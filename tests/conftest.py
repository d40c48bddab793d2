"""Shared pytest configuration: markers, the slow-test switch and the OpenCL fixture."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--runslow", action="store_true", default=False, help="also run tests marked slow"
    )


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow") or os.environ.get("CODL_TVM_RUNSLOW") == "1":
        return
    skip_slow = pytest.mark.skip(reason="slow: run with --runslow or CODL_TVM_RUNSLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


@pytest.fixture(scope="session")
def opencl():
    """The loaded OpenCL runtime; fails (never skips) when no OpenCL device works.

    CI installs a CPU OpenCL device from PyPI, so a missing device is a real failure. Set
    CODL_TVM_ALLOW_NO_OPENCL=1 to skip instead on machines without one.
    """
    from codl_tvm import runtime

    try:
        runtime.load()
        info = runtime.info()
    except Exception as exc:
        if os.environ.get("CODL_TVM_ALLOW_NO_OPENCL") == "1":
            pytest.skip(f"no usable OpenCL device: {exc}")
        raise
    return info
