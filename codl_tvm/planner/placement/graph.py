"""The operator graph HOPE places: super-ops with per-processor latencies and transfer costs.

:func:`build_graph` reads ``main`` of a Relax module as the build sees it before partitioning
(after :func:`~codl_tvm.build.pipeline.inference_passes`: batch norms folded into their convs) and a
cost model, and returns an :class:`OpGraph`, pure data: it never rewrites IR.

Nodes
-----
- Every partitionable operator the cost model describes (conv2d, pools, matmul: the operators a
  :class:`~codl_tvm.core.plan.PartitionPlan` names) is a *free* node: the scheduler chooses its
  processor, and it carries the cost model's whole-operator prediction on each processor.
- Every other binding whose inputs come from exactly one node (bias adds, activations, reshapes,
  tuple projections) is merged into that node, HOPE's super-op: ``codl.PlaceParts`` runs such a
  kernel where its one producer ran, so it never lands elsewhere. The cost model has no
  prediction for these kernels; they add nothing to the node's latency (the graph's ``notes``
  say how many).
- A binding that reads several nodes (concat, residual add) or only the model's inputs is a
  *follow* node: PlaceParts puts it where all its producers ran, else (producers on both
  processors, or none) on the plan's ``home``; a scheduler applies the same rule
  (:meth:`OpGraph.follow`). So is a partitionable operator the cost model cannot describe (it is
  left out of the plan and runs unsplit, placed by the same rule); its reason is kept.
- Bindings that read only constants are dropped (FoldConstant folds them before placement).

Edges
-----
An edge ``src -> dst`` carries the bytes of the tensors of ``src`` that ``dst`` reads and
``transfer_ms``: the cost model's data-sharing prediction for them (the transform, map and
presync kinds, as a split pays for its input), paid when the two ends run on different
processors. A transfer is a delay, not work on either processor, so several readers on the
other processor see the same arrival time: a tensor moved once stays available to every reader.
Tensors of the model's inputs are not modelled (both processors read them).

Where the GPU's operators compute on images (``PlannerConfig.images``, CoDL's hybrid data type)
an edge also carries the image conversion of its tensor, paid in the one direction the build
converts it (:class:`~codl_tvm.passes.texture_parts.PackGpuParts`: packed values flow from GPU
operator to GPU operator, converted only where a buffer reads them): ``pack_ms`` from the CPU to
a GPU node whose head is a conv on images (:func:`~codl_tvm.planner.split.predict.on_images`),
``unpack_ms`` from a GPU node whose result is an image (a conv on images with covered followers;
a pool or a join behind such nodes only) to the CPU. Both are the calibrated cost model's
``image_pack`` / ``image_unpack`` sharing kinds of the edge's bytes, as the split planner
charges a GPU part, and 0 where images are off or the conversions were not measured. The
pairwise model assumes a pool's or a join's producers run where it runs; a join reading both
processors (the build unpacks its GPU operands on the GPU) is not charged.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from codl_tvm.core.errors import PlannerError
from codl_tvm.core.plan import partitionable_bindings, static_shape
from codl_tvm.cost_model.base import IMAGE_SHARING_KINDS, CostModel
from codl_tvm.planner.split.codl import SplitPlanner
from codl_tvm.planner.split.config import PlannerConfig
from codl_tvm.planner.split.predict import on_images

__all__ = ["PROCESSORS", "SPLIT", "CoexecCosts", "DagEdge", "DagNode", "OpGraph", "build_graph"]

PROCESSORS: tuple[str, str] = ("cpu", "gpu")
#: The key of a cost model's ``meta`` that records its hardware's :class:`CoexecCosts`.
META_KEY = "coexec_costs"
#: The placement of a node split across both processors (CoDL's split, Eq. 2).
SPLIT = "both"


@dataclass(frozen=True)
class DagNode:
    """One placeable unit: a partitionable operator with its merged followers, or a join.

    Attributes
    ----------
    name
        Unique in the graph: the plan's operator name (``conv2d_3``) for a partitionable
        operator, the Relax variable's name otherwise.
    cpu_ms, gpu_ms
        Predicted latency run whole on each processor (0 where nothing is predicted).
    follows
        True: placed by :meth:`OpGraph.follow` (PlaceParts' rule), not chosen by a scheduler.
    op
        The :class:`~codl_tvm.core.plan.OpInfo` name a plan places, or None.
    kind
        ``conv2d``, ``max_pool2d``, ..., or the Relax op of a follow node (``concat``).
    members
        The Relax variables of ``main`` merged into this node, in binding order.
    note
        Why a partitionable operator is a follow node (the cost model cannot describe it).
    split_ms, split_dim, split_ratio
        The operator's best CoDL split (Eq. 2: both processors busy, the sharing of its input
        and output included), a third placement choice; None when not offered.
    split_conversion_ms
        The part of ``split_ms`` that is the GPU part's image conversions where the GPU parts
        are on images (:attr:`~codl_tvm.planner.split.predict.SplitEstimate.conversion_ms`),
        else None.
    """

    name: str
    cpu_ms: float
    gpu_ms: float
    follows: bool = False
    op: str | None = None
    kind: str = ""
    members: tuple[str, ...] = ()
    note: str = ""
    split_ms: float | None = None
    split_dim: str | None = None
    split_ratio: float | None = None
    split_conversion_ms: float | None = None

    def latency_ms(self, processor: str) -> float:
        """Predicted latency on ``processor`` (``"cpu"``, ``"gpu"`` or :data:`SPLIT`)."""
        if processor == SPLIT:
            if self.split_ms is None:
                raise PlannerError(f"graph: node {self.name} offers no split")
            return self.split_ms
        return self.cpu_ms if processor == "cpu" else self.gpu_ms

    def choices(self) -> tuple[str, ...]:
        """The placements a scheduler may choose for a free node."""
        return PROCESSORS if self.split_ms is None else (*PROCESSORS, SPLIT)


@dataclass(frozen=True)
class DagEdge:
    """``dst`` reads tensors of ``src``: ``nbytes`` of them, ``transfer_ms`` across processors,
    plus ``pack_ms`` where ``src`` runs on the CPU and ``dst`` on the GPU, ``unpack_ms`` the
    other way (the image conversions of the tensor; 0 on buffers)."""

    src: str
    dst: str
    transfer_ms: float
    nbytes: int = 0
    pack_ms: float = 0.0
    unpack_ms: float = 0.0


@dataclass(frozen=True)
class CoexecCosts:
    """What an operator costs in a co-executed build beyond the cost model's prediction of it
    in a build for one processor alone (:meth:`OpGraph.with_costs`).

    The cost model is fitted on, and the single-processor plans are built as, one processor's
    kernels in one build. A placed plan's kernels run in a co-executed build: epilogues a
    neighbour on the other processor keeps from fusing run as kernels of their own, every GPU
    operator is enqueued and synchronised with the host, and each tensor that crosses
    processors is flushed and mapped. Device traces of placed plans show these as per-processor
    slowdowns and per-operator and per-edge delays.

    Attributes
    ----------
    cpu_factor, gpu_factor
        Latency of an operator run whole on the CPU (GPU) in a co-executed build over its
        prediction.
    gpu_op_ms
        Added to each operator on the GPU (its launch, the host's enqueue and the kernels its
        epilogue adds).
    cross_edge_ms
        Added to every edge whose ends run whole on different processors (the sync around the
        transfer the cost model predicts).
    """

    cpu_factor: float = 1.0
    gpu_factor: float = 1.0
    gpu_op_ms: float = 0.0
    cross_edge_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in ("cpu_factor", "gpu_factor"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and 0.0 < v < float("inf")):
                raise PlannerError(f"CoexecCosts.{name} must be a finite factor > 0, got {v!r}")
        for name in ("gpu_op_ms", "cross_edge_ms"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and 0.0 <= v < float("inf")):
                raise PlannerError(f"CoexecCosts.{name} must be finite and >= 0, got {v!r}")

    @property
    def neutral(self) -> bool:
        """True when the costs change no prediction."""
        return self == CoexecCosts()

    @classmethod
    def of(cls, cost_model: CostModel) -> CoexecCosts:
        """The costs a cost model's file records for its hardware (``meta["coexec_costs"]``,
        written by scripts/fit_coexec_costs.py), else none."""
        record = getattr(cost_model, "meta", {}).get(META_KEY)
        if record is None:
            return cls()
        if not isinstance(record, dict) or set(record) - set(cls.__dataclass_fields__):
            raise PlannerError(
                f"cost model meta {META_KEY!r} must map {', '.join(cls.__dataclass_fields__)} "
                f"to numbers, got {record!r}"
            )
        return cls(**record)


@dataclass(frozen=True)
class OpGraph:
    """A DAG of :class:`DagNode` in topological order with its :class:`DagEdge` list.

    Parameters
    ----------
    nodes
        In a topological order (every edge goes from an earlier node to a later one).
    edges
        At most one edge per (src, dst) pair.
    home
        Where a follow node runs when its producers do not decide (``"cpu"`` or ``"gpu"``).
    notes
        What the graph leaves out (kernels without predictions), for the plan report.
    """

    nodes: tuple[DagNode, ...]
    edges: tuple[DagEdge, ...] = ()
    home: str = "gpu"
    notes: tuple[str, ...] = ()
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    _preds: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    _succs: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    _transfer: dict[tuple[int, int], float] = field(init=False, repr=False, compare=False)
    # (src, dst) -> {processor dst runs on: the image conversion paid on the way there}
    _convert: dict[tuple[int, int], dict[str, float]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "edges", tuple(self.edges))
        if self.home not in PROCESSORS:
            raise PlannerError(f"graph: home must be 'cpu' or 'gpu', got {self.home!r}")
        index: dict[str, int] = {}
        for i, n in enumerate(self.nodes):
            if n.name in index:
                raise PlannerError(f"graph: node {n.name!r} appears twice")
            if n.split_ms is not None and n.follows:
                raise PlannerError(f"graph: follow node {n.name} cannot offer a split")
            for ms in (n.cpu_ms, n.gpu_ms, 0.0 if n.split_ms is None else n.split_ms):
                if not ms >= 0.0 or ms == float("inf"):
                    raise PlannerError(
                        f"graph: node {n.name} needs finite latencies >= 0, got "
                        f"cpu {n.cpu_ms!r}, gpu {n.gpu_ms!r}"
                    )
            index[n.name] = i
        preds: list[list[int]] = [[] for _ in self.nodes]
        succs: list[list[int]] = [[] for _ in self.nodes]
        transfer: dict[tuple[int, int], float] = {}
        convert: dict[tuple[int, int], dict[str, float]] = {}
        for e in self.edges:
            if e.src not in index or e.dst not in index:
                missing = e.src if e.src not in index else e.dst
                raise PlannerError(f"graph: edge {e.src} -> {e.dst} names no node {missing!r}")
            s, d = index[e.src], index[e.dst]
            if s >= d:
                raise PlannerError(
                    f"graph: edge {e.src} -> {e.dst} goes backwards: nodes must be in a "
                    "topological order"
                )
            if (s, d) in transfer:
                raise PlannerError(f"graph: edge {e.src} -> {e.dst} appears twice")
            for what in ("transfer_ms", "pack_ms", "unpack_ms"):
                v = getattr(e, what)
                if not v >= 0.0 or v == float("inf"):
                    raise PlannerError(
                        f"graph: edge {e.src} -> {e.dst} needs a finite {what} >= 0, got {v!r}"
                    )
            transfer[(s, d)] = float(e.transfer_ms)
            convert[(s, d)] = {"gpu": float(e.pack_ms), "cpu": float(e.unpack_ms)}
            preds[d].append(s)
            succs[s].append(d)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_preds", tuple(tuple(p) for p in preds))
        object.__setattr__(self, "_succs", tuple(tuple(s) for s in succs))
        object.__setattr__(self, "_transfer", transfer)
        object.__setattr__(self, "_convert", convert)

    def __len__(self) -> int:
        return len(self.nodes)

    def index(self, name: str) -> int:
        """Position of the node called ``name``."""
        try:
            return self._index[name]
        except KeyError:
            raise PlannerError(f"graph: no node {name!r}") from None

    def preds(self, i: int) -> tuple[int, ...]:
        """Positions of the nodes node ``i`` reads."""
        return self._preds[i]

    def succs(self, i: int) -> tuple[int, ...]:
        """Positions of the nodes that read node ``i``."""
        return self._succs[i]

    def transfer_ms(self, src: int, dst: int) -> float:
        """Transfer delay of the edge ``src -> dst`` when its ends run on different processors
        (the conversions of images aside: :meth:`cross_ms`)."""
        return self._transfer[(src, dst)]

    def conversion_ms(self, src: int, dst: int, to: str) -> float:
        """The image conversion the edge ``src -> dst`` pays when ``dst`` runs whole on ``to``
        and ``src`` whole on the other processor: the pack of its tensor to the GPU, the unpack
        to the CPU (0 on buffers)."""
        return self._convert[(src, dst)][to]

    def cross_ms(self, src: int, dst: int, to: str) -> float:
        """The edge's delay when ``dst`` runs whole on ``to`` and ``src`` whole on the other
        processor: its transfer plus its image conversion that way."""
        conversion = self._convert[(src, dst)][to]
        # added only where there is one: buffers' delays stay the same floats
        return self._transfer[(src, dst)] + conversion if conversion else self._transfer[(src, dst)]

    def delay_ms(self, src: int, dst: int, src_on: str, dst_on: str) -> float:
        """The edge's delay for these placements: its transfer (and image conversion,
        :meth:`cross_ms`) when the ends run whole on different processors; none next to a
        split, whose Eq. 2 includes the sharing (and conversions) of its input and output."""
        if src_on == dst_on or SPLIT in (src_on, dst_on):
            return 0.0
        return self.cross_ms(src, dst, dst_on)

    def follow(self, i: int, placement: Mapping[int, str] | Sequence[str]) -> str:
        """PlaceParts' rule for a follow node: the one processor its producers run whole on,
        else ``home`` (producers on both, or none; split producers do not count: their merged
        output does not decide)."""
        procs = {placement[p] for p in self._preds[i]} - {SPLIT}
        return procs.pop() if len(procs) == 1 else self.home

    def single_processor_ms(self, processor: str) -> float:
        """Sum of the node latencies on one processor (every node there, nothing transferred)."""
        return sum(n.latency_ms(processor) for n in self.nodes)

    def with_costs(self, costs: CoexecCosts) -> OpGraph:
        """The graph as a co-executed build runs it (see :class:`CoexecCosts`): free nodes'
        whole-processor latencies scaled and the GPU's per-operator cost added, every edge's
        cross-processor delay increased by the sync cost. A split's latency (CoDL's Eq. 2, its
        sharing included, as measured split by split) and follow nodes are unchanged, and so
        are the single-processor sums of ``self``: :meth:`single_processor_ms` of the result is
        not a single-processor build's latency."""
        if costs.neutral:
            return self
        nodes = tuple(
            n
            if n.follows
            else dataclasses.replace(
                n,
                cpu_ms=n.cpu_ms * costs.cpu_factor,
                gpu_ms=n.gpu_ms * costs.gpu_factor + (costs.gpu_op_ms if n.gpu_ms > 0 else 0.0),
            )
            for n in self.nodes
        )
        edges = tuple(
            dataclasses.replace(e, transfer_ms=e.transfer_ms + costs.cross_edge_ms)
            for e in self.edges
        )
        return OpGraph(nodes, edges, self.home, self.notes)

    def subgraph(self, keep: Iterable[int]) -> OpGraph:
        """The nodes at positions ``keep`` (in graph order) and the edges between them."""
        names = {self.nodes[i].name for i in keep}
        return OpGraph(
            tuple(n for n in self.nodes if n.name in names),
            tuple(e for e in self.edges if e.src in names and e.dst in names),
            self.home,
        )

    def contract(self, names: Sequence[str], node: DagNode) -> OpGraph | None:
        """The graph with the path ``names`` (a CoDL chain: each node read only by the next
        inside it) replaced by ``node``, or None where it cannot be: a name missing, not a
        path, or an inner node read outside the chain.

        ``node`` takes the place of the chain's last node (every outside producer of the chain
        comes before it, every outside reader after it). Edges into and out of the chain keep
        their transfer and conversions; two from the same producer become one with the larger
        of each (one tensor moved per reader, the chain's input read by its first node).
        """
        if len(names) < 2 or any(n not in self._index for n in names):
            return None
        pos = [self._index[n] for n in names]
        inside = set(pos)
        for a, b in itertools.pairwise(pos):
            if set(self._succs[a]) != {b}:
                return None
        if any(self.nodes[i].follows for i in pos):
            return None
        last = pos[-1]
        rename = {self.nodes[i].name: node.name for i in pos}
        edges: dict[tuple[str, str], DagEdge] = {}
        for e in self.edges:
            src, dst = rename.get(e.src, e.src), rename.get(e.dst, e.dst)
            if src == dst:
                continue
            old = edges.get((src, dst))
            if old is None:
                edges[(src, dst)] = dataclasses.replace(e, src=src, dst=dst)
                continue
            keep = e if e.transfer_ms > old.transfer_ms else old
            edges[(src, dst)] = dataclasses.replace(
                keep,
                src=src,
                dst=dst,
                pack_ms=max(old.pack_ms, e.pack_ms),
                unpack_ms=max(old.unpack_ms, e.unpack_ms),
            )
        nodes = tuple(
            node if i == last else n
            for i, n in enumerate(self.nodes)
            if i == last or i not in inside
        )
        return OpGraph(nodes, tuple(edges.values()), self.home, self.notes)


