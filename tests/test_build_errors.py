"""Build failures reach the caller as :class:`~codl_tvm.core.errors.BuildError`, not as TVM's
errors.

The failing module casts to int4, which TVM 0.27's OpenCL code generator cannot spell ("Cannot
convert type int4 to OpenCL type"): ``tvm.compile`` fails for OpenCL and for co-execution, as
any failure inside TVM's compiler would.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax

import codl_tvm
from codl_tvm.build.coexec import compile_coexec
from codl_tvm.build.runner import build
from codl_tvm.core.errors import BuildError, CodlError
from codl_tvm.core.plan import uniform_plan
from tests.test_errors import assert_one_line_error
from tests.test_errors import codl_tvm as run_cli


def _int4_module() -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((1, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(relax.op.astype(x, "int4"))
            y = bb.emit_output(relax.op.astype(c, "float32"))
        bb.emit_func_output(y)
    return bb.get()


def _assert_build_error(err: BuildError, model: str, device: str) -> None:
    message = str(err)
    assert isinstance(err, CodlError)
    assert message.startswith(f"{model}: building for {device} failed: ")
    assert "int4" in message and "\n" not in message
    assert err.__cause__ is not None and "int4" in str(err.__cause__)  # TVM's own error
    log = Path(message.rsplit("full error: ", 1)[1])
    assert "Traceback" in log.read_text()


@pytest.mark.opencl
def test_runner_build_raises_build_error(opencl, tmp_path, monkeypatch):
    monkeypatch.setenv("CODL_TVM_CACHE_DIR", str(tmp_path))  # the full error's log file
    with pytest.raises(BuildError) as info:
        build(_int4_module(), "opencl", model="int4.onnx")
    _assert_build_error(info.value, "int4.onnx", "opencl")


@pytest.mark.opencl
def test_compile_coexec_raises_build_error(opencl, tmp_path, monkeypatch):
    monkeypatch.setenv("CODL_TVM_CACHE_DIR", str(tmp_path))
    mod = _int4_module()
    with pytest.raises(BuildError) as info:
        compile_coexec(mod, uniform_plan(mod, "OC", 0.5), model="int4.onnx")
    _assert_build_error(info.value, "int4.onnx", "coexec")
    # codl_tvm.compile is compile_coexec: the same error, with the default model label
    with pytest.raises(BuildError, match=r"^Relax module: building for coexec failed: "):
        codl_tvm.compile(mod, uniform_plan(mod, "OC", 0.5))


def _int4_onnx(path: Path) -> Path:
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["c"], to=TensorProto.INT4),
            helper.make_node("Cast", ["c"], ["y"], to=TensorProto.FLOAT),
        ],
        "int4_cast",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, path)
    return path


@pytest.mark.opencl
@pytest.mark.parametrize("device", ["opencl", "coexec"])
def test_cli_prints_the_build_failure_as_one_line(opencl, tmp_path, device):
    model = _int4_onnx(tmp_path / "int4.onnx")
    argv = ["run", str(model), "--device", device, "--repeat", "1", "--number", "1"]
    if device == "coexec":
        argv += ["--dim", "OC", "--ratio", "0.5"]
    proc = run_cli(*argv, env={"CODL_TVM_CACHE_DIR": str(tmp_path / "cache")})
    # a casts-only model has nothing to split: a coexec request builds it for the GPU alone
    assert_one_line_error(proc, f"{model}: building for opencl failed: ", "int4")
