"""Tensor names that are not C identifiers: the sanitizer, and every build path end to end.

Models exported from Caffe2 and by many converters name tensors like ``gpu_0/data_0``; TVM turns
``main``'s parameter names into OpenCL kernel argument names, so such a name broke every OpenCL
build. The build now sees C identifiers while the user's names stay at the API, in the npz files
and in the artifact.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import tvm
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import codl_tvm
from codl_tvm.build.runner import build
from codl_tvm.cli import main
from codl_tvm.core.names import c_identifiers, is_c_identifier, rename_params
from codl_tvm.core.plan import uniform_plan
from codl_tvm.frontend.importer import load_onnx, random_inputs

# -- the sanitizer -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gpu_0/data_0", "gpu_0_data_0"),
        ("conv1.weight", "conv1_weight"),
        ("input:0", "input_0"),
        ("in-put", "in_put"),
        ("a b", "a_b"),
        ("0", "_0"),
        ("1st/layer", "_1st_layer"),
        ("données", "donnu00e9es"),
        ("入力", "u5165u529b"),
        ("", "unnamed"),
        ("int", "int_"),
        ("float4", "float4_"),
        ("__kernel", "__kernel_"),
        ("global", "global_"),
        ("data_0", "data_0"),
        ("_x", "_x"),
    ],
)
def test_single_names(name, expected):
    assert c_identifiers([name]) == {name: expected}
    assert is_c_identifier(expected)


def test_names_that_sanitize_alike_get_suffixes():
    # "a_b" is valid and keeps its name; the others are suffixed in sorted order ('.' < '/' < ':').
    assert c_identifiers(["a/b", "a:b", "a_b", "a.b"]) == {
        "a_b": "a_b",
        "a.b": "a_b_1",
        "a/b": "a_b_2",
        "a:b": "a_b_3",
    }


def test_a_suffix_never_takes_another_original_name():
    got = c_identifiers(["a/b", "a_b_1", "a.b"])
    assert got == {"a_b_1": "a_b_1", "a.b": "a_b", "a/b": "a_b_2"}


def test_a_sanitized_name_never_takes_a_later_original_name():
    # "int_" is kept by the tensor that had it, so the keyword "int" has to look further.
    got = c_identifiers(["int", "int_"])
    assert got["int_"] == "int_" and got["int"] == "int__1"


names_st = st.lists(st.text(max_size=12), max_size=10)
c_names_st = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True).filter(is_c_identifier)


@given(names_st)
def test_every_value_is_an_identifier_and_the_mapping_is_injective(names):
    mapping = c_identifiers(names)
    assert set(mapping) == set(names)
    values = list(mapping.values())
    assert all(is_c_identifier(v) for v in values)
    assert len(set(values)) == len(values)
    for original, new in mapping.items():
        assert new == original or new not in mapping  # never another tensor's original name


@given(st.lists(c_names_st, max_size=6), names_st)
def test_valid_names_keep_their_names(valid, others):
    mapping = c_identifiers(valid + others)
    assert all(mapping[v] == v for v in valid)
    # Applying it again changes nothing.
    assert c_identifiers(mapping.values()) == {v: v for v in mapping.values()}


@given(names_st, st.randoms(use_true_random=False))
def test_the_mapping_is_stable(names, rnd):
    shuffled = list(names)
    rnd.shuffle(shuffled)
    assert c_identifiers(names) == c_identifiers(shuffled) == c_identifiers(names + names)
    assert list(c_identifiers(names)) == list(dict.fromkeys(names))  # keys in the given order


def test_rename_params_keeps_the_function():
    ty = relax.TensorType((2, 3), "float32")
    x, y = relax.Var("x/0", ty), relax.Var("y", ty)
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, y))
        bb.emit_func_output(out)
    func = bb.get()["main"]
    renamed = rename_params(func, c_identifiers(p.name for p in func.params))
    assert [p.name for p in renamed.params] == ["x_0", "y"]
    assert renamed.params[1].same_as(y)  # untouched parameters are the same variables
    relax.analysis.well_formed(tvm.IRModule({"main": renamed}))  # raises if not
    # Structural equality maps variables by position, not by name: the same computation.
    tvm.ir.assert_structural_equal(renamed, func)
    assert rename_params(func, {}).same_as(func)


# -- end to end ----------------------------------------------------------------------------------

# Graph inputs: '/', '.', ':', '-', a leading digit, non-ASCII, and three that sanitize to "a_b".
ODD = ["gpu_0/data_0", "a.b", "a_b", "a/b", "x:0", "in-put", "1st", "données"]
OUT = "gpu_0/softmax_1:0"


def _odd_model() -> onnx.ModelProto:
    """Conv(ODD[0]) plus every other input, then Relu; intermediates and weight oddly named too."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype("float32")
    nodes = [helper.make_node("Conv", [ODD[0], "gpu_0/conv1_w.0"], ["t/0"], pads=[1, 1, 1, 1])]
    prev = "t/0"
    for i, name in enumerate(ODD[1:]):
        nodes.append(helper.make_node("Add", [prev, name], [f"t/{i + 1}"]))
        prev = f"t/{i + 1}"
    nodes.append(helper.make_node("Relu", [prev], [OUT]))
    inputs = [helper.make_tensor_value_info(ODD[0], TensorProto.FLOAT, [1, 3, 8, 8])]
    inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, 8, 8]) for n in ODD[1:]]
    graph = helper.make_graph(
        nodes,
        "odd_names",
        inputs,
        [helper.make_tensor_value_info(OUT, TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(w, "gpu_0/conv1_w.0")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _onnxruntime(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_load_onnx_renames_only_the_build():
    model = load_onnx(_odd_model())
    assert [s.name for s in model.inputs] == ODD
    assert [s.name for s in model.outputs] == [OUT]
    params = [p.name for p in model.mod["main"].params]
    assert params == [c_identifiers(ODD)[n] for n in ODD]
    assert all(is_c_identifier(p) for p in params) and len(set(params)) == len(params)


def test_cpu_build_against_onnxruntime():
    proto = _odd_model()
    model = load_onnx(proto)
    feeds = random_inputs(model, seed=1)
    got = build(model.mod, "cpu")([feeds[s.name] for s in model.inputs])[0]
    _close(got, _onnxruntime(proto, feeds))


@pytest.mark.opencl
def test_opencl_and_coexec_builds_against_onnxruntime(opencl):
    proto = _odd_model()
    model = load_onnx(proto)
    feeds = random_inputs(model, seed=1)
    inputs = [feeds[s.name] for s in model.inputs]
    want = _onnxruntime(proto, feeds)
    _close(build(model.mod, "opencl")(inputs)[0], want)
    for dim in ("H", "OC"):
        got = codl_tvm.compile(model.mod, uniform_plan(model.mod, dim, 0.5))(inputs)
        _close(got[0], want)


def _cli(capsys, *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in err
    return out


@pytest.mark.opencl
def test_cli_run_and_artifact_keep_the_users_names(opencl, tmp_path, capsys):
    proto = _odd_model()
    onnx.save(proto, tmp_path / "m.onnx")
    feeds = random_inputs(load_onnx(proto), seed=2)
    np.savez(tmp_path / "in.npz", **feeds)
    want = _onnxruntime(proto, feeds)
    timing = ("--repeat", "1", "--number", "1")

    out_npz = tmp_path / "run.npz"
    _cli(capsys, "run", str(tmp_path / "m.onnx"), "--device", "opencl", "--inputs",
         str(tmp_path / "in.npz"), "--save-outputs", str(out_npz), *timing)  # fmt: skip
    saved = np.load(out_npz)
    assert saved.files == [OUT]
    _close(saved[OUT], want)

    art = tmp_path / "art"
    _cli(capsys, "compile", str(tmp_path / "m.onnx"), "-o", str(art), "--device", "coexec",
         "--dim", "H", "--ratio", "0.5")  # fmt: skip
    manifest = json.loads((art / "manifest.json").read_text())
    assert [i["name"] for i in manifest["model"]["inputs"]] == ODD
    assert [o["name"] for o in manifest["model"]["outputs"]] == [OUT]
    out_npz = tmp_path / "art.npz"
    printed = _cli(capsys, "run", str(art), "--inputs", str(tmp_path / "in.npz"),
                   "--save-outputs", str(out_npz), *timing)  # fmt: skip
    assert f"output {OUT}:" in printed
    saved = np.load(out_npz)
    assert saved.files == [OUT]
    _close(saved[OUT], want)
    # The stored reference inputs (keyed by the user's names) give the reference outputs.
    assert "-> OK" in _cli(capsys, "run", str(art), *timing)
