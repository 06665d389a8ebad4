"""MindSpore CPU's numerics that both the reference interpreter and the kernel generator reproduce.

One place for facts about how MindSpore 2.10 CPU computes, which `runtime.interpreter` (the
reference) and `codegen.spec` (the kernels) must agree on; neither imports the other for them.
"""

from __future__ import annotations


def ms_sum_order(op: str, rank: int, axes: tuple, shape=None) -> str | None:
    """The order MindSpore 2.10 CPU adds a float32 sum or mean over `axes` (normalised, sorted) of a
    rank-`rank` tensor in (measured bit-equal over shapes and axes), named as the kernels'
    Step.order (codegen/spec.py), or None where it adds in float64 and rounds once:
    - along the last axis of a matrix: "ms8r" (8 partial sums over the whole blocks of 8, added in
      lane order, then the rest one by one);
    - a sum (not a mean) along the first axis of a tensor of rank >= 2: "seq" (in index order), the
      reduced axes of size 1 (`shape`, when given) left out: a full sum of an [n, 1] tensor is one
      along its first axis (measured: [250, 1], [250, 1, 1] and [50, 1, 1, 1] over every axis,
      [250, 1, 3] over (0, 1); [1, 250], [1, 250, 1] and [37, 37] stay in float64).
    A mean is that sum, rounded, over n in float32 (its first-axis form stays in float64).
    (A symbolic dim is never 1: signatures specialise sizes 0 and 1.)"""
    if rank == 2 and tuple(axes) == (1,):
        return "ms8r"
    if op == "sum" and rank >= 2:
        eff = tuple(a for a in axes if shape is None or not (isinstance(shape[a], int) and shape[a] == 1))
        if tuple(axes) == (0,) or eff == (0,):
            return "seq"
    return None
