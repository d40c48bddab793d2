"""Cut ``main`` into pipeline stages: one Relax function per contiguous run of its bindings.

Preconditions: ``main``'s body is one dataflow block (as TVM's ONNX frontend imports a model,
and as the inference simplifications keep it) followed by its return value. Run it on the
imported (or inference-simplified) module, before any build pipeline: each stage is then built
on its own, for its own processor group (:mod:`codl_tvm.objectives.stage_build`).

What it does: given cut points (binding indices of ``main``'s dataflow block, ascending, each in
``1 .. len(bindings) - 1``), :class:`CutStages` adds ``stage_0 .. stage_K`` beside ``main``
(unchanged, so one artifact still runs single inferences):

- ``stage_k`` runs bindings ``cuts[k - 1] .. cuts[k] - 1``;
- its parameters are the tensors live at its start cut: ``main``'s parameters (in their order)
  then bindings (in binding order) that are defined before the cut and used at or after it (or
  returned by ``main``); ``stage_0`` takes exactly ``main``'s parameters;
- it returns the tensors live at its end cut as one tuple, in the same order as the next
  stage's parameters; the last stage returns ``main``'s return value.

So ``stage_K(*...stage_1(*stage_0(*inputs)))`` (unpacking each tuple) equals ``main(*inputs)``.
Constants (the model's weights) stay in the stage that uses them.

:func:`layer_starts` gives the cut points Pipe-it's layers allow: a layer is a major operator
(convolution, matrix product) with the bindings after it up to the next one (its bias, activation,
pooling stay with it, so a cut never separates a kernel from the epilogue that fuses into it).
"""

from __future__ import annotations

from collections.abc import Sequence

import tvm
from tvm import relax
from tvm.relax.analysis import free_vars

from codl_tvm.core.errors import PlanError

from .rewrite import op_name

__all__ = [
    "MAJOR_OPS",
    "CutStages",
    "cut_stages",
    "layer_starts",
    "live_at",
    "stage_name",
]

#: Operators that start a Pipe-it layer (the GEMM-shaped ones its performance model covers).
MAJOR_OPS = frozenset(
    {
        "relax.nn.conv2d",
        "relax.nn.conv2d_transpose",
        "relax.matmul",
        "relax.linear",
    }
)


def stage_name(index: int) -> str:
    """The global name of stage ``index``."""
    return f"stage_{index}"


def _main_block(func: relax.Function) -> tuple[relax.DataflowBlock, relax.Expr]:
    body = func.body
    if (
        not isinstance(body, relax.SeqExpr)
        or len(body.blocks) != 1
        or not isinstance(body.blocks[0], relax.DataflowBlock)
    ):
        raise PlanError(
            "cutting stages needs main's body to be one dataflow block (as the ONNX frontend "
            "imports a model); run the stage cut before the build pipeline"
        )
    return body.blocks[0], body.body


def layer_starts(func: relax.Function) -> list[int]:
    """Binding indices of ``func``'s dataflow block where a Pipe-it layer starts.

    The first layer starts at 0 (bindings before the first major operator go with it); each
    major operator after the first starts a layer. These are the cut points a pipeline may use
    (``layer_starts[1:]``).
    """
    block, _ = _main_block(func)
    majors = [i for i, b in enumerate(block.bindings) if op_name(b.value) in MAJOR_OPS]
    # the first layer holds the first major operator and whatever comes before it
    return [0, *majors[1:]]


def _check_cuts(cuts: Sequence[int], n_bindings: int) -> list[int]:
    out = []
    for c in cuts:
        if isinstance(c, bool) or not isinstance(c, int):
            raise PlanError(f"stage cut {c!r} is not a binding index")
        if not 0 < c < n_bindings:
            raise PlanError(f"stage cut {c} is outside main's bindings 1..{n_bindings - 1}")
        if out and c <= out[-1]:
            raise PlanError(f"stage cuts must ascend, got {list(cuts)}")
        out.append(c)
    return out


def live_at(func: relax.Function, cut: int) -> list[relax.Var]:
    """The variables of ``func`` live at binding index ``cut``: parameters (in order), then
    bindings defined before ``cut`` (in order) that bindings from ``cut`` on, or the return
    value, use."""
    block, ret = _main_block(func)
    used: set[relax.Var] = set(free_vars(ret))
    for b in block.bindings[cut:]:
        used.update(free_vars(b.value))
    defined = list(func.params) + [b.var for b in block.bindings[:cut]]
    return [v for v in defined if v in used]


@relax.expr_functor.mutator
class _Substitute(relax.PyExprMutator):
    """Replace variables by others (a stage's parameters for ``main``'s variables)."""

    def __init__(self, var_map: dict[relax.Var, relax.Var]) -> None:
        super().__init__()
        self.var_map = var_map

    def visit_var_(self, op: relax.Var) -> relax.Expr:
        return self.var_map.get(op, op)

    def visit_dataflow_var_(self, op: relax.DataflowVar) -> relax.Expr:
        return self.var_map.get(op, op)


def _stage(func: relax.Function, name: str, start: int, stop: int, last: bool) -> relax.Function:
    block, ret = _main_block(func)
    bindings = block.bindings[start:stop]
    inputs = list(func.params) if start == 0 else live_at(func, start)
    params = [relax.Var(v.name, v.ty) for v in inputs]
    var_map: dict[relax.Var, relax.Var] = dict(zip(inputs, params, strict=True))
    new_bindings = []
    sub = _Substitute(var_map)
    for b in bindings:
        value = sub.visit_expr(b.value)
        # main's output variables stay non-dataflow; a stage's own output is bound below
        var = type(b.var)(b.var.name, b.var.ty)
        var_map[b.var] = var
        new_bindings.append(relax.VarBinding(var, value))
    result = sub.visit_expr(ret if last else relax.Tuple(live_at(func, stop)))
    if isinstance(result, relax.Var) and not isinstance(result, relax.DataflowVar):
        out = result  # the last stage returns main's own output variable
    else:
        out = relax.Var("gv", result.ty)
        new_bindings.append(relax.VarBinding(out, result))
    body = relax.SeqExpr([relax.DataflowBlock(new_bindings)], out)
    return relax.Function(params, body, out.ty).with_attr("global_symbol", name)


def cut_stages(mod: tvm.IRModule, cuts: Sequence[int]) -> tvm.IRModule:
    """``mod`` with ``stage_0 .. stage_len(cuts)`` added (see the module docstring).

    Raises
    ------
    PlanError
        ``main`` is not one dataflow block, or a cut is not an ascending binding index inside
        it.
    """
    func = mod["main"]
    block, _ = _main_block(func)
    bounds = [0, *_check_cuts(cuts, len(block.bindings)), len(block.bindings)]
    out = mod.clone() if hasattr(mod, "clone") else tvm.IRModule(dict(mod.functions))
    for k in range(len(bounds) - 1):
        name = stage_name(k)
        out[name] = _stage(func, name, bounds[k], bounds[k + 1], k == len(bounds) - 2)
    return relax.transform.Normalize()(out)


@tvm.ir.transform.module_pass(opt_level=0, name="codl.CutStages")
class CutStages:
    """Add pipeline stage functions cut from ``main`` at ``cuts`` (binding indices)."""

    def __init__(self, cuts: Sequence[int]) -> None:
        self.cuts = list(cuts)

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return cut_stages(mod, self.cuts)
