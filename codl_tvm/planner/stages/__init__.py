"""Pipe-it's stage planning: a model's layers cut into contiguous stages, each on a processor
group, for throughput. The layer model (one-core latency, core scaling), the stage search and
the refinement on measured stages.
"""
