"""The core: the partition plan contract, halo geometry, tensor names and the error hierarchy.

Pure Python over TVM IR objects: every other layer may import it, it imports no other layer.
"""
