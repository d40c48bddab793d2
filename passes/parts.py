"""Which processor each part of a partitioned operator belongs to, recovered from the IR.

:class:`~codl_tvm.passes.partition.PartitionOperators` records every split it makes in the
``"codl_parts"`` attribute of ``main`` (a JSON string, so that it survives any pass that keeps
function attributes) and names the variables of each part uniquely. :func:`collect_parts` reads
that record back and resolves the names to the Relax variables of the current ``main``; it raises
when a name no longer exists (a pass in between removed or renamed it).

Record format (one object per split, i.e. per plan entry)::

    {"name": "conv2d_0", "ops": ["conv2d_0"], "dim": "H", "axis": 2, "ratio": 0.5,
     "input": "x", "output": "codl0_out",
     "parts": [{"processor": "gpu", "region": [0, 4], "input_region": [0, 5],
                "bindings": ["codl0_gpu_in", ...]},
               {"processor": "cpu", "region": [4, 8], "input_region": [3, 8],
                "bindings": [...]}]}

``foldable`` (optional) names the record's variables computed from constants alone (a slice of
a weight the graph computes, e.g. by ConstantOfShape): FoldConstant may turn them into constants
and drop their bindings, so :func:`collect_parts` leaves out those no longer bound (a part keeps
its other bindings; a split whose output was folded is left out whole; an input folded away
reads as ``None``, like a constant input).

``region`` is the part's half-open range of the merged output along ``axis``; ``input_region``
the range of the shared chain input (``input``; ``null`` for a constant) it reads along ``axis``,
halo included (for OC: the input channels, e.g. all of them for a dense conv); the last name in
``bindings`` is the part's output; ``output`` is the merged result (a ``concat`` of the part
outputs along ``axis`` in part order, or the single part's output when only one part exists).
The GPU part always comes first and produces the first ``ratio`` of the output.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

from codl_tvm.core.plan import PartitionDim

__all__ = ["PARTS_ATTR", "PartRecord", "Processor", "SplitRecord", "collect_parts"]

PARTS_ATTR = "codl_parts"


class Processor(str, enum.Enum):
    """The processor a part runs on. The GPU takes the first ``ratio`` of the output."""

    GPU = "gpu"
    CPU = "cpu"


@dataclass(frozen=True)
class PartRecord:
    """One processor's part of a split.

    Attributes
    ----------
    processor
        Where the part belongs.
    region
        ``(start, stop)`` of the merged output along the split axis that this part produces.
    input_region
        ``(start, stop)`` of the split's input along the same axis that the part reads (its
        own rows plus the halo for H; for OC the input channels it needs).
    bindings
        Every variable the part binds, in order: the slice of the shared input (if any), each
        operator of the chain with its followers, weight slices that could not be folded.
    """

    processor: Processor
    region: tuple[int, int]
    input_region: tuple[int, int]
    bindings: tuple[object, ...]

    @property
    def output(self):
        """The variable holding the part's result (rows/channels ``region``)."""
        return self.bindings[-1]


@dataclass(frozen=True)
class SplitRecord:
    """A split operator or chain: the variable it reads, its parts, and their merge.

    ``input`` is the shared variable the split reads (``None`` when it reads a constant),
    ``output`` the variable holding the merged result.
    """

    name: str
    ops: tuple[str, ...]
    dim: PartitionDim
    axis: int
    ratio: float
    input: object | None
    output: object
    parts: tuple[PartRecord, ...]


def collect_parts(mod) -> list[SplitRecord]:
    """The splits recorded in ``mod["main"]``, with names resolved to the current variables."""
    func = mod["main"]
    attrs = func.attrs
    if attrs is None or PARTS_ATTR not in attrs:
        return []
    records = json.loads(str(attrs[PARTS_ATTR]))
    by_name: dict[str, object] = {}
    dupes: set[str] = set()
    for param in func.params:
        by_name[param.name] = param
    for block in func.body.blocks:
        for binding in block.bindings:
            name = binding.var.name
            if name in by_name:
                dupes.add(name)
            by_name[name] = binding.var

    def resolve(name: str, split: str, foldable: frozenset[str] = frozenset()):
        if name not in by_name and name in foldable:
            return None  # folded into a constant after PartitionOperators
        if name in dupes:
            raise ValueError(
                f"split {split}: variable name {name!r} is bound more than once in "
                "main; the part record is ambiguous"
            )
        if name not in by_name:
            raise ValueError(
                f"split {split}: variable {name!r} is no longer bound in main (a "
                "pass after PartitionOperators removed or renamed it)"
            )
        return by_name[name]

    out = []
    for rec in records:
        name = rec["name"]
        foldable = frozenset(rec.get("foldable", ()))
        output = resolve(rec["output"], name, foldable)
        if output is None:
            continue  # the whole split was computed at compile time
        parts = []
        for p in rec["parts"]:
            bindings = (resolve(n, name, foldable) for n in p["bindings"])
            parts.append(
                PartRecord(
                    Processor(p["processor"]),
                    (int(p["region"][0]), int(p["region"][1])),
                    (int(p["input_region"][0]), int(p["input_region"][1])),
                    tuple(v for v in bindings if v is not None),
                )
            )
        inp = rec.get("input")
        out.append(
            SplitRecord(
                name,
                tuple(rec["ops"]),
                PartitionDim(rec["dim"]),
                int(rec["axis"]),
                float(rec["ratio"]),
                None if inp is None else resolve(inp, name, foldable),
                output,
                tuple(parts),
            )
        )
    return out
