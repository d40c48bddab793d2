"""codl.Conv2DWinograd: rewrite qualifying conv2d operators as Winograd or channel-packed convs.

Preconditions
-------------
- Runs on Relax, **before LegalizeOps** (it replaces ``relax.nn.conv2d`` calls), and, in the
  co-execution pipeline, **after** :class:`~codl_tvm.passes.partition.PartitionOperators`: H
  parts (with their halo rows and own padding) and OC parts (with their sliced constant weights)
  are ordinary convs by then and are rewritten like any other.
- ``main`` is in normal form with static shapes.

What it does
------------
Each ``relax.nn.conv2d`` binding with NCHW/OIHW/NCHW layouts, float32 data and result, a
constant (``tvm.ir.Constant``) weight, and for which
:func:`~codl_tvm.schedules.winograd.winograd_reason` returns None under the configuration of the
processor that will run it, becomes one ``call_tir`` of
:func:`~codl_tvm.schedules.winograd.winograd_conv2d` reading the data and a new constant, the
weight transformed at compile time (``G g G^T``, so no per-call cost). The binding keeps its
variable name, so the ``"codl_parts"`` record of a partitioned ``main`` stays valid and
:class:`~codl_tvm.passes.place.PlaceParts` places the kernel with its part.

A conv that Winograd does not take, on a CPU whose config enables packed convs
(:func:`~codl_tvm.schedules.packed.packed_reason`), becomes one ``call_tir`` of
:func:`~codl_tvm.schedules.packed.packed_conv2d` reading the weight packed at compile time
(``[O / L, I, KH, KW, L]``, :func:`~codl_tvm.schedules.packed.pack_weight`). Everything else
is left unchanged.

Which configuration applies: bindings of a CPU part (``"codl_parts"``) use the CPU target's
config; GPU parts and every operator outside a split use the main target's (that is where
``PlaceParts`` puts them). Explicit ``cpu`` / ``opencl`` configs override the presets of the
targets. After the pass ran, ``decisions`` maps each conv binding's name to
``"winograd"``, ``"packed"`` or to the reason it was left alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import tvm
from codl_tvm.schedules.analysis import Conv2DInfo
from codl_tvm.schedules.config import CPUConfig, OpenCLConfig
from codl_tvm.schedules.packed import (
    pack_weight,
    packed_blocks,
    packed_conv2d,
    packed_nhwc,
    packed_reason,
)
from codl_tvm.schedules.settings import (
    ScheduleSettings,
    cpu_config,
    current_settings,
    opencl_config,
)
from codl_tvm.schedules.winograd import (
    conv2d_shape_info,
    transform_weight,
    winograd_conv2d,
    winograd_reason,
)
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from codl_tvm.core.plan import static_shape

from .parts import collect_parts

__all__ = ["Conv2DWinograd", "ConvRewrite", "conv2d_rewrite"]

_CONV2D = tvm.ir.Op.get("relax.nn.conv2d")


@dataclass(frozen=True)
class ConvRewrite:
    """How a conv is rewritten: ``compute(data, transform(weight), **attrs)`` (a TE function
    for ``call_te``), the transformed weight of shape ``weight_shape``."""

    algorithm: str  # "winograd" or "packed"
    compute: Callable
    transform: Callable
    weight_shape: tuple[int, ...]
    attrs: dict = field(default_factory=dict)


def conv2d_rewrite(
    info: Conv2DInfo, config: CPUConfig | OpenCLConfig, padding: Sequence[int]
) -> ConvRewrite | str:
    """The Winograd or packed conv a conv becomes under ``config``, or why it stays as it is.

    The one selection the pass and the profiler (``codl-tvm profile --winograd/--packed``)
    share. ``padding`` is ``(top, left, bottom, right)``; the weight must be a constant.
    """
    reason = winograd_reason(info, config)
    if reason is None:
        tile = config.winograd_tile
        a = tile + info.kernel_h - 1
        return ConvRewrite(
            "winograd",
            winograd_conv2d,
            lambda w: transform_weight(w, tile),
            (a, a, info.in_channels, info.out_channels),
            {"padding": tuple(padding), "tile": tile},
        )
    if not (isinstance(config, CPUConfig) and config.conv_packed):
        return reason
    why_not = packed_reason(info, config)
    if why_not is not None:
        return f"{reason}; not packed: {why_not}"
    lanes = config.lanes(info.dtype_bits)
    blocks = packed_blocks(info.out_channels, lanes, config)
    return ConvRewrite(
        "packed",
        packed_conv2d,
        lambda w: pack_weight(w, lanes, blocks),
        (blocks, info.in_channels, info.kernel_h, info.kernel_w, lanes),
        {
            "strides": (info.stride_h, info.stride_w),
            "padding": tuple(padding),
            "dilation": (info.dilation_h, info.dilation_w),
            "out_channels": info.out_channels,
            "nhwc_input": packed_nhwc(info, config),
        },
    )


@mutator
class _Rewriter(PyExprMutator):
    """Re-emits ``main`` with the selected conv2d bindings replaced by Winograd/packed calls."""

    def __init__(self, mod: tvm.IRModule, configs: dict[str, CPUConfig | OpenCLConfig], where):
        super().__init__(mod)
        self._configs = configs
        self._where = where
        self.decisions: dict[str, str] = {}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        if not (isinstance(value, relax.Call) and value.op.same_as(_CONV2D)):
            super().visit_var_binding_(binding)
            return
        name = binding.var.name
        config = self._configs[self._where.get(name, "default")]
        algorithm, call = self._rewrite(value, config)
        if call is None:
            self.decisions[name] = algorithm
            super().visit_var_binding_(binding)
            return
        self.decisions[name] = algorithm
        if isinstance(binding.var, relax.DataflowVar):
            new_var = self.builder_.emit(call, name_hint=name)
        else:
            new_var = self.builder_.emit_output(call, name_hint=name)
        self.set_var_remap(binding.var, new_var)

    def _rewrite(self, call: relax.Call, config) -> tuple[str, relax.Expr | None]:
        """``(algorithm, new call)``, or ``(reason, None)`` when the conv stays as it is."""
        a = call.attrs
        layouts = (str(a.data_layout), str(a.kernel_layout), str(a.out_layout or a.data_layout))
        if layouts != ("NCHW", "OIHW", "NCHW"):
            return f"layouts {layouts}, Winograd and packed convs need NCHW/OIHW", None
        data, weight = call.args
        if not isinstance(weight, tvm.ir.Constant):
            return "weight is not a constant", None
        dshape, wshape = static_shape(data), static_shape(weight)
        if dshape is None or wshape is None or len(dshape) != 4 or len(wshape) != 4:
            return "dynamic or non-4-D shapes", None
        dtypes = {str(data.ty.dtype), str(weight.ty.dtype), str(call.ty.dtype)}
        if dtypes != {"float32"}:
            return f"dtypes {sorted(dtypes)}, Winograd and packed convs are float32 only", None
        padding = [int(p) for p in a.padding]
        info = conv2d_shape_info(
            dshape,
            wshape,
            [int(s) for s in a.strides],
            padding,
            [int(d) for d in a.dilation],
            int(a.groups),
        )
        rewrite = conv2d_rewrite(info, config, padding)
        if isinstance(rewrite, str):
            return rewrite, None
        transformed = relax.const(rewrite.transform(weight.value.numpy()), "float32")
        return rewrite.algorithm, self.builder_.call_te(
            rewrite.compute,
            self.visit_expr(data),
            transformed,
            **rewrite.attrs,
            primfunc_name_hint=f"conv2d_{rewrite.algorithm}",
        )


def _config_of(target: tvm.target.Target, settings: ScheduleSettings) -> CPUConfig | OpenCLConfig:
    kind = target.kind.name
    if kind == "llvm":
        return cpu_config(target, settings)
    if kind == "opencl":
        return opencl_config(target, settings)
    raise ValueError(f"codl.Conv2DWinograd supports llvm and opencl targets, not {kind!r}")


def _host(target: tvm.target.Target) -> tvm.target.Target:
    host = target.host
    return host if host is not None else tvm.target.Target({"kind": "llvm"})


@tvm.transform.module_pass(opt_level=0, name="codl.Conv2DWinograd")
class Conv2DWinograd:
    """Rewrite qualifying convs as Winograd or packed convolutions (see the module docstring).

    Parameters
    ----------
    target : Target
        The build target: where unsplit operators and GPU parts run (``llvm`` or ``opencl``).
    cpu_target : Target | None
        The CPU target of a co-executed build (CPU parts); default: ``target`` when it is an
        llvm target (a build with no CPU parts needs none).
    cpu, opencl : CPUConfig | OpenCLConfig | None
        Configs replacing the presets of the targets (e.g. to force Winograd or packed convs
        on or off).
    settings : ScheduleSettings | None
        The build's schedule switches (which presets use Winograd or packed convs); None:
        :func:`~codl_tvm.schedules.settings.current_settings`, read once here.
    """

    def __init__(
        self,
        target: tvm.target.Target,
        cpu_target: tvm.target.Target | None = None,
        cpu: CPUConfig | None = None,
        opencl: OpenCLConfig | None = None,
        settings: ScheduleSettings | None = None,
    ) -> None:
        self.target = target
        self.settings = current_settings() if settings is None else settings
        if cpu_target is None:  # one processor: no CPU parts; the host stands in
            cpu_target = target if target.kind.name == "llvm" else _host(target)
        self.cpu_target = cpu_target
        self.cpu = cpu
        self.opencl = opencl
        if self.cpu_target.kind.name != "llvm":
            raise ValueError(
                f"codl.Conv2DWinograd: cpu_target must be an llvm target, not "
                f"{self.cpu_target.kind.name!r}"
            )
        self._configs = {"default": self._config(target), "cpu": self._config(self.cpu_target)}
        self._configs["gpu"] = self._configs["default"]
        self.decisions: dict[str, str] = {}

    def _config(self, target: tvm.target.Target) -> CPUConfig | OpenCLConfig:
        if target.kind.name == "llvm" and self.cpu is not None:
            return self.cpu
        if target.kind.name == "opencl" and self.opencl is not None:
            return self.opencl
        return _config_of(target, self.settings)

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
            return mod
        where = {
            var.name: part.processor.value
            for split in collect_parts(mod)
            for part in split.parts
            for var in part.bindings
        }
        rewriter = _Rewriter(mod, self._configs, where)
        main_gv = mod.get_global_var("main")
        new_main = rewriter.visit_expr(mod["main"])
        self.decisions = dict(rewriter.decisions)
        if not {"winograd", "packed"} & set(self.decisions.values()):
            return mod
        rewriter.builder_.update_func(main_gv, new_main)
        return rewriter.builder_.get()
