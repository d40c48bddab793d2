"""The benchmark models on OpenCL images, run on a device behind an RPC tracker, against
onnxruntime on this machine.

For each model: ``codl-tvm compile --preset P --device opencl --gpu-data-type image
--no-measure`` (the GPU alone, every operator that can on images), the artifact run on a device
of ``--key`` (``deploy.run_artifact``: its library uploaded and run there), and its output
compared with onnxruntime's on the same seeded input (the logits: a final Softmax is left
out; float32: within 1e-4 of their largest magnitude, as ``tests/test_texture_models.py`` does
on this machine); ``--gpu-data-type buffer`` builds on buffers instead, ``--save-outputs DIR``
keeps each output (``NAME_DATA_TYPE.npy``, e.g. for ``scripts/float64_reference.py``). One JSON
line a model, written as each ends, so a run cut short keeps the models it finished::

    python scripts/images_on_device.py --tracker 127.0.0.1:9190 --key aarch64-emu-cl \\
        --preset linux-arm64-pocl --models squeezenet --out images_aarch64.jsonl

The emulated aarch64 device: ``python scripts/emulated_aarch64.py serve --opencl --tracker
127.0.0.1:9190 --key aarch64-emu-cl --port 9301`` (as root; a tracker on that port first).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_util import envelope

from codl_tvm.cli import main as cli
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.frontend.models import benchmark_model, seeded_model, without_final_softmax
from codl_tvm.objectives import deploy
from codl_tvm.runtime.artifact import LIBRARY

#: float32: different summation orders only.
RTOL = 1e-4


def check(
    name: str,
    preset: str,
    tracker: str,
    key: str,
    work: Path,
    timeout_s: float,
    data_type: str = "image",
    save: Path | None = None,
    own_weights: bool = False,
) -> dict:
    """Model ``name`` on the device, on images (``data_type``: or buffers): its error against
    onnxruntime; its output saved as ``save/NAME_DATA_TYPE.npy`` when ``save`` is given."""
    import onnx
    import onnxruntime as ort

    # the benchmarks' separable weights (compressible), or the model's own seeded ones
    proto = without_final_softmax((seeded_model if own_weights else benchmark_model)(name))
    path = work / f"{name}.onnx"
    onnx.save(proto, str(path))
    out = work / name
    start = time.perf_counter()
    argv = ["compile", str(path), "--preset", preset, "--device", "opencl"]
    argv += ["--gpu-data-type", data_type, "--no-measure", "--no-reference", "-o", str(out)]
    code = cli(argv)
    if code != 0:
        return {"model": name, "error": f"compile exited {code}"}
    built_s = time.perf_counter() - start
    source = (out / LIBRARY).read_bytes()
    model = load_onnx(proto)
    feeds = random_inputs(model, seed=7)
    inputs = [feeds[s.name] for s in model.inputs]
    start = time.perf_counter()
    run = deploy.run_artifact(out, tracker, key, inputs, number=1, repeat=1,
                              request_timeout_s=timeout_s)  # fmt: skip
    ran_s = time.perf_counter() - start
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})[0]
    got = np.asarray(run.outputs[0]).reshape(ref.shape)
    scale = max(1.0, float(np.max(np.abs(ref))))
    error = float(np.max(np.abs(got - ref))) / scale
    if save is not None:
        np.save(save / f"{name}_{data_type}.npy", got)
    return {
        "model": name,
        "gpu_data_type": data_type,
        "image_kernels": source.count(b"write_imagef") > 0,
        "error": error,
        "within": error <= RTOL,
        "compile_s": round(built_s, 1),
        "run_s": round(ran_s, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tracker", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--preset", required=True)
    p.add_argument("--models", required=True, help="comma list of benchmark models")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds a run may take")
    p.add_argument("--gpu-data-type", choices=("image", "buffer"), default="image",
                   help="the GPU's tensors on images (default) or buffers")  # fmt: skip
    p.add_argument("--save-outputs", default="", help="folder: each model's output as .npy")
    p.add_argument("--weights", choices=("benchmark", "own"), default="benchmark",
                   help="own: the model's own seeded weights, not the benchmarks' separable "
                   "ones")  # fmt: skip
    p.add_argument("--out", required=True, help="JSON lines: the run's envelope, then a model each")
    args = p.parse_args(argv)
    out = Path(args.out)
    save = Path(args.save_outputs) if args.save_outputs else None
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
    head = {"preset": args.preset, "rtol": RTOL, "gpu_data_type": args.gpu_data_type}
    head["weights"] = args.weights
    out.write_text(json.dumps(envelope(sys.argv, head)) + "\n")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            try:
                row = check(name, args.preset, args.tracker, args.key, Path(tmp), args.timeout,
                            args.gpu_data_type, save, args.weights == "own")  # fmt: skip
            except Exception as exc:  # one model's failure is its row, the others still run
                row = {"model": name, "error": f"{type(exc).__name__}: {exc}"[:400]}
            ok = ok and bool(row.get("within"))
            print(json.dumps(row), flush=True)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
