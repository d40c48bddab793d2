"""codl-tvm: CPU+GPU co-execution of deep-learning operators for Apache TVM.

``codl_tvm.compile(mod, plan)`` builds a Relax module whose partitioned operators run on the
OpenCL device and the CPU at once (see :mod:`codl_tvm.build.coexec`).
"""

__version__ = "0.1.0"

__all__ = ["__version__", "compile"]


def compile(
    mod,
    plan,
    gpu=None,
    cpu=None,
    work_dir=None,
    row_blocks: bool = False,
    gpu_data_type: str = "buffer",
    gpu_dtype: str = "float32",
):
    """Build ``mod`` with ``plan`` for co-execution; see
    :func:`codl_tvm.build.coexec.compile_coexec`
    (``row_blocks=True`` also splits LRN-like blocks after an H split along rows;
    ``gpu_data_type="image"`` computes the GPU parts on OpenCL images, CoDL's hybrid data type,
    in half precision with ``gpu_dtype="float16"``)."""
    # deferred: every submodule imports this package first, and most (runtime, cost models,
    # artifacts on a device) need none of the build path
    from codl_tvm.build.coexec import compile_coexec

    return compile_coexec(
        mod,
        plan,
        gpu=gpu,
        cpu=cpu,
        work_dir=work_dir,
        row_blocks=row_blocks,
        gpu_data_type=gpu_data_type,
        gpu_dtype=gpu_dtype,
    )
