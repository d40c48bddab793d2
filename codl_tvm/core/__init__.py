"""The core: the contracts every layer shares. CoDL's partition plan (``plan``), halo geometry,
tensor names, the processor groups a pipeline runs on (``groups``), Pipe-it's stage-plan types
(``stage_plan``) and the error hierarchy.

Pure Python over TVM IR objects: every other layer may import it, it imports no other layer.
"""
