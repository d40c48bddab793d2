"""codl.InsertCoexecSync: let CPU kernels run on shared tensors while the GPU queue runs ahead.

Preconditions
-------------
- Runs after ToNonDataflow and RemovePurityChecking and before CallTIRRewrite: ``main`` is one
  sequence of bindings (executed in order by the VM) whose kernel calls are still ``call_tir``
  / ``call_tir_inplace`` and whose callees carry a ``target`` (``llvm`` = CPU, else GPU), as
  :class:`~codl_tvm.passes.place.PlaceParts` left them.
- The VM runs with devices ``[opencl, cpu]``: device 0 holds shared tensors in SVM, device 1 the
  CPU's private intermediates.

What it does
------------
GPU kernels are enqueued asynchronously; CPU kernels run on the host thread in program order.
- Every CPU kernel gets its tensors through ``codl.coexec.cpu_view`` (a CPU tensor over the
  same SVM bytes, no copy), and its weights from ``codl.coexec.cpu_copy``: the CPU's own copy
  of each constant, made once at the first run (the VM puts every constant on devices[0]).
  Its outputs go to the CPU device when only CPU kernels read them,
  else to a fresh SVM tensor the GPU can read later; the call becomes ``call_tir_inplace``.
- Before a CPU kernel reads a tensor that a GPU kernel wrote, the host waits, but only for
  the GPU work up to that writer: a ``codl.coexec.gpu_mark`` is placed right after the writer
  (before any later GPU kernel, e.g. the GPU part of the same chain) and a
  ``codl.coexec.cpu_wait`` right before the CPU kernel. So the GPU part of a co-executed
  operator runs while the CPU part computes (CoDL's order: enqueue GPU, run CPU, then sync).
- A CPU kernel that follows GPU kernels enqueued after the last mark gets a
  ``codl.coexec.gpu_flush`` before it (before its wait, if any): real GPU drivers start queued
  work only when flushed, and a mark flushes only where a CPU kernel reads the GPU's result, so
  a GPU branch beside a CPU branch (a HOPE placement) would otherwise start only at the next
  mark.
- A CPU kernel writing its region of a shared output (``codl.shared_output``, from
  :class:`~codl_tvm.passes.merge.MergePartsInPlace`) does not wait for the GPU part writing the
  other region of the same tensor.
- Aliases are followed: region views, ``join`` and ``cpu_view`` results share their source's
  pending GPU writes.

:class:`~codl_tvm.passes.issue_ahead.IssueGpuAhead` runs next: it moves GPU kernels (with their
marks) earlier and places the flushes again; the waits stay where this pass put them.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .kernel_calls import CALL_TIR_INPLACE, dtype_expr, is_kernel_call, kernel_processor
from .merge import site_id

__all__ = ["ALIASING_CALLS", "InsertCoexecSync", "packed_name"]

#: Packed calls whose result aliases their (first tensor) argument.
ALIASING_CALLS = ("codl.coexec.region_view", "codl.coexec.join", "codl.coexec.cpu_view")
CPU_DEVICE_INDEX = 1
GPU_DEVICE_INDEX = 0


def packed_name(value) -> str | None:
    """The global symbol of a packed call (``R.call_packed`` / an ``ExternFunc`` call), else
    None."""
    if isinstance(value, relax.Call) and isinstance(value.op, relax.ExternFunc):
        return str(value.op.global_symbol)
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        if value.op.name in ("relax.call_pure_packed", "relax.call_packed") and value.args:
            first = value.args[0]
            if isinstance(first, relax.ExternFunc):
                return str(first.global_symbol)
    return None


def _inplace_indices(call) -> list[int]:
    if call.op.same_as(CALL_TIR_INPLACE):
        return [int(i) for i in call.attrs.inplace_indices]
    return []


def _tensor_vars(expr) -> list:
    return [v for v in relax.analysis.free_vars(expr) if isinstance(v.ty, relax.TensorType)]


@tvm.transform.module_pass(opt_level=0, name="codl.InsertCoexecSync")
class InsertCoexecSync:
    """Insert CPU views, CPU output allocations, GPU marks and CPU waits (see module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        main_gv = mod.get_global_var("main")
        func = mod[main_gv]
        bindings = [b for block in func.body.blocks for b in block.bindings]
        if not any(
            is_kernel_call(b.value) and kernel_processor(mod, b.value) == "cpu" for b in bindings
        ):
            return mod
        plan = self._plan(mod, bindings, func)
        rewriter = _Rewriter(mod, plan)
        new_func = rewriter.visit_expr(func)
        rewriter.builder_.update_func(main_gv, new_func)
        return rewriter.builder_.get()

    @staticmethod
    def _plan(mod, bindings, func) -> dict:
        """Decide mark positions, waits and output devices by one walk over the bindings."""
        root: dict = {}  # var -> alias root var

        def root_of(v):
            while v in root:
                v = root[v]
            return v

        last_gpu: dict = {}  # alias root -> index of the last GPU kernel writing it
        waited_upto = -1
        marks_after: set[int] = set()
        waits_before: dict[int, int] = {}  # binding index -> mark after this GPU index
        consumers: dict = {}
        for i, b in enumerate(bindings):
            for v in _tensor_vars(b.value):
                consumers.setdefault(v, []).append(i)
        returned = set(relax.analysis.free_vars(func.body.body))
        cpu_private: set = set()  # CPU outputs read only by CPU kernels
        for i, b in enumerate(bindings):
            value = b.value
            name = packed_name(value)
            if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
                # ``bn[0]`` of a tuple kernel (batch_norm, dropout) is written with the tuple.
                root[b.var] = root_of(value.tuple_value)
                continue
            if name in ALIASING_CALLS:
                src = value.args[1] if isinstance(value.op, tvm.ir.Op) else value.args[0]
                if isinstance(src, relax.Var):
                    root[b.var] = root_of(src)
                continue
            if not is_kernel_call(value):
                continue
            proc = kernel_processor(mod, value)
            args = list(value.args[1].fields) if isinstance(value.args[1], relax.Tuple) else []
            inplace = _inplace_indices(value)
            if proc == "gpu":
                last_gpu[root_of(b.var)] = i
                for k in inplace:
                    if isinstance(args[k], relax.Var):
                        last_gpu[root_of(args[k])] = i
                        root[b.var] = root_of(args[k])
                continue
            callee = mod[value.args[0]]
            shared = callee.attrs is not None and "codl.shared_output" in callee.attrs
            need = -1
            for k, a in enumerate(args):
                if not isinstance(a, relax.Var) or (shared and k in inplace):
                    continue
                need = max(need, last_gpu.get(root_of(a), -1))
            if need > waited_upto:
                marks_after.add(need)
                waits_before[i] = need
                waited_upto = need
            for k in inplace:
                if isinstance(args[k], relax.Var):
                    root[b.var] = root_of(args[k])
            if not inplace and isinstance(b.var.ty, relax.TensorType):
                users = consumers.get(b.var, [])
                only_cpu = b.var not in returned and all(
                    is_kernel_call(bindings[j].value)
                    and kernel_processor(mod, bindings[j].value) == "cpu"
                    for j in users
                )
                if only_cpu:
                    cpu_private.add(b.var)
        # GPU kernels enqueued since the last mark (a mark flushes) must be submitted before the
        # host runs a CPU kernel beside them: a flush where nothing else would.
        flush_before: set[int] = set()
        unflushed = False
        for i, b in enumerate(bindings):
            if not is_kernel_call(b.value):
                continue
            if kernel_processor(mod, b.value) == "gpu":
                unflushed = i not in marks_after
            elif unflushed:
                flush_before.add(i)
                unflushed = False
        return {
            "func": func,
            "returned": returned,
            "bindings": bindings,
            "marks_after": marks_after,
            "waits_before": waits_before,
            "flush_before": flush_before,
            "cpu_private": cpu_private,
        }


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, plan) -> None:
        super().__init__(mod)
        self.mod_ = mod
        self.plan = plan
        self.index = {b.var: i for i, b in enumerate(plan["bindings"])}
        self.marks: dict[int, relax.Var] = {}
        self.on_cpu: set = set()  # new vars that are CPU tensors
        self.drained = False
        self.const_sites = 0

    def _packed(self, name: str, *args, ty, hint: str):
        call = relax.Call(relax.ExternFunc(name), list(args), ty_args=[ty])
        return self.builder_.emit(call, name_hint=hint)

    def _cpu_view(self, expr):
        if expr in self.on_cpu or not isinstance(expr.ty, relax.TensorType):
            return expr
        if not isinstance(expr, relax.Var):
            # A constant (weight): the VM loads constants onto devices[0]; the CPU gets its own
            # copy, made once per call site at the first run.
            self.const_sites += 1
            site = site_id(self.plan["func"], "const", self.const_sites)
            return self._packed(
                "codl.coexec.cpu_copy", relax.prim_value(site), expr, ty=expr.ty, hint="weight_cpu"
            )
        return self._packed("codl.coexec.cpu_view", expr, ty=expr.ty, hint=f"{expr.name}_cpu")

    def visit_var_binding_(self, binding) -> None:
        i = self.index.get(binding.var)
        value = binding.value
        if not self.drained:
            # GPU work of the previous call may still use buffers the CPU reuses: drain it.
            self.drained = True
            mark = self._packed(
                "codl.coexec.gpu_mark",
                relax.prim_value(GPU_DEVICE_INDEX),
                ty=tvm.ir.PrimType("int64"),
                hint="entry_mark",
            )
            self._packed("codl.coexec.cpu_wait", mark, ty=relax.TupleType([]), hint="wait")
        if i is not None and i in self.plan["flush_before"]:
            self._packed(
                "codl.coexec.gpu_flush",
                relax.prim_value(GPU_DEVICE_INDEX),
                ty=relax.TupleType([]),
                hint="flush",
            )
        if i is not None and i in self.plan["waits_before"]:
            mark = self.marks[self.plan["waits_before"][i]]
            self._packed("codl.coexec.cpu_wait", mark, ty=relax.TupleType([]), hint="wait")
        is_cpu = is_kernel_call(value) and kernel_processor(self.mod_, value) == "cpu"
        if not is_cpu:
            super().visit_var_binding_(binding)
        else:
            self._rewrite_cpu_call(binding)
        if i is not None and i in self.plan["marks_after"]:
            self.marks[i] = self._packed(
                "codl.coexec.gpu_mark",
                relax.prim_value(GPU_DEVICE_INDEX),
                ty=tvm.ir.PrimType("int64"),
                hint="mark",
            )

    def _rewrite_cpu_call(self, binding) -> None:
        call = binding.value
        args = [self.visit_expr(a) for a in call.args[1].fields]
        views = [self._cpu_view(a) if isinstance(a.ty, relax.TensorType) else a for a in args]
        if call.op.same_as(CALL_TIR_INPLACE):
            new = relax.op.call_tir_inplace(
                call.args[0], relax.Tuple(views), _inplace_indices(call), call.ty_args[0]
            )
            var = self.builder_.emit(new, name_hint=binding.var.name)
            self.set_var_remap(binding.var, var)
            return
        out_tys = list(call.ty_args)
        if len(out_tys) == 1 and isinstance(out_tys[0], relax.TupleType):
            out_tys = list(out_tys[0].fields)
        if not out_tys or not all(isinstance(t, relax.TensorType) for t in out_tys):
            raise ValueError(
                f"CPU kernel {binding.var.name}: outputs must be tensors or a tuple of "
                f"tensors, got {call.ty_args}"
            )
        if len(call.ty_args) != 1 or not isinstance(call.ty_args[0], relax.TensorType):
            self._rewrite_cpu_tuple_call(binding, views, out_tys)
            return
        ty = out_tys[0]
        private = binding.var in self.plan["cpu_private"]
        device = CPU_DEVICE_INDEX if private else GPU_DEVICE_INDEX
        cache = binding.var not in self.plan["returned"]
        site = site_id(self.plan["func"], "sync", self.index[binding.var])
        buf = self._alloc(site, ty, device, cache, f"{binding.var.name}_buf")
        out_arg = buf if private else self._cpu_view(buf)
        if private:
            self.on_cpu.add(buf)
        new = relax.op.call_tir_inplace(
            call.args[0], relax.Tuple([*views, out_arg]), [len(views)], ty
        )
        result = self.builder_.emit(new, name_hint=binding.var.name)
        if private:
            self.on_cpu.add(result)
            self.set_var_remap(binding.var, result)
        else:
            # Later kernels (GPU ones included) read the SVM tensor itself.
            self.set_var_remap(binding.var, buf)

    def _alloc(self, site: int, ty, device: int, cache: bool, hint: str):
        """A CPU kernel's output buffer, outside the VM's memory plan, on ``device`` (SVM when it
        is the GPU's): allocated once per call site and reused (``cache``), or fresh for a tensor
        the function returns."""
        return self._packed(
            "codl.coexec.alloc",
            relax.prim_value(site),
            ty.shape,
            dtype_expr(str(ty.dtype)),
            relax.prim_value(device),
            relax.prim_value(cache),
            ty=ty,
            hint=hint,
        )

    def _rewrite_cpu_tuple_call(self, binding, views, out_tys) -> None:
        """A CPU kernel with several outputs (an unfused batch_norm, dropout): one shared
        buffer per output, written in place; later kernels read the tuple of SVM tensors."""
        index = self.index[binding.var]
        cache = binding.var not in self.plan["returned"]
        bufs = []
        for k, ty in enumerate(out_tys):
            site = site_id(self.plan["func"], f"sync{k}", index)
            bufs.append(
                self._alloc(site, ty, GPU_DEVICE_INDEX, cache, f"{binding.var.name}_buf{k}")
            )
        outs = [self._cpu_view(b) for b in bufs]
        n = len(views)
        self.builder_.emit(
            relax.op.call_tir_inplace(
                binding.value.args[0],
                relax.Tuple([*views, *outs]),
                list(range(n, n + len(outs))),
                list(out_tys),
            ),
            name_hint=binding.var.name,
        )
        self.set_var_remap(binding.var, self.builder_.emit(relax.Tuple(bufs), name_hint="outs"))
