"""CoDL's split planning: which operators and chains are split between GPU and CPU, on
which dimension (output rows H or channels OC) and at what ratio.
"""
