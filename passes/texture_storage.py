"""Give every texture-scoped tensor an image storage of its own shape.

TVM's memory planner puts texture tensors on flat ``global`` storages when the target has the
``adreno`` key (``DeviceScopeCompatibility.opencl``), sized in bytes and shared with other
tensors, buffers included; the runtime then needs an image on a buffer
(``cl_khr_image2d_from_buffer``), which drivers refuse for the ``image2d_array_t`` TVM's kernels
take (PoCL: ``CL_INVALID_IMAGE_DESCRIPTOR``). After the finalize phase, ``main`` reads::

    storage = R.vm.alloc_storage(R.shape([50176]), 0, R.dtype("uint8"), R.str("global"))
    alloc = R.vm.alloc_tensor(storage, 0, R.shape([1, 4, 28, 28, 4]), R.dtype("float32"), 0)
    ...
    alloc2 = R.vm.alloc_tensor(storage, 0, R.shape([1, 2, 14, 14, 4]), R.dtype("float32"), 1)

where VDevice 0 is ``global.texture-weight`` and 1 ``global``. This pass gives each tensor of a
texture VDevice its own storage in that scope, of the tensor's shape and dtype, which the
runtime allocates as an image the tensor then shares::

    alloc_image = R.vm.alloc_storage(R.shape([1, 4, 28, 28, 4]), 0, R.dtype("float32"),
                                     R.str("global.texture-weight"))
    alloc = R.vm.alloc_tensor(alloc_image, 0, R.shape([1, 4, 28, 28, 4]), R.dtype("float32"), 0)
    R.vm.kill_object(alloc_image)   # the tensor keeps it alive
    ...
    alloc2 = R.vm.alloc_tensor(storage, 0, R.shape([1, 2, 14, 14, 4]), R.dtype("float32"), 1)

Buffer tensors keep the planned storages; a storage no tensor uses any more is dropped with
its ``kill_object``. Images are not reused between tensors (an image's shape decides who can
use it), so a model holds one image per live texture tensor. Run last, after TVM's
``StaticPlanBlockMemory``, ``LowerAllocTensor`` and ``KillAfterLastUse``.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.op import vm as vm_op

from .rewrite import op_name, rewrite_functions

__all__ = ["ImageStorages", "image_storages"]

_ALLOC_STORAGE = "relax.vm.alloc_storage"
_ALLOC_TENSOR = "relax.vm.alloc_tensor"
_KILL = "relax.vm.kill_object"


def _texture_scopes(mod: tvm.IRModule) -> dict[int, str]:
    """VDevice index -> memory scope, for the texture VDevices of ``mod``."""
    vdevices = mod.global_infos.get("vdevice", ()) if mod.global_infos else ()
    return {
        i: str(v.memory_scope) for i, v in enumerate(vdevices) if "texture" in str(v.memory_scope)
    }


def _image_bindings(value: relax.Call, var: relax.Var, scope: str) -> list[relax.Binding]:
    """An image storage for the tensor ``value`` allocates, the allocation, and the storage's
    release (the tensor holds it)."""
    _storage, offset, shape, dtype, index = value.args
    bb = relax.BlockBuilder()
    storage = relax.Var(f"{var.name}_image", relax.ObjectType())
    alloc = bb.normalize(vm_op.alloc_storage(shape, index, dtype, scope))
    tensor = bb.normalize(vm_op.alloc_tensor(storage, offset, shape, dtype, index))
    kill = bb.normalize(vm_op.kill_object(storage))
    return [
        relax.VarBinding(storage, alloc),
        relax.VarBinding(var, tensor),
        relax.VarBinding(relax.Var(f"{var.name}_free", kill.ty), kill),
    ]


def image_storages(func: relax.Function, scopes: dict[int, str]) -> tuple[relax.Function, int]:
    """``func`` with its texture tensors on image storages of their own, and how many."""
    if not scopes or not isinstance(func.body, relax.SeqExpr):
        return func, 0
    blocks, moved = [], 0
    for block in func.body.blocks:
        out: list[relax.Binding] = []
        for b in block.bindings:
            value = b.value if isinstance(b, relax.VarBinding) else None
            index = value.args[4] if op_name(value) == _ALLOC_TENSOR else None
            if isinstance(index, tvm.tirx.IntImm) and int(index.value) in scopes:
                out.extend(_image_bindings(value, b.var, scopes[int(index.value)]))
                moved += 1
            else:
                out.append(b)
        blocks.append(out)
    if not moved:
        return func, 0
    blocks = _drop_unused_storages(blocks)
    kinds = [type(block) for block in func.body.blocks]
    new_blocks = [kind(bindings) for kind, bindings in zip(kinds, blocks)]
    body = relax.BlockBuilder().normalize(relax.SeqExpr(new_blocks, func.body.body))
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs), moved


def _drop_unused_storages(blocks: list[list[relax.Binding]]) -> list[list[relax.Binding]]:
    """Without the planned storages no tensor is allocated from any more (and their kills)."""
    storages = {b.var for block in blocks for b in block if op_name(b.value) == _ALLOC_STORAGE}
    used = {b.value.args[0] for block in blocks for b in block if op_name(b.value) == _ALLOC_TENSOR}
    dead = storages - used

    def keep(b: relax.Binding) -> bool:
        if b.var in dead:
            return False
        return not (op_name(b.value) == _KILL and b.value.args[0] in dead)

    return [[b for b in block if keep(b)] for block in blocks]


@tvm.transform.module_pass(opt_level=0, name="codl.ImageStorages")
class ImageStorages:
    """Put every texture-scoped tensor of every Relax function on an image storage of its own
    (see the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        scopes = _texture_scopes(mod)
        return rewrite_functions(mod, lambda func: image_storages(func, scopes))
