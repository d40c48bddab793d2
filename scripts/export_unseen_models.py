"""Export models no shipped cost model was fitted on to ONNX, with seeded random weights.

The ten benchmark models (onnx's light models and the CoDL zoo) are the data the shipped cost
models were fitted on; a result on them says nothing about a model the cost model never saw.
These architectures come from torchvision's and timm's model definitions and cover operator
mixes the ten lack: depthwise and grouped convolutions, channel shuffles, dense concatenations,
squeeze-excitation, an encoder-decoder, and inputs wider or narrower than 224x224.

PyTorch is a benchmark-time tool only (never a dependency of the package or of CI)::

    python -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch torchvision timm onnx
    /tmp/torchenv/bin/python scripts/export_unseen_models.py -o .models/unseen

Each model is written as ``NAME.onnx`` (opset 17, batch 1, float32, input ``input``) with a
``models.json`` index (name, source, input shape, what it exercises, SHA-256).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

# name -> (source, constructor, input (C, H, W), what the cost models never saw in it)
MODELS: dict[str, tuple[str, str, tuple[int, int, int], str]] = {
    "mobilenet_v2": (
        "torchvision",
        "mobilenet_v2",
        (3, 224, 224),
        "depthwise 3x3, inverted residual",
    ),
    "shufflenet_v2": ("torchvision", "shufflenet_v2_x1_0", (3, 224, 224), "channel shuffle, split"),
    "densenet121": ("torchvision", "densenet121", (3, 224, 224), "dense blocks (concatenations)"),
    "resnext50": ("torchvision", "resnext50_32x4d", (3, 224, 224), "grouped 3x3 (32 groups)"),
    "efficientnet_b0": ("torchvision", "efficientnet_b0", (3, 224, 224), "depthwise 5x5, SE, SiLU"),
    "mnasnet": ("torchvision", "mnasnet1_0", (3, 224, 224), "depthwise 3x3/5x5, narrow channels"),
    "regnet_x_400mf": ("torchvision", "regnet_x_400mf", (3, 224, 224), "grouped convs (width 16)"),
    "lraspp_mobilenet_v3": (
        "torchvision.segmentation",
        "lraspp_mobilenet_v3_large",
        (3, 256, 256),
        "encoder-decoder: hardswish, SE, bilinear upsampling",
    ),
    "ghostnet": ("timm", "ghostnet_100", (3, 224, 224), "ghost modules (cheap depthwise + concat)"),
    "mobilenet_v2_wide": (
        "torchvision",
        "mobilenet_v2",
        (3, 160, 480),
        "a wide input (160x480) through depthwise layers",
    ),
    "resnet18_narrow": ("torchvision", "resnet18", (3, 96, 96), "a narrow input (96x96)"),
}


class _OutputOnly:
    """Segmentation models return a dict; the ONNX graph keeps its ``out`` tensor."""

    def __new__(cls, model):
        import torch  # deferred: a benchmark-time tool, not a dependency

        class Wrapped(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                return self.inner(x)["out"]

        return Wrapped(model)


def build(source: str, ctor: str):
    """The model with fresh seeded weights."""
    import torch  # deferred: a benchmark-time tool, not a dependency

    torch.manual_seed(0)
    if source == "timm":
        import timm  # deferred: a benchmark-time tool

        return timm.create_model(ctor, pretrained=False)
    import torchvision  # deferred: a benchmark-time tool

    if source == "torchvision.segmentation":
        seg = getattr(torchvision.models.segmentation, ctor)
        return _OutputOnly(seg(weights=None, weights_backbone=None))
    return getattr(torchvision.models, ctor)(weights=None)


def export(name: str, out_dir: Path) -> dict:
    import torch  # deferred: a benchmark-time tool, not a dependency

    source, ctor, chw, what = MODELS[name]
    model = build(source, ctor).eval()
    path = out_dir / f"{name}.onnx"
    x = torch.randn(1, *chw)
    with torch.no_grad():
        torch.onnx.export(
            model,
            (x,),
            str(path),
            opset_version=17,
            dynamo=False,
            input_names=["input"],
            output_names=["output"],
        )
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    import torchvision  # deferred: a benchmark-time tool

    return {
        # the graph depends on the exporter: say which made it
        "exported_with": {"torch": torch.__version__, "torchvision": torchvision.__version__},
        "name": name,
        "source": f"{source}.{ctor}",
        "input": [1, *chw],
        "exercises": what,
        "sha256": sha,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", type=Path, default=Path(".models/unseen"))
    ap.add_argument("--only", nargs="*", choices=sorted(MODELS), help="export these models only")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    index_path = args.out / "models.json"
    # --only re-exports some models: the index keeps the others' entries
    kept = json.loads(index_path.read_text()) if index_path.is_file() else []
    index = []
    for name in args.only or MODELS:
        try:
            index.append(export(name, args.out))
        except Exception as exc:  # one model failing to export must not lose the others
            print(f"export_unseen_models: {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        print(f"{name}: {index[-1]['source']} {index[-1]['input']}")
    done = {e["name"] for e in index}
    merged = [e for e in kept if e["name"] not in done] + index
    index_path.write_text(json.dumps(sorted(merged, key=lambda e: e["name"]), indent=1) + "\n")
    return 0 if len(index) == len(args.only or MODELS) else 1


if __name__ == "__main__":
    sys.exit(main())
