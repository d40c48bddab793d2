"""The codl-tvm command line: run on cpu/opencl, the npz contract, and its error messages."""

from __future__ import annotations

import numpy as np
import pytest

from codl_tvm.build.runner import build
from codl_tvm.cli import bundled_model_path, main
from codl_tvm.frontend.importer import load_onnx, random_inputs


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.opencl
def test_run_opencl_matches_cpu_build(opencl, tmp_path, capsys):
    model = load_onnx(bundled_model_path())
    feeds = random_inputs(model, seed=5)
    np.savez(tmp_path / "in.npz", **feeds)
    code, out, _ = _run(
        capsys,
        "run",
        "--device",
        "opencl",
        "--inputs",
        str(tmp_path / "in.npz"),
        "--save-outputs",
        str(tmp_path / "out.npz"),
        "--repeat",
        "1",
        "--number",
        "1",
    )
    assert code == 0
    assert "output logits: shape (1, 10)" in out and "latency: median" in out
    saved = np.load(tmp_path / "out.npz")
    assert list(saved.files) == ["logits"]
    ref = build(model.mod, "cpu")([feeds["input"]])[0]
    np.testing.assert_allclose(saved["logits"], ref, rtol=1e-4, atol=1e-5)


def test_run_cpu_with_onnx_operator_model(tmp_path, capsys):
    from tests.onnx_data import case_dir, load_case

    directory = case_dir("pytorch-converted", "test_Conv2d_strided")
    _, inputs, expected = load_case(directory)
    model = load_onnx(directory / "model.onnx")
    np.savez(tmp_path / "in.npz", **{model.inputs[0].name: inputs[0]})
    code, _out, _ = _run(
        capsys,
        "run",
        str(directory / "model.onnx"),
        "--device",
        "cpu",
        "--inputs",
        str(tmp_path / "in.npz"),
        "--save-outputs",
        str(tmp_path / "o.npz"),
        "--repeat",
        "1",
        "--number",
        "1",
    )
    assert code == 0
    got = np.load(tmp_path / "o.npz")[model.outputs[0].name]
    np.testing.assert_allclose(got, expected[0], rtol=1e-4, atol=1e-5)


def test_existing_output_file_is_not_overwritten(tmp_path, capsys):
    target = tmp_path / "out.npz"
    target.write_bytes(b"precious")
    code, _, err = _run(capsys, "run", "--device", "cpu", "--save-outputs", str(target))
    assert code == 2 and "file exists" in err
    assert target.read_bytes() == b"precious"


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        ({"wrong_name": np.zeros((1, 3, 64, 64), np.float32)}, "missing input(s) ['input']"),
        ({"input": np.zeros((1, 3, 32, 32), np.float32)}, "has shape (1, 3, 32, 32)"),
        ({"input": np.zeros((1, 3, 64, 64), np.float64)}, "has dtype float64"),
    ],
)
def test_bad_inputs_are_named(tmp_path, capsys, feeds, message):
    np.savez(tmp_path / "in.npz", **feeds)
    code, _, err = _run(capsys, "run", "--device", "cpu", "--inputs", str(tmp_path / "in.npz"))
    assert code == 2 and message in err


def test_missing_and_invalid_model_files(tmp_path, capsys):
    code, _, err = _run(capsys, "run", str(tmp_path / "nope.onnx"), "--device", "cpu")
    assert code == 2 and "nope.onnx: no such model file" in err
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage")
    code, _, err = _run(capsys, "run", str(bad), "--device", "cpu")
    assert code == 2 and "bad.onnx" in err


