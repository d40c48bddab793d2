"""
Compute on the GPU in OpenCL images (CoDL's hybrid data type)
=============================================================

An OpenCL GPU can hold a tensor in a buffer (plain memory) or in an image, read through the
texture cache. On Adreno phone GPUs convolutions on images run several times faster than on
buffers, which is why CoDL lets each processor compute in its own data type: the GPU in images,
the CPU in buffers, converted where the two meet. Elsewhere buffers win: on Mali, and on NVIDIA's
OpenCL, where an H100 ran TVM's image kernels 3.6-18x slower than its buffer kernels
(docs/benchmarks.md, "Which data type should the GPU compute in?"). So the data type is a
choice made per device.

This tutorial builds the bundled small CNN for the GPU alone on images, looks at which kernels
read and write images and at the OpenCL C of one convolution, checks the result against the
buffer build, co-executes the model with the GPU's part on images, and lets the compiler choose
by timing both. It runs on the local OpenCL device (a CPU OpenCL runtime from PyPI): the
numbers show that the machinery works, not which data type a GPU prefers.
"""

# %%
# Ask the device
# --------------
# A texture build packs the channels of each convolution's and pooling's tensors four to a pixel
# (NCHW4c: one RGBA pixel holds four channels). :func:`~codl_tvm.build.texture.check_device`
# says whether every packed tensor fits the device's images (``"auto"``: images if they fit,
# else buffers and why).
import json
import re
import tempfile
from pathlib import Path

import tvm
from tvm.runtime.vm import VirtualMachine

import codl_tvm
from codl_tvm import runtime
from codl_tvm.build.runner import build, default_target, max_abs_difference
from codl_tvm.build.texture import build_texture_gpu, check_device, packed_tensors
from codl_tvm.core.plan import ChainPlan, OpPartition, PartitionPlan
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.frontend.models import bundled_model_path
from codl_tvm.runtime.images import image_caps

runtime.load()  # codl-tvm's OpenCL runtime: it allocates texture-scoped tensors as images
model = load_onnx(bundled_model_path())
caps = image_caps()
print(f"{caps.device} ({runtime.info().platform}): images up to {caps.image2d_max_width} wide")
data_type, why = check_device(model.mod, caps, "auto", "float32")
print(f"'auto' gets {data_type} here" + (f": {why}" if why else ""))
for op, shape in packed_tensors(model.mod):
    print(f"  {op:10} NCHW4c {shape}")

# %%
# Build for the GPU alone on images
# ---------------------------------
# :func:`~codl_tvm.build.texture.build_texture_gpu` runs TVM's Adreno texture phases with
# codl-tvm's fixes and schedules. Its record lists every kernel and whether it reads or writes an
# image: the convolutions (bias and ReLU fused in) and the pools compute on images; a conversion
# kernel packs the NCHW input into an image, and the classifier stays on buffers.
built = build_texture_gpu(model.mod, default_target("opencl"), caps=caps)
print("memory scopes:", built.scopes)
for name, image in built.kernels:
    print(f"  {'image ' if image else 'buffer'} {name}")
print(f"{built.image_kernels} of {len(built.kernels)} kernels on images")

# %%
# The generated kernel
# --------------------
# The executable imports an OpenCL module whose source holds every kernel;
# :meth:`~codl_tvm.build.texture.TextureBuild.kernel_source` gathers it. A convolution takes its
# input as an ``image2d_array_t``, reads one pixel (four channels) per ``read_imagef`` and writes
# four output channels per ``write_imagef``; the weights stay in a buffer.
source = built.kernel_source()
conv = next(name for name, image in built.kernels if image and "conv2d_NCHWc" in name)
body = re.search(rf"__kernel void {conv}_kernel\([^;{{]*\) {{\n.*?\n}}\n", source, re.DOTALL)
lines = [re.search(r"#define READ_IMAGEF.*", source).group(0)]  # TVM's macro over read_imagef
images = re.compile("image2d|READ_IMAGEF|write_imagef")
lines += [line for line in body.group(0).splitlines() if images.search(line)]
for line in lines[:4]:
    line = line.strip()
    print(line if len(line) <= 120 else line[:116] + " ...")

# %%
# Run it and compare with the buffer build
# ----------------------------------------
# The VM gets the OpenCL device once per memory scope (each texture scope is a VDevice).
work = Path(tempfile.mkdtemp(prefix="codl-gpu-images-"))
built.executable.export_library(str(work / "images.so"))
lib = tvm.runtime.load_module(str(work / "images.so"))
vm = VirtualMachine(lib, built.vm_devices(tvm.opencl(0)))
x = random_inputs(model, seed=0)["input"]
on_images = vm["main"](tvm.runtime.tensor(x, tvm.opencl(0))).numpy()

on_buffers = build(model.mod, "opencl")([x])
err = max_abs_difference([on_images], on_buffers)
print(f"images vs buffers: max abs difference {err:.3g}")
assert err < 1e-4

# %%
# Co-execute with the GPU's parts on images
# -----------------------------------------
# In a co-executed build only the GPU part of each split computes on images; the CPU part and the
# tensors the two share stay buffers. Where a GPU part starts, it slices its rows (halo
# included) of the shared buffer and a conversion kernel (``te_layout_transform``) packs them
# into an image; where it ends, another writes its result straight into its region of the
# shared buffer (``_inplace``), beside the CPU's (CoDL's Fig. 8). A chain stays on images from
# its first operator to its last. ``gpu_parts`` records each split's GPU data type, and why a
# part kept buffers (here an OC split whose GPU share is no whole number of pixels).
plan = PartitionPlan(
    ops=(OpPartition("conv2d_1", "OC", 0.4),),
    chains=(ChainPlan(("conv2d_4", "conv2d_5", "conv2d_6", "avg_pool2d_7"), "H", 0.5),),
)
coexec = codl_tvm.compile(model.mod, plan, gpu_data_type="image")
for part in coexec.kernel_splits["gpu_parts"]:
    print(f"  {part['split']:24} {part['data_type']:6} {part.get('why', '')}".rstrip())
chain = "conv2d_4..avg_pool2d_7"
for kernel, split, processor in coexec.kernel_splits["calls"]:
    if split == chain:
        print(f"  {processor}  {kernel}")
err = max_abs_difference(coexec([x]), on_buffers)
print(f"co-executed on images vs buffers: max abs difference {err:.3g}")
assert err < 1e-4

# %%
# Let the device choose
# ---------------------
# Which data type is faster is the device's answer, not the compiler's guess:
# ``codl-tvm compile model.onnx -o OUT/ --gpu-data-type auto`` builds both, times them on the
# device (this machine, or a board or phone through ``--tracker``), keeps the faster and records
# both timings in the manifest; a co-executed build has its plan timed both ways. Below, the
# same for the GPU alone from Python. On this machine's CPU OpenCL runtime the timings say
# nothing about a GPU: they only show the choice being made.
from codl_tvm.objectives.latency import compile_artifact  # noqa: E402
from codl_tvm.options import CompileOptions  # noqa: E402

options = CompileOptions(device="opencl", gpu_data_type="auto", reference=False)
out = compile_artifact(bundled_model_path(), work / "auto", options)
gpu = json.loads((out / "manifest.json").read_text())["gpu"]
print({k: f"{v:.2f} ms" for k, v in gpu.get("measured_ms", {}).items()}, "->", gpu["data_type"])
