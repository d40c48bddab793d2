"""The core: the contracts every layer shares. CoDL's partition plan (``plan``), halo geometry,
tensor names and input/output specs (``names``, ``tensors``), the processor groups a pipeline
runs on (``groups``), Pipe-it's stage-plan types (``stage_plan``), telling a Ctrl-C from a failure
(``interrupts``) and the error hierarchy (``errors``).

Pure Python over TVM IR objects: every other layer may import it, it imports no other layer.
"""
