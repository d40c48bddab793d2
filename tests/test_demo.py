"""``codl-tvm demo``: the planner's decision (the fall-back message), a co-executed build with a
fixed split that matches the unpartitioned model, and a timeline with both lanes."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from codl_tvm.build.runner import build
from codl_tvm.cli import main
from codl_tvm.core.errors import ArtifactError, CodlError, PlanError
from codl_tvm.core.plan import ChainPlan, PartitionPlan
from codl_tvm.demo import (
    DemoOptions,
    OperatorPlacement,
    cost_model_hardware,
    fixed_split_plan,
    halo_span,
    host_cpu_name,
    opencl_on_host_cpu,
    placement_lines,
    run_demo,
)
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.frontend.models import bundled_model_path
from codl_tvm.profiling.trace import Trace, TraceEvent
from codl_tvm.runtime.artifact import load_artifact

# The shipped cost model predicts the bundled CNN at 0.28 ms on the CPU alone against 1.32 ms
# on the GPU alone and every split slower: the planner keeps it on the CPU, on every machine
# (the prediction reads the model and the cost-model file only).
# The shipped cost model keeps the bundled CNN whole on the CPU; compile then times the two
# processors alone and keeps the faster one (this machine's OpenCL device is a CPU runtime).
FALLBACK = re.compile(
    r"codl_small_cnn\.onnx runs on the (cpu|opencl) alone: measured [0-9.]+ ms on the (CPU|GPU) "
    r"alone, faster than the other processor alone \(the plan splits nothing\)"
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_fixed_split_plan_chains_the_bundled_cnn():
    """Consecutive operators chain until one's output is also read elsewhere (the residual
    add reads conv2d_1's output); matmul cannot split on H and is left out."""
    mod = load_onnx(bundled_model_path()).mod
    plan = fixed_split_plan(mod, "H", 0.5)
    expected = PartitionPlan(
        chains=(
            ChainPlan(("conv2d_0", "conv2d_1"), "H", 0.5),
            # conv2d_2's residual add reads conv2d_1's output: an operand sliced into the chain
            ChainPlan(
                ("conv2d_2", "max_pool2d_3", "conv2d_4", "conv2d_5", "conv2d_6", "avg_pool2d_7"),
                "H",
                0.5,
            ),
        ),
        model_fingerprint=plan.model_fingerprint,
    )
    assert plan == expected
    plan.validate(mod)
    alone = fixed_split_plan(mod, "OC", 0.25, chain=False)
    assert not alone.chains and [o.op for o in alone.ops][-1] == "matmul_8"


@pytest.mark.parametrize("ratio", [0.0, 1.0, 1.5])
def test_fixed_split_plan_needs_both_processors(ratio):
    mod = load_onnx(bundled_model_path()).mod
    with pytest.raises(PlanError, match=f"GPU share {ratio}"):
        fixed_split_plan(mod, "H", ratio)


