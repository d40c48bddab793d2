"""Choosing the OpenCL platform: ``CODL_OPENCL_PLATFORM`` by part of a platform's name or
vendor, or by the short names people use (``pocl`` for Portable Computing Language), and
``codl-tvm info`` listing every platform it did not use with the reason, as text by default.

Each case runs ``codl-tvm info`` in a fresh interpreter (a process chooses its platform once).
"""

from __future__ import annotations

import json

import pytest

from codl_tvm.cli.run import info_lines
from codl_tvm.runtime import DeviceInfo, OpenCLInfo
from tests.test_errors import codl_tvm

POCL = "Portable Computing Language"


def _info(choice: str) -> dict | None:
    """``codl-tvm info --json`` with ``CODL_OPENCL_PLATFORM=choice``; None when it fails."""
    proc = codl_tvm("info", "--json", env={"CODL_OPENCL_PLATFORM": choice})
    return json.loads(proc.stdout) if proc.returncode == 0 else None


@pytest.fixture(scope="module")
def pocl() -> dict:
    shown = _info("portable computing")
    if shown is None or shown["platform"] != POCL:
        pytest.skip("PoCL is not installed here")
    return shown


@pytest.mark.opencl
@pytest.mark.parametrize("choice", ["pocl", "PoCL", "POCL", "the pocl project", "PORTABLE"])
def test_pocl_is_chosen_by_its_short_name_vendor_or_name_in_any_case(pocl, choice):
    shown = _info(choice)
    assert shown is not None and shown["platform"] == POCL


@pytest.mark.opencl
def test_info_lists_the_platforms_never_tried_with_the_reason(pocl):
    """Every platform beside the one used is listed with why it was not used, also those
    that were never tried."""
    default = _info("")
    assert default is not None
    if default["platform"] != POCL:  # PoCL comes after the platform used: never tried
        reason = f"not tried: '{default['platform']}' comes first and is used"
        assert {"platform": POCL, "reason": reason} in default["skipped_platforms"]
    chosen = _info("pocl")
    others = {s["platform"]: s["reason"] for s in chosen["skipped_platforms"]}
    if default["platform"] != POCL:
        assert others[default["platform"]] == "not tried: not the platform asked for ('pocl')"


@pytest.mark.opencl
def test_info_prints_text_by_default(opencl):
    # the platform a fresh process chooses (this one's may have been chosen by another test)
    shown = _info("")
    proc = codl_tvm("info")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith(f"platform: {shown['platform']} (")
    assert f"device 0: {shown['devices'][0]['name']}" in proc.stdout
    assert "platforms not used" in proc.stdout
    assert not proc.stdout.lstrip().startswith("{")


def test_info_text_names_each_skipped_platform_and_its_reason():
    dev = DeviceInfo(
        index=0,
        name="Mali-G78",
        vendor="ARM",
        version="OpenCL 3.0",
        driver_version="v1.r38",
        opencl_c_version="OpenCL C 3.0 ",
        compute_units=24,
        max_clock_mhz=848,
        global_mem_bytes=8 << 30,
        local_mem_bytes=32 << 10,
        max_work_group_size=1024,
        svm_fine_grain=False,
        svm_coarse_grain=True,
        svm_atomics=False,
        fp16=True,
    )
    info = OpenCLInfo(
        platform="ARM Platform",
        platform_version="OpenCL 3.0",
        platform_vendor="ARM",
        svm_mode="coarse",
        svm_atomics=False,
        devices=(dev,),
        skipped_platforms=(
            {"platform": POCL, "reason": "not tried: 'ARM Platform' comes first and is used"},
        ),
    )
    assert info_lines(info) == [
        "platform: ARM Platform (ARM; OpenCL 3.0)",
        "memory:   coarse-grained SVM (mapped around GPU use)",
        "device 0: Mali-G78 (ARM)",
        "  24 compute units, 848 MHz, 8.0 GiB global and 32.0 KiB local memory, work groups "
        "up to 1024",
        "  OpenCL C 3.0, driver v1.r38; SVM: coarse; fp16: yes",
        "platforms not used (CODL_OPENCL_PLATFORM picks another):",
        f"  {POCL}: not tried: 'ARM Platform' comes first and is used",
    ]
