"""Run a texture build's generated OpenCL kernels with pyopencl, images included.

Test support until the runtime plugin creates images for texture-scoped tensors: it walks the
scheduled ``main`` of :mod:`codl_tvm.build.texture`'s pipeline (``R.call_tir`` in order), and
for each PrimFunc launches the kernels its lowered host function launches, with the launch
sizes the host passes. Tensors in ``global.texture*`` scopes are ``image2d_array_t`` images
(RGBA float, TVM's flattening: ``texture.h``'s ``DefaultTextureLayoutSeparator``), everything
else buffers. Nothing is emulated: the kernels are TVM's generated source, run on PoCL.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyopencl as cl
import tvm
import tvm_ffi
from tvm import relax, tirx

from codl_tvm.build import texture

CALL_KERNEL = "tirx.call_ffi_kernel"


def image_dims(shape: tuple[int, ...], scope: str) -> tuple[int, int, int]:
    """(width, height, layers) of the image of a tensor whose last axis is one pixel."""
    rank = len(shape)
    axis = {"global.texture": rank - 2, "global.texture-weight": 1, "global.texture-nhwc": 2}[scope]
    width = height = depth = 1
    for i, extent in enumerate(shape[:-1]):
        if i < axis - 1:
            depth *= extent
        elif i < axis:
            height *= extent
        else:
            width *= extent
    return width, height, depth


@dataclass
class Tensor:
    shape: tuple[int, ...]
    dtype: str
    scope: str
    mem: cl.MemoryObject


@dataclass
class Launch:
    kernel: str
    args: list[str]  # buffer names of the PrimFunc
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]


def pocl_context() -> cl.Context:
    for platform in cl.get_platforms():
        for device in platform.get_devices():
            if device.image_support:
                return cl.Context([device])
    raise RuntimeError("no OpenCL device with image support")


def launches(host: tirx.PrimFunc, kernels: dict[str, tirx.PrimFunc]) -> list[Launch]:
    found: list[Launch] = []

    def visit(call):
        if not isinstance(call.op, tvm.ir.Op) or call.op.name != CALL_KERNEL:
            return
        name = str(call.args[0].value)
        tags = [str(t) for t in call.attrs.launch_params]
        values = [int(v) for v in call.args[len(call.args) - len(tags) :]]
        grid, block = [1, 1, 1], [1, 1, 1]
        for tag, value in zip(tags, values):
            kind, axis = tag.split(".")
            (grid if kind == "blockIdx" else block)["xyz".index(axis)] = value
        params = [p.name.removesuffix("_ptr") for p in kernels[name].params]
        found.append(Launch(name, params, tuple(g * b for g, b in zip(grid, block)), tuple(block)))

    tvm_ffi.structural_walk(host.body, [(tvm.ir.Call, visit)])
    return found


def _buffers(func: tirx.PrimFunc) -> dict[str, tuple[tuple[int, ...], str, str]]:
    """Shape, dtype and scope of every buffer a scheduled PrimFunc declares, by name."""
    found = {}

    def add(buf):
        found[buf.name] = (tuple(int(s) for s in buf.shape), str(buf.dtype), buf.scope())

    for param in func.params:
        add(param)

    def block(blk) -> None:
        for buf in blk.alloc_buffers:
            add(buf)

    tvm_ffi.structural_walk(func.body, [(tvm.s_tir.SBlock, block)])
    return found


class TextureRunner:
    """Runs scheduled PrimFuncs (and a texture build's ``main``) on an OpenCL device.

    ``scheduled`` holds the PrimFuncs as scheduled (buffer scopes, launch names) and, for
    :meth:`run`, ``main``; ``prims`` the same PrimFuncs ready for TVM's TIR build (global
    symbols attached).
    """

    def __init__(self, scheduled: tvm.IRModule, prims: tvm.IRModule, target: tvm.target.Target):
        self.target = target
        self.scheduled = scheduled
        tir = tirx.transform.BindTarget(target.with_host(target.host))(prims)
        with target:
            self.tir = texture.texture_tir_pipeline()[0](tir)
        self.kernels = {
            gv.name_hint: f
            for gv, f in self.tir.functions.items()
            if f.attrs is not None and "tirx.kernel_launch_params" in f.attrs
        }
        built = tvm.compile(
            prims, target=target, tir_pipeline=texture.register_texture_tir_pipeline()
        )
        # the per-kernel sources repeat the header and prototypes, which C allows
        self.source = texture.TextureBuild(built, ()).kernel_source()
        self.ctx = pocl_context()
        self.queue = cl.CommandQueue(self.ctx)
        self.program = cl.Program(self.ctx, self.source).build()

    @classmethod
    def for_model(cls, mod: tvm.IRModule, target: tvm.target.Target) -> TextureRunner:
        """``mod`` built with the texture pipeline; :meth:`run` runs its ``main``."""
        target = texture.texture_target(target)
        texture.install_texture_size_fix()
        with target:
            scheduled = mod
            for passes in (
                texture.layout_passes(),
                texture.scope_passes(target),
                texture.schedule_passes(),
            ):
                scheduled = tvm.transform.Sequential(passes)(scheduled)
        lowered = texture.texture_pipeline(target)(mod)
        prims = {gv: f for gv, f in lowered.functions.items() if isinstance(f, tirx.PrimFunc)}
        return cls(scheduled, tvm.IRModule(prims), target)

    @classmethod
    def for_primfuncs(
        cls, funcs: dict[str, tirx.PrimFunc], target: tvm.target.Target
    ) -> TextureRunner:
        """Scheduled PrimFuncs by name; :meth:`call` launches them."""
        target = texture.texture_target(target)
        prims = {name: f.with_attr("global_symbol", name) for name, f in funcs.items()}
        return cls(tvm.IRModule(funcs), tvm.IRModule(prims), target)

    def tensor(self, shape, dtype: str, scope: str, value: np.ndarray | None = None) -> Tensor:
        mf = cl.mem_flags
        if "texture" in scope:
            fmt = cl.ImageFormat(cl.channel_order.RGBA, cl.channel_type.FLOAT)
            dims = image_dims(tuple(shape), scope)
            mem = cl.create_image(self.ctx, mf.READ_WRITE, fmt, shape=dims, is_array=True)
            if value is not None:
                cl.enqueue_copy(
                    self.queue,
                    mem,
                    np.ascontiguousarray(value, dtype),
                    origin=(0, 0, 0),
                    region=dims,
                )
        else:
            nbytes = max(4, int(np.prod(shape)) * np.dtype(dtype).itemsize)
            if value is None:
                mem = cl.Buffer(self.ctx, mf.READ_WRITE, nbytes)
            else:
                host = np.ascontiguousarray(value, dtype)
                mem = cl.Buffer(self.ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host)
        return Tensor(tuple(shape), dtype, scope, mem)

    def read(self, t: Tensor) -> np.ndarray:
        out = np.empty(t.shape, t.dtype)
        if "texture" in t.scope:
            dims = image_dims(t.shape, t.scope)
            cl.enqueue_copy(self.queue, out, t.mem, origin=(0, 0, 0), region=dims)
        else:
            cl.enqueue_copy(self.queue, out, t.mem)
        self.queue.finish()
        return out

    def copy(self, src: Tensor, scope: str) -> Tensor:
        """``src`` in a new tensor of memory scope ``scope`` (image <-> buffer)."""
        dst = self.tensor(src.shape, src.dtype, scope)
        src_image, dst_image = "texture" in src.scope, "texture" in scope
        if src_image and not dst_image:
            region = image_dims(src.shape, src.scope)
            cl.enqueue_copy(self.queue, dst.mem, src.mem, offset=0, origin=(0, 0, 0), region=region)
        elif dst_image and not src_image:
            region = image_dims(dst.shape, scope)
            cl.enqueue_copy(self.queue, dst.mem, src.mem, offset=0, origin=(0, 0, 0), region=region)
        else:
            raise NotImplementedError(f"copy {src.scope} -> {scope}")
        return dst

    def call(self, name: str, args: list[Tensor]) -> None:
        """Launch PrimFunc ``name``'s kernels; ``args`` are its parameters, output last."""
        func = self.scheduled[name]
        buffers = _buffers(func)
        named = {p.name: t for p, t in zip(func.params, args)}
        for buf, (shape, dtype, scope) in buffers.items():
            if buf not in named:  # intermediates the kernels exchange (a padded input)
                named[buf] = self.tensor(shape, dtype, scope)
        for launch in launches(self.tir[name], self.kernels):
            kernel = cl.Kernel(self.program, launch.kernel)
            kernel(
                self.queue,
                launch.global_size,
                launch.local_size,
                *[named[a].mem for a in launch.args],
            )

    def run(self, *inputs: np.ndarray) -> np.ndarray:
        """``main`` of the scheduled module on ``inputs`` (NCHW numpy arrays)."""
        main = self.scheduled["main"]
        env: dict[relax.Var, Tensor] = {}
        for param, value in zip(main.params, inputs):
            env[param] = self.tensor(value.shape, str(value.dtype), "global", value)
        for block in main.body.blocks:
            for binding in block.bindings:
                env[binding.var] = self._binding(binding, env)
        self.env = env  # every binding's tensor, for tests of intermediate kernels
        return self.read(env[main.body.body])

    def _binding(self, binding: relax.VarBinding, env) -> Tensor:
        value = binding.value
        if isinstance(value, relax.Var):
            return env[value]
        if isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.to_vdevice":
            # what the VM's to_device does between an image and a buffer: a copy of the same
            # NCHW4c bytes (rows of pixels)
            return self.copy(env[value.args[0]], str(value.attrs.dst_vdevice.memory_scope))
        if not (isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.call_tir"):
            raise NotImplementedError(f"binding {binding.var.name}: {value.op}")
        gv, args = value.args[0], value.args[1].fields
        func = self.scheduled[gv]
        params = list(func.params)
        tensors = []
        for arg, buf in zip(args, params):
            if isinstance(arg, tvm.ir.Constant):
                data = arg.value.numpy()
                tensors.append(self.tensor(data.shape, str(data.dtype), buf.scope(), data))
            else:
                tensors.append(env[arg])
        out_buf = params[-1]
        out = self.tensor(tuple(int(s) for s in out_buf.shape), str(out_buf.dtype), out_buf.scope())
        self.call(gv.name_hint, [*tensors, out])
        return out
