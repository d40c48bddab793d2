"""Remote devices through TVM's RPC tracker.

- :mod:`~codl_tvm.rpc.client`: tracker requests with bounded waits, a remote's version report;
- :mod:`~codl_tvm.rpc.farm`: every free device of a key running jobs in parallel;
- :mod:`~codl_tvm.rpc.server`: the RPC server a board runs (``codl-tvm serve``);
- :mod:`~codl_tvm.rpc.remote_vm`: a library loaded in a Relax VM over a remote's devices (an
  image build's OpenCL device once per VM slot), run and timed there;
- :mod:`~codl_tvm.rpc.plugin`: checking the OpenCL plugin of a remote and uploading one that fits.

Deploying a model to a device is an objective: :mod:`codl_tvm.objectives.deploy`. The package
imports none of its modules, so that a board's server imports only ``client`` and ``server``.
"""
