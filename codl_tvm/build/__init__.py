"""The build layer: Relax pass pipelines, target presets, building and running one library.

``pipeline`` (the phase functions of the single-processor and co-execution pipelines),
``targets`` (presets for the devices codl-tvm deploys to), ``coexec`` (``codl_tvm.compile``),
``runner`` (build and run in the stock Relax VM), ``cache`` (libraries keyed by a build spec) and
``node_tests`` (ONNX's backend node tests through the import and every build path).
"""
