"""codl.SanitizeParamNames: make every Relax function's parameter names valid C identifiers.

Preconditions
-------------
None: it runs first in codl-tvm's pipelines (:func:`codl_tvm.build.pipeline.inference_passes`), on
the module as the caller hands it to ``tvm.compile`` or :func:`codl_tvm.compile`.

Why
---
TVM names kernel arguments after the Relax parameters they read (``x/0`` becomes the OpenCL
argument ``x/0_ptr``) and ``clBuildProgram`` rejects the kernel. :func:`codl_tvm.frontend.importer.
load_onnx` already renames the parameters of the modules it imports, but a module built by hand
(``BlockBuilder``, TVMScript) or with TVM's own ``from_onnx`` reaches the build with its names
as they are; this pass covers those.

What it does
------------
In every Relax function, parameters whose names are no C identifiers get the names
:func:`codl_tvm.core.names.c_identifiers` gives them (distinct, never another parameter's name);
valid names stay. Variables keep their identity (only their names change), so the function
computes the same and inputs still bind by position; operator names, which plans refer to, are
untouched. A module with nothing to rename is returned as it was.
"""

from __future__ import annotations

import tvm
from tvm import relax

from codl_tvm.core.names import c_identifiers, rename_params

from .rewrite import rewrite_functions

__all__ = ["SanitizeParamNames", "sanitize_param_names"]


def sanitize_param_names(func: relax.Function) -> tuple[relax.Function, int]:
    """``func`` with C-identifier parameter names, and how many parameters were renamed."""
    mapping = c_identifiers(p.name for p in func.params)
    renamed = sum(1 for old, new in mapping.items() if old != new)
    return (rename_params(func, mapping) if renamed else func), renamed


@tvm.transform.module_pass(opt_level=0, name="codl.SanitizeParamNames")
class SanitizeParamNames:
    """Rename the parameters of every Relax function to valid C identifiers."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_functions(mod, sanitize_param_names)
