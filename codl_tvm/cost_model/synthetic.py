"""Synthetic latency records of an imaginary CPU + GPU pair, for examples and tests.

Nothing here is measured: latencies follow a made-up device (a fixed launch overhead plus
FLOPs over a throughput per processor, and data-sharing costs linear in bytes with a constant
pre-sync). Cost models fitted on them with the cost-model package's own ``fit`` behave like
models of a real pair with those properties, which is what the planner's tests and tutorial need.
Use measured datasets (``codl-tvm cost-model fit``) for real plans.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from codl_tvm.cost_model.analytical import CodlModel
from codl_tvm.cost_model.dataset import OpRecord, SharingRecord
from codl_tvm.cost_model.features import FeatureError, OpParams, Partition, op_features

__all__ = ["IMPLS", "SyntheticDevice", "synthetic_cost_model", "synthetic_records"]


@dataclass(frozen=True)
class SyntheticDevice:
    """An imaginary processor pair.

    Parameters
    ----------
    cpu_gflops, gpu_gflops
        Throughput of each processor (GFLOP/s).
    cpu_overhead_ms, gpu_overhead_ms
        Fixed cost of every kernel launch.
    share_ms_per_mb
        Data-sharing cost per MB for each of transform and map.
    presync_ms
        Constant pre-synchronisation cost of a co-executed operator.
    """

    cpu_gflops: float = 20.0
    gpu_gflops: float = 20.0
    cpu_overhead_ms: float = 0.01
    gpu_overhead_ms: float = 0.01
    share_ms_per_mb: float = 0.05
    presync_ms: float = 0.01

    def latency_ms(self, flops: float, processor: str) -> float:
        gflops = self.gpu_gflops if processor == "gpu" else self.cpu_gflops
        overhead = self.gpu_overhead_ms if processor == "gpu" else self.cpu_overhead_ms
        return overhead + flops / (gflops * 1e6)


def _random_params(rng: np.random.Generator, op: str) -> OpParams:
    while True:
        try:
            if op == "dense":
                return OpParams(
                    "dense",
                    int(rng.integers(1, 8)),
                    1,
                    int(rng.integers(16, 1025)),
                    int(rng.integers(8, 1025)),
                )
            h = int(rng.integers(4, 97))
            c = int(rng.choice([8, 16, 32, 64, 128]))
            k = int(rng.choice([1, 2, 3, 5]))
            s = int(rng.choice([1, 2]))
            p = k // 2
            if op == "pool":
                return OpParams("pool", h, h, c, c, k, s, (p, p, p, p))
            oc = int(rng.choice([8, 16, 32, 64, 128]))
            groups = c if (k == 3 and rng.random() < 0.2 and oc == c) else 1
            return OpParams("conv2d", h, h, c, oc, k, s, (p, p, p, p), groups=groups)
        except FeatureError:
            continue


IMPLS: dict[str, str] = {"conv2d": "direct", "dense": "matmul", "pool": "pool"}


def synthetic_records(device: SyntheticDevice, n_per_group: int = 60, seed: int = 0) -> list:
    """Operator records (conv2d, dense, pool on both processors, whole and split) and sharing
    records of ``device``; deterministic for a seed. Implementations are named as in
    :data:`IMPLS` (the analytical model's ``direct`` and ``gemm`` formulas)."""
    rng = np.random.default_rng(seed)
    records: list = []
    for op in ("conv2d", "dense", "pool"):
        impl = IMPLS[op]
        for proc in ("cpu", "gpu"):
            made = 0
            while made < n_per_group:
                params = _random_params(rng, op)
                dims = ["OC"] if op == "dense" else ["H", "OC"]
                if rng.random() < 0.3:
                    partition = Partition("none", 1.0 if proc == "gpu" else 0.0)
                else:
                    partition = Partition(str(rng.choice(dims)), float(rng.integers(1, 10)) / 10)
                feats = op_features(params, proc, impl, partition)
                if feats.part.empty:
                    continue
                lat = device.latency_ms(feats.flops, proc)
                records.append(OpRecord(params, partition, proc, impl, lat, 1))
                made += 1
    for nbytes in np.linspace(1e4, 8e6, 12):
        ms = device.share_ms_per_mb * nbytes / 1e6
        records.append(SharingRecord("transform", int(nbytes), ms, 1))
        records.append(SharingRecord("map", int(nbytes), ms, 1))
        records.append(SharingRecord("presync", int(nbytes), device.presync_ms, 1))
    return records


def synthetic_cost_model(
    device: SyntheticDevice | None = None, seed: int = 0, preset: str = "pocl-local"
) -> CodlModel:
    """A :class:`CodlModel` (``preset``) fitted on :func:`synthetic_records` of ``device``."""
    return CodlModel(preset).fit(synthetic_records(device or SyntheticDevice(), seed=seed))
