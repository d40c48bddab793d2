"""Expected failures end as one line, ``codl-tvm: error: ...`` with exit status 2, never a
traceback; the project's errors share one base class.

The CLI cases run ``codl-tvm`` as a subprocess, as a user would, and read its real stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from codl_tvm import runtime
from codl_tvm.core import errors
from codl_tvm.frontend.models import bundled_model_path


def codl_tvm(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    """Run ``codl-tvm ARGV`` in a fresh interpreter; the completed process."""
    return subprocess.run(
        [sys.executable, "-m", "codl_tvm.cli", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=600,
    )


def assert_one_line_error(proc, *needles: str) -> str:
    """``proc`` failed with exit 2 and one ``codl-tvm: error:`` line holding every needle."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("codl-tvm: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _conv_model(path: Path) -> Path:
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [w],
    )
    path.write_bytes(helper.make_model(graph).SerializeToString())
    return path


# -- one hierarchy ----------------------------------------------------------------------------


def test_every_project_error_is_a_codl_error_and_keeps_its_builtin_base():
    from codl_tvm.build.targets import ToolchainError, get_preset
    from codl_tvm.core.errors import ArtifactError
    from codl_tvm.core.plan import PlanError
    from codl_tvm.cost_model.base import ModelFileError
    from codl_tvm.frontend.importer import ModelError
    from codl_tvm.rpc.client import RemoteFailure, RPCError

    for cls in (ArtifactError, ModelFileError, ModelError, PlanError, RPCError, ToolchainError):
        assert issubclass(cls, errors.CodlError)
    assert issubclass(ArtifactError, ValueError) and issubclass(ToolchainError, RuntimeError)
    assert issubclass(RemoteFailure, RPCError)
    # an unknown preset is still a KeyError for old callers, with a readable message
    with pytest.raises(KeyError) as info:
        get_preset("phone")
    assert isinstance(info.value, errors.CodlError)
    assert str(info.value).startswith("unknown target preset 'phone'")


# -- bad files --------------------------------------------------------------------------------


