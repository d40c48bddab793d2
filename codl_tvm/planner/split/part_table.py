"""Each operator's parts under a partition plan, as a table: which rows (H splits) or channels
(OC splits) of its output the GPU and the CPU compute, with the halo geometry the partitioning
pass builds (:func:`~codl_tvm.planner.split.part_shapes.chain_parts`). Inside a chain the two
parts of an early operator overlap: both processors compute the rows the chain's next operators
read (the halo) instead of exchanging them. ``codl-tvm demo`` prints this table.
"""

from __future__ import annotations

from dataclasses import dataclass

from codl_tvm.core.errors import FeatureError
from codl_tvm.core.plan import PartitionDim, PartitionPlan, partitionable_ops
from codl_tvm.planner.split.part_shapes import chain_parts, op_params

__all__ = ["OperatorPlacement", "halo_span", "operator_placement", "placement_lines"]


@dataclass(frozen=True)
class OperatorPlacement:
    """Where one operator of the co-executed build runs: the part of its output each processor
    computes (rows for an H split, channels for OC), or whole outside the plan."""

    op: str
    #: output shape without the batch axis
    output: tuple[int, ...]
    #: the plan entry that splits it (``first..last`` for a chain); None: outside the plan
    split: str | None
    dim: str | None
    gpu: tuple[int, int] | None
    cpu: tuple[int, int] | None
    #: why an operator outside the plan is not split
    reason: str = ""
    #: whether ``gpu``/``cpu`` are known (False: an operator the split geometry cannot describe)
    known: bool = True


def operator_placement(mod, plan: PartitionPlan) -> list[OperatorPlacement]:
    """Each partitionable operator's parts under ``plan``, with the halo geometry the
    partitioning pass builds: in a chain, earlier operators' parts overlap by the rows (or
    channels) that both processors compute to avoid exchanging data inside the chain."""
    infos = {i.name: i for i in partitionable_ops(mod)}
    where: dict[str, OperatorPlacement] = {}
    for entry in plan.entries():
        chain = [infos[o] for o in entry.ops]
        try:
            parts = chain_parts(chain, [op_params(i) for i in chain], entry.dim, entry.ratio)
        except (FeatureError, ValueError):
            parts = None  # an operator the geometry does not describe: its parts unknown
        name = entry.ops[0] if len(entry.ops) == 1 else f"{entry.ops[0]}..{entry.ops[-1]}"
        for k, info in enumerate(chain):
            spans: list[tuple[int, int] | None] = []
            for shapes in (None, None) if parts is None else (parts.gpu, parts.cpu):
                if shapes is None:
                    spans.append(None)
                elif entry.dim == PartitionDim.H:
                    spans.append((shapes[k].row0, shapes[k].row0 + shapes[k].out_h))
                else:
                    spans.append((shapes[k].oc0, shapes[k].oc0 + shapes[k].oc))
            where[info.name] = OperatorPlacement(
                info.name,
                tuple(info.output_shape[1:]),
                name,
                entry.dim.value,
                *spans,
                known=parts is not None,
            )
    dims = {e.dim.value for e in plan.entries()}
    for info in infos.values():
        if info.name not in where:
            why = (
                f"cannot split on {'/'.join(sorted(dims))}"
                if not dims & {d.value for d in info.dims}
                else "left whole by the plan"
            )
            where[info.name] = OperatorPlacement(
                info.name, tuple(info.output_shape[1:]), None, None, None, None, why
            )
    return [where[name] for name in infos]


def placement_lines(placement: list[OperatorPlacement]) -> list[str]:
    """The per-operator placement table of :func:`operator_placement`."""
    rows = [f"  {'operator':14s} {'output':11s} {'GPU part':14s} {'CPU part':14s} chain"]
    unit = {"H": "rows", "OC": "ch"}
    for p in placement:
        shape = "x".join(map(str, p.output))
        if p.split is None:
            rows.append(f"  {p.op:14s} {shape:11s} whole, outside the plan ({p.reason})")
            continue
        cells = [
            ("-" if p.known else "?") if span is None else f"{unit[p.dim]} {span[0]}:{span[1]}"
            for span in (p.gpu, p.cpu)
        ]
        chain = p.split if p.split != p.op else ""
        rows.append(f"  {p.op:14s} {shape:11s} {cells[0]:14s} {cells[1]:14s} {chain}".rstrip())
    halo = [(p, span) for p in placement if (span := halo_span(p)) is not None]
    if halo:
        p, (lo, hi) = halo[0]
        rows += [
            f"  GPU and CPU parts overlap inside chains (e.g. {p.op}: {unit[p.dim]} {lo}:{hi} "
            "on both): the halo,",
            "  rows the chain's next operators read, computed by both processors instead of "
            "exchanged",
        ]
    return rows


def halo_span(p: OperatorPlacement) -> tuple[int, int] | None:
    """The part of ``p``'s output that both processors compute (the halo of an operator
    early in an H chain), or None."""
    if p.gpu is None or p.cpu is None:
        return None
    lo, hi = max(p.gpu[0], p.cpu[0]), min(p.gpu[1], p.cpu[1])
    return (lo, hi) if lo < hi else None
