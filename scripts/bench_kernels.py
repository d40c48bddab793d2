"""Per-kernel benchmark of codl-tvm's schedules against onnxruntime (and cuDNN for OpenCL).

Operators: CoDL's conv shapes (each conv2d + bias + relu, as the ONNX frontend emits them), the
64x112x112 conv of ResNet-like stems, a strided and a depthwise conv, a max pool and a dense layer.
Compile here (full TVM), run on the device machine (runtime-only TVM; ``out/`` is git-ignored,
so it can be carried):

    python scripts/bench_kernels.py --compile-dir out/kernels [--mcpu skylake-avx512] \
        [--opencl-devices nvidia,pocl] [--cpu-variants 'oc8:conv_oc_tile=8,conv_oh_tile=1']
    # on the device machine (carry .whl and out/kernels; PYTHONPATH=/tmp/site:$PWD):
    python scripts/bench_kernels.py --run-dir out/kernels --threads 8 --cpus 0-7 \
        [--opencl-platform nvidia --opencl-config nvidia --torch] --out kernels.json
    POCL_CPU_MAX_CU_COUNT=8 python scripts/bench_kernels.py --run-dir out/kernels \
        --threads 8 --cpus 0-7 --opencl-platform portable --opencl-config pocl --out pocl.json

``--compile-dir`` writes one library per (operator, target) and ``manifest.json`` (shapes, the
``codl.*`` attributes of every scheduled kernel: algorithm, preset, parallel extent, vector width,
workgroup size and count) and copies the OpenCL plugin built here (``CODL_TVM_PLUGIN_LIB`` points
at it there). ``--cpu-variants`` adds CPU builds with :class:`CPUConfig` overrides (a small
sweep, one library each, reported as ``tvm-cpu@NAME``). ``--run-dir`` loads the libraries with
``tvm.runtime.load_module``, checks each output against onnxruntime, times onnxruntime for every
operator first (host clock, same thread count and CPU affinity) and TVM afterwards
(``time_evaluator``), since both runtimes' worker threads spin after a call and would steal each
other's cores if interleaved; optionally PyTorch/cuDNN on CUDA (CUDA events around each call, so
launch latency is included for small kernels, unlike TVM's batched ``time_evaluator``). One
OpenCL platform per process. ``TVM_NUM_THREADS`` is set from ``--threads`` before TVM starts
its thread pool. Weights are generated from a seed on both sides. The JSON holds the command,
commit and machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

SEED = 2022

# name -> (kind, params). conv: (C, H, W, OC, K, stride, pad, groups)
OPS: dict[str, tuple[str, tuple]] = {
    "conv_104x104x64_128_3x3": ("conv", (64, 104, 104, 128, 3, 1, 1, 1)),
    "conv_13x13x1024_1024_3x3": ("conv", (1024, 13, 13, 1024, 3, 1, 1, 1)),
    # ResNet50's last two stages: deep, small maps (split-K on big GPUs)
    "conv_14x14x256_256_3x3": ("conv", (256, 14, 14, 256, 3, 1, 1, 1)),
    "conv_7x7x512_512_3x3": ("conv", (512, 7, 7, 512, 3, 1, 1, 1)),
    "conv_112x112x32_64_3x3": ("conv", (32, 112, 112, 64, 3, 1, 1, 1)),
    "conv_52x52x256_128_1x1": ("conv", (256, 52, 52, 128, 1, 1, 0, 1)),
    # ResNet50's 14x14 pointwise convs (a flattened image of 196 pixels: register tiles of
    # 8 pixels leave a tail) and SqueezeNet's 13x13 expand conv (169, prime factors only)
    "conv_14x14x256_1024_1x1": ("conv", (256, 14, 14, 1024, 1, 1, 0, 1)),
    "conv_14x14x1024_256_1x1": ("conv", (1024, 14, 14, 256, 1, 1, 0, 1)),
    "conv_13x13x64_256_1x1": ("conv", (64, 13, 13, 256, 1, 1, 0, 1)),
    "conv_56x56x64_64_3x3": ("conv", (64, 56, 56, 64, 3, 1, 1, 1)),
    "conv_112x112x64_64_3x3": ("conv", (64, 112, 112, 64, 3, 1, 1, 1)),
    "conv_112x112x64_64_3x3_s2": ("conv", (64, 112, 112, 64, 3, 2, 1, 1)),
    "dwconv_56x56x128_3x3": ("conv", (128, 56, 56, 128, 3, 1, 1, 128)),
    "maxpool_112x112x64_3x3_s2": ("maxpool", (64, 112, 112, 3, 2, 1)),
    "dense_4096_1000": ("dense", (4096, 1000)),
    "dense_9216_4096": ("dense", (9216, 4096)),
    "dense_25088_4096": ("dense", (25088, 4096)),  # VGG's fc6
}


def _conv_out(size: int, k: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - k) // stride + 1


def op_arrays(name: str) -> dict[str, np.ndarray]:
    """Seeded inputs and weights of an operator (identical on both machines)."""
    kind, p = OPS[name]
    rng = np.random.default_rng(SEED + sum(map(ord, name)))
    if kind == "conv":
        c, h, w, oc, k, _, _, g = p
        scale = np.sqrt(2.0 / (c // g * k * k))
        return {
            "x": rng.standard_normal((1, c, h, w)).astype("float32"),
            "w": (rng.standard_normal((oc, c // g, k, k)) * scale).astype("float32"),
            "b": (rng.standard_normal(oc) * 0.1).astype("float32"),
        }
    if kind == "maxpool":
        c, h, w = p[:3]
        return {"x": rng.standard_normal((1, c, h, w)).astype("float32")}
    k, n = p
    return {
        "x": rng.standard_normal((1, k)).astype("float32"),
        "w": (rng.standard_normal((k, n)) / np.sqrt(k)).astype("float32"),
        "b": (rng.standard_normal(n) * 0.1).astype("float32"),
    }


def op_flops(name: str) -> float:
    kind, p = OPS[name]
    if kind == "conv":
        c, h, w, oc, k, s, pad, g = p
        return 2.0 * oc * (c // g) * k * k * _conv_out(h, k, s, pad) * _conv_out(w, k, s, pad)
    if kind == "maxpool":
        c, h, w, k, s, pad = p
        return float(c * _conv_out(h, k, s, pad) * _conv_out(w, k, s, pad) * k * k)
    return 2.0 * p[0] * p[1]


# ---------------------------------------------------------------------------------------------
# compile (full TVM)


def relax_module(name: str):
    """The operator as Relax, with every array a parameter (order: sorted array names)."""
    from tvm import relax

    kind, p = OPS[name]
    arrays = op_arrays(name)
    bb = relax.BlockBuilder()
    params = {k: relax.Var(k, relax.TensorType(v.shape, "float32")) for k, v in arrays.items()}
    with bb.function("main", [params[k] for k in sorted(params)]):
        with bb.dataflow():
            x = params["x"]
            if kind == "conv":
                _, _, _, oc, _, s, pad, g = p
                y = bb.emit(relax.op.nn.conv2d(x, params["w"], strides=s, padding=pad, groups=g))
                bias = bb.emit(relax.op.reshape(params["b"], (1, oc, 1, 1)))
                y = bb.emit(relax.op.nn.relu(relax.op.add(y, bias)))
            elif kind == "maxpool":
                _, _, _, k, s, pad = p
                y = bb.emit(relax.op.nn.max_pool2d(x, k, s, pad))
            else:
                y = bb.emit(relax.op.add(relax.op.matmul(x, params["w"]), params["b"]))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _kernel_attrs(mod) -> dict[str, dict]:
    from tvm import tirx

    out = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc):
            attrs = {k: v for k, v in dict(func.attrs or {}).items() if str(k).startswith("codl.")}
            out[gv.name_hint] = {k: (v if isinstance(v, str) else int(v)) for k, v in attrs.items()}
    return out


def _parse_variants(spec: str) -> dict[str, dict[str, int]]:
    """``"oc16:conv_oc_tile=16,conv_oh_tile=1;oh4:conv_oh_tile=4"`` -> config overrides."""
    variants: dict[str, dict[str, int]] = {}
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        name, _, fields = item.partition(":")
        if not name or not fields:
            raise SystemExit(f"bad --cpu-variants entry {item!r}: expected name:field=value,...")
        variants[name] = {
            key.strip(): int(value)
            for key, _, value in (f.partition("=") for f in fields.split(","))
        }
    return variants


def compile_all(args: argparse.Namespace) -> None:
    import contextlib
    import dataclasses
    import shutil

    import tvm
    from bench_util import git_commit, write_json
    from codl_tvm.schedules import (
        apply_schedules,
        cpu_alone_settings,
        cpu_config,
        cpu_overrides,
        dense_enabled,
        opencl_config,
        packed_enabled,
        winograd_enabled,
    )
    from tvm.target import Target

    from codl_tvm.build.pipeline import algorithm_passes, legalize_passes, single_device_pipeline

    out = Path(args.compile_dir)
    out.mkdir(parents=True, exist_ok=True)
    host = {"kind": "llvm", "mcpu": args.mcpu}
    targets = {"cpu": Target(host)}
    for dev in filter(None, args.opencl_devices.split(",")):
        attrs = {"kind": "opencl", "device": dev}
        if dev == "nvidia":
            attrs.update(max_num_threads=1024, max_shared_memory_per_block=49152)
        targets[f"opencl-{dev}"] = Target(attrs, host=host)
    if len(targets) > 1:
        try:
            from codl_tvm.runtime.plugin_build import build_plugin

            shutil.copy(build_plugin(), out / "libcodl_tvm_opencl.so")
        except Exception as err:  # the OpenCL rows then need the plugin built there
            print(f"warning: OpenCL plugin not built here: {err}", file=sys.stderr)
    builds = [(k, t, None) for k, t in targets.items()]
    for variant, overrides in _parse_variants(args.cpu_variants).items():
        cfg = dataclasses.replace(cpu_config(targets["cpu"]), name=variant, **overrides)
        builds.append((f"cpu@{variant}", targets["cpu"], cfg))
    for variant, overrides in _parse_variants(args.opencl_variants).items():
        for k, t in targets.items():
            if k != "cpu":
                cfg = dataclasses.replace(opencl_config(t), name=variant, **overrides)
                builds.append((f"{k}@{variant}", t, cfg))
    if args.cpu_alone or args.cpu_alone_variants:
        # as `codl-tvm compile --device cpu` builds for the CPU alone: constant weights,
        # Winograd and packed convs, CPU_ALONE_SETTINGS (plus each variant's overrides)
        builds.append(("cpu@cpualone", targets["cpu"], "cpualone"))
        for variant, overrides in _parse_variants(args.cpu_alone_variants).items():
            builds.append((f"cpu@cpualone-{variant}", targets["cpu"], ("cpualone", overrides)))
    if args.winograd:
        # The conv weight becomes a constant (Winograd transforms constant weights at build
        # time); every preset with Winograd switched on.
        builds += [(f"{k}@winograd", t, "winograd") for k, t in targets.items()]
    if args.dense:
        # codl's OpenCL dense rule instead of dlight's (off in the presets until measured).
        builds += [(f"{k}@dense", t, "dense") for k, t in targets.items() if k != "cpu"]
    ops = args.ops.split(",") if args.ops else list(OPS)
    manifest = {
        "commit": git_commit(),
        "seed": SEED,
        "targets": {k: str(t) for k, t in targets.items()},
        "ops": {},
    }
    for name in ops:
        if name not in OPS:
            raise SystemExit(f"unknown operator {name!r}; known: {', '.join(OPS)}")
        entry = {
            "kind": OPS[name][0],
            "params": list(OPS[name][1]),
            "flops": op_flops(name),
            "inputs": {k: list(v.shape) for k, v in sorted(op_arrays(name).items())},
            "libs": {},
            "kernels": {},
        }
        for tname, target, cpu_cfg in builds:
            mod = relax_module(name)
            bound: list[str] = []
            switch = contextlib.nullcontext()
            gpu_cfg, alone = None, {}
            if isinstance(cpu_cfg, tuple):
                cpu_cfg, alone = cpu_cfg
            if not isinstance(cpu_cfg, str) and target.kind.name == "opencl":
                gpu_cfg, cpu_cfg = cpu_cfg, None
            if cpu_cfg in ("cpualone", "winograd"):
                # constant weights: Winograd and packed convs transform them at build time
                if OPS[name][0] == "maxpool" or (cpu_cfg == "winograd" and OPS[name][0] != "conv"):
                    continue
                w = tvm.runtime.tensor(op_arrays(name)["w"])
                mod = tvm.relax.transform.BindParams("main", {"w": w})(mod)
                bound = ["w"]
            if cpu_cfg == "cpualone":
                cpu_cfg = None
                switch = contextlib.ExitStack()
                for ctx in (
                    winograd_enabled("all"),
                    packed_enabled("all"),
                    cpu_alone_settings(),
                    cpu_overrides(**alone),
                ):
                    switch.enter_context(ctx)
            elif cpu_cfg == "winograd":
                cpu_cfg, switch = None, winograd_enabled("all")
            elif cpu_cfg == "dense":
                if OPS[name][0] != "dense":
                    continue
                cpu_cfg, switch = None, dense_enabled()
            with switch:
                with target:
                    mod = tvm.transform.Sequential(
                        algorithm_passes(target, cpu=cpu_cfg, opencl=gpu_cfg)
                    )(mod)
                    mod = tvm.transform.Sequential(legalize_passes(target))(mod)
                    mod = apply_schedules(target, cpu=cpu_cfg, opencl=gpu_cfg)(mod)
                t0 = time.perf_counter()
                pipeline = single_device_pipeline(target, cpu=cpu_cfg, opencl=gpu_cfg)
                ex = tvm.compile(mod, target=target, relax_pipeline=pipeline)
            lib = f"{name}.{tname}.so"
            ex.export_library(str(out / lib))
            entry["libs"][tname] = lib
            entry.setdefault("bound", {})[tname] = bound
            entry["kernels"][tname] = _kernel_attrs(mod)
            print(
                f"{name:30s} {tname:14s} {time.perf_counter() - t0:6.1f} s "
                f"{entry['kernels'][tname]}",
                flush=True,
            )
        manifest["ops"][name] = entry
    write_json(out / "manifest.json", manifest)


# ---------------------------------------------------------------------------------------------
# run (runtime-only TVM is enough)


def onnx_model(name: str):
    """The same operator as a one-node ONNX graph with its weights as initializers."""
    from onnx import TensorProto, helper, numpy_helper

    kind, p = OPS[name]
    arrays = op_arrays(name)
    x = arrays["x"]
    inits = [numpy_helper.from_array(v, k) for k, v in arrays.items() if k != "x"]
    if kind == "conv":
        _, _, _, _, k, s, pad, g = p
        nodes = [
            helper.make_node(
                "Conv",
                ["x", "w", "b"],
                ["c"],
                kernel_shape=[k, k],
                strides=[s, s],
                pads=[pad] * 4,
                group=g,
            ),
            helper.make_node("Relu", ["c"], ["y"]),
        ]
    elif kind == "maxpool":
        _, _, _, k, s, pad = p
        nodes = [
            helper.make_node(
                "MaxPool", ["x"], ["y"], kernel_shape=[k, k], strides=[s, s], pads=[pad] * 4
            )
        ]
    else:
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"])]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by older onnxruntime releases too
    return model


def _parse_cpus(spec: str) -> set[int]:
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _ort_session(name: str, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(
        onnx_model(name).SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )


def _stats_ms(samples_ms) -> dict:
    a = np.asarray(samples_ms, dtype=float)
    return {
        "median_ms": float(np.median(a)),
        "min_ms": float(a.min()),
        "p90_ms": float(np.percentile(a, 90)),
        "samples": len(a),
    }


def _time_host_ms(fn, min_s: float, min_runs: int) -> dict:
    for _ in range(3):
        fn()
    samples = []
    t_end = time.perf_counter() + min_s
    while len(samples) < min_runs or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return _stats_ms(samples)


def _time_tvm(vm, dev, args, number: int, repeat: int) -> dict:
    timer = vm.time_evaluator("main", dev, number=number, repeat=repeat, min_repeat_ms=50)
    return _stats_ms([r * 1e3 for r in timer(*args).results])


def _rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    got = got.reshape(ref.shape)
    return float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-12))


def _torch_ms(name: str, min_s: float, tf32: bool = True) -> dict | None:
    """PyTorch on CUDA; ``tf32`` is cuDNN's default for convolutions (tensor cores with 10-bit
    mantissas), off for a plain float32 comparison with the OpenCL kernels."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    kind, p = OPS[name]
    arrays = {k: torch.from_numpy(v).cuda() for k, v in op_arrays(name).items()}
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    f = torch.nn.functional
    if kind == "conv":
        _, _, _, _, _, s, pad, g = p

        def fn():
            return f.relu(f.conv2d(arrays["x"], arrays["w"], arrays["b"], s, pad, 1, g))
    elif kind == "maxpool":
        _, _, _, k, s, pad = p

        def fn():
            return f.max_pool2d(arrays["x"], k, s, pad)
    else:

        def fn():
            return torch.addmm(arrays["b"], arrays["x"], arrays["w"])

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    samples = []
    t_end = time.perf_counter() + min_s
    while len(samples) < 20 or time.perf_counter() < t_end:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop))
    return _stats_ms(samples)


