"""codl.PlaceParts: put every kernel of a partitioned model on its processor.

Preconditions
-------------
- Runs after :class:`~codl_tvm.passes.partition.PartitionOperators`, LegalizeOps and
  AnnotateTIROpPattern (FoldConstant may run before it), and **before FuseOps**: ``main``'s
  bindings still carry the names the ``"codl_parts"`` record uses.

What it does
------------
- Every ``call_tir`` binding gets a placement: ``cpu`` for the bindings of CPU parts, ``gpu``
  for GPU parts. A kernel outside every split (batch norm, softmax, concat, residual add, ...)
  runs where its inputs were computed, so that it adds no CPU/GPU edge; when they come from both
  processors, from a merged split, or only from the model's inputs and constants, it runs on the
  plan's ``home`` processor (CoDL's data-holding GPU by default; the planner picks the faster
  one). Placing them all on the GPU cost a GPU round trip per layer wherever the CPU ran whole
  convolutions followed by an unfused batch norm (RetinaFace on the emulated SoC: 29 ms co-executed
  against 11 ms on the CPU alone, a PoCL softmax alone 15 ms).
- Every GPU/CPU edge is cut for FuseOps by a fence: the consumer reads the producer's tensor
  through an alias binding (``codl_fence = x``), which FuseOps takes for an opaque node, so it
  never fuses kernels of two processors into one function while each side keeps its own fusions
  (a conv with its bias add, ReLU and residual add, as in a single-processor build). So is a
  same-processor edge into a kernel that waits for more of the other processor's work than its
  producer (a residual add reading the other processor's branch, its shortcut conv issued
  before that branch is done): fused, the shortcut conv would wait for the branch instead of
  running beside it; the add keeps its ReLU. ``CanonicalizeBindings`` right after FuseOps
  removes the aliases. Making a kernel on the edge opaque instead cut it from its own
  processor's neighbours too: a CPU conv's bias add or ReLU, and the GPU residual add and ReLU
  after a shortcut conv, ran as kernels of their own.
- Every kernel's output tensor gets its processor's Relax ``VDevice`` (``main``'s module gets the
  global info ``"vdevice" = [GPU, CPU]``, the device order of the VM): the IR states where every
  tensor lives, and later passes read the placement from it.
- The callee PrimFunc gets the processor's target as its ``target`` attribute; a PrimFunc that
  both processors call (LegalizeOps shares identical kernels) is cloned, ``<name>_cpu``. A part's
  kernel also gets its split's name (``codl.split``), and a PrimFunc two splits share is
  cloned per split (so the kernel record can name each call's split;
  :class:`~codl_tvm.passes.share_kernels.ShareIdenticalKernels` merges the copies again once
  the record is written). TVM then
  compiles CPU kernels with LLVM and GPU kernels as OpenCL in one build.
- The ``concat`` that merges a split's parts is marked opaque (so FuseOps keeps it a call of its
  own, which :class:`~codl_tvm.passes.merge.MergePartsInPlace` later removes) and tagged
  ``codl.merge`` with the split axis and every part's region.
- Kernels FuseOps will create lose the attribute in FuseTIR (TVM 0.27);
  :class:`~codl_tvm.passes.fused_targets.RestoreTargets` puts it back from the VDevices.
"""

from __future__ import annotations

import json

import tvm
from tvm import relax

from .fused_targets import SPLIT_ATTR
from .parts import collect_parts

__all__ = ["PlaceParts"]

_OPAQUE = 8


def _callee(binding):
    value = binding.value
    if isinstance(value, relax.Call) and value.op.same_as(tvm.ir.Op.get("relax.call_tir")):
        return value.args[0]
    return None


