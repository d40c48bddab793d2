"""Warm-up before timing: each shard process launches its own share of a library's kernels,
the shards together create every program into the program cache, a fresh process then runs the
library from that cache with the right numbers, and a default compile warms its GPU build up
in the build worker.

The default device of this machine (CI: a CPU OpenCL runtime) stands in for PoCL: the program
cache works the same for every driver; ``CODL_OPENCL_WARM_UP=1`` switches the warm-up on where
it would not pay (two cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tvm

from codl_tvm import runtime
from codl_tvm.build.runner import build
from codl_tvm.cli import bundled_model_path
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.options import CompileOptions
from codl_tvm.runtime.program_binaries import opencl_modules
from codl_tvm.runtime.warm_up import WarmUpProcesses, default_shards, warm_up, worth_warming

pytestmark = pytest.mark.opencl

_RUN_FROM_CACHE = """
import json, sys
import numpy as np, tvm
from tvm.runtime.vm import VirtualMachine
from codl_tvm import runtime
library, inputs = sys.argv[1], np.load(sys.argv[2])
runtime.load()
dev = tvm.opencl(0)
vm = VirtualMachine(tvm.runtime.load_module(library), [dev])
out = vm["main"](*[tvm.runtime.tensor(inputs[k], dev) for k in sorted(inputs.files)])
np.save(sys.argv[3], out.numpy())
print(json.dumps(runtime.cache_stats()))
"""


@pytest.fixture(scope="module")
def builds(tmp_path_factory, opencl):
    """The bundled model built for the GPU alone and the CPU alone, and its inputs."""
    work = tmp_path_factory.mktemp("warm")
    model = load_onnx(bundled_model_path())
    values = random_inputs(model, 0)
    inputs = [values[s.name] for s in model.inputs]
    gpu = build(model.mod, "opencl", work_dir=work / "gpu")
    cpu = build(model.mod, "cpu", work_dir=work / "cpu")
    with runtime.record_kernels() as events:
        gpu(inputs)
    return model, inputs, gpu, cpu, {e.name for e in events}


def _launched(gpu, inputs, index: int, count: int) -> set[str]:
    shard = runtime.plugin_function("codl.opencl.set_warm_shard")
    shard(index, count)
    try:
        with runtime.record_kernels() as events:
            gpu(inputs)
    finally:
        shard(0, 0)  # every kernel again, for the other tests of this process
    return {e.name for e in events}


def test_shards_launch_disjoint_shares_covering_every_kernel(builds):
    _, inputs, gpu, _, kernels = builds
    assert len(kernels) >= 4
    shares = [_launched(gpu, inputs, i, 3) for i in range(3)]
    assert set().union(*shares) == kernels
    assert sum(len(s) for s in shares) == len(kernels)  # disjoint
    assert sum(1 for s in shares if s) >= 2  # the names spread over the shards
    with runtime.record_kernels() as events:  # back to every kernel
        gpu(inputs)
    assert {e.name for e in events} == kernels


def _kernel_sources(library) -> dict[str, int]:
    """Each kernel's source size as the plugin compiles it: the preamble before TVM's first
    ``// Function:`` line, then the kernel's own text."""
    sizes = {}
    for module in opencl_modules(tvm.runtime.load_module(str(library))):
        text = module.inspect_source()
        marker = "// Function: "
        preamble, *parts = text.split(marker)
        for part in parts:
            sizes[part.split("\n", 1)[0].rstrip("\r ")] = len(preamble) + len(marker) + len(part)
    return sizes


def test_shards_are_dealt_longest_source_first_to_the_least_loaded(builds):
    """Two shards: the kernels go out longest first, each to the shard holding the least source
    so far, so the shards' source totals differ by at most one kernel's."""
    _, inputs, gpu, _, kernels = builds
    sizes = _kernel_sources(gpu.library)
    assert kernels <= set(sizes)
    load, expected = [0, 0], [set(), set()]
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        least = load.index(min(load))
        expected[least].add(name)
        load[least] += sizes[name]
    assert abs(load[0] - load[1]) <= max(sizes.values())
    for index in range(2):
        assert _launched(gpu, inputs, index, 2) == expected[index] & kernels