def run_all(args: argparse.Namespace) -> None:
    if args.cpus:
        os.sched_setaffinity(0, _parse_cpus(args.cpus))
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    run_dir = Path(args.run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    os.environ.setdefault("CODL_TVM_COMMIT", manifest.get("commit", "unknown"))
    plugin = run_dir / "libcodl_tvm_opencl.so"
    if args.opencl_platform and plugin.is_file():
        os.environ.setdefault("CODL_TVM_PLUGIN_LIB", str(plugin))

    import tvm
    from bench_util import envelope, write_json
    from tvm.runtime.vm import VirtualMachine

    devices = {"cpu": tvm.cpu(0)}
    opencl_info = None
    if args.opencl_platform:
        from codl_tvm import runtime

        runtime.load(platform=args.opencl_platform)
        info = runtime.info()
        opencl_info = {
            "platform": info.platform,
            "device": info.devices[0].name,
            "compute_units": info.devices[0].compute_units,
            "svm_mode": info.svm_mode,
        }
        devices[f"opencl-{args.opencl_config}"] = tvm.opencl(0)
    names = [n for n in manifest["ops"] if not args.ops or n in args.ops.split(",")]
    # onnxruntime first, for every operator, and TVM afterwards: both runtimes' worker threads
    # spin for a while after a call, and would steal the other's cores if interleaved.
    refs, results = {}, {}
    for name in names:
        arrays = op_arrays(name)
        sess = _ort_session(name, args.threads)
        refs[name] = sess.run(None, {"x": arrays["x"]})[0]
        results[name] = {
            "flops": manifest["ops"][name]["flops"],
            "kernels": manifest["ops"][name]["kernels"],
            "onnxruntime": _time_host_ms(
                lambda s=sess, a=arrays: s.run(None, {"x": a["x"]}), args.min_seconds, 20
            ),
        }
        del sess
    time.sleep(1.0)
    for name in names:
        entry, row, arrays = manifest["ops"][name], results[name], op_arrays(name)
        for tname, libname in entry["libs"].items():
            dev = devices.get(tname.split("@")[0])
            if dev is None:
                continue
            lib = tvm.runtime.load_module(str(run_dir / libname))
            vm = VirtualMachine(lib, dev)
            bound = entry.get("bound", {}).get(tname, [])
            vm_args = [tvm.runtime.tensor(arrays[k], dev) for k in sorted(arrays) if k not in bound]
            out = vm["main"](*vm_args)
            res = _time_tvm(vm, dev, vm_args, args.number, args.repeat)
            res["max_rel_err_vs_onnxruntime"] = _rel_err(out.numpy(), refs[name])
            res["gflops"] = entry["flops"] / res["median_ms"] / 1e6
            res["ratio_vs_onnxruntime"] = res["median_ms"] / row["onnxruntime"]["median_ms"]
            row[f"tvm-{tname}"] = res
        if args.torch:
            row["torch-cuda"] = _torch_ms(name, args.min_seconds)
            row["torch-cuda-fp32"] = _torch_ms(name, args.min_seconds, tf32=False)
        summary = "  ".join(
            f"{k} {v['median_ms']:.3f}ms"
            for k, v in row.items()
            if isinstance(v, dict) and "median_ms" in v
        )
        print(f"{name:30s} {summary}", flush=True)
    data = envelope(
        sys.argv,
        results,
        threads=args.threads,
        cpus=args.cpus,
        opencl=opencl_info,
        compile_commit=manifest.get("commit"),
        targets=manifest.get("targets"),
    )
    if args.out:
        write_json(args.out, data)
    else:
        print(json.dumps(data, indent=2))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--compile-dir", help="compile every operator into this folder")
    mode.add_argument("--run-dir", help="run the libraries of this folder")
    parser.add_argument("--ops", default="", help="comma-separated subset of operators")
    parser.add_argument("--mcpu", default="skylake-avx512", help="CPU of the llvm target")
    parser.add_argument(
        "--opencl-devices",
        default="nvidia,pocl",
        help="OpenCL device classes to compile for ('' for none)",
    )
    parser.add_argument(
        "--cpu-variants",
        default="",
        help="extra CPU builds with config overrides, e.g. "
        "'oc16:conv_oc_tile=16,conv_oh_tile=1;oh4:conv_oh_tile=4'",
    )
    parser.add_argument(
        "--opencl-variants",
        default="",
        help="extra OpenCL builds with config overrides, e.g. 'nosplit:conv_split_k=1'",
    )
    parser.add_argument(
        "--cpu-alone",
        action="store_true",
        help="also build each op as builds for the CPU alone do (cpu@cpualone: constant "
        "weights, Winograd, packed convs, CPU_ALONE_SETTINGS)",
    )
    parser.add_argument(
        "--cpu-alone-variants",
        default="",
        help="extra CPU-alone builds with CPUConfig overrides (cpu@cpualone-NAME), e.g. "
        "'t2k:max_tile_bytes=2048'",
    )
    parser.add_argument("--threads", type=int, default=8, help="TVM and onnxruntime threads")
    parser.add_argument("--cpus", default="", help="CPU affinity, e.g. 8-15")
    parser.add_argument(
        "--opencl-platform",
        default="",
        help="also run OpenCL libraries on this platform (e.g. nvidia, portable)",
    )
    parser.add_argument(
        "--opencl-config",
        default="nvidia",
        help="which compiled OpenCL device class to run (nvidia, pocl)",
    )
    parser.add_argument("--torch", action="store_true", help="also time PyTorch on CUDA")
    parser.add_argument(
        "--winograd",
        action="store_true",
        help="also build every conv with constant weights and Winograd on (<target>@winograd)",
    )
    parser.add_argument(
        "--dense",
        action="store_true",
        help="also build every dense op with codl's OpenCL dense rule (<opencl target>@dense)",
    )
    parser.add_argument("--number", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--min-seconds", type=float, default=1.0)
    parser.add_argument("--out", default="", help="JSON result file (default: stdout)")
    args = parser.parse_args(argv)
    if args.compile_dir:
        compile_all(args)
    else:
        run_all(args)


if __name__ == "__main__":
    main()