@tvm.transform.module_pass(opt_level=0, name="codl.PlaceParts")
class PlaceParts:
    """Assign each kernel to the GPU or the CPU target (see the module docstring).

    Parameters
    ----------
    gpu_target
        The OpenCL target (with an LLVM host) of GPU kernels.
    cpu_target
        The LLVM target of CPU kernels.
    home
        ``"gpu"`` or ``"cpu"``: where kernels outside every split go when their inputs do not
        decide (:attr:`~codl_tvm.core.plan.PartitionPlan.home`).
    """

    def __init__(
        self, gpu_target: tvm.target.Target, cpu_target: tvm.target.Target, home: str = "gpu"
    ) -> None:
        if home not in ("gpu", "cpu"):
            raise ValueError(f"PlaceParts: home must be 'gpu' or 'cpu', got {home!r}")
        self.gpu_target = gpu_target
        self.cpu_target = cpu_target
        self.home = home

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        splits = collect_parts(mod)
        placement: dict[str, str] = {}
        split_of: dict[str, str] = {}
        merges: dict[str, dict] = {}
        for split in splits:
            for part in split.parts:
                for var in part.bindings:
                    placement[var.name] = part.processor.value
                    split_of[var.name] = split.name
            if len(split.parts) > 1:
                merges[split.output.name] = {
                    "axis": split.axis,
                    "regions": [list(p.region) for p in split.parts],
                    "processors": [p.processor.value for p in split.parts],
                }
        func = mod["main"]
        rt = _Retarget(mod)
        bb = rt.builder_
        bindings = [b for block in func.body.blocks for b in block.bindings]
        where_of = {}
        users: dict[tvm.ir.GlobalVar, set[str]] = {}
        seen_as: dict = {}  # every variable -> the placement of the kernel that computed it
        for b in bindings:
            gv = _callee(b)
            if gv is None:
                # batch_norm's users read ``bn[0]``: a projection is where its tuple is.
                value = b.value
                source = value.tuple_value if isinstance(value, relax.TupleGetItem) else value
                if isinstance(source, relax.Var) and source in seen_as:
                    seen_as[b.var] = seen_as[source]
                continue
            if not isinstance(mod[gv], tvm.tirx.PrimFunc):
                continue
            if b.var.name in merges:
                where = "merge"
            elif b.var.name in placement:
                where = placement[b.var.name]
            else:
                where = _follow_producers(b, seen_as, self.home)
            where_of[b.var] = seen_as[b.var] = where
            if where != "merge":
                users.setdefault(gv, set()).add((where, split_of.get(b.var.name, "")))
        fences = _fenced_edges(bindings, where_of)
        # One PrimFunc per (processor, split): a kernel LegalizeOps shared between two splits
        # (VGG's repeated convs) stays two kernels, so FuseOps cannot merge their fused groups
        # either and a timeline can tell the splits apart (codl.split).
        renames: dict[tuple[tvm.ir.GlobalVar, str, str], tvm.ir.GlobalVar] = {}
        for gv, variants in users.items():
            prim = mod[gv]
            for i, (where, split) in enumerate(sorted(variants)):
                target = self.cpu_target if where == "cpu" else self.gpu_target
                new = prim.with_attr("target", target)
                if split:
                    new = new.with_attr(SPLIT_ATTR, split)
                if i == 0:
                    bb.update_func(gv, new)
                    renames[(gv, where, split)] = gv
                else:
                    # the builder makes the name unique; the symbol must be that name
                    added = bb.add_func(new, f"{gv.name_hint}_{where}")
                    bb.update_func(added, new.with_attr("global_symbol", added.name_hint))
                    renames[(gv, where, split)] = added
        for b in bindings:
            where = where_of.get(b.var)
            if where is None:
                continue
            gv = _callee(b)
            if where == "merge":
                # Each merge kernel carries its own regions, so each gets its own copy.
                name = f"codl_merge_{b.var.name}"
                prim = mod[gv].with_attrs(
                    {
                        "target": self.gpu_target,
                        "op_pattern": _OPAQUE,
                        "codl.merge": json.dumps(merges[b.var.name]),
                        "global_symbol": name,
                    }
                )
                rt.callee_of[b.var] = bb.add_func(prim, name)
            else:
                rt.callee_of[b.var] = renames[(gv, where, split_of.get(b.var.name, ""))]
        # Every kernel's output carries its processor's VDevice: the IR states where each
        # tensor lives (global info "vdevice" = [GPU, CPU], the VM's device order).
        rt.vdevices = {
            "gpu": relax.VDevice(self.gpu_target, 0, "global"),
            "cpu": relax.VDevice(self.cpu_target, 0, "global"),
        }
        rt.where_of = where_of
        rt.fences = fences
        new_main = rt.visit_expr(func)
        bb.update_func(mod.get_global_var("main"), new_main)
        out = bb.get()
        out.update_global_info("vdevice", [rt.vdevices["gpu"], rt.vdevices["cpu"]])
        for b in bindings:
            gv = _callee(b)
            if where_of.get(b.var) == "merge" and gv not in users and gv in out.get_global_vars():
                del out[gv]  # only merges called it; each now has its own copy
        return out


def _follow_producers(binding, where_of, home: str) -> str:
    """Placement of a kernel outside every split: the one processor its input kernels ran on,
    else ``home`` (inputs from both, from a merge, or none: model inputs and constants only).
    Tuple projections and aliases are followed to the kernel that computed the value."""
    producers = {where_of.get(a) for a in binding.value.args[1].fields}
    producers -= {None, "merge"}
    return producers.pop() if len(producers) == 1 else home


