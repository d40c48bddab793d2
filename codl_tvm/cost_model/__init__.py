"""Latency cost models of operator parts on the CPU and GPU (CoDL section 5, SVM paper section 3).

``features`` describes an operator part with named fields, ``dataset`` stores measurements,
``base.CostModel`` is the interface (fit / predict / save / load, JSON files), implemented by
``analytical.CodlModel`` (CoDL's Eq. 3 per implementation, Eq. 2 composition), ``gbdt.GbdtModel``
(xgboost per implementation with dispatch features) and ``flops.FlopsModel`` (FLOPs-linear
baseline and fallback); ``evaluate`` holds the metrics and the ``cost-model`` commands,
``assessment`` the full report of ``cost-model eval`` (random split and leave-one-model-out
with CoDL's model, FLOPs and the data's ceilings beside), ``decisions`` the splits a model picks
against the measured best, ``in_model`` whole-model sums against measured builds,
``dispatch`` reads work-group and parallel-loop features from scheduled TIR, ``sampling`` draws
shapes to profile. The GBDT's feature code sits beside it: ``dispatch_shape`` (a part's work
over the processor), ``tiling_features`` (the direct conv's tiling, mirrored) and
``kernel_counts`` (counts read from a part's rebuilt kernel); ``part_ir`` builds a part's one-op
module, for the profiler and for ``kernel_counts``; ``linalg`` holds the least-squares helpers.
Importing this package imports neither TVM, xgboost nor matplotlib (``part_ir`` and
``kernel_counts``, which need TVM, are imported by name).
"""

from codl_tvm.cost_model.analytical import PRESETS, CodlConfig, CodlModel, ProcessorBlocking
from codl_tvm.cost_model.base import (
    CoexecLatency,
    CostModel,
    CostModelFallbackWarning,
    ModelFileError,
    SharingModel,
    load_model,
)
from codl_tvm.cost_model.dataset import (
    Dataset,
    DatasetError,
    DatasetWriter,
    OpRecord,
    SharingRecord,
    load_dataset,
    save_dataset,
)
from codl_tvm.cost_model.dispatch import dispatch_features, kernel_launches
from codl_tvm.cost_model.features import (
    DispatchFeatures,
    FeatureError,
    OpFeatures,
    OpParams,
    Partition,
    PartShape,
    op_features,
    part_shape,
)
from codl_tvm.cost_model.flops import FlopsModel
from codl_tvm.cost_model.gbdt import GbdtConfig, GbdtModel

__all__ = [
    "PRESETS",
    "CodlConfig",
    "CodlModel",
    "CoexecLatency",
    "CostModel",
    "CostModelFallbackWarning",
    "Dataset",
    "DatasetError",
    "DatasetWriter",
    "DispatchFeatures",
    "FeatureError",
    "FlopsModel",
    "GbdtConfig",
    "GbdtModel",
    "ModelFileError",
    "OpFeatures",
    "OpParams",
    "OpRecord",
    "PartShape",
    "Partition",
    "ProcessorBlocking",
    "SharingModel",
    "SharingRecord",
    "dispatch_features",
    "kernel_launches",
    "load_dataset",
    "load_model",
    "op_features",
    "part_shape",
    "save_dataset",
]
