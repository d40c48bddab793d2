"""codl.IsolateParts: give every processor's part its own dataflow blocks.

Preconditions
-------------
- Runs right after :class:`~codl_tvm.passes.partition.PartitionOperators` and before
  LegalizeOps: ``main`` carries the ``"codl_parts"`` record and the part variables it names.

What it does
------------
Rebuilds ``main`` so that its bindings, in their original (topological) order, are grouped into
dataflow blocks of one *placement* each: ``gpu`` and ``cpu`` for the parts' bindings, ``merge``
for the concat that joins a split's parts, and ``default`` for everything else. FuseOps and
FuseTIR work inside one dataflow block, so after this pass no fused kernel mixes processors, and
the block a kernel lands in tells which processor runs it (:func:`binding_placements`). Values
used by a later block become block outputs under their original names, so the part record stays
valid. Numerics are unchanged.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .parts import collect_parts

__all__ = ["PLACEMENTS", "IsolateParts", "binding_placements", "placement_names"]

PLACEMENTS = ("gpu", "cpu", "merge", "default")


def placement_names(mod: tvm.IRModule) -> dict[str, str]:
    """Variable name -> placement for every variable the part record names."""
    names: dict[str, str] = {}
    for split in collect_parts(mod):
        for part in split.parts:
            for var in part.bindings:
                names[var.name] = part.processor.value
        if len(split.parts) > 1:
            names[split.output.name] = "merge"
    return names


@mutator
class _Subst(PyExprMutator):
    def __init__(self, vmap: dict) -> None:
        super().__init__()
        self.vmap = vmap

    def visit_var_(self, var):
        return self.vmap.get(var, var)

    def visit_dataflow_var_(self, var):
        return self.vmap.get(var, var)


def _used_vars(expr) -> set:
    return set(relax.analysis.free_vars(expr))


@tvm.transform.module_pass(opt_level=0, name="codl.IsolateParts")
class IsolateParts:
    """Group ``main``'s bindings into single-placement dataflow blocks (see module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        names = placement_names(mod)
        if not names:
            return mod
        func = mod["main"]
        bindings = [b for block in func.body.blocks for b in block.bindings]
        labels = [names.get(b.var.name, "default") for b in bindings]
        runs: list[list[int]] = []
        for i, label in enumerate(labels):
            if runs and labels[runs[-1][0]] == label:
                runs[-1].append(i)
            else:
                runs.append([i])
        run_of = {bindings[i].var: r for r, run in enumerate(runs) for i in run}
        # A variable read by a later block (or returned) must be a block output.
        escapes = set(_used_vars(func.body.body))
        for i, b in enumerate(bindings):
            for v in _used_vars(b.value):
                if v in run_of and run_of[v] != run_of[b.var]:
                    escapes.add(v)

        bb = relax.BlockBuilder()
        vmap: dict = {}
        subst = _Subst(vmap)
        attrs = {k: func.attrs[k] for k in func.attrs.keys()} if func.attrs else {}
        with bb.function("main", list(func.params), attrs=attrs, pure=func.is_pure):
            for run in runs:
                with bb.dataflow():
                    for i in run:
                        b = bindings[i]
                        value = subst.visit_expr(b.value)
                        if b.var in escapes:
                            new = bb.emit_output(value, name_hint=b.var.name)
                        else:
                            new = bb.emit(value, name_hint=b.var.name)
                        vmap[b.var] = new
            bb.emit_func_output(subst.visit_expr(func.body.body))
        new_mod = bb.finalize()
        new_func = new_mod["main"]
        out = mod.clone() if hasattr(mod, "clone") else tvm.IRModule(dict(mod.functions))
        out["main"] = new_func
        return out


def binding_placements(func: relax.Function, names: dict[str, str]) -> list[str]:
    """Placement of each block of an isolated ``main`` (also after legalization and fusion).

    A block's placement is that of any variable in it the part record names; blocks with none
    are ``default``. Raises when a block mixes placements (something fused across parts).
    """
    out = []
    for block in func.body.blocks:
        found = {names[b.var.name] for b in block.bindings if b.var.name in names}
        if len(found) > 1:
            raise ValueError(f"a dataflow block mixes placements {sorted(found)}; run "
                             "codl.IsolateParts before fusion")
        out.append(found.pop() if found else "default")
    return out