@pytest.mark.opencl
def test_run_coexec_with_an_automatic_plan(opencl, tmp_path, capsys):
    from codl_tvm.cost_model.synthetic import SyntheticDevice, synthetic_cost_model

    # A cost model fitted on synthetic records of a balanced device pair (nothing measured).
    synthetic_cost_model(SyntheticDevice()).save(tmp_path / "cm.json")
    model = load_onnx(bundled_model_path())
    feeds = random_inputs(model, seed=2)
    np.savez(tmp_path / "in.npz", **feeds)
    code, out, _ = _run(
        capsys,
        "run",
        "--device",
        "coexec",
        "--plan",
        "auto",
        "--cost-model",
        str(tmp_path / "cm.json"),
        "--inputs",
        str(tmp_path / "in.npz"),
        "--save-outputs",
        str(tmp_path / "out.npz"),
        "--repeat",
        "1",
        "--number",
        "1",
    )
    assert code == 0
    assert "conv2d_0" in out  # the plan report table
    ref = build(model.mod, "cpu")([feeds["input"]])[0]
    got = np.load(tmp_path / "out.npz")["logits"]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    # Without --cost-model the shipped model for the local device pair plans it.
    code, out, _ = _run(
        capsys,
        "run",
        "--device",
        "coexec",
        "--plan",
        "auto",
        "--inputs",
        str(tmp_path / "in.npz"),
        "--save-outputs",
        str(tmp_path / "out2.npz"),
        "--repeat",
        "1",
        "--number",
        "1",
    )
    assert code == 0 and "shipped default" in out
    got = np.load(tmp_path / "out2.npz")["logits"]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    code, _, err = _run(
        capsys,
        "run",
        "--device",
        "coexec",
        "--plan",
        "auto",
        "--cost-model",
        str(tmp_path / "missing.json"),
    )
    assert code == 2 and "missing.json: no such file" in err


@pytest.mark.opencl
def test_info_describes_the_device_in_use(opencl, capsys):
    import json

    assert main(["info", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["platform"] == opencl.platform
    assert shown["svm_mode"] == opencl.svm_mode
    assert [d["name"] for d in shown["devices"]] == [d.name for d in opencl.devices]


def test_compile_block_splits_default_to_measured_settings():
    """InstanceNorm blocks are split by default (FST gained), LRN row blocks are not (AlexNet
    at k = 12 lost 1.06x with them, benchmarks/ab_soc_k12_row_blocks.json)."""
    from codl_tvm.cli import build_parser

    args = build_parser().parse_args(["compile", "m.onnx", "-o", "out"])
    assert args.split_channel_blocks is True and args.split_row_blocks is False
    args = build_parser().parse_args(["compile", "m.onnx", "-o", "out", "--split-row-blocks"])
    assert args.split_row_blocks is True


def test_compile_flags_set_every_compile_option():
    """Every CompileOptions field but processor_scale is set from a compile flag
    (COMPILE_FLAGS names it, for the errors that name the field), so the two cannot drift
    apart; the flags' defaults are the fields' defaults."""
    import argparse
    import dataclasses

    from codl_tvm.cli import build_parser
    from codl_tvm.cli.compile import COMPILE_FLAGS, _compile_options
    from codl_tvm.options import CompileOptions

    fields = {f.name for f in dataclasses.fields(CompileOptions)}
    assert set(COMPILE_FLAGS) == fields - {"processor_scale"}
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = set(sub.choices["compile"]._option_string_actions)
    assert {f.removeprefix("--no-") for f in COMPILE_FLAGS.values()} <= {
        f.removeprefix("--no-") for f in flags
    }
    args = parser.parse_args(["compile", "m.onnx", "-o", "out"])
    assert _compile_options(args, None) == CompileOptions()


def test_compile_option_errors_name_the_flags(tmp_path, capsys):
    """The options' errors name their fields; ``compile`` shows the flags that set them."""
    code, _, err = _run(capsys, "compile", "-o", str(tmp_path / "a"), "--refine", "1")
    assert code == 2 and "--refine needs --verify > 0" in err and "Traceback" not in err
    code, _, err = _run(capsys, "compile", "-o", str(tmp_path / "b"), "--tracker", "127.0.0.1:9190")
    assert code == 2 and "--tracker and --key go together" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
