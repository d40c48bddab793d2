"""Access to the ONNX backend test data shipped inside the onnx package."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"


def case_dir(group: str, name: str) -> Path:
    return DATA / group / name


def load_case(directory: Path) -> tuple[onnx.ModelProto, list[np.ndarray], list[np.ndarray]]:
    """Model, inputs and expected outputs of an ONNX backend test case (test_data_set_0)."""
    model = onnx.load(str(directory / "model.onnx"))
    ds = directory / "test_data_set_0"

    def read(prefix: str) -> list[np.ndarray]:
        files = sorted(ds.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
        out = []
        for f in files:
            t = onnx.TensorProto()
            t.ParseFromString(f.read_bytes())
            out.append(numpy_helper.to_array(t))
        return out

    return model, read("input"), read("output")


def light_model(name: str) -> onnx.ModelProto:
    """onnx's light model as shipped (constant-filled weights)."""
    return onnx.load(str(DATA / "light" / f"light_{name}.onnx"))
