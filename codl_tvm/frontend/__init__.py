"""The frontend: ONNX models into Relax (importer, graph rewrites), and the models that ship.

``importer`` loads ONNX into a Relax ``IRModule`` with input/output metadata; ``rewrites``
repairs operators TVM imports wrongly; ``models`` and ``zoo`` are the bundled and benchmark
models.
"""
