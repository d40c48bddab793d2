"""A compiled profiling campaign cut down to some models' parts, so it fits one device machine.

    python scripts/device/subset_campaign.py .device/prof_k12_all .device/prof_k12 \
        --models vgg16,yolov2,fst,resnet50,posenet [--sampled] [--ratios 0.4,0.6]

Writes OUT (the manifest's parts whose ``name`` starts with one of the models, plus the sampled
parts, which have no name, with ``--sampled``, and their libraries) and OUT.tar.xz beside it,
as ``profile_campaign.py`` does. ``--ratios`` keeps only the split parts of those ratios (whole
operators are always kept); parts are ordered as ``--models`` lists the models, so a
profiling run cut by its time limit has measured the first ones. The source directory is
left as it is.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tarfile
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", help="compiled campaign directory (with manifest.json)")
    p.add_argument("out", help="new directory (must not exist)")
    p.add_argument("--models", required=True, help="comma-separated model names to keep")
    p.add_argument("--sampled", action="store_true", help="also keep the sampled shapes")
    p.add_argument("--ratios", help="comma-separated split ratios to keep (default: all)")
    args = p.parse_args()
    src, out = Path(args.src), Path(args.out)
    manifest = json.loads((src / "manifest.json").read_text())
    order = {m: i for i, m in enumerate(args.models.split(","))}  # models, in profiling order
    ratios = {round(float(r), 6) for r in args.ratios.split(",")} if args.ratios else None
    if out.exists():
        raise SystemExit(f"{out} exists: choose a new directory")

    def keep(part: dict) -> bool:
        split = part.get("partition", {})
        if ratios is not None and split.get("dim", "none") != "none":
            if round(float(split["ratio"]), 6) not in ratios:
                return False
        name = part.get("name")
        if name is None:
            return args.sampled
        return name.split("/")[0] in order

    parts = [part for part in manifest["parts"] if keep(part)]
    # stable: sampled parts (no name) last, each model's parts in campaign order
    parts.sort(key=lambda part: order.get(str(part.get("name", "")).split("/")[0], len(order)))
    missing = [part["library"] for part in parts if not (src / part["library"]).exists()]
    if missing:
        raise SystemExit(f"{src}: {len(missing)} libraries missing, e.g. {missing[0]}")
    out.mkdir(parents=True)
    for part in parts:
        shutil.copy2(src / part["library"], out / part["library"])
    (out / "manifest.json").write_text(json.dumps({**manifest, "parts": parts}))
    archive = Path(str(out).rstrip("/") + ".tar.xz")
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(out, arcname=out.name)
    print(f"kept {len(parts)} of {len(manifest['parts'])} parts -> {archive}")


if __name__ == "__main__":
    main()
