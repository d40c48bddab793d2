"""Dispatch features read from scheduled TIR: what a built kernel really launches.

For the GPU, every kernel launch is a loop nest bound to ``blockIdx.*`` / ``threadIdx.*``
(``T.thread_binding`` loops in scheduled TIR, ``thread_extent`` attributes after lowering): the
work-group size is the product of the ``threadIdx`` extents, the work-group count the product of
the ``blockIdx`` extents. For the CPU, the outermost ``parallel`` loop of a nest gives the
parallel blocks and the widest ``vectorized`` loop the vector width; the thread count is a
property of the runtime, so the caller passes it.

This reads the PrimFuncs of a module after scheduling (dlight or a codl schedule rule), before or
after lowering; it needs TVM but no device. Symbolic extents give ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from codl_tvm.cost_model.features import DispatchFeatures

__all__ = ["KernelLaunch", "dispatch_features", "kernel_launches", "stmt_children"]

_CHILD_FIELDS = ("body", "then_case", "else_case", "block", "init")


@dataclass(frozen=True)
class KernelLaunch:
    """One GPU launch or one CPU loop nest of a PrimFunc."""

    wg_size: int | None = None
    wg_count: int | None = None
    parallel_blocks: int | None = None
    vector_width: int | None = None
    reduces: bool = False

    @property
    def work(self) -> int:
        """Threads launched (GPU) or parallel blocks (CPU), to pick the main kernel."""
        if self.wg_size and self.wg_count:
            return self.wg_size * self.wg_count
        return self.parallel_blocks or 0


def stmt_children(stmt) -> list:
    """The statements directly inside a TIR statement (a ``SeqStmt``'s, else its body fields),
    for the walks here and in ``kernel_counts``."""
    seq = getattr(stmt, "seq", None)
    if seq is not None:
        return list(seq)
    out = []
    for name in _CHILD_FIELDS:
        child = getattr(stmt, name, None)
        if child is not None and not isinstance(child, int | float | str):
            out.append(child)
    return out


def _const(expr) -> int | None:
    value = getattr(expr, "value", None)
    return int(value) if isinstance(value, int) else None


def _binding(stmt) -> tuple[str, int | None] | None:
    """``(thread tag, extent)`` if ``stmt`` binds a GPU thread axis."""
    from tvm import tirx  # deferred: importing the cost-model package does not import TVM

    if isinstance(stmt, tirx.For) and stmt.kind == tirx.ForKind.THREAD_BINDING:
        return stmt.thread_binding.thread_tag, _const(stmt.extent)
    if isinstance(stmt, tirx.AttrStmt) and stmt.attr_key == "thread_extent":
        return stmt.node.thread_tag, _const(stmt.value)
    return None


def _launch(root) -> KernelLaunch:
    """Collect the bindings / parallel and vectorized loops of one launch rooted at ``root``."""
    from tvm import s_tir, tirx  # deferred: the cost-model package imports without TVM

    extents: dict[str, int | None] = {}
    parallel: int | None = None
    vector: int | None = None
    reduces = False
    stack = [root]
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, s_tir.SBlock) and any(
            iv.iter_type == tirx.IterVar.CommReduce for iv in stmt.iter_vars
        ):
            reduces = True
        bound = _binding(stmt)
        if bound is not None:
            tag, ext = bound
            if tag in extents and extents[tag] is not None and ext is not None:
                extents[tag] = max(extents[tag], ext)
            else:
                extents.setdefault(tag, ext)
        if isinstance(stmt, tirx.For):
            if stmt.kind == tirx.ForKind.PARALLEL and parallel is None:
                parallel = _const(stmt.extent)
            elif stmt.kind == tirx.ForKind.VECTORIZED:
                ext = _const(stmt.extent)
                if ext is not None:
                    vector = max(vector or 0, ext)
        stack.extend(reversed(stmt_children(stmt)))

    def product(prefix: str) -> int | None:
        values = [v for k, v in extents.items() if k.startswith(prefix)]
        if not values or any(v is None for v in values):
            return None
        out = 1
        for v in values:
            out *= v
        return out

    return KernelLaunch(product("threadIdx."), product("blockIdx."), parallel, vector, reduces)


def _is_launch_root(stmt) -> bool:
    from tvm import tirx  # deferred: importing the cost-model package does not import TVM

    bound = _binding(stmt)
    if bound is not None and bound[0].startswith(("blockIdx.", "threadIdx.")):
        return True
    return isinstance(stmt, tirx.For) and stmt.kind == tirx.ForKind.PARALLEL


def kernel_launches(func) -> list[KernelLaunch]:
    """Launches of one PrimFunc, in program order: each maximal loop nest bound to GPU threads,
    or each outermost parallel loop nest on the CPU; a PrimFunc with neither (a serial CPU
    kernel, possibly vectorized) counts as one launch with one parallel block."""
    from tvm import tirx  # deferred: importing the cost-model package does not import TVM

    if not isinstance(func, tirx.PrimFunc):
        raise TypeError(f"expected a tvm.tirx.PrimFunc, got {type(func).__name__}")
    launches: list[KernelLaunch] = []
    stack = [func.body]
    while stack:
        stmt = stack.pop()
        if _is_launch_root(stmt):
            launches.append(_launch(stmt))
            continue
        stack.extend(reversed(stmt_children(stmt)))
    if not launches:
        serial = _launch(func.body)
        launches.append(KernelLaunch(None, None, 1, serial.vector_width))
    return launches


def _declared(func, launch: KernelLaunch) -> bool:
    """Whether ``launch`` is the main launch a codl schedule rule recorded on ``func``
    (``codl.workgroup_size`` / ``codl.workgroup_count``): a rule knows which of its kernels is
    the operator itself."""
    attrs = func.attrs or {}
    if "codl.workgroup_size" in attrs and "codl.workgroup_count" in attrs:
        size, count = int(attrs["codl.workgroup_size"]), int(attrs["codl.workgroup_count"])
        return size > 0 and (launch.wg_size, launch.wg_count) == (size, count)
    return False


def dispatch_features(funcs: Iterable, threads: int | None = None) -> DispatchFeatures:
    """Dispatch features of an operator built as ``funcs`` (its PrimFuncs, e.g. the transform,
    GEMM and inverse-transform kernels of a Winograd convolution).

    The main kernel is the launch with the most threads (GPU) or parallel blocks (CPU) among
    those that reduce (the conv, matmul or pooling itself, not the padding copy in front of it,
    which often launches more threads), preferring reducing GPU launches that a codl rule
    recorded as the operator's own (``codl.workgroup_size`` / ``codl.workgroup_count``);
    ``num_kernels`` counts every launch. ``threads`` is the
    CPU thread-pool size the kernel runs with (not visible in the IR).
    """
    launches: list[KernelLaunch] = []
    declared: list[KernelLaunch] = []
    for f in funcs:
        own = kernel_launches(f)
        launches.extend(own)
        declared.extend(k for k in own if _declared(f, k))
    if not launches:
        raise ValueError("no PrimFunc given")
    reducing = [k for k in launches if k.reduces]
    # a rule's record is trusted only for a reducing launch: attributes read back from the loops
    # (no override) take each axis's largest extent, which can be the padding copy's
    computing = [k for k in declared if k.reduces] or reducing or launches
    main = max(computing, key=lambda k: k.work)
    gpu = main.wg_size is not None or main.wg_count is not None
    return DispatchFeatures(
        wg_size=main.wg_size,
        wg_count=main.wg_count,
        cpu_parallel_blocks=None if gpu else main.parallel_blocks,
        vector_width=None if gpu else main.vector_width,
        threads=None if gpu else threads,
        num_kernels=len(launches),
    )