def test_demo_never_replaces_the_users_files(tmp_path, capsys):
    """The demo refuses a directory holding files it did not write, with or without --force,
    an earlier demo's output or existing trace files without --force, and a bad split, each
    with one line and before building anything; nothing there is touched."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ArtifactError, match=r"notes\.txt, which the demo did not write"):
        run_demo(DemoOptions(output=mine, force=True))
    assert (mine / "notes.txt").read_text() == "keep me"
    assert main(["demo", "-o", str(mine), "--force"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("codl-tvm: error: ") and "notes.txt" in err
    earlier = tmp_path / "earlier"
    (earlier / "planned").mkdir(parents=True)
    with pytest.raises(ArtifactError, match="pass --force"):
        run_demo(DemoOptions(output=earlier))
    assert main(["demo", "--ratio", "1"]) == 2
    assert "GPU share 1.0" in capsys.readouterr().err
    # the trace's paths are checked before anything is built
    missing = tmp_path / "no" / "t.json"
    assert main(["demo", "-o", str(tmp_path / "new"), "--trace", str(missing)]) == 2
    assert f"folder {missing.parent} does not exist" in capsys.readouterr().err
    (tmp_path / "t.png").write_bytes(b"mine")
    with pytest.raises(ArtifactError, match=r"t\.png exists; pass --force"):
        run_demo(DemoOptions(trace=tmp_path / "t.json"))
    assert (tmp_path / "t.png").read_bytes() == b"mine"
    assert main(["demo", "-o", str(tmp_path / "new"), "--cost-model", "nope.json"]) == 2
    assert "--cost-model nope.json: no such file" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_failed_demo_leaves_no_directory(opencl, tmp_path):
    """A run that fails after starting (here: planning with a corrupt cost model) removes the
    directory it created."""
    bad = tmp_path / "cm.json"
    bad.write_text("{not json")
    with pytest.raises(CodlError, match=r"cm\.json: corrupt cost model file"):
        run_demo(DemoOptions(output=tmp_path / "out", cost_model=bad))
    assert not (tmp_path / "out").exists()


def test_opencl_device_on_the_host_cpu():
    """The sentence on why co-execution is slower here depends on this: a CPU OpenCL runtime
    (Intel's names the device like the CPU, PoCL prefixes it) shares the host's cores."""
    host = host_cpu_name()
    assert host
    assert opencl_on_host_cpu(host, "Intel(R) OpenCL")
    assert opencl_on_host_cpu(f"cpu-x86-64-{host}", "Portable Computing Language")
    assert opencl_on_host_cpu("pthread-generic", "Portable Computing Language")
    assert not opencl_on_host_cpu("NVIDIA H100 80GB HBM3", "NVIDIA CUDA")
    assert not opencl_on_host_cpu("Mali-G710", "ARM Platform")


def test_timeline_png_colours_splits(tmp_path):
    trace = Trace(
        [
            TraceEvent("GPU", "conv_kernel", 0.0, 400.0, "conv2d_0..conv2d_1"),
            TraceEvent("CPU", "conv", 10.0, 380.0, "conv2d_0..conv2d_1"),
            TraceEvent("sync", "wait", 380.0, 400.0),
            TraceEvent("GPU", "softmax_kernel", 400.0, 405.0),
        ]
    )
    assert trace.lane_counts() == {"GPU": 2, "CPU": 1, "sync": 1}
    trace.save_png(tmp_path / "t.png", title="two lanes")
    data = (tmp_path / "t.png").read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5_000


class _Lines(logging.Handler):
    """The messages logged, in order."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def demo(opencl, tmp_path_factory):
    progress = _Lines()
    log = logging.getLogger("codl_tvm.demo")
    log.addHandler(progress)
    level = log.level
    log.setLevel(logging.INFO)
    out = tmp_path_factory.mktemp("demo") / "out"
    try:
        result = run_demo(DemoOptions(output=out, rounds=1, runs_per_round=1))
    finally:
        log.removeHandler(progress)
        log.setLevel(level)
    return result, progress.lines


def test_demo_keeps_the_planners_fallback(demo):
    result, progress = demo
    assert result.planned.device in ("cpu", "opencl") and result.planned.ok
    assert result.fallback.startswith("measured") and "the plan splits nothing" in result.fallback
    assert any(FALLBACK.fullmatch(line) for line in result.lines())
    # one short line before each long step
    assert [line[:5] for line in progress if line.startswith("[")] == [
        f"[{i}/5]" for i in range(1, 6)
    ]


def test_demo_coexecuted_build_matches_the_reference(demo):
    """The co-executed artifact, run here again, equals the unpartitioned model built by the
    test itself; both processors hold a part of every split."""
    result, _ = demo
    assert result.coexec.device == "coexec" and result.ok
    art = load_artifact(result.coexec.artifact)
    model = load_onnx(bundled_model_path())
    x = random_inputs(model, seed=5)["input"]
    expected = build(model.mod, "cpu")([x])[0]
    np.testing.assert_allclose(art([x])[0], expected, rtol=1e-4, atol=1e-4)
    split = [p for p in result.placement if p.split is not None]
    assert len(split) == 8 and all(p.gpu and p.cpu for p in split)
    # the table's last operator of each chain has the regions the build's pass wrote
    built = json.loads((result.coexec.artifact / "placement.json").read_text())
    table = {p.op: p for p in result.placement}
    for row in built:
        last = table[row["ops"][-1]]
        regions = {part["processor"]: tuple(part["region"]) for part in row["parts"]}
        assert (last.gpu, last.cpu) == (regions["gpu"], regions["cpu"]), row


def test_demo_writes_a_timeline_with_both_lanes(demo):
    result, _ = demo
    data = result.timeline_png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    # the Chrome trace beside it, read back from the file, has kernels on both lanes
    lanes = Trace.load_chrome(result.chrome_trace).lane_counts()
    assert lanes.get("GPU", 0) > 0 and lanes.get("CPU", 0) > 0
    assert str(result.timeline_png) in "\n".join(result.lines())


def _codl_tvm() -> str:
    found = shutil.which("codl-tvm", path=str(Path(sys.executable).parent)) or shutil.which(
        "codl-tvm"
    )
    assert found, "the codl-tvm console script is not installed"
    return found


def test_cli_demo_fits_one_screen(opencl, tmp_path):
    """``codl-tvm demo`` as a user runs it: exit 0, no traceback, the fall-back message, both
    checks OK, the timeline written, and the whole output on one screen."""
    trace = tmp_path / "t.json"
    proc = subprocess.run(
        [_codl_tvm(), "demo", "-o", str(tmp_path / "out"), "--trace", str(trace)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    out = proc.stdout
    assert FALLBACK.search(out), out
    assert out.count("-> OK") == 2 and "MISMATCH" not in out
    assert trace.is_file() and trace.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
    assert str(trace.with_suffix(".png")) in out
    assert len(out.splitlines()) <= 40, out


def test_predictions_are_labelled_with_the_hardware_they_describe(demo):
    """The planner's numbers are the cost model's, for the hardware it was fitted on; the
    latencies beside them are this machine's."""
    result, _ = demo
    lines = result.lines()
    assert lines[0].startswith("planner's predictions (emulated-soc")
    assert "for an emulated SoC" in lines[0] and lines[0].endswith("not this machine:")
    assert any(line.startswith("latency here, median") for line in lines)
    assert cost_model_hardware("device-h100.json") == "an H100 with a 16-core Xeon"
    assert cost_model_hardware("mine.json") == "the hardware its data was measured on"


def test_overlapping_rows_are_explained_as_the_halo(demo):
    result, _ = demo
    halos = [(p.op, halo_span(p)) for p in result.placement if halo_span(p) is not None]
    assert halos, "an H chain computes halo rows on both processors"
    op, (lo, hi) = halos[0]
    text = "\n".join(result.lines())
    assert f"(e.g. {op}: rows {lo}:{hi} on both): the halo," in text


def test_the_halo_note_only_where_parts_overlap():
    def row(gpu, cpu):
        return OperatorPlacement("conv2d_0", (8, 32, 32), "conv2d_0..conv2d_1", "H", gpu, cpu)

    assert halo_span(row((0, 18), (14, 32))) == (14, 18)
    assert halo_span(row((0, 16), (16, 32))) is None
    assert len(placement_lines([row((0, 16), (16, 32))])) == 2  # header and the row
    lines = placement_lines([row((0, 18), (14, 32))])
    assert "(e.g. conv2d_0: rows 14:18 on both): the halo," in lines[2]
