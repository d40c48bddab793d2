"""The CoDL paper's evaluation models, built in code as ONNX graphs with seeded weights.

CoDL (MobiSys 2022) evaluates RetinaFace, YOLOv2, VGG-16, PoseNet and Fast Style Transfer. No
trained weights are shipped here: :func:`build_model` writes each architecture with ``onnx.helper``
and fills it with seeded random weights, scaled so that activations neither explode nor vanish
(He-normal convolutions and fully-connected layers, batch-norm with seeded mean, variance, scale
and shift), so every output depends on the input and numerical comparisons mean something.
Latency, which is what co-execution planning cares about, does not depend on weight values.

Conventions (shared with :mod:`codl_tvm.frontend.models` and :mod:`codl_tvm.frontend.importer`):

- ONNX opset 13, IR version 8, one input ``input`` of shape ``(1, 3, H, W)`` (float32, NCHW).
- Tensor names are C identifiers (TVM's OpenCL codegen names kernel parameters after them).
- Fully-connected layers are ``Gemm`` without ``transB`` (weights stored pre-transposed as
  ``(in, out)``), so the imported module multiplies by the weight as stored.
- Convolutions carry their padding (no separate ``Pad`` nodes) so that every convolution is a
  single partitionable ``relax.nn.conv2d`` after import.

Models (``input_hw`` is ``(H, W)``; the default is the evaluation size):

``yolov2`` (416x416, H and W multiples of 32)
    YOLOv2 for VOC (Redmon and Farhadi, 2017, ``yolo-voc.cfg``): Darknet-19 without its classifier
    (3x3/1x1 convolutions without bias, batch-norm, LeakyReLU 0.1, five 2x2 max-pools), two 3x3
    1024 convolutions, the passthrough route (1x1 64 convolution of the 26x26x512 feature map,
    reorganised by space-to-depth into 13x13x256 and concatenated before the 13x13x1024 map), a
    3x3 1024 convolution and the 1x1 detection convolution with 5 anchors x (5 + 20) = 125
    channels. Output ``detections``: the raw ``(1, 125, H/32, W/32)`` map.
``vgg16`` (224x224, multiples of 32)
    VGG-16 (configuration D of Simonyan and Zisserman, 2015): 13 3x3 convolutions with ReLU, five
    2x2 max-pools, three fully-connected layers (4096, 4096, 1000). Output ``logits``
    ``(1, 1000)``; the first fully-connected layer takes ``512 * H/32 * W/32`` features.
``posenet`` (257x257, ``H - 1`` and ``W - 1`` multiples of 16)
    The single-pose/multi-pose PoseNet of TensorFlow.js (PersonLab heads, Papandreou et al.
    2018) on MobileNet-v1 with depth multiplier 1.0 and output stride 16: a 3x3 stride-2
    convolution and 13 depthwise-separable blocks (3x3 depthwise + 1x1 pointwise, ReLU6); the
    block that would reach stride 32 keeps stride 1 and the last block's depthwise convolution
    uses dilation 2 (TF.js's atrous rule). TF "SAME" padding is symmetric for these sizes.
    Four 1x1 heads on the ``((H-1)/16+1)^2`` map: ``heatmaps`` (17, sigmoid), ``offsets`` (34),
    ``displacement_fwd`` (32) and ``displacement_bwd`` (32).
``fst`` (256x256, multiples of 4)
    Fast Style Transfer (Johnson, Alahi and Fei-Fei, 2016): 9x9 convolution (32), two 3x3
    stride-2 convolutions (64, 128), five residual blocks (two 3x3 128 convolutions each), two
    upsampling stages, a 9x9 convolution to 3 channels, ``tanh`` output. InstanceNormalization
    (Ulyanov et al.) after every convolution but the last, ReLU after each norm except the
    second one of a residual block. Output ``stylized`` ``(1, 3, H, W)``. Use
    ``input_hw=(512, 512)`` for the larger evaluation size.
``retinaface`` (640x640, multiples of 32)
    RetinaFace (Deng et al., 2019) with the MobileNet-0.25 backbone of the widely used PyTorch
    implementation (biubug6/Pytorch_Retinaface): MobileNet-v1 x0.25 (3x3 stride-2 conv and 13
    depthwise-separable blocks, batch-norm, LeakyReLU 0.1), an FPN on the stride-8/16/32 maps
    (1x1 lateral convolutions to 64 channels, nearest 2x upsampling, add, 3x3 merge
    convolutions), an SSH context module per level (3x3 branch of 32 channels, 5x5 and 7x7
    branches of 16 as stacked 3x3 convolutions, concat, ReLU) and 1x1 class/box/landmark heads
    with 2 anchors per position. Outputs ``bbox`` ``(1, A, 4)``, ``scores`` ``(1, A, 2)``
    (softmax) and ``landmarks`` ``(1, A, 10)`` with ``A = 2 * (HW/64 + HW/256 + HW/1024)``
    (16800 at 640x640).

Simplifications (all keep the operators that co-execution partitions):

- YOLOv2: Darknet's ``reorg`` layer orders channels differently from ONNX ``SpaceToDepth``; the
  common ONNX conversions (and this one) use ``SpaceToDepth(blocksize=2)``, same shapes and
  work. The region layer's decoding (sigmoid/exp with anchors, class softmax, NMS) is
  post-processing and is not part of the graph.
- VGG-16: dropout is omitted (inference) and the output is logits without softmax.
- PoseNet: TF.js ships the weights with batch-norm folded into convolution biases; the graph
  has convolutions with bias and ReLU6 (``Clip(0, 6)``) like the TF.js model. Pose decoding is
  post-processing. (The CoDL paper's reference [35] for "PoseNet" is a hand-pose network; the
  widely deployed MobileNet PoseNet of TF.js is built here.)
- FST: zero padding inside the convolutions instead of reflection padding, and no border crop
  in the residual blocks (Johnson et al. use valid convolutions on a 40-pixel reflection-padded
  input). The upsampling stages are nearest-neighbour ``Resize`` (x2) followed by a 3x3
  convolution (the "resize-convolution" used by the PyTorch ``fast_neural_style`` example)
  instead of fractionally-strided convolutions: TVM 0.27's ONNX frontend imports
  ``ConvTranspose``, but as ``relax.nn.conv2d_transpose``, which codl-tvm's partitioner does not
  split, while a ``Resize`` + ``Conv`` stage gives two more partitionable convolutions with the
  same output size and a similar cost. The output is ``tanh`` (Johnson's scaled tanh without
  the affine rescale to [0, 255]).
- RetinaFace: heads are 1x1 convolutions with bias; reshapes to ``(1, -1, k)`` are done with
  ``Transpose`` + ``Reshape`` like the PyTorch model's ``permute`` + ``view``. Prior-box
  decoding and NMS are post-processing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["DEFAULT_INPUT_HW", "ZOO_MODELS", "build_model", "save_model"]

ZOO_MODELS: tuple[str, ...] = ("yolov2", "vgg16", "posenet", "fst", "retinaface")

DEFAULT_INPUT_HW: MappingProxyType[str, tuple[int, int]] = MappingProxyType(
    {
        "yolov2": (416, 416),
        "vgg16": (224, 224),
        "posenet": (257, 257),
        "fst": (256, 256),
        "retinaface": (640, 640),
    }
)

OPSET = 13
IR_VERSION = 8
LEAKY = 0.1


class _Graph:
    """Accumulates ONNX nodes and seeded initializers; every tensor name is a C identifier."""

    def __init__(self, name: str, seed: int):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self._count: dict[str, int] = {}
        self._shared: set[str] = set()

    def fresh(self, prefix: str) -> str:
        n = self._count.get(prefix, 0) + 1
        self._count[prefix] = n
        return f"{prefix}{n}"

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def shared(self, name: str, value: np.ndarray) -> str:
        """An initializer used by several nodes (added once)."""
        if name not in self._shared:
            self._shared.add(name)
            self.const(name, value)
        return name

    def name_output(self, name: str) -> str:
        """Rename the output of the last node (a graph output nobody reads yet) to ``name``."""
        self.nodes[-1].output[0] = name
        return name

    def node(self, op: str, inputs: list[str], prefix: str, **attrs) -> str:
        out = self.fresh(prefix)
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{out}_{op}", **attrs))
        return out

    # -- layers ----------------------------------------------------------------------------

    def conv(
        self,
        x: str,
        cin: int,
        cout: int,
        k: int,
        *,
        stride: int = 1,
        pad: int | None = None,
        dilation: int = 1,
        group: int = 1,
        bias: bool = True,
        gain: float = 2.0,
        prefix: str = "conv",
    ) -> str:
        """``Conv`` with He-normal weights (variance ``gain / fan_in``) and a small bias."""
        name = self.fresh(prefix)
        pad = dilation * (k // 2) if pad is None else pad
        fan_in = (cin // group) * k * k
        w = self.rng.standard_normal((cout, cin // group, k, k), dtype=np.float32)
        w *= np.float32(np.sqrt(gain / fan_in))
        inputs = [x, self.const(f"{name}_w", w.astype("float32"))]
        if bias:
            b = self.rng.standard_normal(cout) * 0.1
            inputs.append(self.const(f"{name}_b", b.astype("float32")))
        self.nodes.append(
            helper.make_node(
                "Conv",
                inputs,
                [name],
                name=f"{name}_Conv",
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[pad] * 4,
                dilations=[dilation, dilation],
                group=group,
            )
        )
        return name

    def batch_norm(self, x: str, c: int) -> str:
        """``BatchNormalization`` with seeded scale, shift, running mean and running variance."""
        name = self.fresh("bn")
        rng = self.rng
        params = [
            self.const(f"{name}_scale", rng.uniform(0.8, 1.2, c).astype("float32")),
            self.const(f"{name}_shift", (rng.standard_normal(c) * 0.1).astype("float32")),
            self.const(f"{name}_mean", (rng.standard_normal(c) * 0.1).astype("float32")),
            self.const(f"{name}_var", rng.uniform(0.8, 1.2, c).astype("float32")),
        ]
        self.nodes.append(
            helper.make_node(
                "BatchNormalization", [x, *params], [name], name=f"{name}_BN", epsilon=1e-5
            )
        )
        return name

    def instance_norm(self, x: str, c: int) -> str:
        name = self.fresh("in")
        scale = self.const(f"{name}_scale", self.rng.uniform(0.8, 1.2, c).astype("float32"))
        shift = self.const(f"{name}_shift", (self.rng.standard_normal(c) * 0.1).astype("float32"))
        self.nodes.append(
            helper.make_node(
                "InstanceNormalization", [x, scale, shift], [name], name=f"{name}_IN", epsilon=1e-5
            )
        )
        return name

    def leaky(self, x: str, alpha: float = LEAKY) -> str:
        return self.node("LeakyRelu", [x], "leaky", alpha=alpha)

    def relu(self, x: str) -> str:
        return self.node("Relu", [x], "relu")

    def relu6(self, x: str) -> str:
        lo = self.shared("relu6_min", np.array(0.0, "float32"))
        hi = self.shared("relu6_max", np.array(6.0, "float32"))
        return self.node("Clip", [x, lo, hi], "relu6")

    def maxpool2(self, x: str) -> str:
        return self.node("MaxPool", [x], "pool", kernel_shape=[2, 2], strides=[2, 2])

    def upsample2(self, x: str) -> str:
        """Nearest-neighbour x2 (PyTorch ``interpolate(mode="nearest")``)."""
        scales = self.shared("up_scales", np.array([1.0, 1.0, 2.0, 2.0], "float32"))
        return self.node(
            "Resize",
            [x, "", scales],
            "up",
            mode="nearest",
            coordinate_transformation_mode="asymmetric",
            nearest_mode="floor",
        )

    def gemm(self, x: str, fin: int, fout: int, gain: float = 2.0) -> str:
        """Fully-connected layer; the weight is stored pre-transposed as ``(fin, fout)``."""
        name = self.fresh("fc")
        w = self.rng.standard_normal((fin, fout), dtype=np.float32) * np.float32(
            np.sqrt(gain / fin)
        )
        b = (self.rng.standard_normal(fout) * 0.1).astype("float32")
        self.nodes.append(
            helper.make_node(
                "Gemm",
                [x, self.const(f"{name}_w", w), self.const(f"{name}_b", b)],
                [name],
                name=f"{name}_Gemm",
            )
        )
        return name

    def finish(self, input_hw: tuple[int, int], outputs: list[str]):
        def model_of(inputs, inits, outs):
            graph = helper.make_graph(self.nodes, self.name, inputs, outs, inits)
            model = helper.make_model(
                graph,
                opset_imports=[helper.make_opsetid("", OPSET)],
                producer_name="codl-tvm.zoo",
            )
            model.ir_version = IR_VERSION
            return model

        x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, *input_hw])
        # Shape inference serializes the whole model: run it on a copy whose weights are typed
        # graph inputs (small initializers such as shapes and scales stay, inference reads them).
        small = [t for t in self.inits if np.prod(t.dims, dtype=np.int64) <= 16]
        typed = [
            helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
            for t in self.inits
            if np.prod(t.dims, dtype=np.int64) > 16
        ]
        untyped = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        inferred = onnx.shape_inference.infer_shapes(
            model_of([x, *typed], small, untyped), strict_mode=True
        )
        shapes = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output]}
        outs = [shapes[o] for o in outputs]
        for out in outs:
            dims = out.type.tensor_type.shape.dim
            if not dims or any(not d.HasField("dim_value") for d in dims):
                raise RuntimeError(
                    f"zoo model {self.name}: output '{out.name}' has no static shape"
                )
        model = model_of([x], self.inits, outs)
        onnx.checker.check_model(model)
        return model


# -- architectures ---------------------------------------------------------------------------


def _yolov2(g: _Graph, hw: tuple[int, int]) -> list[str]:
    def cbl(x, cin, cout, k):
        return g.leaky(g.batch_norm(g.conv(x, cin, cout, k, bias=False, gain=2 / 1.01), cout))

    x, c = "input", 3
    # Darknet-19 without its classifier: (filters, kernel) per conv, "M" = 2x2 max-pool.
    cfg = [
        (32, 3), "M",
        (64, 3), "M",
        (128, 3), (64, 1), (128, 3), "M",
        (256, 3), (128, 1), (256, 3), "M",
        (512, 3), (256, 1), (512, 3), (256, 1), (512, 3), "R", "M",
        (1024, 3), (512, 1), (1024, 3), (512, 1), (1024, 3),
    ]  # fmt: skip
    route = None
    for item in cfg:
        if item == "M":
            x = g.maxpool2(x)
        elif item == "R":
            route = x  # the 26x26x512 map (at 416x416) feeding the passthrough layer
        else:
            x = cbl(x, c, item[0], item[1])
            c = item[0]
    x = cbl(x, 1024, 1024, 3)
    x = cbl(x, 1024, 1024, 3)
    p = cbl(route, 512, 64, 1)
    p = g.node("SpaceToDepth", [p], "reorg", blocksize=2)
    x = g.node("Concat", [p, x], "route", axis=1)
    x = cbl(x, 256 + 1024, 1024, 3)
    x = g.conv(x, 1024, 5 * (5 + 20), 1, gain=1.0, prefix="detect")
    g.name_output("detections")
    return ["detections"]


def _vgg16(g: _Graph, hw: tuple[int, int]) -> list[str]:
    x, c = "input", 3
    for stage in ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512)):
        for cout in stage:
            x = g.relu(g.conv(x, c, cout, 3))
            c = cout
        x = g.maxpool2(x)
    x = g.node("Flatten", [x], "flatten", axis=1)
    fin = 512 * (hw[0] // 32) * (hw[1] // 32)
    x = g.relu(g.gemm(x, fin, 4096))
    x = g.relu(g.gemm(x, 4096, 4096))
    x = g.gemm(x, 4096, 1000, gain=1.0)
    g.name_output("logits")
    return ["logits"]


def _posenet(g: _Graph, hw: tuple[int, int]) -> list[str]:
    # TF.js mobileNet100Architecture: (kind, stride); output stride 16 with atrous rates.
    arch = [("conv", 2, 32)] + [
        ("sep", s, c)
        for s, c in [(1, 64), (2, 128), (1, 128), (2, 256), (1, 256), (2, 512)]
        + [(1, 512)] * 5
        + [(2, 1024), (1, 1024)]
    ]
    x, c = "input", 3
    current_stride, rate = 1, 1
    for kind, stride, cout in arch:
        if current_stride == 16:
            layer_stride, layer_rate = 1, rate
            rate *= stride
        else:
            layer_stride, layer_rate = stride, 1
            current_stride *= stride
        if kind == "conv":
            x = g.relu6(g.conv(x, c, cout, 3, stride=layer_stride))
        else:
            x = g.relu6(
                g.conv(x, c, c, 3, stride=layer_stride, dilation=layer_rate, group=c, prefix="dw")
            )
            x = g.relu6(g.conv(x, c, cout, 1, prefix="pw"))
        c = cout
    heat = g.conv(x, c, 17, 1, gain=1.0, prefix="heatmap")
    g.node("Sigmoid", [heat], "sigmoid")
    g.name_output("heatmaps")
    outs = ["heatmaps"]
    for name, ch in (("offsets", 34), ("displacement_fwd", 32), ("displacement_bwd", 32)):
        g.conv(x, c, ch, 1, gain=1.0, prefix=f"{name}_conv")
        g.name_output(name)
        outs.append(name)
    return outs


def _fst(g: _Graph, hw: tuple[int, int]) -> list[str]:
    def cir(x, cin, cout, k, stride=1, relu=True):
        y = g.instance_norm(g.conv(x, cin, cout, k, stride=stride), cout)
        return g.relu(y) if relu else y

    x = cir("input", 3, 32, 9)
    x = cir(x, 32, 64, 3, stride=2)
    x = cir(x, 64, 128, 3, stride=2)
    for _ in range(5):
        y = cir(x, 128, 128, 3)
        y = cir(y, 128, 128, 3, relu=False)
        x = g.node("Add", [x, y], "res")
    x = cir(g.upsample2(x), 128, 64, 3)
    x = cir(g.upsample2(x), 64, 32, 3)
    x = g.conv(x, 32, 3, 9, gain=1.0)
    g.node("Tanh", [x], "tanh")
    g.name_output("stylized")
    return ["stylized"]


def _retinaface(g: _Graph, hw: tuple[int, int]) -> list[str]:
    leaky_gain = 2 / (1 + LEAKY**2)

    def cb(x, cin, cout, k, stride=1, group=1, act=True):
        y = g.conv(x, cin, cout, k, stride=stride, group=group, bias=False, gain=leaky_gain)
        y = g.batch_norm(y, cout)
        return g.leaky(y) if act else y

    def conv_dw(x, cin, cout, stride):
        return cb(cb(x, cin, cin, 3, stride=stride, group=cin), cin, cout, 1)

    x = cb("input", 3, 8, 3, stride=2)
    blocks = (
        [(8, 16, 1), (16, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1)]  # stage 1 (stride 8)
        + [(64, 128, 2)] + [(128, 128, 1)] * 5  # stage 2 (stride 16)
        + [(128, 256, 2), (256, 256, 1)]  # stage 3 (stride 32)
    )  # fmt: skip
    feats = []
    for i, (cin, cout, stride) in enumerate(blocks):
        x = conv_dw(x, cin, cout, stride)
        if i in (4, 10, 12):  # last block of each stage
            feats.append(x)
    # FPN
    o1 = cb(feats[0], 64, 64, 1)
    o2 = cb(feats[1], 128, 64, 1)
    o3 = cb(feats[2], 256, 64, 1)
    o2 = cb(g.node("Add", [o2, g.upsample2(o3)], "fpn_add"), 64, 64, 3)
    o1 = cb(g.node("Add", [o1, g.upsample2(o2)], "fpn_add"), 64, 64, 3)
    # SSH context modules
    levels = []
    for f in (o1, o2, o3):
        c3 = cb(f, 64, 32, 3, act=False)
        c5_1 = cb(f, 64, 16, 3)
        c5 = cb(c5_1, 16, 16, 3, act=False)
        c7_2 = cb(c5_1, 16, 16, 3)
        c7 = cb(c7_2, 16, 16, 3, act=False)
        levels.append(g.relu(g.node("Concat", [c3, c5, c7], "ssh_cat", axis=1)))
    # Heads: 2 anchors per position, (1, -1, k) per level, concatenated over levels.
    outs = []
    for head, k in (("bbox", 4), ("scores", 2), ("landmarks", 10)):
        parts = []
        for f in levels:
            y = g.conv(f, 64, 2 * k, 1, gain=1.0, prefix=f"{head}_head")
            y = g.node("Transpose", [y], f"{head}_nhwc", perm=[0, 2, 3, 1])
            shape = g.shared(f"{head}_shape", np.array([1, -1, k], "int64"))
            parts.append(g.node("Reshape", [y, shape], f"{head}_flat"))
        y = g.node("Concat", parts, f"{head}_cat", axis=1)
        if head == "scores":
            y = g.node("Softmax", [y], "scores_softmax", axis=-1)
        g.name_output(head)
        outs.append(head)
    return outs


@dataclass(frozen=True)
class _Spec:
    build: Callable[[_Graph, tuple[int, int]], list[str]]
    rule: str
    valid: Callable[[int], bool]


_SPECS: dict[str, _Spec] = {
    "yolov2": _Spec(_yolov2, "a positive multiple of 32", lambda n: n > 0 and n % 32 == 0),
    "vgg16": _Spec(_vgg16, "a positive multiple of 32", lambda n: n > 0 and n % 32 == 0),
    "posenet": _Spec(
        _posenet, "16 * k + 1 with k >= 1 (e.g. 257, 513)", lambda n: n > 16 and n % 16 == 1
    ),
    "fst": _Spec(_fst, "a positive multiple of 4", lambda n: n > 0 and n % 4 == 0),
    "retinaface": _Spec(_retinaface, "a positive multiple of 32", lambda n: n > 0 and n % 32 == 0),
}


def _check_name(name: str) -> _Spec:
    spec = _SPECS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(f"unknown zoo model {name!r}; known models: {', '.join(ZOO_MODELS)}")
    return spec


def _check_hw(name: str, spec: _Spec, input_hw) -> tuple[int, int]:
    if input_hw is None:
        return DEFAULT_INPUT_HW[name]
    try:
        values = tuple(input_hw)
    except TypeError:
        values = ()
    if len(values) != 2 or not all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values
    ):
        raise ValueError(f"zoo model {name!r}: input_hw must be two ints (H, W), got {input_hw!r}")
    bad = [int(v) for v in values if not spec.valid(int(v))]
    if bad:
        raise ValueError(
            f"zoo model {name!r}: input_hw {tuple(int(v) for v in values)} is not usable: "
            f"{bad[0]} is not {spec.rule}"
        )
    return (int(values[0]), int(values[1]))


def build_model(
    name: str, *, input_hw: tuple[int, int] | None = None, seed: int = 0
) -> onnx.ModelProto:
    """Build zoo model ``name`` as an ONNX graph with seeded random weights.

    Parameters
    ----------
    name
        One of :data:`ZOO_MODELS`.
    input_hw
        Input height and width (default: the evaluation size in :data:`DEFAULT_INPUT_HW`).
        Small sizes keep tests quick; each model constrains the sizes (see the module docstring).
    seed
        Seed of the weights; the same seed gives the same model.

    Returns
    -------
    onnx.ModelProto
        Opset 13, one input ``input`` of shape ``(1, 3, H, W)``, statically shaped outputs.

    Raises
    ------
    ValueError
        For an unknown name (the message lists the known ones) or an unusable ``input_hw``
        (the message names the model, the value and the rule).
    """
    spec = _check_name(name)
    hw = _check_hw(name, spec, input_hw)
    g = _Graph(name, seed)
    outputs = spec.build(g, hw)
    return g.finish(hw, outputs)


def save_model(name: str, path: str | Path, *, overwrite: bool = False, **kw) -> Path:
    """Build zoo model ``name`` and write it to ``path`` as an ONNX file.

    Parameters
    ----------
    name
        One of :data:`ZOO_MODELS`.
    path
        The file to write (parent directories are created).
    overwrite
        Replace an existing file; by default an existing file is never touched.
    **kw
        ``input_hw`` and ``seed``, as for :func:`build_model`.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    FileExistsError
        When ``path`` exists and ``overwrite`` is false.
    ValueError
        As :func:`build_model` (checked before anything is written).
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
    model = build_model(name, **kw)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path
