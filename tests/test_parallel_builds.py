"""A compile that measures builds each processor alone in worker processes while it plans and
builds the co-executed library, and drops a candidate that fails in one warning line.

The failing candidates fail for real: their builds run TVM's compiler and linker for the
preset's OpenCL device with host code for another architecture, which this machine's linker
refuses. The build function is swapped in the compile's process and, pickled by reference,
in its workers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time

import pytest

from codl_tvm.build import cache
from codl_tvm.build.cache import BuildSpec, build_library
from codl_tvm.build.parallel import BackgroundBuilds, BuildJob
from codl_tvm.build.targets import get_preset
from codl_tvm.cli import bundled_model_path
from codl_tvm.core.errors import ArtifactError
from codl_tvm.cost_model.synthetic import SyntheticDevice, synthetic_cost_model
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.objectives.verify import error_summary, operator_named
from codl_tvm.options import CompileOptions
from codl_tvm.runtime.artifact import file_sha256

#: Host code for another architecture: this machine's linker refuses the object files.
_OTHER_HOST = {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}


def _for_another_host(path, spec, mod, preset, failing=("opencl", "coexec")):
    """The real build, with the devices in ``failing`` built with their host code for aarch64:
    TVM compiles them and the link fails."""
    if spec.device in failing:
        preset = dataclasses.replace(preset, cpu=_OTHER_HOST, native=False)
    return build_library(path, spec, mod, preset)


def _nothing_links(path, spec, mod, preset):
    return _for_another_host(path, spec, mod, preset, failing=("cpu", "opencl", "coexec"))


def _sleep(path, spec, mod, preset):
    time.sleep(600)


def _touch(path, spec, mod, preset):
    path.write_bytes(b"")
    return None, None


def test_the_operator_an_error_names():
    ir = "Did you forget to bind?\n@T.prim_func\ndef fused_conv2d_add_relu(x: T.handle):\n ..."
    assert operator_named(ir) == "fused_conv2d_add_relu"
    assert operator_named("CL_INVALID_WORK_GROUP_SIZE in kernel 'max_pool2d_kernel'") == (
        "max_pool2d_kernel"
    )
    assert operator_named("ld returned 1 exit status") is None
    link = "Compilation error:\n/usr/bin/ld: a.o: Relocations\n/usr/bin/ld: error adding symbols"
    assert error_summary(link) == "Compilation error: /usr/bin/ld: error adding symbols"


@pytest.mark.slow
@pytest.mark.opencl
def test_default_compile_builds_each_processor_alone_in_a_worker(
    tmp_path, opencl, caplog, monkeypatch
):
    """The two builds for one processor come from a worker (one, even on a 2-core machine),
    the co-executed one from the compile; the measurement is what it was."""
    monkeypatch.setattr(cache, "default_workers", lambda jobs: 1)
    synthetic_cost_model(SyntheticDevice()).save(tmp_path / "balanced.json")
    out = tmp_path / "art"
    with caplog.at_level(logging.INFO):
        compile_artifact(
            bundled_model_path(), out, CompileOptions(cost_model=tmp_path / "balanced.json")
        )
    measured = json.loads((out / "manifest.json").read_text())["verify"]
    assert set(measured["median_ms"]) == {"cpu", "opencl", "coexec"}
    assert measured["chosen"] == min(measured["median_ms"], key=measured["median_ms"].get)
    assert measured["dropped"] == {}
    builds = measured["builds"]
    assert builds["cpu"]["source"] == builds["opencl"]["source"] == "worker"
    assert builds["coexec"]["source"] == "here"
    assert all(b["s"] > 0 for b in builds.values())
    assert measured["measure_s"] > 0  # the timing's own seconds, beside the builds'
    assert "building cpu, opencl in 1 worker process beside the compile" in caplog.text
    assert "the opencl library was built in a worker process" in caplog.text
    assert "wrote" in caplog.text and " s" in caplog.text


@pytest.mark.opencl
def test_candidates_that_do_not_build_are_dropped_in_one_line(
    tmp_path, opencl, caplog, monkeypatch
):
    """The GPU alone (built in a worker) and the co-executed plan (built here) fail to link:
    each is dropped in one warning naming it and its device, and the CPU alone is kept."""
    monkeypatch.setattr(cache, "build_library", _for_another_host)
    monkeypatch.setattr(cache, "default_workers", lambda jobs: 1)
    synthetic_cost_model(SyntheticDevice()).save(tmp_path / "balanced.json")
    out = tmp_path / "art"
    with caplog.at_level(logging.INFO):
        compile_artifact(
            bundled_model_path(), out, CompileOptions(cost_model=tmp_path / "balanced.json")
        )
    manifest = json.loads((out / "manifest.json").read_text())
    measured = manifest["verify"]
    assert set(measured["median_ms"]) == {"cpu"} and measured["chosen"] == "cpu"
    assert set(measured["dropped"]) == {"opencl", "coexec"}
    assert all("build failed" in why for why in measured["dropped"].values())
    assert measured["builds"]["opencl"]["source"] == "worker"
    assert manifest["device"] == "cpu"
    assert "co-executed build failed" in manifest["plan"]["fallback"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    dropped = [w for w in warnings if w.startswith("verify: dropping")]
    assert len(dropped) == 2 and all("\n" not in w for w in dropped)
    gpu = opencl.devices[0].name
    assert any(f"the GPU alone (OpenCL: {gpu})" in w and "ld" in w for w in dropped)
    assert any(w.startswith("verify: dropping co-executed (") for w in dropped)


@pytest.mark.opencl
def test_every_candidate_failing_is_one_error(tmp_path, opencl, monkeypatch):
    monkeypatch.setattr(cache, "build_library", _nothing_links)
    monkeypatch.setattr(cache, "default_workers", lambda jobs: 1)
    with pytest.raises(ArtifactError, match="every candidate build failed") as info:
        compile_artifact(bundled_model_path(), tmp_path / "art", CompileOptions())
    assert "\n" not in str(info.value)
    assert not (tmp_path / "art").exists()


def test_closing_stops_the_workers(tmp_path):
    """A compile that stops (an error, Ctrl-C) terminates the builds still running."""
    model = bundled_model_path()
    spec = BuildSpec("cpu", None, file_sha256(model), "opencl", "llvm", None)
    jobs = [BuildJob(n, spec, tmp_path / f"{n}.so") for n in ("cpu", "opencl")]
    builds = BackgroundBuilds(model, spec.model_sha256, get_preset("opencl"), jobs, _sleep, 2)
    procs = [proc for proc, _ in builds._procs]
    assert len(procs) == 2 and all(p.is_alive() for p in procs)
    builds.close()
    assert not any(p.is_alive() for p in procs)


def test_a_result_says_how_long_its_worker_took_to_set_up(tmp_path):
    """Each result carries its worker's set-up time (spawn to the model imported), which the
    compile records beside the build's own seconds."""
    model = bundled_model_path()
    spec = BuildSpec("cpu", None, file_sha256(model), "opencl", "llvm", None)
    jobs = [BuildJob(n, spec, tmp_path / f"{n}.so") for n in ("a", "b")]
    begun = time.perf_counter()
    with BackgroundBuilds(model, spec.model_sha256, get_preset("opencl"), jobs, _touch, 1) as bg:
        first, second = bg.result("a"), bg.result("b")
    elapsed = time.perf_counter() - begun
    assert first.error is None and (tmp_path / "a.so").is_file()
    # one worker built both: one set-up, before the first build
    assert 0 < first.setup_s == second.setup_s < elapsed
    assert first.setup_s > first.seconds  # a worker starts Python and TVM; the build touches
    assert first.phases() == {"setup_s": round(first.setup_s, 3)}
