"""Processor groups: the CPU clusters and GPUs a Pipe-it pipeline's stages run on.

Owns the group model (:class:`ProcessorGroup`), its text form (:func:`parse_groups` reads
``big:0-3,little:4-7,gpu``), the checks every pipeline's groups pass before anything is searched,
built or loaded (:func:`check_groups`), and which cores this process may use
(:func:`process_cpus`, the default those checks compare against).

Pure Python: the planner's stage search (:mod:`codl_tvm.planner.stages`), the profiling of layer
tables and the pipeline artifact's loader (:mod:`codl_tvm.runtime.staged_artifact`) share it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from codl_tvm.core.errors import PlannerError

__all__ = [
    "GROUP_KINDS",
    "ProcessorGroup",
    "check_groups",
    "parse_cpu_list",
    "parse_groups",
    "process_cpus",
]

GROUP_KINDS = ("cpu", "gpu")


@dataclass(frozen=True)
class ProcessorGroup:
    """A processor group a pipeline's stages are built for.

    Parameters
    ----------
    name
        The group's name (``"big"``, ``"little"``, ``"gpu"``).
    kind
        ``"cpu"``: stages take 1 to ``len(cores)`` of its cores; ``"gpu"``: one stage, the
        whole device (``cores`` are then the host cores its driver may use, possibly none).
    cores
        Host CPU core ids.
    """

    name: str
    kind: str
    cores: tuple[int, ...]

    @property
    def most_stage_cores(self) -> int:
        """The largest core count one stage of this group may have (a GPU counts as 1)."""
        return len(self.cores) if self.kind == "cpu" else 1


def parse_cpu_list(text: str) -> set[int]:
    """``"0-3,8,10-11"`` (the kernel's CPU list format, as in ``cpuset.cpus.effective``) as a
    set of core ids."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _allowed_cpus() -> set[int] | None:
    """The cores the process's cpuset cgroup allows (cgroup v2, then v1), else the online ones:
    what a thread of it may pin itself to, whatever mask it inherited."""
    try:
        entries = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        entries = []
    candidates = []
    for line in entries:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            candidates.append(f"/sys/fs/cgroup{path}/cpuset.cpus.effective")
        elif "cpuset" in controllers.split(","):
            candidates.append(f"/sys/fs/cgroup/cpuset{path}/cpuset.effective_cpus")
    candidates.append("/sys/devices/system/cpu/online")
    for f in candidates:
        try:
            cpus = parse_cpu_list(open(f).read())
        except (OSError, ValueError):
            continue
        if cpus:
            return cpus
    return None


def process_cpus() -> frozenset[int]:
    """The cores this process may use: those its cpuset allows (else every online core), not
    the calling thread's affinity, which TVM's pool narrows on the thread that runs it and a
    spawned process inherits; a stage thread may pin itself to any of them."""
    allowed = _allowed_cpus()
    if allowed is None:
        allowed = set(range(os.cpu_count() or 1))
    if hasattr(os, "sched_getaffinity"):
        allowed |= os.sched_getaffinity(0)
    return frozenset(allowed)


def _core_list(text: str, where: str) -> list[int]:
    lo, sep, hi = text.partition("-")
    try:
        first, last = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        raise PlannerError(f"{where}: bad core range {text!r} (expected N or N-M)") from None
    if first < 0 or last < first:
        raise PlannerError(f"{where}: bad core range {text!r}")
    return list(range(first, last + 1))


def parse_groups(spec: str, available: Iterable[int] | None = None) -> tuple[ProcessorGroup, ...]:
    """Read processor groups from ``"big:0-3,6,little:8-11,gpu"`` and check them.

    A ``name:cores`` item starts a group; a bare number or range after it adds cores to it; a
    bare name is a group without cores. Groups named ``gpu`` (or ``gpu0``, ``gpu1``, ...) are
    GPU groups, all others CPU clusters.

    Parameters
    ----------
    spec
        The groups' text.
    available
        The cores this process may run on (default: :func:`process_cpus`).

    Raises
    ------
    PlannerError
        Malformed text, or groups :func:`check_groups` refuses.
    """
    groups: list[tuple[str, list[int]]] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            raise PlannerError(f"processor groups {spec!r}: empty item")
        name, sep, cores = item.partition(":")
        if sep:
            name, cores = name.strip(), cores.strip()
            groups.append((name, _core_list(cores, f"group {name!r}") if cores else []))
        elif item[0].isdigit():
            if not groups:
                raise PlannerError(f"processor groups {spec!r}: cores {item!r} before any group")
            groups[-1][1].extend(_core_list(item, f"group {groups[-1][0]!r}"))
        else:
            groups.append((item, []))
    return check_groups(
        [
            ProcessorGroup(name, "gpu" if _is_gpu_name(name) else "cpu", tuple(cores))
            for name, cores in groups
        ],
        available,
    )


def _is_gpu_name(name: str) -> bool:
    return name == "gpu" or (name.startswith("gpu") and name[3:].isdigit())


def _ranges(cores: Iterable[int]) -> str:
    cores = sorted(set(cores))
    out = []
    for _, run in itertools.groupby(enumerate(cores), lambda ic: ic[1] - ic[0]):
        run = [c for _, c in run]
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)


def check_groups(
    groups: Sequence[ProcessorGroup], available: Iterable[int] | None = None
) -> tuple[ProcessorGroup, ...]:
    """Refuse groups a pipeline cannot run on, before anything is searched or built.

    Parameters
    ----------
    groups
        The processor groups.
    available
        The cores this process may run on (default: :func:`process_cpus`).

    Raises
    ------
    PlannerError
        No groups, a duplicate or empty name, an unknown kind, a CPU group without cores, a core
        named twice, or cores the machine does not have.
    """
    if not groups:
        raise PlannerError("no processor groups to build a pipeline on")
    if available is None:
        available = process_cpus()
    avail = set(available)
    seen_names: set[str] = set()
    owner: dict[int, str] = {}
    for g in groups:
        if not isinstance(g, ProcessorGroup):
            raise PlannerError(f"not a ProcessorGroup: {g!r}")
        if not g.name:
            raise PlannerError("a processor group has an empty name")
        if g.name in seen_names:
            raise PlannerError(f"processor group {g.name!r} is named twice")
        seen_names.add(g.name)
        if g.kind not in GROUP_KINDS:
            raise PlannerError(f"processor group {g.name!r}: unknown kind {g.kind!r}")
        if g.kind == "cpu" and not g.cores:
            raise PlannerError(f"processor group {g.name!r} has no cores")
        if len(set(g.cores)) != len(g.cores):
            raise PlannerError(f"processor group {g.name!r} names a core twice")
        missing = set(g.cores) - avail
        if missing:
            raise PlannerError(
                f"processor group {g.name!r} names cores {_ranges(missing)}, which this machine "
                f"does not have (available: {_ranges(avail) or 'none'})"
            )
        for c in g.cores:
            if c in owner:
                raise PlannerError(f"core {c} is in both group {owner[c]!r} and {g.name!r}")
            owner[c] = g.name
    return tuple(groups)
