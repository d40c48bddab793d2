"""HOPE's placement: whole operators (and branches) placed on the CPU or the GPU over the
operator graph, with the baselines it is measured against.
"""
