"""OpenCL images for TVM's texture memory scopes in the runtime plugin (``runtime.images``).

The plugin chooses its OpenCL platform once per process, so each platform (PoCL, which lacks
``cl_khr_image2d_from_buffer``, and Intel's CPU runtime, which has it; both from pip) runs the
checks in a fresh interpreter (``CODL_OPENCL_PLATFORM``, and ``CODL_OPENCL_SVM=buffer`` for
devices without SVM) that prints its results as JSON. Pixels are compared with numpy exactly;
the image sizes with TVM's flattening rule (``texture.h``: ``DefaultTextureLayoutSeparator``,
``ApplyTexture2DFlattening``), written out here on its own. Kernels: hand-written OpenCL C with
image arguments, and a TIR function with texture-scoped buffers built by TVM's Adreno texture
path. The Relax VM's texture storages reach the plugin's ``DeviceAllocator.opencl``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.opencl

REPO = Path(__file__).resolve().parent.parent
PLATFORMS = ("pocl", "intel")
# the platforms again in buffer mode (devices without SVM: images on cl_mem buffers, not SVM)
MODES = (*((p, "") for p in PLATFORMS), *((p, "buffer") for p in PLATFORMS))
_SKIP = 3  # exit status of a child whose platform is not installed

# (scope, shape): each scope, with layers, rows and pixels of different sizes
CASES = (
    ("global.texture", (2, 3, 5, 4)),
    ("global.texture", (1, 2, 3, 6, 4)),
    ("global.texture-nhwc", (2, 3, 4, 5, 4)),
    ("global.texture-weight", (3, 2, 2, 3, 4)),
    ("global.texture", (7, 4)),
)

PRELUDE = """
import json, sys
import numpy as np
import tvm
from codl_tvm import runtime
from codl_tvm.runtime import images

WANT = sys.argv[1]
try:
    runtime.load()
    PLATFORM = runtime.info().platform
except Exception as exc:  # the platform is not installed here
    print(f"{WANT}: {exc}".splitlines()[0], file=sys.stderr)
    sys.exit(3)
dev = tvm.opencl(0)
caps = images.image_caps(dev)
checks = {}
"""


def _texture_dims(shape: tuple[int, ...], scope: str) -> tuple[int, int, int]:
    """TVM's image of a texture-scope tensor: (pixels per row, rows, layers)."""
    rank = len(shape)
    sep = {"global.texture": rank - 2, "global.texture-nhwc": 2, "global.texture-weight": 1}[scope]
    width = height = depth = 1
    for i, n in enumerate(shape[:-1]):
        if sep == 0 or i < sep - 1:
            depth *= n
        elif i < sep:
            height *= n
        else:
            width *= n
    return width, height, depth


