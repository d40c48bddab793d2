"""Write the CoDL evaluation models (codl_tvm.frontend.zoo) as ONNX files into a directory.

Each model is written as ``OUT_DIR/<name>.onnx`` at its evaluation size, or as
``OUT_DIR/<name>_<H>x<W>.onnx`` with ``--input-hw``. Existing files are kept unless
``--overwrite`` is given. Weights are seeded random tensors (``--seed``), not trained ones.

Usage: python scripts/make_zoo_models.py OUT_DIR [--models yolov2 vgg16 ...]
       [--input-hw H W] [--seed N] [--overwrite]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from codl_tvm.frontend.zoo import DEFAULT_INPUT_HW, ZOO_MODELS, save_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="directory the .onnx files are written to")
    parser.add_argument(
        "--models", nargs="+", default=list(ZOO_MODELS), metavar="NAME",
        help=f"models to write (default: all of {', '.join(ZOO_MODELS)})",
    )  # fmt: skip
    parser.add_argument(
        "--input-hw", nargs=2, type=int, metavar=("H", "W"),
        help="input height and width instead of each model's evaluation size",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing files")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models if m not in ZOO_MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {', '.join(ZOO_MODELS)}")
    status = 0
    for name in args.models:
        hw = tuple(args.input_hw) if args.input_hw else None
        stem = name if hw is None else f"{name}_{hw[0]}x{hw[1]}"
        path = args.out_dir / f"{stem}.onnx"
        try:
            save_model(name, path, overwrite=args.overwrite, input_hw=hw, seed=args.seed)
        except (FileExistsError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 2
            continue
        h, w = hw or DEFAULT_INPUT_HW[name]
        print(f"wrote {path} ({name}, input 1x3x{h}x{w}, seed {args.seed})")
    return status


if __name__ == "__main__":
    sys.exit(main())
