"""``compile --verify`` (:attr:`~codl_tvm.options.CompileOptions.verify`): time the candidate
builds against each processor alone and keep the fastest, with candidates made from that timing
(plans re-made with calibrated predictions, plans refined from timelines of the fastest
co-executed build).

The cost model cannot see everything co-execution costs (contention, synchronisation, kernels
outside the plan); measuring is what guarantees that an artifact is never slower than the best
single processor. Timing runs here, or on a device through a TVM RPC tracker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm import runtime
from codl_tvm.build.cache import Libraries
from codl_tvm.core.errors import ArtifactError
from codl_tvm.frontend.importer import random_inputs
from codl_tvm.planner.split.refine import RefineError, moves, refine_plan, split_times
from codl_tvm.profiling.trace import trace_inference
from codl_tvm.rpc.client import RPCError, check_remote_versions, request_remote
from codl_tvm.runtime.artifact import PROCESSOR_NAMES, Manifest
from codl_tvm.runtime.vm import time_vm

__all__ = ["refine_from_timelines", "refined_candidates", "time_here", "time_remote", "verify"]

logger = logging.getLogger(__name__)


def verify(
    model,
    candidates: dict[str, Path],
    libraries: Libraries,
    rounds: int,
    seed: int,
    manifest: Manifest,
    remote: tuple[str, str] | None,
    more: Callable[[dict[str, float]], dict[str, Path]] | None = None,
) -> Path:
    """Time the co-executed builds (``candidates``: ``"coexec"`` and ``"coexec:<mode>"`` to
    their exported libraries) against each processor alone (here, or on ``remote``, a
    ``(tracker, key)`` pair); return the library of the fastest and record the measurements
    (and a fallback) in ``manifest``.

    ``more``, given the medians of that first timing, returns more candidate libraries (plans
    re-made with the cost model calibrated to the measured single-processor latencies, plans
    refined from timelines of the fastest co-executed build); if it returns any, every build is
    timed again with them and the second timing decides."""
    libs = dict(candidates)
    for device in ("cpu", "opencl"):
        libs[device] = libraries.single(device)
    values = random_inputs(model, seed)
    inputs = [values[s.name] for s in model.inputs]

    def measure():
        if remote is None:
            samples, where = time_here(libs, inputs, rounds), "this machine"
        else:
            samples, where = time_remote(libs, inputs, rounds, *remote)
        return samples, where, {name: float(np.median(v)) for name, v in samples.items()}

    samples, where, ms = measure()
    first = None
    extra = more(ms) if more is not None else {}
    if extra:
        first = {"median_ms": ms, "samples_ms": samples}
        logger.info(
            "verify: first timing %s; timing again with %s",
            ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items()),
            ", ".join(extra),
        )
        libs.update(extra)
        samples, where, ms = measure()
    chosen = min(ms, key=ms.get)
    manifest.verify = {
        "rounds": rounds,
        "on": where,
        "median_ms": ms,
        "samples_ms": samples,
        "chosen": chosen,
    }
    if first is not None:
        manifest.verify["first_timing"] = first
    logger.info(
        "measured on %s (median of %d rounds): %s; keeping %s",
        where,
        rounds,
        ", ".join(f"{_described(k)} {v:.3f} ms" for k, v in ms.items()),
        _described(chosen),
    )
    if chosen in ("cpu", "opencl"):
        manifest.device = chosen
        manifest.vm_devices = [chosen]
        coexec = [v for k, v in ms.items() if k.startswith("coexec")]
        # "(--verify)": the manifest's words, which earlier artifacts have too
        manifest.plan["fallback"] = (
            f"measured {min(coexec):.3f} ms co-executed vs {ms[chosen]:.3f} ms on the "
            f"{PROCESSOR_NAMES[chosen]} alone (--verify)"
            if coexec
            else f"measured {ms[chosen]:.3f} ms on the {PROCESSOR_NAMES[chosen]} alone, faster "
            "than the other processor alone (the plan splits nothing)"
        )
        target = libraries.preset.target("cpu" if chosen == "cpu" else "gpu")
        manifest.targets = {chosen: str(target)}
    return libs[chosen]


def _described(build: str) -> str:
    """A timed build in words: ``cpu`` -> "the CPU alone", ``coexec:h_only`` -> "co-executed
    (h_only plan)"."""
    if build in PROCESSOR_NAMES:
        return f"the {PROCESSOR_NAMES[build]} alone"
    _, _, plan = build.partition(":")
    return "co-executed" + (f" ({plan} plan)" if plan else "")


