"""Options of the library calls behind the commands, one frozen dataclass per call.

``codl-tvm compile`` has some twenty flags; :class:`CompileOptions` carries them to
:func:`codl_tvm.objectives.latency.compile_artifact` as one value (the CLI builds it from its
arguments, scripts and tutorials build and reuse it). Each options class checks itself when it is
made: its errors (:class:`OptionsError`) name its fields, which the CLI maps to its flags.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from codl_tvm.build.targets import get_preset
from codl_tvm.core.errors import ArtifactError, PlannerError
from codl_tvm.core.plan import PartitionPlan
from codl_tvm.planner import ALL_MODES, PlannerConfig
from codl_tvm.runtime.artifact import DEVICES
from codl_tvm.runtime.weights import PLACEMENTS

__all__ = ["GPU_DATA_TYPES", "GPU_DTYPES", "CompileOptions", "OptionsError"]

#: Where a GPU-alone build keeps its tensors: buffers, OpenCL images, or images where the device
#: can hold them (``CompileOptions.gpu_data_type`` None: the cost model's profile decides).
GPU_DATA_TYPES = ("buffer", "image", "auto")

#: The GPU tensors' type of a GPU-alone build.
GPU_DTYPES = ("float32", "float16")


class OptionsError(ArtifactError):
    """Options that do not go together, or a value out of range.

    Attributes
    ----------
    fields
        The options fields the message names (a command line names its flags for them
        instead).
    """

    def __init__(self, message: str, fields: tuple[str, ...]) -> None:
        super().__init__(message)
        self.fields = fields


@dataclass(frozen=True)
class CompileOptions:
    """How :func:`~codl_tvm.objectives.latency.compile_artifact` plans and builds an artifact.

    Checked when made (:class:`OptionsError` names the fields at fault): the values are
    normalised (``verify_modes`` a tuple, ``processor_scale`` and ``weight_gbps`` float pairs,
    ``build_cache`` a path).

    Attributes
    ----------
    device
        ``coexec`` (GPU + CPU), ``cpu`` or ``opencl``.
    mode
        Planner mode (``codl_tvm.planner.ALL_MODES``: CoDL's, a placement mode such as
        ``hope``, or ``auto``) when ``plan`` is not given.
    cost_model
        Cost-model file for the planner; default: the shipped model for ``preset``.
    plan
        A :class:`~codl_tvm.core.plan.PartitionPlan` to use instead of planning.
    preset
        Target preset (``codl_tvm.build.targets``); default ``opencl`` (this machine's OpenCL
        device and CPU).
    reference
        Store seeded inputs and the unpartitioned host-CPU outputs for ``run`` to check.
    seed
        Seed of the reference inputs.
    force
        Replace an earlier artifact in the output directory.
    winograd
        True: build qualifying 3x3 stride-1 convs as Winograd convs on both processors
        (:func:`codl_tvm.schedules.winograd_enabled` for every preset). False: never.
        None (default): only builds for the CPU alone (``device="cpu"``, a planner fallback to
        the CPU, ``verify``'s CPU candidate) on the CPU presets where Winograd measured faster
        on whole models (``codl_tvm.schedules`` ``WINOGRAD_CPU_ALONE``).
    packed
        True: build qualifying CPU convs as channel-packed convs
        (:mod:`codl_tvm.schedules.packed`), co-executed CPU parts included. False: never.
        None (default): only builds for the CPU alone, on the CPU presets of
        ``PACKED_CPU_ALONE`` (co-executed parts keep the kernels the cost model was fitted on).
    measure
        Decide on measured whole-model latencies (``device="coexec"`` with a planned plan):
        build the plan co-executed and the model for each processor alone, time the three on
        the target (this machine, or the device behind ``tracker``) for
        :data:`~codl_tvm.objectives.measure.MEASURE_ROUNDS` rounds and keep the fastest, so the
        artifact is never slower than the best single processor the run could see, whatever the
        cost model predicted (it may describe another machine, or operators it never saw).
        Where the target cannot be reached (a preset that cross-compiles, no OpenCL device, a
        CPU without the preset's instruction set), the compile says so and the choice stays
        the cost model's, recorded as unchecked (``manifest["plan"]["unchecked"]``). False:
        never measure (cross-compiling without a device). ``verify`` > 0 measures as asked
        instead.
    verify
        Rounds of timing (``device="coexec"``): build the plan co-executed and the model for
        each processor alone, time the builds on this machine round-robin and keep the
        fastest, whatever the cost model predicted. The cost model cannot see everything that
        co-execution costs (contention for memory bandwidth, synchronisation, kernels outside
        the plan), so this is what guarantees that an artifact is never slower than the best
        single processor, at the price of two more builds and a few seconds of runs. Where the
        two processors' measured latencies missed their predictions by different factors (more
        than :data:`~codl_tvm.planner.policy.CALIBRATION_MIN_SHIFT` apart), the plan of
        ``mode`` is re-made with each processor's predictions scaled by its ``measured /
        predicted`` ratio and, if it differs from the plans timed, joins a second timing of
        every build (``manifest["plan"]["calibration"]``; off with ``verify_calibrate=False``).
        0: no timing.
    verify_modes
        With ``verify``: more planner modes (e.g. ``codl_no_chain``, ``h_only``) whose plans
        join the timed candidates when they differ from ``mode``'s. The cost model cannot rank
        plans whose predicted latencies are within its error, so the measurement picks among
        them; the artifact's plan files are the chosen plan's.
    tracker, key
        With ``verify``: time the builds on a device of ``key`` behind this TVM RPC tracker
        (``HOST:PORT``) instead of this machine; the way to verify for a phone or board
        (presets that cross-compile need it).
    build_cache
        A directory of exported libraries to reuse: a library whose model file, processor set,
        plan, targets, Winograd setting and codl-tvm/TVM code match one built before is copied
        from it instead of built again, and every library built is stored there. ``verify``
        then builds only what no earlier compile built.
    coexec_cpu_alone
        With ``device="coexec"``: every CPU function of the co-executed build gets the kernels
        of the builds for the CPU alone (their Winograd and packed convs and
        ``CPU_ALONE_SETTINGS``). None (default): on when the planner's cost model was fitted
        with a dataset of those kernels (its ``meta["cpu_alone_settings"]``), so the planner
        predicts the kernels the build makes; off with a given plan.
    verify_calibrate
        With ``verify``: re-plan with predictions calibrated to the measured single-processor
        latencies and time those plans too.
    split_channel_blocks
        With ``device="coexec"``: an InstanceNorm-like block (statistics over the spatial axes,
        then per-channel elementwise ops) that reads a split's output is split along channels
        at the plan's ``block_ratio``, so both processors normalise instead of one while the
        other waits (FST on the emulated SoC: 0.86-0.96x the latency). False keeps such blocks
        whole on one processor.
    split_row_blocks
        With ``device="coexec"``: a row-local block that reads an H split's output (LRN:
        channel pads and slices and elementwise ops) is split along rows at that split's
        ratio. False (the default) keeps such blocks whole on one processor: AlexNet at
        k = 12 measured 1.04-1.07x slower split (see docs/benchmarks.md).
    issue_ahead
        With ``device="coexec"``: each GPU kernel is enqueued as early as its inputs allow
        (:class:`codl_tvm.passes.issue_ahead.IssueGpuAhead`), not when the VM reaches it
        between CPU kernels. False keeps ``main``'s order (the A/B of the GPU issue order).
    refine
        With ``verify`` (on this machine): after the first timing, take ``refine_traces``
        timelines of the fastest co-executed build, balance each split from them
        (:func:`codl_tvm.planner.split.refine.refine_plan`) and build the result as candidate
        ``coexec:refined``; ``refine`` > 1 refines that one again (``coexec:refined2``, ...).
        Every build is then timed again and the fastest kept, so a refinement that does not
        pay is never chosen (``manifest["plan"]["refine"]``).
    refine_traces
        Timelines per refinement round.
    weight_gbps
        ``(cpu, gpu)`` in-model weight-streaming rates, GB/s: the planner predicts every part
        no faster than its weights' bytes over its processor's rate
        (:attr:`~codl_tvm.planner.PlannerConfig.weight_gbps`). None: off.
    processor_scale
        ``(cpu, gpu)`` factors on the cost model's predicted compute latencies
        (:attr:`~codl_tvm.planner.PlannerConfig.processor_scale`): planning for a device whose
        processors have other core counts than the profiled pair. ``verify``'s calibration
        applies on top.
    weights
        ``"embedded"``: every weight is a constant of ``model.so``. ``"beside"``: the large
        ones are in ``weights.bin`` beside it, read on a thread while the first inference
        runs, each awaited before its first use (:mod:`codl_tvm.runtime.weights`). ``verify``
        times embedded builds; the chosen one is built again with its weights beside.
    gpu_data_type
        None (default): the data type the cost model's profile chose for the device the compile
        builds for (its ``meta["gpu_data_type"]``, ``codl-tvm profile --data-type``; images
        where the model's tensors fit them, ``manifest["gpu"]["source"]`` ``"profile"``), for
        the GPU alone and the GPU parts of co-executed builds; buffers where the cost model has
        no profile or one of another device (a note says so,
        :func:`codl_tvm.objectives.gpu_data.prepare_gpu_data`). A build for the GPU alone
        (``device="opencl"``): its tensors in buffers (``"buffer"``) or, for the operators
        the texture layout covers (convs, pools, elementwise
        ops), in OpenCL images (``"image"``, :func:`codl_tvm.build.texture.build_texture_gpu`,
        CoDL's GPU data type); a device without images, or whose images cannot hold the model's
        tensors, is an error (:class:`~codl_tvm.core.errors.DeviceSupportError`). ``"auto"``:
        where this machine runs the preset, or on the device behind ``tracker``, the buffer
        build and (where the device can hold them) the image build are timed
        (``MEASURE_ROUNDS`` rounds, or ``verify``'s) and the faster kept
        (``manifest["gpu"]["measured_ms"]``); with ``measure=False`` or a preset that
        cross-compiles without ``tracker``, images where the device can hold them, else
        buffers, recorded as ``unchecked``. A co-executed build (``device="coexec"``) with
        ``"image"`` computes its GPU parts on images where covered, the CPU parts on buffers
        (:mod:`codl_tvm.build.texture_coexec`); ``"auto"`` there, where the compile measures,
        builds the plan both ways and times them beside each processor alone
        (:mod:`codl_tvm.objectives.gpu_data`), else images where the device has them
        (``unchecked``). With images possible, the planner cuts OC splits at whole RGBA
        pixels where that costs little (``PlannerConfig.gpu_channels``).
    gpu_dtype
        A build for the GPU alone: ``"float32"`` (default) or ``"float16"`` GPU tensors (TVM's
        mixed precision, convs accumulating in half; inputs and outputs stay float32). Needs
        ``cl_khr_fp16`` on a device of this machine.
    tune_budget_s
        Seconds to spend measuring, on this machine (or the device behind ``tracker``), the
        operators the cost model flags as outside its data (``device="coexec"``, planned):
        whole on each processor and split at a few GPU shares, the most expensive first
        (:func:`codl_tvm.objectives.tune.tune_operators`); the planner then plans them on the
        measurements (recorded in the manifest's ``"tune"``). Resumable: the measurements are kept
        in ``tune/`` of ``build_cache`` (else of the user's cache directory) and a later compile
        measures only what is missing. None: no tuning.
    """

    device: str = "coexec"
    mode: str = "codl"
    cost_model: str | Path | None = None
    plan: PartitionPlan | None = None
    preset: str | None = None
    reference: bool = True
    seed: int = 0
    force: bool = False
    winograd: bool | None = None
    packed: bool | None = None
    measure: bool = True
    verify: int = 0
    verify_modes: tuple[str, ...] = ()
    tracker: str | None = None
    key: str | None = None
    build_cache: str | Path | None = None
    coexec_cpu_alone: bool | None = None
    verify_calibrate: bool = True
    split_channel_blocks: bool = True
    split_row_blocks: bool = False
    issue_ahead: bool = True
    refine: int = 0
    refine_traces: int = 5
    weight_gbps: tuple[float, float] | None = None
    processor_scale: tuple[float, float] = (1.0, 1.0)
    weights: str = "embedded"
    split_margin: str = "novel"
    gpu_data_type: str | None = None
    gpu_dtype: str = "float32"
    tune_budget_s: float | None = None

    def __post_init__(self) -> None:
        self._check_values()
        self._check_verify()

    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)  # normalising a frozen instance once, when made

    def _check_values(self) -> None:
        """Each field on its own."""
        if self.device not in DEVICES:
            raise OptionsError(f"device {self.device!r} is not one of {DEVICES}", ("device",))
        try:  # the planner's own check, before anything is built
            PlannerConfig(split_margin=self.split_margin)
        except PlannerError as exc:
            raise OptionsError(str(exc).removeprefix("planner: "), ("split_margin",)) from None
        if self.weight_gbps is not None:
            try:  # the planner's own check, before anything is built
                self._set("weight_gbps", PlannerConfig(weight_gbps=self.weight_gbps).weight_gbps)
            except PlannerError as exc:
                raise OptionsError(str(exc).removeprefix("planner: "), ("weight_gbps",)) from None
        try:
            scale = tuple(self.processor_scale)
        except TypeError:  # not a pair at all
            scale = (self.processor_scale,)
        if len(scale) != 2 or not all(
            isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in scale
        ):
            raise OptionsError(
                f"processor_scale must be two positive factors (cpu, gpu), got {scale!r}",
                ("processor_scale",),
            )
        self._set("processor_scale", (float(scale[0]), float(scale[1])))
        if self.weights not in PLACEMENTS:
            raise OptionsError(
                f"weights {self.weights!r} is not one of {', '.join(PLACEMENTS)}", ("weights",)
            )
        for name, allowed in (("gpu_data_type", GPU_DATA_TYPES), ("gpu_dtype", GPU_DTYPES)):
            value = getattr(self, name)
            if value not in allowed and not (name == "gpu_data_type" and value is None):
                raise OptionsError(
                    f"{name} {getattr(self, name)!r} is not one of {', '.join(allowed)}", (name,)
                )
        for name, least in (("verify", 0), ("refine", 0), ("refine_traces", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                what = "a number of rounds" if name == "verify" else "a whole number"
                raise OptionsError(f"{name} must be {what} >= {least}, got {value!r}", (name,))
        self._set("verify_modes", tuple(self.verify_modes))
        bad = [m for m in self.verify_modes if m not in ALL_MODES]
        if bad:
            raise OptionsError(
                f"verify_modes: {', '.join(map(repr, bad))} not among the planner modes "
                f"{', '.join(ALL_MODES)}",
                ("verify_modes",),
            )
        if self.build_cache is not None:
            self._set("build_cache", Path(self.build_cache))
        t = self.tune_budget_s
        if t is not None and not (
            isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < math.inf
        ):
            raise OptionsError(
                f"tune_budget_s must be a time budget in seconds > 0, got {t!r}", ("tune_budget_s",)
            )

    def _check_verify(self) -> None:
        """The fields that only mean something together."""
        if (self.tracker is None) != (self.key is None):
            raise OptionsError(
                "tracker and key go together (an RPC tracker's HOST:PORT and a device key): "
                "give both or neither",
                ("tracker", "key"),
            )
        needs_verify = (
            ("tracker", "only measuring times builds on the tracker's device"),
            ("refine", "refined plans are candidates for verify to time"),
            ("verify_modes", "their plans are candidates for verify to time"),
        )
        for name, why in needs_verify:
            # the default measurement times on the tracker's device too
            if name == "tracker" and self.measure:
                continue
            if getattr(self, name) and not self.verify:
                raise OptionsError(f"{name} needs verify > 0 ({why})", (name, "verify"))
        if self.refine and self.tracker is not None:
            raise OptionsError(
                "refine takes timelines on this machine; it cannot be combined with tracker",
                ("refine", "tracker"),
            )
        if self.refine and self.device != "coexec":
            raise OptionsError(
                f"refine balances co-executed splits; device is {self.device!r}",
                ("refine", "device"),
            )
        if self.coexec_cpu_alone and self.device != "coexec":
            raise OptionsError(
                f"coexec_cpu_alone applies to device 'coexec', not {self.device!r} (builds for "
                "the CPU alone use those kernels already)",
                ("coexec_cpu_alone", "device"),
            )
        gpu = self.gpu_data_type not in (None, "buffer") or self.gpu_dtype != "float32"
        if gpu and self.device == "cpu":
            raise OptionsError(
                "gpu_data_type and gpu_dtype describe GPU builds; device is 'cpu'",
                ("gpu_data_type", "gpu_dtype", "device"),
            )
        if self.tune_budget_s is not None:
            self._check_tune()
        if self.verify_modes and self.plan is not None:
            raise OptionsError(
                "verify_modes plans with the cost model; it cannot be combined with a given plan",
                ("verify_modes", "plan"),
            )

    def _check_tune(self) -> None:
        """``tune_budget_s`` times operator parts on this machine (or the tracker's device) for
        the planner."""
        preset = get_preset(self.preset or "opencl")
        cross = f"preset {preset.name!r} cross-compiles (give tracker and key to tune there)"
        for name, bad, why in (
            ("preset", preset.is_cross and self.tracker is None, cross),
            ("device", self.device != "coexec", f"device is {self.device!r}, not 'coexec'"),
            ("plan", self.plan is not None, "a plan is given, the planner does not run"),
            ("measure", not self.measure, "measuring is switched off (measure=False)"),
        ):
            if bad:
                raise OptionsError(
                    f"tune_budget_s times the planner's operators on this machine, but {why}",
                    ("tune_budget_s", name),
                )

    @property
    def remote(self) -> tuple[str, str] | None:
        """``(tracker, key)`` where ``verify`` times on a device through RPC, else None."""
        return None if self.tracker is None else (self.tracker, self.key)