def test_missing_garbage_and_truncated_models(tmp_path):
    assert_one_line_error(
        codl_tvm("run", str(tmp_path / "nope.onnx"), "--device", "cpu"), "nope.onnx"
    )
    garbage = tmp_path / "garbage.onnx"
    garbage.write_text("this is not a model\n")
    assert_one_line_error(codl_tvm("compile", str(garbage), "-o", str(tmp_path / "o")), "garbage")
    whole = _conv_model(tmp_path / "whole.onnx").read_bytes()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(whole[: len(whole) // 2])
    assert_one_line_error(codl_tvm("run", str(truncated), "--device", "cpu"), "truncated.onnx")


def test_a_text_file_given_as_inputs_is_not_called_pickled_data(tmp_path):
    text = tmp_path / "inputs.txt"
    text.write_text("1 2 3\n")
    line = assert_one_line_error(
        codl_tvm("run", "--device", "cpu", "--inputs", str(text)), "inputs.txt", "not an .npz"
    )
    assert "pickle" not in line


def test_save_outputs_into_a_missing_directory_fails_before_running(tmp_path):
    out = tmp_path / "no" / "such" / "dir" / "out.npz"
    proc = codl_tvm("run", "--device", "cpu", "--save-outputs", str(out))
    assert_one_line_error(proc, "--save-outputs", "does not exist")
    assert "latency" not in proc.stdout  # nothing was built or run first
    assert not out.parent.exists()


def test_save_outputs_suffix_and_existing_file_are_checked_first(tmp_path):
    precious = tmp_path / "out.npz"
    precious.write_bytes(b"precious")
    assert_one_line_error(
        codl_tvm("run", "--device", "cpu", "--save-outputs", str(precious)), "file exists"
    )
    assert precious.read_bytes() == b"precious"
    assert_one_line_error(
        codl_tvm("run", "--device", "cpu", "--save-outputs", str(tmp_path / "o.txt")), ".npz"
    )


def test_a_plan_that_does_not_fit_and_a_missing_cost_model(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("{not json")
    argv = ["run", str(bundled_model_path()), "--device", "coexec"]
    assert_one_line_error(codl_tvm(*argv, "--plan", str(plan)), "plan.json")
    assert_one_line_error(
        codl_tvm(*argv, "--plan", "auto", "--cost-model", str(tmp_path / "cm.json")), "cm.json"
    )


# -- OpenCL platforms -------------------------------------------------------------------------


def test_an_unknown_opencl_platform_is_one_line():
    proc = codl_tvm("info", env={"CODL_OPENCL_PLATFORM": "no-such-platform"})
    assert_one_line_error(proc, "No usable OpenCL platform matches 'no-such-platform'")


def _pocl_available() -> bool:
    proc = codl_tvm("info", env={"CODL_OPENCL_PLATFORM": "portable"})
    return proc.returncode == 0 and "Portable Computing Language" in proc.stdout


@pytest.mark.opencl
def test_a_chosen_platform_that_cannot_build_kernels_is_refused_with_the_reason(tmp_path):
    """``CODL_OPENCL_PLATFORM`` used to skip the compiler probe: a chosen PoCL that cannot build
    kernels was used anyway (and ``info`` called it fine). PoCL's POCL_EXTRA_BUILD_FLAGS makes
    every build fail here, as an LLVM that does not know the host CPU does."""
    if not _pocl_available():
        pytest.skip("PoCL is not installed here")
    broken = {"CODL_OPENCL_PLATFORM": "portable", "POCL_EXTRA_BUILD_FLAGS": "-fno-such-flag"}
    line = assert_one_line_error(
        codl_tvm("info", env=broken), "Portable Computing Language", "cannot build a kernel"
    )
    assert "no-such-flag" in line  # the build log's reason
    proc = codl_tvm("run", "--device", "opencl", "--repeat", "1", "--number", "1", env=broken)
    assert_one_line_error(proc, "OpenCL is not usable here", "cannot build a kernel")


# -- build failures ---------------------------------------------------------------------------


@pytest.mark.opencl
def test_an_opencl_kernel_that_does_not_compile_is_one_line_with_the_log_in_a_file(
    opencl, tmp_path, monkeypatch
):
    """The plugin's error carries the whole build log (tens of kilobytes for a model's
    kernels); build_error keeps the kernel, the device and the first error line, and writes the
    whole log to a file it names."""
    import tvm

    monkeypatch.setenv("CODL_TVM_CACHE_DIR", str(tmp_path))
    source = "__kernel void broken(__global float* a) { a[get_global_id(0)] = not_declared; }\n"
    source += "// padding\n" * 2000  # a long source, as TVM's kernels are
    mod = runtime.opencl_module_from_source(source, {"broken": (["handle"], ["threadIdx.x"])})
    a = tvm.runtime.tensor(np.zeros(4, np.float32), tvm.opencl(0))
    with pytest.raises(Exception) as info:
        mod["broken"](a, 4)
    err = runtime.build_error(info.value, "m.onnx", "opencl")
    assert isinstance(err, errors.BuildError)
    message = str(err)
    assert "\n" not in message and len(message) < 1000
    assert message.startswith("m.onnx: OpenCL kernel broken does not compile on ")
    assert "not_declared" in message
    log = Path(message.rsplit("full build log: ", 1)[1])
    assert log.parent == tmp_path / "logs" and "not_declared" in log.read_text()


def test_other_build_failures_name_the_model_and_keep_the_traceback_in_a_file(
    tmp_path, monkeypatch
):
    import tvm

    from codl_tvm.frontend.importer import load_onnx

    monkeypatch.setenv("CODL_TVM_CACHE_DIR", str(tmp_path))
    mod = load_onnx(_conv_model(tmp_path / "m.onnx")).mod
    try:
        tvm.compile(mod, target="no-such-target-kind")
    except Exception as exc:  # TVM's own error type for an unknown target kind
        err = runtime.build_error(exc, "m.onnx", "cpu")
    else:
        pytest.fail("TVM compiled for an unknown target")
    message = str(err)
    assert message.startswith("m.onnx: building for cpu failed: ") and "\n" not in message
    log = Path(message.rsplit("full error: ", 1)[1])
    assert "Traceback" in log.read_text() and "no-such-target-kind" in log.read_text()
    # the project's own errors pass through unchanged
    own = errors.ModelError("m.onnx: bad")
    assert runtime.build_error(own, "m.onnx", "cpu") is own


# -- the CLI never hides a broken command -----------------------------------------------------


def test_every_command_of_the_table_is_registered():
    from codl_tvm.cli import COMMANDS, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == {name for _, names in COMMANDS for name in names}


def test_a_command_that_fails_to_import_fails_loudly(monkeypatch):
    """A full TVM: an import error in a command module is a bug, raised, not a missing
    subcommand."""
    from codl_tvm import cli

    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, ("codl_tvm.cli.no_such_module", ("x",))))
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        cli.build_parser()


def test_runtime_only_tvm_lists_compiler_commands_and_says_why_they_cannot_run(tmp_path):
    env = {"TVM_USE_RUNTIME_LIB": "1"}
    help_text = codl_tvm("--help", env=env)
    assert help_text.returncode == 0 and "compile" in help_text.stdout
    proc = codl_tvm("compile", str(bundled_model_path()), "-o", str(tmp_path / "o"), env=env)
    assert_one_line_error(proc, "`codl-tvm compile` needs TVM's compiler", "runtime-only")


def test_runtime_only_tvm_runs_a_compiled_artifact(tmp_path):
    """The deployment case: a machine whose TVM is its runtime alone runs `codl-tvm run
    ARTIFACT/` (a library imported at the top of a command module must not need the compiler)."""
    from codl_tvm.cli import main

    model = _conv_model(tmp_path / "conv.onnx")
    art = tmp_path / "art"
    assert main(["compile", str(model), "-o", str(art), "--device", "cpu"]) == 0
    proc = codl_tvm(
        "run", str(art), "--repeat", "1", "--number", "1", env={"TVM_USE_RUNTIME_LIB": "1"}
    )
    assert proc.returncode == 0, proc.stderr
    assert "-> OK" in proc.stdout


def test_info_output_is_json_with_the_flag(opencl):
    proc = codl_tvm("info", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["platform"] == opencl.platform
