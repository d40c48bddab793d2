"""codl.StreamWeights at IR level (Before/Expected): large constants become fetches of
``codl.weights.get`` placed right before their first use, numbered in first-use order; small
constants stay; the sink receives the key and the arrays in fetch order.

The modules are built with a BlockBuilder: the pass runs after finalisation (no dataflow
blocks), and TVMScript cannot spell a module's constants without its metadata section.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from codl_tvm.passes.stream_weights import GET, MIN_BYTES, StreamWeights, weights_key
from tvm import relax

SHAPE = (1, 64, 8, 8)  # 16 KiB of float32: streamed
RNG = np.random.default_rng(0)
A = RNG.standard_normal(SHAPE).astype("float32")
B = RNG.standard_normal(SHAPE).astype("float32")
SMALL = np.float32(0.5) * np.ones((1, 64, 1, 1), "float32")  # 256 bytes: stays embedded
# main after finalisation: its VM builtins are impure calls, so it is forced pure
FINALIZED = {"relax.force_pure": True}


def _x() -> relax.Var:
    return relax.Var("x", relax.TensorType(SHAPE, "float32"))


def _before(a: relax.Expr, b: relax.Expr, small: relax.Expr) -> tvm.IRModule:
    """main(x) = ((x + b) * a + a) * small, outside dataflow (as after finalisation): ``b`` is
    used first although it is the second argument constant built."""
    x = _x()
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs=FINALIZED):
        y = bb.emit(relax.op.add(x, b))
        z = bb.emit(relax.op.multiply(y, a))
        w = bb.emit(relax.op.add(z, a))
        out = bb.emit(relax.op.multiply(w, small))
        bb.emit_func_output(out)
    return bb.get()


def _fetch(key: str, i: int, like: np.ndarray) -> relax.Call:
    return relax.Call(
        relax.ExternFunc(GET),
        [tvm.ir.StringImm(key), tvm.ir.prim.IntImm("int64", i)],
        ty_args=[relax.TensorType(like.shape, str(like.dtype))],
    )


def _expected(key: str, small: relax.Expr) -> tvm.IRModule:
    x = _x()
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs=FINALIZED):
        w0 = bb.emit(_fetch(key, 0, B))  # b: first used by the first binding
        y = bb.emit(relax.op.add(x, w0))
        w1 = bb.emit(_fetch(key, 1, A))  # a: fetched once, before its first use
        z = bb.emit(relax.op.multiply(y, w1))
        w = bb.emit(relax.op.add(z, w1))
        out = bb.emit(relax.op.multiply(w, small))
        bb.emit_func_output(out)
    return bb.get()


def verify(before: tvm.IRModule, expected: tvm.IRModule, sink: dict) -> tvm.IRModule:
    after = StreamWeights(sink, "cpu")(before)
    tvm.ir.assert_structural_equal(after, expected)
    relax.analysis.well_formed(after)  # raises if not
    return after


def test_constants_become_fetches_in_first_use_order():
    assert A.nbytes >= MIN_BYTES > SMALL.nbytes
    small = relax.const(SMALL)
    before = _before(relax.const(A), relax.const(B), small)
    key = f"{weights_key([B, A])}@cpu"
    sink: dict = {}
    verify(before, _expected(key, small), sink)
    assert sink["key"] == key
    assert [a.tobytes() for a in sink["arrays"]] == [B.tobytes(), A.tobytes()]


def test_the_device_is_part_of_the_key():
    arrays = [B, A]
    sink: dict = {}
    StreamWeights(sink, "opencl")(_before(relax.const(A), relax.const(B), relax.const(SMALL)))
    assert sink["key"] == f"{weights_key(arrays)}@opencl" != f"{weights_key(arrays)}@cpu"
    assert weights_key([A, B]) != weights_key([B, A])  # the order is part of it too


def test_small_constants_only_is_unchanged():
    before = _before(relax.const(SMALL), relax.const(SMALL), relax.const(SMALL))
    sink: dict = {}
    after = StreamWeights(sink, "cpu")(before)
    tvm.ir.assert_structural_equal(after, before)
    assert sink == {"key": None, "arrays": []}


def test_dataflow_blocks_are_refused():
    x = _x()
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs=FINALIZED):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, relax.const(A)))
        bb.emit_func_output(out)
    with pytest.raises(ValueError, match="after the finalisation phase"):
        StreamWeights({}, "cpu")(bb.get())


def _two_functions(a: relax.Expr, b: relax.Expr, fetch=None) -> tvm.IRModule:
    """f1(x) = x + a; f2(x) = (x + b) * a: one constant in two functions. With ``fetch``
    (index -> call), the expected module: each function fetches what it uses itself."""
    bb = relax.BlockBuilder()
    x = _x()
    with bb.function("f1", [x], attrs=FINALIZED):
        a1 = bb.emit(fetch(0, A)) if fetch else a
        bb.emit_func_output(bb.emit(relax.op.add(x, a1)))
    x = _x()
    with bb.function("f2", [x], attrs=FINALIZED):
        b2 = bb.emit(fetch(1, B)) if fetch else b
        y = bb.emit(relax.op.add(x, b2))
        a2 = bb.emit(fetch(0, A)) if fetch else a
        bb.emit_func_output(bb.emit(relax.op.multiply(y, a2)))
    return bb.get()


def test_a_constant_of_two_functions_is_one_weight_fetched_in_each():
    # f2 referred to f1's variable: an ill-formed module
    key = f"{weights_key([A, B])}@cpu"
    a = relax.const(A)
    expected = _two_functions(None, None, lambda i, like: _fetch(key, i, like))
    sink: dict = {}
    verify(_two_functions(a, relax.const(B)), expected, sink)
    assert sink["key"] == key and len(sink["arrays"]) == 2
