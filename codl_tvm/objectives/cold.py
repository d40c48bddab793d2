"""``compile --objective cold``: the build with the lowest measured cold start on this machine.

A one-shot run pays for everything a warm run has already done: reading the library (whose
constants hold the weights), creating the OpenCL programs, setting up the VM. Which build is
fastest then is not the one fastest warm (NNV12, MobiSys 2022): Winograd convs read larger
weights (their transform is folded at compile time: 16/9 of the bytes per 3x3 conv for
F(2x2, 3x3)), and a GPU build creates one program per kernel where a CPU build creates none.
So the candidates (the co-executed plan, each processor alone, the CPU alone with direct convs
where it would use Winograd) are built, each started ``rounds`` times in a fresh process with
its files evicted from the page cache and empty program caches
(:func:`codl_tvm.profiling.cold_start.cold_start_ms`), and the one with the lowest median is
written to
the output; the manifest's ``cold`` record gives every candidate's times.

Where the weights are stored is measured too: the candidates are built with their weights
beside the library (read on a thread while the first inference runs), and the fastest one is
also measured with its weights embedded in the library (one read, no fetches): the placement
with the lower median is kept (``--weights`` fixes it instead).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

from codl_tvm.build.targets import get_preset
from codl_tvm.core.errors import ArtifactError
from codl_tvm.options import CompileOptions, compile_model
from codl_tvm.planner.policy import cpu_alone_winograd
from codl_tvm.profiling.cold_start import cold_start_ms
from codl_tvm.runtime.artifact import MANIFEST
from codl_tvm.runtime.weights import PLACEMENTS

__all__ = ["cold_candidates", "compile_cold"]


def cold_candidates(options: CompileOptions) -> dict[str, dict]:
    """The builds ``compile --objective cold`` measures: name -> the options they change."""
    preset = get_preset(options.preset or "opencl")
    found: dict[str, dict] = {}
    if preset.gpu is not None:
        found["coexec"] = {"device": "coexec"}
        found["opencl"] = {"device": "opencl", "plan": None}
    found["cpu"] = {"device": "cpu", "plan": None}
    if options.winograd or (options.winograd is None and cpu_alone_winograd(preset)):
        # Winograd's weights are read larger at every cold start
        found["cpu:direct"] = {"device": "cpu", "plan": None, "winograd": False}
    return found


def compile_cold(
    model_path: str | Path,
    out_dir: str | Path,
    options: CompileOptions,
    rounds: int = 3,
    log: Callable[[str], None] = print,
    weights: str | None = None,
) -> Path:
    """Build every :func:`cold_candidates` build of ``model_path``, measure each one's cold
    start ``rounds`` times here, and write the fastest to ``out_dir`` (as ``compile`` would,
    ``options`` otherwise unchanged); returns the directory. ``weights``: where every
    candidate stores its weights (``embedded``, ``beside``); None measures both placements of
    the fastest candidate and keeps the faster.

    Raises
    ------
    ArtifactError
        A cross-compiling preset (cold starts are measured on this machine), or ``rounds`` < 1.
    """
    if rounds < 1:
        raise ArtifactError(f"--objective cold needs at least one round, got {rounds}")
    preset = get_preset(options.preset or "opencl")
    if preset.is_cross:
        raise ArtifactError(
            f"--objective cold measures cold starts on this machine, but preset {preset.name!r} "
            f"cross-compiles for {preset.triple}"
        )
    candidates = cold_candidates(options)
    medians: dict[str, float] = {}
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="codl-cold-") as tmp:
        cache = options.build_cache or Path(tmp) / "build_cache"
        base = dataclasses.replace(options, build_cache=cache, verify=0)
        if weights is None:
            # the fastest candidate's embedded placement joins after the first measurements
            base = dataclasses.replace(base, weights="beside")
        elif weights not in PLACEMENTS:
            raise ArtifactError(f"weights {weights!r} is not one of {', '.join(PLACEMENTS)}")
        else:
            base = dataclasses.replace(base, weights=weights)

        def measure(name: str, change: dict) -> None:
            path = Path(tmp) / name.replace(":", "-")
            cand = dataclasses.replace(base, reference=False, force=False, **change)
            compile_model(model_path, path, cand, log=lambda s: None)
            times[name] = [cold_start_ms(path, Path(tmp) / "caches") for _ in range(rounds)]
            medians[name] = statistics.median(times[name])
            log(f"cold start of the {name} build: {medians[name]:.1f} ms (median of {rounds})")

        for name, change in candidates.items():
            measure(name, change)
        if weights is None:
            best = min(medians, key=medians.get)
            candidates[f"{best}:embedded"] = {**candidates[best], "weights": "embedded"}
            measure(f"{best}:embedded", candidates[f"{best}:embedded"])
        chosen = min(medians, key=medians.get)
        log(f"keeping the {chosen} build (lowest cold start)")
        out = compile_model(
            model_path, out_dir, dataclasses.replace(base, **candidates[chosen]), log=log
        )
    manifest = json.loads((Path(out) / MANIFEST).read_text())
    manifest["cold"] = {"rounds": rounds, "cold_ms": times, "median_ms": medians, "chosen": chosen}
    tmp_path = Path(out) / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp_path.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp_path, Path(out) / MANIFEST)
    return Path(out)