def time_here(libs: dict[str, Path], inputs, rounds: int) -> dict[str, list[float]]:
    """Median of 2 runs per round, the builds round-robin, so drift does not favour one."""
    runtime.load()
    vms = {}
    for name, path in libs.items():
        devices = {"coexec": [tvm.opencl(0), tvm.cpu(0)], "cpu": [tvm.cpu(0)]}.get(
            name.split(":", 1)[0], [tvm.opencl(0)]
        )
        vms[name] = (VirtualMachine(tvm.runtime.load_module(str(path)), devices), devices[0])
    samples: dict[str, list[float]] = {name: [] for name in vms}
    for _ in range(rounds):
        for name, (vm, dev) in vms.items():
            samples[name].append(time_vm(vm, dev, inputs, number=2, repeat=1).median_ms)
    return samples


def time_remote(libs: dict[str, Path], inputs, rounds: int, tracker: str, key: str):
    """Each build uploaded to one device of ``key`` and timed there (``rounds`` repeats of 2
    runs; the builds one after the other in one session)."""
    # deferred: codl_tvm.objectives.deploy imports TVM's compiler, and this module is imported
    # where TVM is runtime-only (artifacts on a device)
    from codl_tvm.objectives.deploy import run_remote

    try:
        remote = request_remote(tracker, key)
    except RPCError as exc:
        raise ArtifactError(f"verify: {exc}") from None
    try:
        info = check_remote_versions(remote)
        if (info or {}).get("opencl") != "1":
            raise ArtifactError(
                f"verify: remote device {remote.name} has no usable OpenCL runtime (start its "
                "server with `codl-tvm serve --opencl`)"
            )
        samples = {}
        for name, path in libs.items():
            device = name.split(":", 1)[0]
            run = run_remote(remote, path, inputs, device, number=2, repeat=rounds)
            samples[name] = [run.median_ms]
        where = f"{remote.name} (RPC {tracker}, key {key})"
        if (info or {}).get("emulated"):  # e.g. qemu: the choice below follows no real latency
            where += f" [EMULATED ({info['emulated']}): not hardware latencies]"
        return samples, where
    except RPCError as exc:
        raise ArtifactError(f"verify: {exc}") from None
    finally:
        remote.close()


def refine_from_timelines(traced, splits: dict, inputs, plan, traces: int, step: float = 1.0):
    """Take ``traces`` timelines of ``traced`` (anything with a ``vm``; its kernel record is
    ``splits``) and refine ``plan`` from them; returns ``(refined plan, record)`` (the record
    without its ``"from"``). Raises :class:`~codl_tvm.planner.split.refine.RefineError`."""
    timelines = [
        trace_inference(traced, inputs, warmup=1 if i == 0 else 0, kernel_splits=splits)
        for i in range(traces)
    ]
    refined, rows = refine_plan(plan, splits, split_times(timelines), step=step)
    return refined, {
        "from_plan": plan.to_dict(),
        "traces": traces,
        "step": step,
        "span_ms": [round(t.span_us() / 1e3, 4) for t in timelines],
        "splits": rows,
    }


def refined_candidates(
    model, source, plan, library, libraries, refine, seed, seen, refined, mode
) -> dict:
    """``refine = (rounds, traces)`` rounds of refinement for ``--verify``: timelines of the
    co-executed build ``source`` (its ``library``, built with ``plan``), each split balanced
    from them (:func:`codl_tvm.planner.split.refine.refine_plan`), the result built as
    ``coexec:refined`` (then ``coexec:refined2`` from that, ...). Returns ``{name: library}``
    and records ``refined[name] = (plan, record)``; stops early when a round changes nothing
    or cannot be refined. ``mode``: the planner mode the refined plans descend from."""
    rounds, traces = refine
    values = random_inputs(model, seed)
    inputs = [values[s.name] for s in model.inputs]
    found = {}
    for r in range(1, rounds + 1):
        splits = libraries.kernel_splits.get(source)
        if not splits:
            logger.info("verify: %s has no kernel record; nothing to refine", source)
            break
        vm = VirtualMachine(tvm.runtime.load_module(str(library)), [tvm.opencl(0), tvm.cpu(0)])
        try:
            new, record = refine_from_timelines(
                SimpleNamespace(vm=vm), splits, inputs, plan, traces
            )
        except RefineError as exc:
            logger.info("verify: %s cannot be refined: %s", source, exc)
            break
        text = new.to_json()
        if text in seen:
            logger.info("verify: refining %s gives no new plan; no more rounds", source)
            break
        seen.add(text)
        name = "coexec:refined" if r == 1 else f"coexec:refined{r}"
        logger.info(
            "verify: %s from %d timelines of %s: %s",
            name,
            traces,
            source,
            ", ".join(moves(record["splits"])),
        )
        library = libraries.coexec(name, new)
        refined[name] = (new, {"from": source, "mode": mode, **record})
        found[name] = library
        source, plan = name, new
    return found
