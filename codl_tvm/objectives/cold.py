"""The cold-start objective: the build with the lowest measured cold start on this machine.

A one-shot run pays for everything a warm run has already done: reading the library (whose
constants hold the weights), creating the OpenCL programs, setting up the VM. Which build is
fastest then is not the one fastest warm (NNV12, MobiSys 2022): Winograd convs read larger
weights (their transform is folded at compile time: 16/9 of the bytes per 3x3 conv for
F(2x2, 3x3)), and a GPU build creates one program per kernel where a CPU build creates none.
So the candidates (:func:`cold_candidates`: the co-executed plan, each processor alone, the CPU
alone with direct convs where it would use Winograd) are built, each started ``rounds`` times in
a fresh process with its files evicted from the page cache and empty program caches
(:func:`codl_tvm.profiling.cold_start.cold_start_ms`), and the one with the lowest median is
written to the output; the manifest's ``cold`` record gives every candidate's times.

Where the weights are stored is measured too: the candidates are built with their weights
beside the library (read on a thread while the first inference runs), and the fastest one is
also measured with its weights embedded in the library (one read, no fetches): the placement
with the lower median is kept (:attr:`ColdOptions.weights` fixes it instead).

A candidate's label (``cpu:direct:embedded``) is its build (:data:`CANDIDATE_LABELS`) and, after
a second colon, its weights' placement; :func:`describe_candidate` says it in words, and every
log line gives both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import statistics
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from codl_tvm.build.targets import get_preset
from codl_tvm.core.errors import ArtifactError
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.options import CompileOptions, OptionsError
from codl_tvm.planner.policy import cpu_alone_winograd
from codl_tvm.profiling.cold_start import cold_start_ms
from codl_tvm.runtime.artifact import MANIFEST
from codl_tvm.runtime.weights import PLACEMENTS

__all__ = [
    "CANDIDATE_LABELS",
    "ColdOptions",
    "cold_candidates",
    "compile_cold",
    "describe_candidate",
]

logger = logging.getLogger(__name__)

#: What each candidate build of :func:`cold_candidates` is, by its label.
CANDIDATE_LABELS: dict[str, str] = {
    "coexec": "the co-executed plan on the GPU and the CPU",
    "opencl": "the GPU alone",
    "cpu": "the CPU alone",
    "cpu:direct": "the CPU alone with direct convolutions (no Winograd)",
}

_PLACEMENT_WORDS = {
    "embedded": "weights embedded in the library",
    "beside": "weights beside the library",
}


@dataclass(frozen=True)
class ColdOptions:
    """How :func:`compile_cold` builds and measures its candidates (checked when made).

    Attributes
    ----------
    compile
        The options every candidate is built with, each candidate changing the fields of
        :func:`cold_candidates`; the kept one is built with them as ``codl-tvm compile``
        would (its ``verify`` is ignored: the cold starts are the measurement).
    rounds
        Cold starts measured per candidate (the median counts).
    weights
        Where every candidate stores its weights (``"embedded"``, ``"beside"``); None measures
        both placements of the fastest candidate and keeps the faster.

    Raises
    ------
    OptionsError
        ``rounds`` below 1 or an unknown ``weights`` placement (the message names the field).
    """

    compile: CompileOptions = dataclasses.field(default_factory=CompileOptions)
    rounds: int = 3
    weights: str | None = None

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise OptionsError(
                f"rounds must be >= 1 (cold starts per candidate), got {self.rounds}", ("rounds",)
            )
        if self.weights is not None and self.weights not in PLACEMENTS:
            raise OptionsError(
                f"weights must be one of {', '.join(PLACEMENTS)} or None, got {self.weights!r}",
                ("weights",),
            )


def cold_candidates(options: CompileOptions) -> dict[str, dict]:
    """The builds ``compile --objective cold`` measures: label (:data:`CANDIDATE_LABELS`) ->
    the fields of ``options`` they change."""
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


def describe_candidate(label: str) -> str:
    """A candidate's label in words: ``cpu:direct:embedded`` -> "the CPU alone with direct
    convolutions (no Winograd), weights embedded in the library"."""
    build, _, placement = label.rpartition(":")
    if placement not in _PLACEMENT_WORDS or build not in CANDIDATE_LABELS:
        build, placement = label, ""
    words = CANDIDATE_LABELS.get(build, build)
    return f"{words}, {_PLACEMENT_WORDS[placement]}" if placement else words


def compile_cold(model_path: str | Path, out_dir: str | Path, options: ColdOptions) -> Path:
    """Build every :func:`cold_candidates` build of ``model_path``, measure each one's cold
    start ``options.rounds`` times here, and write the fastest to ``out_dir`` (as ``compile``
    would, ``options.compile`` otherwise unchanged); returns the directory.

    Raises
    ------
    ArtifactError
        A cross-compiling preset (cold starts are measured on this machine).
    """
    preset = get_preset(options.compile.preset or "opencl")
    if preset.is_cross:
        raise ArtifactError(
            f"the cold objective measures cold starts on this machine, but preset "
            f"{preset.name!r} cross-compiles for {preset.triple}"
        )
    candidates = cold_candidates(options.compile)
    rounds = options.rounds
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="codl-cold-") as tmp:
        cache = options.compile.build_cache or Path(tmp) / "build_cache"
        # the fastest candidate's embedded placement joins after the first measurements
        placement = options.weights or "beside"
        base = dataclasses.replace(options.compile, build_cache=cache, verify=0, weights=placement)

        def measure(label: str, change: dict) -> None:
            path = Path(tmp) / label.replace(":", "-")
            cand = dataclasses.replace(base, reference=False, force=False, **change)
            # a candidate's build lines would bury the times
            with _quiet(logging.getLogger(compile_artifact.__module__)):
                compile_artifact(model_path, path, cand)
            times[label] = [cold_start_ms(path, Path(tmp) / "caches") for _ in range(rounds)]
            logger.info(
                "cold start of %s (%s): %.1f ms (median of %d)",
                label,
                describe_candidate(label),
                statistics.median(times[label]),
                rounds,
            )

        for label, change in candidates.items():
            measure(label, change)
        if options.weights is None:
            best = min(times, key=lambda k: statistics.median(times[k]))
            candidates[f"{best}:embedded"] = {**candidates[best], "weights": "embedded"}
            measure(f"{best}:embedded", candidates[f"{best}:embedded"])
        medians = {label: statistics.median(t) for label, t in times.items()}
        chosen = min(medians, key=medians.get)
        logger.info("keeping %s (%s): the lowest cold start", chosen, describe_candidate(chosen))
        out = compile_artifact(model_path, out_dir, dataclasses.replace(base, **candidates[chosen]))
    manifest = json.loads((Path(out) / MANIFEST).read_text())
    manifest["cold"] = {
        "rounds": rounds,
        "cold_ms": times,
        "median_ms": medians,
        "chosen": chosen,
        "labels": {label: describe_candidate(label) for label in times},
    }
    tmp_path = Path(out) / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp_path.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp_path, Path(out) / MANIFEST)
    return Path(out)


@contextlib.contextmanager
def _quiet(log: logging.Logger) -> Iterator[None]:
    """``log``'s progress (INFO) hidden for the block, its warnings kept."""
    level = log.level
    log.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        log.setLevel(level)
