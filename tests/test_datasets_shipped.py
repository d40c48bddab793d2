"""The device datasets shipped beside the cost models, read gzip-compressed.

The shipped datasets (``codl_tvm/data/cost_models/datasets/*.jsonl.gz``) are the measurements
the shipped cost models were fitted on; each model's ``meta["dataset"]`` names them.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from codl_tvm.cost_model.dataset import DatasetError, DatasetWriter, load_dataset

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "codl_tvm" / "data" / "cost_models"
DATASETS = MODELS / "datasets"


def test_compressed_dataset_reads_as_the_plain_one(tmp_path):
    packed = DATASETS / "emulated_soc_k12_dense.jsonl.gz"
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(gzip.decompress(packed.read_bytes()))
    a, b = load_dataset(packed), load_dataset(plain)
    assert len(a.records) > 100
    assert a.records == b.records and a.meta == b.meta


def test_truncated_gzip_is_one_dataset_error(tmp_path):
    packed = (DATASETS / "emulated_soc_k12_dense.jsonl.gz").read_bytes()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(DatasetError, match=r"cut\.jsonl\.gz: not a readable gzip file"):
        load_dataset(cut)
    text = tmp_path / "text.jsonl.gz"
    text.write_text('{"format": "codl-tvm-latency-dataset"}\n')
    with pytest.raises(DatasetError, match="not a readable gzip file"):
        load_dataset(text)


def test_writer_refuses_a_compressed_path(tmp_path):
    with pytest.raises(DatasetError, match="read-only"):
        DatasetWriter(tmp_path / "new.jsonl.gz")
    assert not (tmp_path / "new.jsonl.gz").exists()


@pytest.mark.parametrize("model", sorted(MODELS.glob("*.json")), ids=lambda p: p.name)
def test_each_shipped_model_names_shipped_datasets(model):
    """A shipped cost model's training data is in the tree (so it can be refitted)."""
    meta = json.loads(model.read_text())["meta"]
    paths = meta["dataset"] if isinstance(meta["dataset"], list) else [meta["dataset"]]
    for p in paths:
        assert (ROOT / p).is_file(), p