# ---------------------------------------------------------------------------------------------
# From a Relax module.


def _nbytes(var) -> int:
    shape = static_shape(var)
    ty = getattr(var, "ty", None)
    dtype = getattr(ty, "dtype", None)
    if shape is None or dtype is None:
        return 0
    import tvm  # deferred: TVM, which `import codl_tvm.planner` does not load

    n = 1
    for v in shape:
        n *= v
    dt = tvm.DataType(str(dtype))
    return n * max(1, dt.bits * dt.lanes // 8)


def _kind(value) -> str:
    import tvm  # deferred: see _nbytes

    op = getattr(value, "op", None)
    if isinstance(op, tvm.ir.Op):
        return op.name.rsplit(".", 1)[-1]
    return type(value).__name__.lower()


@dataclass
class _Nodes:
    """The nodes of a graph under construction, in binding order (each a dict of
    :class:`DagNode`'s fields), with where every bound variable is computed."""

    nodes: list[dict] = field(default_factory=list)
    node_of: dict = field(default_factory=dict)  # relax.Var -> position of its node
    unpredicted: dict[str, int] = field(default_factory=dict)  # kind -> kernels not predicted

    def count_unpredicted(self, value) -> None:
        from tvm import relax  # deferred: see _nbytes

        if isinstance(value, relax.Call):
            self.unpredicted[_kind(value)] = self.unpredicted.get(_kind(value), 0) + 1


def _collect_nodes(folded, planner: SplitPlanner, config: PlannerConfig, splits: bool) -> _Nodes:
    """One node per partitionable operator and per other kernel with several producers or
    none; a kernel with one producer joins its producer's node (HOPE's super-op)."""
    from tvm import relax  # deferred: see _nbytes

    by_op = {o.name: o for o in planner.ops}
    infos = {b.var: info for info, b in partitionable_bindings(folded)}
    out = _Nodes()
    params = set(folded["main"].params)
    for b in (b for block in folded["main"].body.blocks for b in block.bindings):
        used = [v for v in relax.analysis.free_vars(b.value) if isinstance(v, relax.Var)]
        producers = {out.node_of[v] for v in used if v in out.node_of}
        info = infos.get(b.var)
        if info is None and len(producers) == 1:
            # HOPE's super-op: PlaceParts runs a kernel with one producer where that one ran
            (out.node_of[b.var],) = producers
            node = out.nodes[out.node_of[b.var]]
            node["members"].append(b.var.name)
            # a kernel the texture layout does not cover reads NCHW: the node's result leaves
            # it as a buffer (unpacked inside the node, whoever reads it)
            node["image_out"] = node["image_out"] and _packed_follower(b.value)
            out.count_unpredicted(b.value)
            continue
        if info is None and not producers and not any(v in params for v in used):
            continue  # constants only: FoldConstant folds it before placement
        if info is not None:
            op = by_op[info.name]
            free = op.params is not None
            packs = free and on_images(op.params)
            node = {
                "name": info.name,
                "kind": info.kind,
                "op": info.name if free else None,
                "follows": not free,
                "note": "" if free else op.problem,
                "cpu": op.cpu_ms if free else 0.0,
                "gpu": op.gpu_ms if free else 0.0,
                "split": planner.best_split(op, config.dims) if free and splits else None,
                "packs": packs,
                # a pool is packed only behind packed producers
                "image_out": packs
                or (free and info.kind in _POOL_KINDS and _behind_images(out, producers)),
            }
        else:
            out.count_unpredicted(b.value)
            node = {"name": b.var.name, "kind": _kind(b.value), "op": None, "follows": True}
            # a join is packed where every tensor it reads is (PackGpuParts' behind_packed)
            node.update(note="", cpu=0.0, gpu=0.0, split=None, packs=False)
            node["image_out"] = _behind_images(out, producers) and _packed_follower(b.value)
        node["members"] = [b.var.name]
        out.node_of[b.var] = len(out.nodes)
        out.nodes.append(node)
    return out


#: Plan operators that the texture layout packs behind a packed producer.
_POOL_KINDS = ("max_pool2d", "avg_pool2d")


def _behind_images(found: _Nodes, producers: set[int]) -> bool:
    """Whether every one of ``producers`` (some) leaves its result as an image on the GPU."""
    return bool(producers) and all(found.nodes[p]["image_out"] for p in producers)


def _packed_follower(value) -> bool:
    """Whether the texture layout computes ``value`` on packed operands (a kernel a GPU
    operator's image result flows through without a conversion)."""
    import tvm  # deferred: see _nbytes

    # deferred: the passes need TVM's compiler, which `import codl_tvm.planner` does not load
    from codl_tvm.passes.texture_layout import BINARY_OPS, MEAN_OP, POOL_OPS, UNARY_OPS

    op = getattr(value, "op", None)
    if not isinstance(op, tvm.ir.Op):
        return False
    return op.name in UNARY_OPS | BINARY_OPS | POOL_OPS | {MEAN_OP, "relax.concat"}


def _edges(folded, found: _Nodes, names: Sequence[str], planner: SplitPlanner) -> list[DagEdge]:
    """One edge per pair of nodes where one reads the other's variables (its members' reads
    included), its transfer the predicted sharing of those tensors and, where the GPU computes
    on images, their pack into a GPU node that computes on images and their unpack out of a
    GPU node whose result is an image (the cost model's image conversion kinds)."""
    from tvm import relax  # deferred: see _nbytes

    # node -> {producer node -> the producer's variables it reads}
    reads: list[dict[int, set]] = [{} for _ in found.nodes]
    for b in (b for block in folded["main"].body.blocks for b in block.bindings):
        here = found.node_of.get(b.var)
        if here is None:
            continue
        for v in relax.analysis.free_vars(b.value):
            src = found.node_of.get(v)
            if src is not None and src != here:
                reads[here].setdefault(src, set()).add(v)
    images = planner.config.images
    pack, unpack = IMAGE_SHARING_KINDS
    edges = []
    for dst, srcs in enumerate(reads):
        for src, tensors in sorted(srcs.items()):
            nbytes = sum(_nbytes(v) for v in tensors)
            edge = DagEdge(names[src], names[dst], planner.pred.sharing_ms(nbytes), nbytes)
            if images and found.nodes[dst]["packs"]:
                edge = dataclasses.replace(
                    edge, pack_ms=planner.pred.model.predict_sharing(pack, nbytes)
                )
            if images and found.nodes[src]["image_out"]:
                edge = dataclasses.replace(
                    edge, unpack_ms=planner.pred.model.predict_sharing(unpack, nbytes)
                )
            edges.append(edge)
    return edges


def _unique_names(nodes: Sequence[dict]) -> list[str]:
    names: list[str] = []
    seen: set[str] = set()
    for n in nodes:
        name = n["name"]
        while name in seen:  # Relax variable names need not be unique
            name += "_"
        seen.add(name)
        names.append(name)
    return names


def _dag_node(name: str, n: dict) -> DagNode:
    split = n["split"]
    return DagNode(
        name,
        float(n["cpu"]),
        float(n["gpu"]),
        n["follows"],
        n["op"],
        n["kind"],
        tuple(n["members"]),
        n["note"],
        *((None, None, None) if split is None else (split.total_ms, split.dim, split.ratio)),
        None if split is None else split.conversion_ms,
    )


def _graph_notes(
    nodes: Sequence[DagNode], unpredicted: Mapping[str, int], cost_model: CostModel
) -> list[str]:
    notes = []
    if unpredicted:
        # named, so that an operator the cost model has never seen (DepthToSpace) is visible
        kinds = ", ".join(f"{k} x{c}" for k, c in sorted(unpredicted.items()))
        notes.append(
            f"{sum(unpredicted.values())} kernel(s) outside the cost model ({kinds}) add no "
            "predicted latency; each runs with its producer or on the home processor"
        )
    for n in nodes:
        if n.op is None and n.kind in ("conv2d", "max_pool2d", "avg_pool2d", "matmul"):
            notes.append(f"{n.name} ({n.kind}) is not placed by the plan: {n.note}")
    if cost_model.sharing is None:
        notes.append(
            f"the {cost_model.kind} cost model has no data-sharing measurements: transfers "
            "between the processors are taken as free"
        )
    return notes


def build_graph(
    mod,
    cost_model: CostModel,
    config: PlannerConfig | None = None,
    home: str | None = None,
    splits: bool = False,
) -> OpGraph:
    """The :class:`OpGraph` of ``mod["main"]`` with ``cost_model``'s predictions.

    Parameters
    ----------
    mod
        The Relax module as imported (the graph is read after the inference passes the build
        runs first; operator names are those of the imported module).
    cost_model
        A fitted :class:`~codl_tvm.cost_model.CostModel`, already calibrated if the planner
        calibrates (:func:`codl_tvm.planner.split.predict.calibrated_model`).
    config
        The :class:`~codl_tvm.planner.split.config.PlannerConfig` whose implementation choices
        and dtype the predictions use (None: the defaults).
    home
        Where follow nodes go when their producers do not decide; None: the processor predicted
        faster for the sum of the free nodes (as the CoDL planner picks it).
    splits
        Also offer each operator's best CoDL split (along ``config.dims``, at its ratios) as a
        third placement, where one gives both processors work.

    Returns
    -------
    OpGraph
        Nodes in ``main``'s binding order.
    """
    # deferred: the build's passes need TVM's compiler, which `import codl_tvm.planner` does
    # not load
    from codl_tvm.build.pipeline import inference_passes

    if not isinstance(cost_model, CostModel):
        raise PlannerError(f"build_graph needs a fitted CostModel, got {type(cost_model).__name__}")
    config = config or PlannerConfig()
    folded = mod
    for p in inference_passes():
        folded = p(folded)
    planner = SplitPlanner(folded, cost_model, config, "hope")
    found = _collect_nodes(folded, planner, config, splits)
    names = _unique_names(found.nodes)
    nodes = tuple(_dag_node(names[i], n) for i, n in enumerate(found.nodes))
    edges = _edges(folded, found, names, planner)
    if home is None:
        free = [n for n in nodes if not n.follows]
        cpu = sum(n.cpu_ms for n in free)
        gpu = sum(n.gpu_ms for n in free)
        home = "cpu" if cpu < gpu else "gpu"
    notes = _graph_notes(nodes, found.unpredicted, cost_model)
    return OpGraph(nodes, tuple(edges), home, tuple(notes))
