"""codl.IssueGpuAhead at IR level: Before/Expected TVMScript modules compared structurally
(CPU only, no device).

The Before module is ``main`` as :class:`~codl_tvm.passes.sync.InsertCoexecSync` leaves it for a
split operator followed by an independent CPU kernel and a GPU kernel that reads the split's
merged output: the GPU part writes rows [0, 2) of ``y``, the CPU part rows [2, 4), ``join``
merges them, the CPU kernel ``other`` needs nothing of the split, and then the GPU kernel
``neg`` reads ``y``. In host order the GPU idles while the host runs ``other``.
"""

from __future__ import annotations

import pytest
import tvm
from codl_tvm.passes.issue_ahead import GPU_INPUTS_ATTR, IssueGpuAhead, gpu_inputs
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

GPU = tvm.target.Target({"kind": "opencl"}, host={"kind": "llvm"})
CPU = tvm.target.Target({"kind": "llvm"})


def _vdevices():
    return {"vdevice": [I.vdevice(GPU, 0, "global"), I.vdevice(CPU, 0, "global")]}


@I.ir_module
class Before:
    I.module_global_infos(_vdevices())

    @T.prim_func(private=True)
    def gpu_rows(x: T.Buffer((4,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"target": GPU})
        for i in range(2):
            y[i] = x[i] * T.float32(2)

    @T.prim_func(private=True)
    def cpu_rows(x: T.Buffer((4,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"target": CPU})
        for i in range(2):
            y[i] = x[i + 2] * T.float32(2)

    @T.prim_func(private=True)
    def other(x: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
        T.func_attr({"target": CPU})
        for i in range(4):
            y[i] = T.max(x[i], T.float32(0))

    @T.prim_func(private=True)
    def neg(x: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
        T.func_attr({"target": GPU})
        for i in range(4):
            y[i] = T.float32(0) - x[i]

    @R.function
    def main(x: R.Tensor((4,), "float32", "opencl:0:global")):
        R.func_attr({"relax.force_pure": True})
        cls = Before
        entry_mark = R.call_packed("codl.coexec.gpu_mark", 0, ty_args=(R.Prim("int64"),))
        _ = R.call_packed("codl.coexec.cpu_wait", entry_mark, ty_args=(R.Tuple,))
        y = R.call_packed(
            "codl.coexec.alloc", 11, R.shape([4]), R.dtype("float32"), 0, True,
            ty_args=(R.Tensor((4,), "float32", "opencl:0:global"),),
        )  # fmt: skip
        yg = R.call_packed(
            "codl.coexec.region_view", y, 0, 0, 2,
            ty_args=(R.Tensor((2,), "float32", "opencl:0:global"),),
        )  # fmt: skip
        g1 = R.call_tir_inplace(
            cls.gpu_rows, (x, yg), [1], out_ty=R.Tensor((2,), "float32", "opencl:0:global")
        )
        x_cpu = R.call_packed(
            "codl.coexec.cpu_view", x, ty_args=(R.Tensor((4,), "float32", "opencl:0:global"),)
        )
        yc = R.call_packed(
            "codl.coexec.region_view", y, 0, 2, 4,
            ty_args=(R.Tensor((2,), "float32", "llvm:0:global"),),
        )  # fmt: skip
        yc_cpu = R.call_packed(
            "codl.coexec.cpu_view", yc, ty_args=(R.Tensor((2,), "float32", "llvm:0:global"),)
        )
        # the sync pass's flush: the GPU part was enqueued since the last mark
        _ = R.call_packed("codl.coexec.gpu_flush", 0, ty_args=(R.Tuple,))
        c1 = R.call_tir_inplace(
            cls.cpu_rows, (x_cpu, yc_cpu), [1], out_ty=R.Tensor((2,), "float32", "llvm:0:global")
        )
        y1 = R.call_packed(
            "codl.coexec.join", y, g1, c1,
            ty_args=(R.Tensor((4,), "float32", "opencl:0:global"),),
        )  # fmt: skip
        buf = R.call_packed(
            "codl.coexec.alloc", 12, R.shape([4]), R.dtype("float32"), 1, True,
            ty_args=(R.Tensor((4,), "float32", "llvm:0:global"),),
        )  # fmt: skip
        c2 = R.call_tir_inplace(
            cls.other, (x_cpu, buf), [1], out_ty=R.Tensor((4,), "float32", "llvm:0:global")
        )
        g2 = R.call_tir(cls.neg, (y1,), out_ty=R.Tensor((4,), "float32", "opencl:0:global"))
        return (g2, c2)


@I.ir_module
class ExpectedAhead:
    """Without gates: ``neg`` right after the join, before ``other``, flushed before it."""

    I.module_global_infos(_vdevices())

    @T.prim_func(private=True)
    def gpu_rows(x: T.Buffer((4,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"target": GPU})
        for i in range(2):
            y[i] = x[i] * T.float32(2)

    @T.prim_func(private=True)
    def cpu_rows(x: T.Buffer((4,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"target": CPU})
        for i in range(2):
            y[i] = x[i + 2] * T.float32(2)

    @T.prim_func(private=True)
    def other(x: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
        T.func_attr({"target": CPU})
        for i in range(4):
            y[i] = T.max(x[i], T.float32(0))

    @T.prim_func(private=True)
    def neg(x: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
        T.func_attr({"target": GPU})
        for i in range(4):
            y[i] = T.float32(0) - x[i]

    @R.function
    def main(x: R.Tensor((4,), "float32", "opencl:0:global")):
        R.func_attr({"relax.force_pure": True})
        cls = ExpectedAhead
        entry_mark = R.call_packed("codl.coexec.gpu_mark", 0, ty_args=(R.Prim("int64"),))
        _ = R.call_packed("codl.coexec.cpu_wait", entry_mark, ty_args=(R.Tuple,))
        y = R.call_packed(
            "codl.coexec.alloc", 11, R.shape([4]), R.dtype("float32"), 0, True,
            ty_args=(R.Tensor((4,), "float32", "opencl:0:global"),),
        )  # fmt: skip
        yg = R.call_packed(
            "codl.coexec.region_view", y, 0, 0, 2,
            ty_args=(R.Tensor((2,), "float32", "opencl:0:global"),),
        )  # fmt: skip
        g1 = R.call_tir_inplace(
            cls.gpu_rows, (x, yg), [1], out_ty=R.Tensor((2,), "float32", "opencl:0:global")
        )
        x_cpu = R.call_packed(
            "codl.coexec.cpu_view", x, ty_args=(R.Tensor((4,), "float32", "opencl:0:global"),)
        )
        yc = R.call_packed(
            "codl.coexec.region_view", y, 0, 2, 4,
            ty_args=(R.Tensor((2,), "float32", "llvm:0:global"),),
        )  # fmt: skip
        yc_cpu = R.call_packed(
            "codl.coexec.cpu_view", yc, ty_args=(R.Tensor((2,), "float32", "llvm:0:global"),)
        )
        _ = R.call_packed("codl.coexec.gpu_flush", 0, ty_args=(R.Tuple,))
        c1 = R.call_tir_inplace(
            cls.cpu_rows, (x_cpu, yc_cpu), [1], out_ty=R.Tensor((2,), "float32", "llvm:0:global")
        )
        y1 = R.call_packed(
            "codl.coexec.join", y, g1, c1,
            ty_args=(R.Tensor((4,), "float32", "opencl:0:global"),),
        )  # fmt: skip
        g2 = R.call_tir(cls.neg, (y1,), out_ty=R.Tensor((4,), "float32", "opencl:0:global"))
        buf = R.call_packed(
            "codl.coexec.alloc", 12, R.shape([4]), R.dtype("float32"), 1, True,
            ty_args=(R.Tensor((4,), "float32", "llvm:0:global"),),
        )  # fmt: skip
        _ = R.call_packed("codl.coexec.gpu_flush", 0, ty_args=(R.Tuple,))
        c2 = R.call_tir_inplace(
            cls.other, (x_cpu, buf), [1], out_ty=R.Tensor((4,), "float32", "llvm:0:global")
        )
        return (g2, c2)


@I.ir_module
class ExpectedGated:
    """With gates: ``neg`` right after the GPU part, held on the device until the CPU part has
    run; it reads the shared tensor ``y`` (the join stays on the host, after the part)."""

    I.module_global_infos(_vdevices())

    @T.prim_func(private=True)
    def gpu_rows(x: T.Buffer((4,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"target": GPU})
        for i in range(2):
            y[i] = x[i] * T.float32(2)

    @T.prim_func(private=True)
    def cpu_rows(x: T.Buffer((4,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"target": CPU})
        for i in range(2):
            y[i] = x[i + 2] * T.float32(2)

    @T.prim_func(private=True)
    def other(x: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
        T.func_attr({"target": CPU})
        for i in range(4):
            y[i] = T.max(x[i], T.float32(0))

    @T.prim_func(private=True)
    def neg(x: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
        T.func_attr({"target": GPU})
        for i in range(4):
            y[i] = T.float32(0) - x[i]

    @R.function
    def main(x: R.Tensor((4,), "float32", "opencl:0:global")):
        R.func_attr({"relax.force_pure": True})
        cls = ExpectedGated
        entry_mark = R.call_packed("codl.coexec.gpu_mark", 0, ty_args=(R.Prim("int64"),))
        _ = R.call_packed("codl.coexec.cpu_wait", entry_mark, ty_args=(R.Tuple,))
        y = R.call_packed(
            "codl.coexec.alloc", 11, R.shape([4]), R.dtype("float32"), 0, True,
            ty_args=(R.Tensor((4,), "float32", "opencl:0:global"),),
        )  # fmt: skip
        yg = R.call_packed(
            "codl.coexec.region_view", y, 0, 0, 2,
            ty_args=(R.Tensor((2,), "float32", "opencl:0:global"),),
        )  # fmt: skip
        g1 = R.call_tir_inplace(
            cls.gpu_rows, (x, yg), [1], out_ty=R.Tensor((2,), "float32", "opencl:0:global")
        )
        gate = R.call_packed("codl.coexec.gpu_gate", 0, ty_args=(R.Prim("int64"),))
        g2 = R.call_tir(cls.neg, (y,), out_ty=R.Tensor((4,), "float32", "opencl:0:global"))
        x_cpu = R.call_packed(
            "codl.coexec.cpu_view", x, ty_args=(R.Tensor((4,), "float32", "opencl:0:global"),)
        )
        yc = R.call_packed(
            "codl.coexec.region_view", y, 0, 2, 4,
            ty_args=(R.Tensor((2,), "float32", "llvm:0:global"),),
        )  # fmt: skip
        yc_cpu = R.call_packed(
            "codl.coexec.cpu_view", yc, ty_args=(R.Tensor((2,), "float32", "llvm:0:global"),)
        )
        _ = R.call_packed("codl.coexec.gpu_flush", 0, ty_args=(R.Tuple,))
        c1 = R.call_tir_inplace(
            cls.cpu_rows, (x_cpu, yc_cpu), [1], out_ty=R.Tensor((2,), "float32", "llvm:0:global")
        )
        _ = R.call_packed("codl.coexec.cpu_signal", gate, ty_args=(R.Tuple,))
        y1 = R.call_packed(  # noqa: F841 (the join the host still makes)
            "codl.coexec.join", y, g1, c1,
            ty_args=(R.Tensor((4,), "float32", "opencl:0:global"),),
        )  # fmt: skip
        buf = R.call_packed(
            "codl.coexec.alloc", 12, R.shape([4]), R.dtype("float32"), 1, True,
            ty_args=(R.Tensor((4,), "float32", "llvm:0:global"),),
        )  # fmt: skip
        c2 = R.call_tir_inplace(
            cls.other, (x_cpu, buf), [1], out_ty=R.Tensor((4,), "float32", "llvm:0:global")
        )
        return (g2, c2)


def verify(gates: bool, expected: tvm.IRModule, inputs: dict[int, list[int]]) -> None:
    after = IssueGpuAhead(gates)(Before)
    tvm.relax.analysis.well_formed(after)  # raises on a violation
    tvm.ir.assert_structural_equal(after.without_attr(GPU_INPUTS_ATTR), expected)
    assert gpu_inputs(after) == inputs


def test_gpu_kernel_moves_ahead_of_an_independent_cpu_kernel():
    # kernel calls after: gpu_rows, cpu_rows, neg, other; neg reads what cpu_rows wrote
    verify(False, ExpectedAhead, {0: [], 2: [1]})


def test_gated_gpu_kernel_moves_ahead_of_its_producer_and_reads_the_shared_tensor():
    # gpu_rows, neg, cpu_rows, other: neg still waits for cpu_rows, which now comes after it
    verify(True, ExpectedGated, {0: [], 1: [2]})


def test_without_reorder_only_the_record_is_added():
    after = IssueGpuAhead(reorder=False)(Before)
    tvm.ir.assert_structural_equal(after.without_attr(GPU_INPUTS_ATTR), Before)
    # host order: gpu_rows, cpu_rows, other, neg
    assert gpu_inputs(after) == {0: [], 3: [1]}
    assert gpu_inputs(Before) == {}


@pytest.mark.parametrize("gates", [False, True])
def test_an_order_already_ahead_is_kept(gates):
    done = IssueGpuAhead(gates)(Before)
    again = IssueGpuAhead(gates)(done)
    tvm.ir.assert_structural_equal(again, done)
    assert gpu_inputs(again) == gpu_inputs(done)


def test_a_gate_never_spans_a_binding_that_could_block_on_the_queue():
    """An unknown packed call between the GPU kernel's issue point and its producer (it might
    copy on the queue, behind the gate): no gate, the kernel is issued after the producer."""
    main = Before["main"]
    blocks = main.body.blocks[0].bindings
    unknown = tvm.relax.VarBinding(
        tvm.relax.Var("copy", tvm.relax.TupleType([])),
        tvm.relax.Call(tvm.relax.ExternFunc("some.copy"), [], ty_args=[tvm.relax.TupleType([])]),
    )
    at = next(i for i, b in enumerate(blocks) if b.var.name == "x_cpu")
    new = [*blocks[:at], unknown, *blocks[at:]]
    body = tvm.relax.SeqExpr([tvm.relax.BindingBlock(new)], main.body.body)
    mod = Before.clone()
    mod["main"] = tvm.relax.Function(main.params, body, main.ret_ty, main.is_pure, main.attrs)
    after = IssueGpuAhead(True)(mod)
    called = [
        str(b.value.op.global_symbol)
        for b in after["main"].body.blocks[0].bindings
        if isinstance(b.value, tvm.relax.Call) and isinstance(b.value.op, tvm.relax.ExternFunc)
    ]
    assert "codl.coexec.gpu_gate" not in called
    tvm.ir.assert_structural_equal(after, IssueGpuAhead(False)(mod))
    assert gpu_inputs(after) == {0: [], 2: [1]}
