"""Objectives: each kind of compile in one place, from options to a written artifact.

``latency`` (the default: one co-executed or single-processor artifact), ``verify`` (its
measured choice among candidates), ``refine`` (rebalancing from measured timelines), ``tune``
(the operators the cost model knows least, measured here before planning),
``throughput`` and ``stage_build`` (Pipe-it: a model cut into stages on processor groups) and
``cold`` (the build with the lowest measured cold start, NNV12).
"""