def _fenced_edges(bindings, where_of) -> dict:
    """The kernel-to-kernel edges FuseOps must not fuse: kernel variable -> the argument
    variables it reads through a fence (read through tuple projections and aliases, as
    batch_norm's users read ``bn[0]``).

    Every GPU/CPU edge is fenced. A same-processor edge is fenced where fusing would delay the
    producer behind the other processor: FuseOps emits a fused kernel where its last kernel was,
    so the producer would start only when everything its consumer waits for on the other
    processor is done. Each processor runs its kernels in program order (the host runs CPU
    kernels one after the other; the GPU queue is in order and a GPU kernel is enqueued after
    the CPU kernels before it), so what a kernel waits for on each processor is one position in
    the program: the latest of its inputs' and, for a GPU kernel, of the CPU kernels before it.
    A residual add reading the other processor's branch keeps its shortcut conv apart when that
    conv could run beside the branch, and takes it in when it could not.
    """
    by_var = {b.var: b for b in bindings}

    def producer(var):
        seen = 0
        while var in by_var and _callee(by_var[var]) is None and seen < len(bindings):
            value = by_var[var].value
            if isinstance(value, relax.TupleGetItem):
                var = value.tuple_value
            elif isinstance(value, relax.Var):
                var = value
            else:
                break
            seen += 1
        return var

    waits: dict = {}  # kernel -> {processor: program position it waits for there}
    done: dict = {}  # kernel -> the same, once it ran (its own position on its processor)
    last = {"cpu": -1, "gpu": -1}
    out: dict = {}
    for i, b in enumerate(bindings):  # in program order: producers first
        where = where_of.get(b.var)
        if where is None:
            continue
        reads = [
            (arg, producer(arg))
            for arg in b.value.args[1].fields
            if isinstance(arg, relax.Var) and producer(arg) in where_of
        ]
        w = {k: max([done[p][k] for _, p in reads], default=-1) for k in ("cpu", "gpu")}
        if where == "merge":
            # no kernel of its own once MergePartsInPlace ran: done when both parts are
            done[b.var] = w
            continue  # opaque already
        w["cpu"] = max(w["cpu"], last["cpu"])
        if where == "gpu":
            w["gpu"] = max(w["gpu"], last["gpu"])
        waits[b.var] = w
        done[b.var] = {**w, where: i}
        last[where] = i
        other = "gpu" if where == "cpu" else "cpu"
        for arg, p in reads:
            if where_of[p] == "merge":
                continue
            if where_of[p] != where or waits[p][other] < w[other]:
                out.setdefault(b.var, set()).add(arg)
    return out


@relax.expr_functor.mutator
class _Retarget(relax.PyExprMutator):
    """Point each call_tir at the PrimFunc chosen for its binding, keeping the bound variable."""

    def __init__(self, mod) -> None:
        super().__init__(mod)
        self.callee_of: dict = {}
        self.vdevices: dict = {}
        self.where_of: dict = {}
        self.fences: dict = {}

    def visit_var_binding_(self, binding) -> None:
        new_gv = self.callee_of.get(binding.var)
        if new_gv is None:
            super().visit_var_binding_(binding)
            return
        call = binding.value
        ty_args = list(call.ty_args)
        where = self.where_of.get(binding.var)
        vdev = self.vdevices.get("cpu" if where == "cpu" else "gpu")
        if len(ty_args) == 1 and isinstance(ty_args[0], relax.TensorType) and vdev is not None:
            old = ty_args[0]
            ty_args = [relax.TensorType(old.shape, old.dtype, vdevice=vdev)]
        # the other processor's tensors are read through fences: an alias FuseOps cannot fuse
        fenced = self.fences.get(binding.var, set())
        args = [
            self.builder_.emit(self.visit_expr(a), name_hint="codl_fence")
            if a in fenced
            else self.visit_expr(a)
            for a in call.args[1].fields
        ]
        value = relax.Call(
            call.op,
            [new_gv, relax.Tuple(args), *[self.visit_expr(a) for a in call.args[2:]]],
            call.attrs,
            ty_args,
        )
        value = self.builder_.normalize(value)
        if isinstance(binding.var, relax.DataflowVar):
            new_var = self.builder_.emit(value, name_hint=binding.var.name)
        else:
            new_var = self.builder_.emit_output(value, name_hint=binding.var.name)
        self.set_var_remap(binding.var, new_var)
