"""Co-execution passes: split, chain and place operators on GPU + CPU.

- :class:`PartitionOperators` (``partition.py``): splits the operators and chains of a
  :class:`~codl_tvm.core.plan.PartitionPlan` into a GPU part and a CPU part merged with ``concat``;
  :class:`OperatorAnalysis` (``partition_analysis.py``) is what it reads first (chains,
  followers, the blocks after a split), also used by the planner.
- :func:`collect_parts` (``parts.py``): which variables belong to which processor, and which
  output region each part produces.
- :class:`SanitizeParamNames` (``param_names.py``): first in every pipeline, gives Relax
  parameters C-identifier names (TVM names kernel arguments after them).
- :class:`~codl_tvm.passes.imported_clip.ImportedClip` (``imported_clip.py``): right after
  import, makes the two kernels TVM's ONNX importer emits for Clip (ReLU6) one ``R.clip``.
- :class:`FoldBatchNorm` (``fold_bn.py``): before partitioning, folds inference batch norms after
  constant-weight convs into the convs (keeps operator names and shapes).
- :class:`PairwiseVariadic` (``variadic.py``): before partitioning, rewrites the ONNX frontend's
  stack-and-reduce Sum/Max/Min as binary ops (residual adds that fuse into the conv before them).
- :class:`LRNWindowSum` (``lrn.py``): before partitioning, writes LRN's channel-window average
  pool as shifted adds (one elementwise kernel instead of an unscheduled 3-D pool).
- :class:`OrderSplits` (``order.py``): after partitioning, orders ``main``'s bindings so the
  splits are issued in a placement schedule's dispatch order (HOPE).
- :class:`Conv2DWinograd` (``winograd.py``): after partitioning, before legalization, rewrites
  qualifying 3x3 convs (and conv parts) as Winograd convs, per processor config.
- :func:`~codl_tvm.passes.kernel_splits.kernel_splits` (``kernel_splits.py``): every kernel call
  of a co-executed ``main`` in execution order with the split it computes (the build's record
  that attributes a timeline's kernels to the plan).
- :class:`~codl_tvm.passes.stages.CutStages` (``stages.py``): before any build pipeline, adds
  pipeline stage functions cut from ``main`` at layer boundaries (Pipe-it).
- :class:`~codl_tvm.passes.share_kernels.ShareIdenticalKernels` (``share_kernels.py``): after
  that record, merges the per-split kernel copies of identical code (PoCL reloads the binaries
  of a model with more than 128 distinct kernels on every launch).
- :class:`~codl_tvm.passes.stream_weights.StreamWeights` (``stream_weights.py``): last, with
  ``--weights beside``, turns large constants into fetches of weights loaded beside the library
  while the model runs.
- :class:`~codl_tvm.passes.issue_ahead.IssueGpuAhead` (``issue_ahead.py``): right after the
  co-execution sync, enqueues each GPU kernel as early as its inputs allow (optionally held by
  on-device gates the CPU signals).
- The texture build of the GPU alone (CoDL's hybrid data type, :mod:`codl_tvm.build.texture`):
  :class:`~codl_tvm.passes.texture_layout.ToTextureLayout` (``texture_layout.py``: operators on
  NCHW4c images, weights packed at build time),
  :class:`~codl_tvm.passes.texture_scope_copy.TextureScopeCopies` (``texture_scope_copy.py``:
  copies between image layouts as kernels),
  :class:`~codl_tvm.passes.texture_call_sites.OwnScopedKernels` (``texture_call_sites.py``: a
  kernel copy per combination of memory scopes) and
  :class:`~codl_tvm.passes.texture_storage.ImageStorages` (``texture_storage.py``: each image
  tensor its own image-shaped storage).
- Co-executed builds with GPU parts on images (:mod:`codl_tvm.build.texture_coexec`):
  :class:`~codl_tvm.passes.texture_parts.PackGpuParts` (``texture_parts.py``: the GPU parts in
  NCHW4c, conversions at their ends, the CPU parts untouched) and
  :class:`~codl_tvm.passes.texture_scopes.GpuImageScopes` (``texture_scopes.py``: packed tensors
  only GPU kernels read in images).
"""

from codl_tvm.core.geometry import (
    ChannelMap,
    PartSpan,
    SlidingWindow,
    Span,
    chain_channel_spans,
    chain_row_spans,
    split_point,
)

from .fold_bn import FoldBatchNorm
from .lrn import LRNWindowSum
from .order import OrderSplits
from .param_names import SanitizeParamNames
from .partition import PartitionOperators
from .partition_analysis import OperatorAnalysis
from .parts import PARTS_ATTR, PartRecord, Processor, SplitRecord, collect_parts
from .variadic import PairwiseVariadic
from .winograd import Conv2DWinograd

__all__ = [
    "PARTS_ATTR",
    "ChannelMap",
    "Conv2DWinograd",
    "FoldBatchNorm",
    "LRNWindowSum",
    "OperatorAnalysis",
    "OrderSplits",
    "PairwiseVariadic",
    "PartRecord",
    "PartSpan",
    "PartitionOperators",
    "Processor",
    "SanitizeParamNames",
    "SlidingWindow",
    "Span",
    "SplitRecord",
    "chain_channel_spans",
    "chain_row_spans",
    "collect_parts",
    "split_point",
]
