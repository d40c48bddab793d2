"""codl.InsertCoexecSync at IR level: Before/Expected TVMScript modules compared structurally
(CPU only).

The Before module is ``main`` as ToNonDataflow and RemovePurityChecking leave it after
:class:`~codl_tvm.passes.place.PlaceParts`, with tiny kernels: a GPU kernel, two CPU kernels
(the first reads the GPU's output and a weight, the second only the first's), and a GPU kernel
reading the second CPU kernel's output.
"""

from __future__ import annotations

import numpy as np
import tvm
from codl_tvm.passes.merge import site_id
from codl_tvm.passes.sync import InsertCoexecSync
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

GPU = tvm.target.Target({"kind": "opencl"}, host={"kind": "llvm"})
CPU = tvm.target.Target({"kind": "llvm"})
W = np.arange(2, dtype="float32")


def _vdevices():
    return {"vdevice": [I.vdevice(GPU, 0, "global"), I.vdevice(CPU, 0, "global")]}


@I.ir_module
class Before:
    I.module_global_infos(_vdevices())

    @T.prim_func(private=True)
    def neg(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"target": GPU})
        for i in range(2):
            y[i] = T.float32(0) - x[i]

    @T.prim_func(private=True)
    def add(
        x: T.Buffer((2,), "float32"), w: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")
    ):
        T.func_attr({"target": CPU})
        for i in range(2):
            y[i] = x[i] + w[i]

    @T.prim_func(private=True)
    def relu(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"target": CPU})
        for i in range(2):
            y[i] = T.max(x[i], T.float32(0))

    @R.function
    def main(
        x: R.Tensor((2,), "float32", "opencl:0:global"),
    ) -> R.Tensor((2,), "float32", "opencl:0:global"):
        R.func_attr({"relax.force_pure": True})
        cls = Before
        g1 = R.call_tir(cls.neg, (x,), out_ty=R.Tensor((2,), "float32", "opencl:0:global"))
        c1 = R.call_tir(
            cls.add, (g1, R.const(W)), out_ty=R.Tensor((2,), "float32", "llvm:0:global")
        )
        c2 = R.call_tir(cls.relu, (c1,), out_ty=R.Tensor((2,), "float32", "llvm:0:global"))
        g2 = R.call_tir(cls.neg, (c2,), out_ty=R.Tensor((2,), "float32", "opencl:0:global"))
        return g2


# The runtime caches weights and buffers per call site; the ids are the pass's own function of
# main and the binding (the weight of the first CPU call; bindings 1 and 2 are c1 and c2).
WEIGHT_SITE = site_id(Before["main"], "const", 1)
C1_SITE = site_id(Before["main"], "sync", 1)
C2_SITE = site_id(Before["main"], "sync", 2)
GPU_DEVICE, CPU_DEVICE = 0, 1


