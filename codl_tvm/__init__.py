"""codl-tvm: CPU+GPU co-execution of deep-learning operators for Apache TVM."""

__version__ = "0.1.0"
