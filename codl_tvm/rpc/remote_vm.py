"""A model library loaded on a remote device: uploaded, run in a Relax VM over the remote's
devices, and timed there.

The VM's device list is given by name, one per VM slot, as an artifact's manifest lists it
(``vm_devices``): ``"opencl"`` is the remote's OpenCL device, ``"cpu"`` its CPU. A co-executed
build takes ``["opencl", "cpu"]``. A build whose GPU tensors are images takes the OpenCL device
once per VM slot: the Relax VM indexes its devices by VDevice, a texture build declares one
VDevice per memory scope (:meth:`codl_tvm.build.texture.TextureBuild.vm_devices`), and each
allocation's slot gives its tensor's view that scope, which codl-tvm's OpenCL plugin on the
server (``codl-tvm serve --opencl``) turns into an image.

:func:`remote_image_caps` reads the remote OpenCL device's image support, which decides
whether a model's tensors can be images there.

This module imports only TVM's runtime, :mod:`codl_tvm.runtime` and :mod:`codl_tvm.rpc.client`,
so that commands that run artifacts import it where TVM is runtime-only.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm.rpc.client import RemoteDevice
from codl_tvm.runtime.images import ImageCaps
from codl_tvm.runtime.vm import flatten_outputs

__all__ = ["IMAGE_CAPS_FUNC", "VM_DEVICE_NAMES", "RemoteVM", "remote_image_caps", "vm_devices_for"]

#: The names a VM slot may have.
VM_DEVICE_NAMES = ("opencl", "cpu")
#: The plugin's function reporting an OpenCL device's image support (as JSON).
IMAGE_CAPS_FUNC = "codl.opencl.image_caps"


def remote_image_caps(remote: RemoteDevice) -> ImageCaps | None:
    """The image support of the remote's OpenCL device, as codl-tvm's plugin there reports it
    (:func:`codl_tvm.runtime.images.image_caps`); None where the server has no such function
    (no plugin, or one from before it).

    Raises
    ------
    codl_tvm.core.errors.RemoteFailure
        The remote failed to answer (e.g. its OpenCL has no usable device).
    """

    def _ask() -> str | None:
        try:
            func = remote.session.get_function(IMAGE_CAPS_FUNC)
        except AttributeError:  # TVM's answer for a function the server does not have
            return None
        return None if func is None else str(func(0))

    text = remote.call("reading its image support", _ask)
    return None if text is None else ImageCaps(**json.loads(text))


def vm_devices_for(device: str) -> list[str]:
    """The VM slots of a buffer build for ``device`` (``"cpu"``, ``"opencl"`` or ``"coexec"``:
    OpenCL first, where the inputs live, then the CPU)."""
    slots = {"cpu": ["cpu"], "opencl": ["opencl"], "coexec": ["opencl", "cpu"]}
    if device not in slots:
        raise ValueError(f"device {device!r} is not one of {', '.join(slots)}")
    return slots[device]


class RemoteVM:
    """``library`` uploaded to ``remote`` and loaded there in a Relax VM over ``vm_devices``.

    Parameters
    ----------
    remote
        The connected device.
    library
        The exported model library (for the remote's machine).
    vm_devices
        The VM's devices by name, one per slot (:data:`VM_DEVICE_NAMES`); the first one receives
        the inputs and times the runs.

    Raises
    ------
    ValueError
        ``vm_devices`` is empty or names another device.
    codl_tvm.core.errors.RemoteFailure
        The upload, the load or the VM's creation failed there (naming the device and stage).
    """

    def __init__(self, remote: RemoteDevice, library: str | Path, vm_devices: Sequence[str]):
        names = list(vm_devices)
        unknown = sorted(set(names) - set(VM_DEVICE_NAMES))
        if not names or unknown:
            raise ValueError(
                f"vm_devices {names}: each slot is one of {', '.join(VM_DEVICE_NAMES)}"
            )
        library = Path(library)
        sess = remote.session
        self.remote = remote
        self.vm_devices = names
        # A fresh remote name per upload: overwriting a library the server has loaded crashes it.
        name = f"{library.stem}-{uuid.uuid4().hex[:12]}{library.suffix}"
        remote.call("uploading the model", lambda: sess.upload(str(library), name))
        rlib = remote.call("loading the model", lambda: sess.load_module(name))
        self.devices = [sess.cl(0) if n == "opencl" else sess.cpu(0) for n in names]
        self.vm = remote.call("creating the VM", lambda: VirtualMachine(rlib, self.devices))

    def set_inputs(self, inputs: Sequence[np.ndarray]) -> None:
        """Place ``inputs`` (``main``'s order) on the first device and give them to ``main``.

        Over RPC the VM receives call arguments as borrowed ``DLTensor*`` handles, which the
        plugin's typed builtins (``codl.coexec.cpu_view`` takes an ``ffi.Tensor``) reject;
        ``set_input`` copies them into VM-owned tensors on the server first.
        """
        dev = self.devices[0]

        def _set() -> None:
            args = [tvm.runtime.tensor(np.asarray(x, order="C"), dev) for x in inputs]
            self.vm.set_input("main", *args)

        self.remote.call("copying inputs", _set)

    def run(self) -> list[np.ndarray]:
        """Run ``main`` once on the inputs set last; return its outputs (flattened, in order)."""

        def _run():
            self.vm.invoke_stateful("main")
            return self.vm.get_outputs("main")

        out = self.remote.call("running main", _run)
        return self.remote.call("copying outputs back", lambda: flatten_outputs(out))

    def time(self, number: int, repeat: int) -> list[float]:
        """``repeat`` latencies in ms of ``main`` on the inputs set last, each the mean of
        ``number`` runs (``time_evaluator`` on the first device's timer, after its warm-up
        run)."""

        def _time():
            evaluator = self.vm.time_evaluator(
                "invoke_stateful", self.devices[0], number=number, repeat=repeat
            )
            return evaluator("main")

        res = self.remote.call("timing main", _time)
        return [float(r) * 1e3 for r in res.results]