def _run(platform: str, code: str, tmp_path: Path, svm: str = "") -> dict:
    env = {
        **os.environ,
        "CODL_OPENCL_PLATFORM": platform,
        "CODL_OPENCL_SVM": svm,
        "CODL_TVM_CACHE_DIR": str(tmp_path),
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    # a file, not -c: TVMScript's parser reads the source of what it decorates
    script = tmp_path / "check_images.py"
    script.write_text(PRELUDE + f"CASES = {CASES!r}\n" + textwrap.dedent(code))
    proc = subprocess.run(
        [sys.executable, str(script), platform],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    if proc.returncode == _SKIP:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _failed(checks: dict) -> list[str]:
    return [name for name, ok in checks.items() if ok is not True]


COPIES = """
import pyopencl as cl

rng = np.random.default_rng(0)
out = {"caps": caps.__dict__, "infos": [], "svm": runtime.svm_mode()}
# the device's limits and extensions as pyopencl reports them
for p in cl.get_platforms():
    if p.name == PLATFORM:
        d = p.get_devices()[0]
        out["cl"] = {
            "image_support": bool(d.image_support),
            "image2d_max_width": d.image2d_max_width,
            "image2d_max_height": d.image2d_max_height,
            "image_max_array_size": d.image_max_array_size,
            "image2d_from_buffer": "cl_khr_image2d_from_buffer" in d.extensions,
            "fp16": "cl_khr_fp16" in d.extensions,
        }
dtypes = ["float32"] + (["float16"] if caps.supports("float16") else [])
for dtype in dtypes:
    for scope, shape in CASES:
        tag = f"{dtype} {scope} {shape}"
        x = rng.standard_normal(shape).astype(dtype)
        img = tvm.runtime.empty(shape, dtype, dev, mem_scope=scope)
        out["infos"].append([scope, list(shape), dtype, images.image_info(img).__dict__])
        checks[f"is image: {tag}"] = images.is_image(img)
        img.copyfrom(x)
        checks[f"host->image->host: {tag}"] = bool(np.array_equal(img.numpy(), x))
        buf = tvm.runtime.empty(shape, dtype, dev)
        checks[f"buffer is no image: {tag}"] = not images.is_image(buf)
        img.copyto(buf)
        checks[f"image->buffer: {tag}"] = bool(np.array_equal(buf.numpy(), x))
        img2 = tvm.runtime.empty(shape, dtype, dev, mem_scope=scope)
        tvm.runtime.tensor(-x, dev).copyto(img2)
        checks[f"buffer->image: {tag}"] = bool(np.array_equal(img2.numpy(), -x))
        img.copyto(img2)
        checks[f"image->image: {tag}"] = bool(np.array_equal(img2.numpy(), x))

        # regions, as (x pixels, y rows, z layers); the reference is the dense image
        info = images.image_info(img)
        dense = x.reshape(info.depth, info.height, info.width, 4)
        o = (info.width // 2, info.height // 2, info.depth // 2)
        r = (info.width - o[0], info.height - o[1], info.depth - o[2])
        sl = np.s_[o[2] : o[2] + r[2], o[1] : o[1] + r[1], o[0] : o[0] + r[0]]
        got = images.read_region(img, o, r)
        checks[f"read region: {tag}"] = bool(np.array_equal(got, dense[sl]))
        patch = rng.standard_normal((r[2], r[1], r[0], 4)).astype(dtype)
        images.write_region(img, o, patch)
        want = dense.copy()
        want[sl] = patch
        checks[f"write region: {tag}"] = bool(np.array_equal(img.numpy(), want.reshape(shape)))
        # image region -> buffer at an offset, and a buffer block -> image region
        flat = tvm.runtime.tensor(np.zeros(patch.size + 8, dtype), dev)
        itemsize = np.dtype(dtype).itemsize
        images.copy_region_to_buffer(img, o, r, flat, byte_offset=8 * itemsize)
        fn = flat.numpy()
        checks[f"image region->buffer: {tag}"] = bool(
            np.array_equal(fn[8:], patch.ravel()) and not fn[:8].any()
        )
        block = rng.standard_normal(patch.size + 4).astype(dtype)
        images.copy_region_from_buffer(
            img, o, r, tvm.runtime.tensor(block, dev), byte_offset=4 * itemsize
        )
        want[sl] = block[4:].reshape(patch.shape)
        checks[f"buffer->image region: {tag}"] = bool(
            np.array_equal(img.numpy(), want.reshape(shape))
        )

# many allocations and frees of images (on buffers where the device allows)
for i in range(200):
    t = images.empty((16, 32, 4), "float32", dev, image2d_array=bool(i % 2))
    del t
out["checks"] = checks
print(json.dumps(out))
"""


@pytest.fixture(scope="module", params=MODES, ids=lambda m: "-".join(filter(None, m)))
def copies(request, tmp_path_factory) -> dict:
    platform, svm = request.param
    tmp = tmp_path_factory.mktemp(f"images-{platform}")
    return _run(platform, COPIES, tmp, svm)


def test_image_caps_match_what_opencl_reports(copies, request):
    assert (copies["svm"] == "buffer") == request.node.callspec.id.endswith("buffer")
    caps, cl = copies["caps"], copies["cl"]
    for key, value in cl.items():
        assert caps[key] == value, key
    assert caps["rgba_float"]


def test_texture_tensors_are_images_of_tvms_flattening(copies):
    assert copies["infos"]
    for scope, shape, dtype, info in copies["infos"]:
        width, height, depth = _texture_dims(tuple(shape), scope)
        assert (info["width"], info["height"], info["depth"]) == (width, height, depth), shape
        assert info["scope"] == scope and info["dtype"] == dtype
        assert info["image_type"] == "image2d_array" and not info["view"]
        # an image lies on a buffer only where the device can alias one
        if info["from_buffer"]:
            assert copies["caps"]["image2d_from_buffer"]
            assert info["row_pitch"] >= width * 4 * (2 if dtype == "float16" else 4)


def test_copies_whole_and_by_region_match_numpy(copies):
    checks = copies["checks"]
    assert len(checks) >= 11 * len(CASES)
    assert _failed(checks) == []


def test_half_images_where_the_device_supports_them(copies):
    half = [k for k in copies["checks"] if ": float16 " in k]
    assert bool(half) == copies["caps"]["rgba_half"]


KERNELS = """
SRC = '''
__kernel void affine(__read_only image2d_array_t src, __write_only image2d_array_t dst,
                     float a) {
  int4 p = (int4)(get_global_id(0), get_global_id(1), get_global_id(2), 0);
  write_imagef(dst, p, read_imagef(src, p) * a + (float4)(1.0f, 2.0f, 3.0f, 4.0f));
}
__kernel void scale2d(__read_only image2d_t src, __global float4* dst, int width) {
  int x = get_global_id(0), y = get_global_id(1);
  dst[y * width + x] = read_imagef(src, (int2)(x, y)) * 3.0f;
}
'''
HALF = '''
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
__kernel void affine_h(__read_only image2d_array_t src, __write_only image2d_array_t dst) {
  int4 p = (int4)(get_global_id(0), get_global_id(1), get_global_id(2), 0);
  write_imageh(dst, p, read_imageh(src, p) * (half)2.0f + (half4)(1.0f, 2.0f, 3.0f, 4.0f));
}
'''
xyz = ["threadIdx.x", "threadIdx.y", "threadIdx.z"]
mod = runtime.opencl_module_from_source(
    SRC, {"affine": (["handle", "handle", "float32"], xyz),
          "scale2d": (["handle", "handle", "int32"], xyz[:2])}
)
out = {"caps": caps.__dict__}
rng = np.random.default_rng(1)
bias = np.array([1, 2, 3, 4], np.float32)
for scope, shape in CASES:
    x = rng.standard_normal(shape).astype("float32")
    a = tvm.runtime.empty(shape, "float32", dev, mem_scope=scope)
    b = tvm.runtime.empty(shape, "float32", dev, mem_scope=scope)
    a.copyfrom(x)
    info = images.image_info(a)
    mod["affine"](a, b, 2.0, info.width, info.height, info.depth)
    want = x * np.float32(2) + bias
    checks[f"affine {scope} {shape}"] = bool(np.array_equal(b.numpy(), want))

# an image2d (one layer): on a buffer where the device has cl_khr_image2d_from_buffer
y = rng.standard_normal((6, 10, 4)).astype("float32")
img = images.empty(y.shape, "float32", dev, "global.texture", image2d_array=False)
img.copyfrom(y)
info = images.image_info(img)
out["image2d"] = info.__dict__
dst = tvm.runtime.empty(y.shape, "float32", dev)
mod["scale2d"](img, dst, 10, 10, 6)
checks["image2d kernel"] = bool(np.array_equal(dst.numpy(), y * np.float32(3)))
if info.from_buffer:
    # the image and the buffer under it are one memory: each sees what the other wrote
    view = images.buffer_view(img)
    checks["buffer view shape"] = tuple(view.shape) == (1, 6, info.row_pitch // 16, 4)
    checks["buffer sees the image"] = bool(np.array_equal(view.numpy()[0, :, :10], y))
    padded = view.numpy()
    padded[0, :, :10] = -y
    tvm.runtime.tensor(padded, dev).copyto(view)
    checks["image sees the buffer"] = bool(np.array_equal(img.numpy(), -y))
else:
    try:
        images.buffer_view(img)
        checks["no buffer view without image2d_from_buffer"] = False
    except images.ImageError as exc:
        checks["no buffer view without image2d_from_buffer"] = "not on a buffer" in str(exc)

if caps.fp16 and caps.rgba_half:
    hmod = runtime.opencl_module_from_source(HALF, {"affine_h": (["handle", "handle"], xyz)})
    x = rng.standard_normal((2, 3, 5, 4)).astype("float16")
    a = tvm.runtime.empty(x.shape, "float16", dev, mem_scope="global.texture")
    b = tvm.runtime.empty(x.shape, "float16", dev, mem_scope="global.texture")
    a.copyfrom(x)
    hmod["affine_h"](a, b, 5, 3, 2)
    want = x * np.float16(2) + bias.astype(np.float16)
    checks["half kernel"] = bool(np.array_equal(b.numpy(), want))
out["checks"] = checks
print(json.dumps(out))
"""


@pytest.mark.parametrize(("platform", "svm"), MODES)
def test_kernels_read_and_write_images(platform, svm, tmp_path):
    out = _run(platform, KERNELS, tmp_path, svm)
    assert _failed(out["checks"]) == []
    assert out["image2d"]["image_type"] == "image2d"
    assert out["image2d"]["from_buffer"] == out["caps"]["image2d_from_buffer"]
    assert ("image sees the buffer" in out["checks"]) == out["caps"]["image2d_from_buffer"]
    assert ("half kernel" in out["checks"]) == (out["caps"]["fp16"] and out["caps"]["rgba_half"])


TVM_KERNEL = """
import tvm_ffi
from tvm.s_tir.backend.adreno import pipeline as adreno_tir
from tvm.s_tir.backend.adreno import transform as adreno_tir_transform
from tvm.tirx import compilation_pipeline


def store_type_fix():
    # TVM 0.27's TextureFlatten types image stores by the image's pointer type, and the pixel
    # loop is then scalarised (see /work/shared/TVM-0.27-NOTES.md): stores get the void type
    store = tvm.ir.Op.get("tirx.texture2d_store")

    def fix(call):
        if not call.op.same_as(store) or isinstance(call.ty, tvm.ir.PrimType):
            return call
        return tvm.ir.Call(store, list(call.args), ret_ty=tvm.ir.PrimType("void"))

    @tvm.tirx.transform.prim_func_pass(opt_level=0, name="test.TextureStoreType")
    def _fix(func, _mod, _ctx):
        body = tvm_ffi.structural_map(func.body, [(tvm.ir.Call, fix)])
        return func if body.same_as(func.body) else func.with_body(body)

    return _fix


def texture_tir_pipeline():
    @tvm.transform.module_pass(opt_level=0, name="test.TexturePipeline")
    def _pipeline(mod, _ctx):
        passes = [adreno_tir_transform.TextureFlatten(), store_type_fix(),
                  adreno_tir.default_tir_pipeline()]
        return tvm.transform.Sequential(passes)(mod)

    return (_pipeline, compilation_pipeline.finalize_host_passes,
            compilation_pipeline.finalize_device_passes)


compilation_pipeline.register_tir_pipeline("test_texture", texture_tir_pipeline)
SRC = '''
# from tvm.script import ir as I
# from tvm.script import tirx as T

@I.ir_module
class Module:
    @T.prim_func(s_tir=True)
    def main(A: T.Buffer((2, 3, 5, 4), "float32", scope="SCOPE"),
             B: T.Buffer((2, 3, 5, 4), "float32", scope="SCOPE")):
        T.func_attr({"tirx.noalias": True})
        for i0 in T.thread_binding(5, thread="blockIdx.x"):
            for i1 in T.thread_binding(6, thread="threadIdx.x"):
                for k in T.vectorized(4):
                    with T.sblock("B"):
                        n = T.axis.spatial(2, (i0 * 6 + i1) // 15)
                        c = T.axis.spatial(3, (i0 * 6 + i1) % 15 // 5)
                        w = T.axis.spatial(5, (i0 * 6 + i1) % 5)
                        v = T.axis.spatial(4, k)
                        T.reads(A[n, c, w, v])
                        T.writes(B[n, c, w, v])
                        B[n, c, w, v] = A[n, c, w, v] * T.float32(2.0) + T.float32(1.0)
'''
target = tvm.target.Target("qcom/adreno-opencl-texture", host={"kind": "llvm"})
out = {}
rng = np.random.default_rng(2)
for scope in ("global.texture", "global.texture-nhwc"):
    ex = tvm.compile(tvm.script.from_source(SRC.replace("SCOPE", scope)), target=target,
                     tir_pipeline="test_texture")
    # through a library, so the OpenCL kernels load with the plugin's module loader
    path = f"texture-{scope}.so"
    ex.export_library(path)
    lib = tvm.runtime.load_module(path)
    source = lib.imports[0].inspect_source()
    checks[f"{scope}: image parameters"] = "image2d_array_t A" in source
    x = rng.standard_normal((2, 3, 5, 4)).astype("float32")
    a = tvm.runtime.empty(x.shape, "float32", dev, mem_scope=scope)
    b = tvm.runtime.empty(x.shape, "float32", dev, mem_scope=scope)
    a.copyfrom(x)
    lib["main"](a, b)
    checks[f"{scope}: TVM kernel"] = bool(
        np.array_equal(b.numpy(), x * np.float32(2) + np.float32(1))
    )
out["checks"] = checks
print(json.dumps(out))
"""


@pytest.mark.parametrize("platform", PLATFORMS)
def test_tvm_generated_texture_kernel_runs_on_images(platform, tmp_path):
    """A TIR function whose buffers are texture-scoped, built with TVM's Adreno texture path
    (image2d_array_t parameters, read_imagef/write_imagef), runs through the plugin."""
    out = _run(platform, TVM_KERNEL, tmp_path)
    assert _failed(out["checks"]) == []
    assert len(out["checks"]) == 4


ERRORS = """
def error(fn):
    try:
        fn()
    except images.ImageError as exc:
        return str(exc)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None

w, h, n = caps.image2d_max_width, caps.image2d_max_height, caps.image_max_array_size
out = {"caps": caps.__dict__, "errors": {
    "width": error(lambda: images.empty((1, 2, w + 1, 4), "float32", dev)),
    "height": error(lambda: images.empty((1, h + 1, 1, 4), "float32", dev)),
    "layers": error(lambda: images.empty((n + 1, 1, 1, 4), "float32", dev)),
    "channels": error(lambda: images.empty((2, 3, 5), "float32", dev)),
    "dtype": error(lambda: images.empty((2, 3, 4), "int32", dev)),
    "scope": error(lambda: images.empty((2, 3, 4), "float32", dev, "global.texture-foo")),
    "layers of an image2d": error(
        lambda: images.empty((2, 3, 4, 4), "float32", dev, image2d_array=False)
    ),
    "region": error(lambda: images.read_region(
        images.empty((2, 3, 4), "float32", dev), (1, 0, 0), (3, 1, 1))),
    "not an image": error(lambda: images.image_info(tvm.runtime.empty((4,), "float32", dev))),
    "tvm.runtime.empty": error(
        lambda: tvm.runtime.empty((1, 2, w + 1, 4), "float32", dev, mem_scope="global.texture")
    ),
    "cpu view": error(lambda: runtime.cpu_view(
        tvm.runtime.empty((2, 3, 4), "float32", dev, mem_scope="global.texture"))),
}}
print(json.dumps(out))
"""


@pytest.mark.parametrize("platform", PLATFORMS)
def test_bad_images_raise_one_clear_error(platform, tmp_path):
    out = _run(platform, ERRORS, tmp_path)
    errors, caps = out["errors"], out["caps"]
    device = f"opencl(0) '{caps['device']}'"
    limits = {
        "width": ("CL_DEVICE_IMAGE2D_MAX_WIDTH", caps["image2d_max_width"], "[1, 2, "),
        "height": ("CL_DEVICE_IMAGE2D_MAX_HEIGHT", caps["image2d_max_height"], "[1, "),
        "layers": ("CL_DEVICE_IMAGE_MAX_ARRAY_SIZE", caps["image_max_array_size"], "["),
    }
    for key, (limit, value, shape) in limits.items():
        msg = errors[key]
        assert msg is not None and "\n" not in msg, key
        assert device in msg and f"{limit} = {value}" in msg and shape in msg, msg
    assert "last axis is the 4 RGBA channels" in errors["channels"]
    assert "float32 or float16" in errors["dtype"]
    assert "unknown texture memory scope 'global.texture-foo'" in errors["scope"]
    assert "an image2d has one" in errors["layers of an image2d"]
    assert "is not inside the 3 x 2 x 1 image" in errors["region"]
    assert "expects a texture-scope OpenCL tensor" in errors["not an image"]
    assert "CL_DEVICE_IMAGE2D_MAX_WIDTH" in errors["tvm.runtime.empty"]
    assert "global.texture image (copy it to a 'global' tensor)" in errors["cpu view"]
    for key, msg in errors.items():
        assert msg is not None and "\n" not in msg.strip(), key


VM = """
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

SRC = '''
__kernel void affine(__read_only image2d_array_t src, __write_only image2d_array_t dst,
                     float a) {
  int4 p = (int4)(get_global_id(0), get_global_id(1), get_global_id(2), 0);
  write_imagef(dst, p, read_imagef(src, p) * a + (float4)(1.0f, 2.0f, 3.0f, 4.0f));
}
'''
xyz = ["threadIdx.x", "threadIdx.y", "threadIdx.z"]
mod = runtime.opencl_module_from_source(SRC, {"affine": (["handle", "handle", "float32"], xyz)})
seen = []
T4 = R.Tensor((2, 3, 5, 4), "float32")


@tvm.register_global_func("test.images.affine")
def affine(x, y):
    seen.append(images.image_info(y).__dict__)
    info = images.image_info(x)
    mod["affine"](x, y, 2.0, info.width, info.height, info.depth)


# The VM's storage in a texture scope (DeviceAllocator.opencl: an image) and a tensor of the
# same scope on it (Allocator::CreateView: the storage's image), as TVM's memory planner emits
@I.ir_module
class Texture:
    @R.function(pure=False)
    def main(x: R.Tensor((2, 3, 5, 4), "float32")):
        s = R.vm.alloc_storage(
            R.shape([2, 3, 5, 4]), R.prim_value(0), R.dtype("float32"), "global.texture"
        )
        y = R.call_packed(
            "vm.builtin.alloc_tensor", s, R.prim_value(0), R.shape([2, 3, 5, 4]),
            R.dtype("float32"), R.str("global.texture"), sinfo_args=T4,
        )
        _ = R.call_packed("test.images.affine", x, y, sinfo_args=R.Tuple())
        return y


# a texture view of a buffer storage (a 'global' tensor on a texture storage never asks the
# allocator: TVM's StorageObj::AllocTensorScoped hands out the storage's data pointer)
@I.ir_module
class Mixed:
    @R.function(pure=False)
    def image_of_buffer():
        s = R.vm.alloc_storage(R.shape([4096]), R.prim_value(0), R.dtype("float32"), "global")
        y = R.call_packed(
            "vm.builtin.alloc_tensor", s, R.prim_value(0), R.shape([2, 3, 5, 4]),
            R.dtype("float32"), R.str("global.texture"), sinfo_args=T4,
        )
        return y


out = {"caps": caps.__dict__}
x = np.random.default_rng(3).standard_normal((2, 3, 5, 4)).astype("float32")
a = tvm.runtime.empty(x.shape, "float32", dev, mem_scope="global.texture")
a.copyfrom(x)


def vm_of(mod):
    ex = tvm.compile(mod, target="llvm", relax_pipeline="zero")
    return relax.VirtualMachine(ex, [dev, tvm.cpu()])



vm = vm_of(Texture)
for _ in range(2):  # a second run reuses nothing it should not
    y = vm["main"](a)
    checks[f"vm texture view {len(seen)}"] = images.is_image(y) and bool(
        np.array_equal(y.numpy(), x * np.float32(2) + np.array([1, 2, 3, 4], np.float32))
    )
out["view"] = seen[0]
vm = vm_of(Mixed)
out["errors"] = {}
for name in ("image_of_buffer",):
    try:
        vm[name]()
        out["errors"][name] = None
    except ValueError as exc:
        out["errors"][name] = str(exc).strip().splitlines()[-1]
out["checks"] = checks
print(json.dumps(out))
"""


@pytest.mark.parametrize("platform", PLATFORMS)
def test_relax_vm_texture_storage_and_views(platform, tmp_path):
    """The Relax VM's texture-scope storages and tensors go through ``DeviceAllocator.opencl``:
    the storage is an image, a tensor of the same scope on it shares that image, and views the
    device cannot make say why in one line."""
    out = _run(platform, VM, tmp_path)
    assert _failed(out["checks"]) == [] and len(out["checks"]) == 2
    assert out["view"]["view"] and out["view"]["image_type"] == "image2d_array"
    assert (out["view"]["width"], out["view"]["height"], out["view"]["depth"]) == (5, 3, 2)
    why = (
        "refuses image2d arrays on buffers"
        if out["caps"]["image2d_from_buffer"]
        else "lacks cl_khr_image2d_from_buffer"
    )
    msg = out["errors"]["image_of_buffer"]
    assert msg is not None and why in msg and "global.texture view" in msg, msg
