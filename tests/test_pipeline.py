"""codl_tvm.build.pipeline: phases shared with TVM's gpu_generic backend, and IR dumps (CPU
only)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from codl_tvm.passes.place import PlaceParts
from tvm import relax
from tvm.relax.backend import gpu_generic

from codl_tvm.build.pipeline import (
    DUMP_IR_ENV,
    coexec_dataflow_lower_passes,
    dataflow_lower_passes,
    finalize_passes,
    legalize_passes,
    single_device_pipeline,
)
from codl_tvm.core.plan import PartitionPlan

LLVM = tvm.target.Target({"kind": "llvm"})
PHASES = ["inference", "algorithm", "legalize", "schedule", "dataflow-lower", "finalize"]


def _names(passes) -> list[str]:
    return [p.info.name for p in passes]


def test_unchanged_phases_are_tvms_own():
    assert _names(dataflow_lower_passes(LLVM)) == _names(gpu_generic.dataflow_lower_passes(LLVM))
    assert _names(finalize_passes(LLVM)) == _names(gpu_generic.finalize_passes(LLVM))


def test_legalize_is_tvms_without_dlight():
    """codl-tvm schedules in a phase of its own; everything else of TVM's legalize phase stays
    (this fails when a TVM upgrade changes that phase, so the copy is revisited)."""
    tvm_names = [
        n for n in _names(gpu_generic.legalize_passes(LLVM)) if n != "ApplyDefaultSchedule"
    ]
    ours = _names(legalize_passes(LLVM))
    assert [n for n in ours if not n.startswith("codl.")] == tvm_names


def test_coexec_phases_differ_only_where_documented():
    plan = PartitionPlan(ops=())
    placed = _names(legalize_passes(LLVM, PlaceParts(LLVM, LLVM, plan.home)))
    # codl passes that run in every build (e.g. NaN legalization) are not the point here
    placed = [n for n in placed if not n.startswith("codl.") or n in _COEXEC_ONLY]
    assert placed == [
        "LegalizeOps",
        "AnnotateTIROpPattern",
        "FoldConstant",
        "codl.PlaceParts",
        "FuseOps",
        "CanonicalizeBindings",  # removes PlaceParts' fences
        "codl.RecordFusedTargets",
        "FuseTIR",
        "codl.RestoreTargets",
    ]
    lowered = _names(coexec_dataflow_lower_passes(LLVM, {}))
    assert "RewriteDataflowReshape" not in lowered
    assert lowered[-1] == "CallTIRRewrite"
    assert lowered.index("codl.InsertCoexecSync") < lowered.index("codl.RecordKernelSplits")
    assert "codl.RecordKernelSplits" not in _names(coexec_dataflow_lower_passes(LLVM))


_COEXEC_ONLY = {"codl.PlaceParts", "codl.RecordFusedTargets", "codl.RestoreTargets"}


def _conv_module() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 2, 6, 6), "float32"))
    w = np.random.default_rng(0).standard_normal((3, 2, 3, 3)).astype("float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(w), padding=[1, 1, 1, 1]))
            gv = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(gv)
    return bb.get()


def _dumped(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_dump_ir_argument_writes_every_phase(tmp_path, monkeypatch):
    monkeypatch.delenv(DUMP_IR_ENV, raising=False)
    dump = tmp_path / "ir"
    tvm.compile(
        _conv_module(), target=LLVM, relax_pipeline=single_device_pipeline(LLVM, dump_ir=dump)
    )
    assert _dumped(dump) == [f"{i:02d}-{name}.py" for i, name in enumerate(PHASES)]
    assert "R.call_tir" in (dump / "02-legalize.py").read_text()


@pytest.mark.parametrize("explicit", [False, True])
def test_environment_alias_and_explicit_argument(tmp_path, monkeypatch, explicit):
    """``CODL_TVM_DUMP_IR`` is the argument's alias; an explicit ``dump_ir`` wins over it."""
    monkeypatch.setenv(DUMP_IR_ENV, str(tmp_path / "env"))
    kwargs = {"dump_ir": tmp_path / "arg"} if explicit else {}
    pipeline = single_device_pipeline(LLVM, **kwargs)
    tvm.compile(_conv_module(), target=LLVM, relax_pipeline=pipeline)
    written, unused = ("arg", "env") if explicit else ("env", "arg")
    assert len(_dumped(tmp_path / written)) == len(PHASES)
    assert not (tmp_path / unused).exists()
