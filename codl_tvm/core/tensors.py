"""The description of a model's graph inputs and outputs, shared by the importer (which makes
them), the artifacts (whose manifests store them) and everything that feeds a model inputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TensorSpec"]


@dataclass(frozen=True)
class TensorSpec:
    """Name, static shape and dtype of a graph input or output."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        """The manifest form: ``{"name", "shape" (a list), "dtype"}``."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> TensorSpec:
        """The spec of a manifest entry (:meth:`to_dict`)."""
        return cls(record["name"], tuple(record["shape"]), record["dtype"])
