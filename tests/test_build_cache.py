"""The build cache's key is the digest of one frozen ``BuildSpec``: every field changes it, and
the settings that a build does not use are normalised away so equal builds share a key.

End-to-end reuse (a second compile copies the library) is tested in test_artifact.py.
"""

from __future__ import annotations

import dataclasses

import pytest
from codl_tvm.schedules import cpu_config, winograd_enabled
from codl_tvm.schedules.presets import PACKED_CPU_ALONE, WINOGRAD_CPU_ALONE

from codl_tvm.build.cache import BuildSpec, Libraries, code_digest, source_files, spec_settings
from codl_tvm.build.targets import get_preset
from codl_tvm.core.plan import uniform_plan
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.frontend.models import bundled_model_path
from codl_tvm.runtime.artifact import Manifest, ModelRecord


def _spec(**fields) -> BuildSpec:
    base = {
        "device": "coexec",
        "plan": "{}",
        "model_sha256": "0" * 64,
        "preset": "opencl",
        "cpu_target": "llvm",
        "gpu_target": "opencl",
    }
    return BuildSpec(**{**base, **fields})


def _other(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, tuple):
        return (*value, "winograd")
    return f"{value}-other"


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(BuildSpec)])
def test_every_field_is_in_the_key(name):
    spec = _spec()
    changed = dataclasses.replace(spec, **{name: _other(getattr(spec, name))})
    assert changed.key() != spec.key()
    assert dataclasses.replace(spec).key() == spec.key()  # and the key is deterministic


def test_code_digest_covers_passes_and_schedules():
    """A change to a pass or a schedule rule changes what is built: the digest reads them
    (they live in their own folders, mapped into the package)."""
    names = {name for name, _ in source_files()}
    assert "codl_tvm.passes/partition.py" in names
    assert "codl_tvm.schedules/cpu.py" in names
    assert "codl_tvm/build/cache.py" in names
    assert len(code_digest()) == 64


def test_library_specs_keep_only_the_settings_a_build_uses(tmp_path):
    """A build for one processor ignores the co-executed build's settings (blocks, CPU-part
    algorithms), and the CPU-alone kernels only concern the CPU build without a plan."""
    model = load_onnx(bundled_model_path())
    manifest = Manifest(
        model=ModelRecord(str(model.path), "1" * 64, list(model.inputs), list(model.outputs)),
        winograd=False,
        winograd_cpu_alone=True,
        packed=False,
        packed_cpu_alone=True,
    )
    libs = Libraries(tmp_path, None, model, manifest, get_preset("opencl"))
    cpu, gpu = libs.spec("cpu", None), libs.spec("opencl", None)
    assert cpu.cpu_alone_winograd and cpu.cpu_alone_packed
    assert not gpu.cpu_alone_winograd and not gpu.cpu_alone_packed
    plan = uniform_plan(model.mod, "H", 0.5)
    before = libs.spec("coexec", plan)
    libs.channel_blocks, libs.row_blocks = False, True
    libs.coexec_cpu_algorithms = ("packed",)
    after = libs.spec("coexec", plan)
    assert (after.channel_blocks, after.row_blocks, after.coexec_cpu_algorithms) == (
        False,
        True,
        ("packed",),
    )
    assert after.key() != before.key()
    assert libs.spec("cpu", None) == cpu and libs.spec("opencl", None) == gpu
    assert after.cpu_target == str(get_preset("opencl").target("cpu"))


def test_a_build_reads_its_switches_from_its_spec():
    """The switches a library is built under come from its spec, not from the blocks the
    compile entered: a worker process (outside those blocks) builds the same library."""
    preset = get_preset("opencl")
    plain = _spec(device="opencl", plan=None)
    with winograd_enabled("all"):  # the compile's switch: not the plain spec's
        assert spec_settings(plain, preset).winograd == frozenset()
    alone = _spec(device="cpu", plan=None, cpu_alone_winograd=True, cpu_alone_packed=True)
    settings = spec_settings(alone, preset)
    assert settings.winograd == frozenset(WINOGRAD_CPU_ALONE) and settings.cpu_alone
    assert settings.packed == frozenset(PACKED_CPU_ALONE)
    assert (
        spec_settings(_spec(winograd=True), preset).winograd
        == spec_settings(_spec(device="cpu", winograd=True), preset).winograd
    )
    coexec = _spec(coexec_cpu_algorithms=("packed",), coexec_cpu_alone=True)
    settings = spec_settings(coexec, preset)
    assert settings.packed == {cpu_config(preset.target("cpu")).name} and settings.cpu_alone


def test_warm_up_processes_start_only_with_an_opencl_build_made_here(tmp_path):
    """A compile that times on PoCL starts its warm-up processes as it begins an OpenCL
    build of its own (their start overlaps the build); a CPU build starts none, and closing
    the libraries stops the ones never used."""
    model = load_onnx(bundled_model_path())
    manifest = Manifest(
        model=ModelRecord(str(model.path), "1" * 64, list(model.inputs), list(model.outputs))
    )
    libs = Libraries(tmp_path, None, model, manifest, get_preset("opencl"))
    libs.warm_up = True
    libs.single("cpu")
    assert libs.builds["cpu"]["source"] == "here" and libs.warm_ahead is None
    libs.single("opencl")
    ahead = libs.warm_ahead
    assert ahead is not None and all(p.poll() is None for p in ahead.procs)
    libs.close()
    assert all(p.returncode is not None for p in ahead.procs)