def test_a_shard_out_of_range_is_refused(opencl):
    with pytest.raises(ValueError, match="warm shard 3 of 3"):
        runtime.plugin_function("codl.opencl.set_warm_shard")(3, 3)


def test_warm_up_fills_the_program_cache_for_a_fresh_process(builds, tmp_path, monkeypatch):
    """Three shards create every kernel's program into an empty cache; a fresh process then
    builds none from source and computes what the CPU build computes."""
    model, inputs, gpu, cpu, kernels = builds
    monkeypatch.setenv("CODL_TVM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path / "pocl"))
    specs = [(s.shape, s.dtype) for s in model.inputs]
    assert warm_up(gpu.library, ["opencl"], specs, shards=3) > 0
    programs = list((tmp_path / "cache" / "opencl-programs").glob("*.bin"))
    # every kernel of the module, those the run never launches too (the timing creates them all)
    modules = opencl_modules(tvm.runtime.load_module(str(gpu.library)))
    assert len(programs) == sum(m.inspect_source().count("// Function: ") for m in modules)
    assert len(programs) >= len(kernels)
    np.savez(tmp_path / "inputs.npz", **{f"{i:03d}": x for i, x in enumerate(inputs)})
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_FROM_CACHE, str(gpu.library), str(tmp_path / "inputs.npz"),
         str(tmp_path / "out.npy")],
        capture_output=True, text=True, check=True, env=dict(os.environ),
    )  # fmt: skip
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    assert stats["source_builds"] == 0 and stats["disk_hits"] == len(kernels)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), cpu(inputs)[0], atol=1e-4)


def test_processes_started_ahead_do_the_warm_up_and_unused_ones_stop(builds, tmp_path, monkeypatch):
    """Processes started before the library exists (as a build worker starts them) wait, then
    create every program when given the library; a set never used stops when closed."""
    model, _, gpu, _, _ = builds
    monkeypatch.setenv("CODL_TVM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path / "pocl"))
    ahead = WarmUpProcesses(2)
    assert all(p.poll() is None for p in ahead.procs)  # waiting for their spec
    specs = [(s.shape, s.dtype) for s in model.inputs]
    assert warm_up(gpu.library, ["opencl"], specs, processes=ahead) > 0
    assert [p.returncode for p in ahead.procs] == [0, 0]
    modules = opencl_modules(tvm.runtime.load_module(str(gpu.library)))
    programs = list((tmp_path / "cache" / "opencl-programs").glob("*.bin"))
    assert len(programs) == sum(m.inspect_source().count("// Function: ") for m in modules)
    unused = WarmUpProcesses(2)
    unused.close()
    assert all(p.returncode is not None for p in unused.procs)


def test_automatic_only_with_cores_to_spare_and_off_when_asked(opencl, monkeypatch):
    monkeypatch.setenv("CODL_OPENCL_WARM_UP", "1")
    assert worth_warming()
    monkeypatch.setenv("CODL_OPENCL_WARM_UP", "5")
    assert worth_warming() and default_shards() == 5
    monkeypatch.setenv("CODL_OPENCL_WARM_UP", "0")
    assert not worth_warming()
    monkeypatch.delenv("CODL_OPENCL_WARM_UP")
    two = {0, 1}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: two)
    assert not worth_warming()  # two warm-up processes need a third core
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert default_shards() == 8
    assert default_shards(most=None) == 15  # a profiling run: nothing else needs the cores


@pytest.mark.slow
def test_default_compile_warms_the_gpu_build_up_in_its_worker(tmp_path, opencl, monkeypatch):
    """The GPU build comes warmed up from its worker; what the timing then measured decides."""
    monkeypatch.setenv("CODL_OPENCL_WARM_UP", "1")
    monkeypatch.setenv("CODL_TVM_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "art"
    compile_artifact(bundled_model_path(), out, CompileOptions())
    measured = json.loads((out / "manifest.json").read_text())["verify"]
    builds = measured["builds"]
    assert builds["opencl"]["source"] == "worker" and builds["opencl"]["warm_s"] > 0
    assert "warm_s" not in builds["cpu"]
    # a co-executed build made here is warmed up before the timing too
    assert all("warm_s" in b for name, b in builds.items() if name.startswith("coexec"))
    assert measured["chosen"] == min(measured["median_ms"], key=measured["median_ms"].get)