@I.ir_module
class Expected:
    I.module_global_infos(_vdevices())

    @T.prim_func(private=True)
    def neg(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"target": GPU})
        for i in range(2):
            y[i] = T.float32(0) - x[i]

    @T.prim_func(private=True)
    def add(
        x: T.Buffer((2,), "float32"), w: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")
    ):
        T.func_attr({"target": CPU})
        for i in range(2):
            y[i] = x[i] + w[i]

    @T.prim_func(private=True)
    def relu(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"target": CPU})
        for i in range(2):
            y[i] = T.max(x[i], T.float32(0))

    @R.function
    def main(
        x: R.Tensor((2,), "float32", "opencl:0:global"),
    ) -> R.Tensor((2,), "float32", "opencl:0:global"):
        R.func_attr({"relax.force_pure": True})
        cls = Expected
        # drain the previous call's GPU work before the CPU reuses its buffers
        entry_mark: R.Prim("int64") = R.call_packed(
            "codl.coexec.gpu_mark", GPU_DEVICE, ty_args=(R.Prim("int64"),)
        )
        R.call_packed("codl.coexec.cpu_wait", entry_mark, ty_args=(R.Tuple,))
        g1 = R.call_tir(cls.neg, (x,), out_ty=R.Tensor((2,), "float32", "opencl:0:global"))
        # mark right after the GPU writer; the CPU waits for that much only
        mark: R.Prim("int64") = R.call_packed(
            "codl.coexec.gpu_mark", GPU_DEVICE, ty_args=(R.Prim("int64"),)
        )
        R.call_packed("codl.coexec.cpu_wait", mark, ty_args=(R.Tuple,))
        # CPU view of the GPU tensor, the CPU's own copy of the weight
        g1_cpu: R.Tensor((2,), "float32", "opencl:0:global") = R.call_packed(
            "codl.coexec.cpu_view", g1, ty_args=(R.Tensor((2,), "float32", "opencl:0:global"),)
        )
        weight_cpu: R.Tensor((2,), "float32") = R.call_packed(
            "codl.coexec.cpu_copy", WEIGHT_SITE, R.const(W), ty_args=(R.Tensor((2,), "float32"),)
        )
        # c1 is read only by CPU kernels: a private buffer on the CPU device
        c1_buf: R.Tensor((2,), "float32", "llvm:0:global") = R.call_packed(
            "codl.coexec.alloc",
            C1_SITE,
            R.shape([2]),
            R.dtype("float32"),
            CPU_DEVICE,
            T.bool(True),  # cached per call site (not a returned tensor)
            ty_args=(R.Tensor((2,), "float32", "llvm:0:global"),),
        )
        c1: R.Tensor((2,), "float32", "llvm:0:global") = R.call_tir_inplace(
            cls.add,
            (g1_cpu, weight_cpu, c1_buf),
            out_ty=R.Tensor((2,), "float32", "llvm:0:global"),
            inplace_indices=[2],
        )
        # c2 is read by the GPU: a shared (SVM) buffer on the GPU device, written via a CPU view
        c2_buf: R.Tensor((2,), "float32", "llvm:0:global") = R.call_packed(
            "codl.coexec.alloc",
            C2_SITE,
            R.shape([2]),
            R.dtype("float32"),
            GPU_DEVICE,
            T.bool(True),  # cached per call site (not a returned tensor)
            ty_args=(R.Tensor((2,), "float32", "llvm:0:global"),),
        )
        c2_buf_cpu: R.Tensor((2,), "float32", "llvm:0:global") = R.call_packed(
            "codl.coexec.cpu_view", c2_buf, ty_args=(R.Tensor((2,), "float32", "llvm:0:global"),)
        )
        _c2: R.Tensor((2,), "float32", "llvm:0:global") = R.call_tir_inplace(
            cls.relu,
            (c1, c2_buf_cpu),
            out_ty=R.Tensor((2,), "float32", "llvm:0:global"),
            inplace_indices=[1],
        )
        # the GPU reads the shared buffer itself
        g2 = R.call_tir(cls.neg, (c2_buf,), out_ty=R.Tensor((2,), "float32", "opencl:0:global"))
        return g2


def test_insert_coexec_sync():
    tvm.ir.assert_structural_equal(InsertCoexecSync()(Before), Expected)


def test_a_module_without_cpu_kernels_is_left_alone():
    gpu_only = Before.clone()
    for name in ("add", "relu"):
        gv = gpu_only.get_global_var(name)
        gpu_only[gv] = gpu_only[gv].with_attr("target", GPU)
    assert InsertCoexecSync()(gpu_only).same_as(gpu_only)


