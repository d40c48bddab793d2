"""Find the first operator whose OpenCL result differs from onnxruntime, layer by layer.

Every node output of an ONNX model becomes a graph output, so one build shows where a wrong
result starts. Compile here, run where the device is:

    python scripts/debug_layers.py compile --model bvlc_alexnet --out .device/debug
    python scripts/debug_layers.py run --dir .device/debug --platform portable
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np


def _all_outputs_model(name: str):
    import onnx

    from codl_tvm.models import light_model

    model = light_model(name)
    model = onnx.shape_inference.infer_shapes(model)
    known = {v.name: v for v in model.graph.value_info}
    outs = [o.name for o in model.graph.output]
    for node in model.graph.node:
        for out in node.output:
            if out in known and out not in outs:
                model.graph.output.append(known[out])
                outs.append(out)
    return model


def cmd_compile(args: argparse.Namespace) -> None:
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    from codl_tvm.pipeline import single_device_pipeline
    from codl_tvm.runtime._build import build_plugin

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(build_plugin(), out / "libcodl_tvm_opencl.so")
    model = _all_outputs_model(args.model)
    mod = from_onnx(model, keep_params_in_input=True)
    main = mod["main"]
    n_in = int(main.attrs["num_input"])
    target = tvm.target.Target({"kind": "opencl"}, host={"kind": "llvm", "mcpu": args.mcpu})
    ex = tvm.compile(mod, target=target, relax_pipeline=single_device_pipeline(target))
    ex.export_library(str(out / "model.so"))
    (out / "manifest.json").write_text(
        json.dumps(
            {
                "model": args.model,
                "inputs": [
                    [p.name, [int(v) for v in p.ty.shape.values]] for p in main.params[:n_in]
                ],
                "params": [p.name for p in main.params[n_in:]],
                "outputs": [o.name for o in model.graph.output],
            }
        )
    )


def cmd_run(args: argparse.Namespace) -> None:
    import onnxruntime as ort
    import tvm
    from onnx import numpy_helper
    from tvm.runtime.vm import VirtualMachine

    from codl_tvm import runtime

    runtime.load(platform=args.platform)
    man = json.loads((Path(args.dir) / "manifest.json").read_text())
    model = _all_outputs_model(man["model"])
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    rng = np.random.default_rng(11)
    feeds = {n: rng.random(s, dtype=np.float64).astype("float32") for n, s in man["inputs"]}
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    dev = tvm.opencl(0)
    vm = VirtualMachine(tvm.runtime.load_module(str(Path(args.dir) / "model.so")), dev)
    vm_args = [tvm.runtime.tensor(feeds[n], dev) for n, _ in man["inputs"]]
    vm_args += [tvm.runtime.tensor(init[p], dev) for p in man["params"]]
    outs = vm["main"](*vm_args)
    print(runtime.info().platform, runtime.info().devices[0].name)
    for name, want, got in zip(man["outputs"], ref, outs):
        got = got.numpy().reshape(want.shape)
        scale = max(float(np.max(np.abs(want))), 1e-12)
        print(f"{name:40s} {want.shape!s:22s} rel err {np.max(np.abs(got - want)) / scale:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("compile")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--mcpu", default="skylake-avx512")
    p.set_defaults(func=cmd_compile)
    p = sub.add_parser("run")
    p.add_argument("--dir", required=True)
    p.add_argument("--platform", required=True)
    p.set_defaults(func=cmd_run)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
