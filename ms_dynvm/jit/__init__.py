"""The executor both tiers share: the compile driver (`compile`: when a group is compiled, the
fusibility rule and pass pipeline it goes through, the background compile thread, installing
kernels) and launching (`launch`: which kernel serves an input layout, prepared launches, result
memory, OpenMP threads). Imports no MindSpore: a frontend hands it Functions and pointers and wraps
the NumPy results itself.
"""