# Two branches: the GPU computes g1 from x while the CPU computes c1 from x; no CPU kernel reads
# g1, so no mark follows it: a flush submits it before the CPU kernel runs.
@I.ir_module
class BeforeBranches:
    I.module_global_infos(_vdevices())

    @T.prim_func(private=True)
    def neg(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"target": GPU})
        for i in range(2):
            y[i] = T.float32(0) - x[i]

    @T.prim_func(private=True)
    def relu(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"target": CPU})
        for i in range(2):
            y[i] = T.max(x[i], T.float32(0))

    @R.function
    def main(x: R.Tensor((2,), "float32", "opencl:0:global")) -> R.Tuple(
        R.Tensor((2,), "float32", "opencl:0:global"), R.Tensor((2,), "float32", "opencl:0:global")
    ):
        R.func_attr({"relax.force_pure": True})
        cls = BeforeBranches
        g1 = R.call_tir(cls.neg, (x,), out_ty=R.Tensor((2,), "float32", "opencl:0:global"))
        c1 = R.call_tir(cls.relu, (x,), out_ty=R.Tensor((2,), "float32", "llvm:0:global"))
        g2 = R.call_tir(cls.neg, (c1,), out_ty=R.Tensor((2,), "float32", "opencl:0:global"))
        return (g1, g2)


C1_BRANCH_SITE = site_id(BeforeBranches["main"], "sync", 1)


@I.ir_module
class ExpectedBranches:
    I.module_global_infos(_vdevices())

    @T.prim_func(private=True)
    def neg(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"target": GPU})
        for i in range(2):
            y[i] = T.float32(0) - x[i]

    @T.prim_func(private=True)
    def relu(x: T.Buffer((2,), "float32"), y: T.Buffer((2,), "float32")):
        T.func_attr({"target": CPU})
        for i in range(2):
            y[i] = T.max(x[i], T.float32(0))

    @R.function
    def main(x: R.Tensor((2,), "float32", "opencl:0:global")) -> R.Tuple(
        R.Tensor((2,), "float32", "opencl:0:global"), R.Tensor((2,), "float32", "opencl:0:global")
    ):
        R.func_attr({"relax.force_pure": True})
        cls = ExpectedBranches
        entry_mark: R.Prim("int64") = R.call_packed(
            "codl.coexec.gpu_mark", GPU_DEVICE, ty_args=(R.Prim("int64"),)
        )
        R.call_packed("codl.coexec.cpu_wait", entry_mark, ty_args=(R.Tuple,))
        g1 = R.call_tir(cls.neg, (x,), out_ty=R.Tensor((2,), "float32", "opencl:0:global"))
        # the GPU branch is submitted before the host runs the CPU branch
        R.call_packed("codl.coexec.gpu_flush", GPU_DEVICE, ty_args=(R.Tuple,))
        x_cpu: R.Tensor((2,), "float32", "opencl:0:global") = R.call_packed(
            "codl.coexec.cpu_view", x, ty_args=(R.Tensor((2,), "float32", "opencl:0:global"),)
        )
        c1_buf: R.Tensor((2,), "float32", "llvm:0:global") = R.call_packed(
            "codl.coexec.alloc",
            C1_BRANCH_SITE,
            R.shape([2]),
            R.dtype("float32"),
            GPU_DEVICE,
            T.bool(True),
            ty_args=(R.Tensor((2,), "float32", "llvm:0:global"),),
        )
        c1_buf_cpu: R.Tensor((2,), "float32", "llvm:0:global") = R.call_packed(
            "codl.coexec.cpu_view", c1_buf, ty_args=(R.Tensor((2,), "float32", "llvm:0:global"),)
        )
        _c1: R.Tensor((2,), "float32", "llvm:0:global") = R.call_tir_inplace(
            cls.relu,
            (x_cpu, c1_buf_cpu),
            out_ty=R.Tensor((2,), "float32", "llvm:0:global"),
            inplace_indices=[1],
        )
        g2 = R.call_tir(cls.neg, (c1_buf,), out_ty=R.Tensor((2,), "float32", "opencl:0:global"))
        return (g1, g2)


def test_gpu_branch_is_flushed_before_a_cpu_branch():
    tvm.ir.assert_structural_equal(InsertCoexecSync()(BeforeBranches), ExpectedBranches)
