"""VM dtypes: short names used in bytecode text, signatures and kernels, and their NumPy and MindSpore
equivalents.

The VM names are the ones printed in types (`f32[4,B]`). MindSpore is never imported here: the frontend
maps MindSpore dtypes to these names by their string form (`str(ms.float32) == 'Float32'`).
"""

from __future__ import annotations

import numpy as np

# VM name -> NumPy dtype. bfloat16 has no NumPy dtype: the interpreter computes it in float32 and
# rounds to bfloat16 on every result (see interpreter._round_bf16).
_NP = {
    "bool": np.bool_,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,
    "u8": np.uint8,
    "u16": np.uint16,
    "u32": np.uint32,
    "u64": np.uint64,
    "f16": np.float16,
    "bf16": np.float32,
    "f32": np.float32,
    "f64": np.float64,
    "c64": np.complex64,
    "c128": np.complex128,
}

DTYPES = tuple(_NP)
FLOATS = frozenset({"f16", "bf16", "f32", "f64"})
COMPLEX = frozenset({"c64", "c128"})
INTS = frozenset({"i8", "i16", "i32", "i64", "u8"})
# Held, never computed on: MindSpore 2.10 supports these unsigned types on few CPU kernels, with
# rules of its own (no promotion with any other dtype but bool, no Python int operand, a mean that
# divides the wrapped sum), so every op with such an operand or result is recorded as an opaque
# call (frontend/recorder.py): the VM only types, stores and hands on their values.
STORAGE_ONLY = frozenset({"u16", "u32", "u64"})

# MindSpore's str(dtype) -> VM name.
_FROM_MS = {
    "Bool": "bool",
    "Int8": "i8",
    "Int16": "i16",
    "Int32": "i32",
    "Int64": "i64",
    "UInt8": "u8",
    "UInt16": "u16",
    "UInt32": "u32",
    "UInt64": "u64",
    "Float16": "f16",
    "BFloat16": "bf16",
    "Float32": "f32",
    "Float64": "f64",
    "Complex64": "c64",
    "Complex128": "c128",
}
_TO_MS = {v: k for k, v in _FROM_MS.items()}

_FROM_NP = {np.dtype(v): k for k, v in _NP.items() if k != "bf16"}

# Type ids that MindSpore passes for dtype arguments (`Cast(x, 42)`), from mindspore/_c_expression
# TypeId. Measured with MindSpore 2.10: Cast(x, ms.float16) dispatches 42, ms.bfloat16 45,
# ms.float32 43, ms.complex64 51.
TYPE_ID = {
    30: "bool",
    32: "i8",
    33: "i16",
    34: "i32",
    35: "i64",
    37: "u8",
    38: "u16",
    39: "u32",
    40: "u64",
    42: "f16",
    43: "f32",
    44: "f64",
    45: "bf16",
    51: "c64",
    52: "c128",
}
TYPE_ID_OF = {v: k for k, v in TYPE_ID.items()}


def to_numpy(dtype: str) -> np.dtype:
    """NumPy dtype that holds values of VM dtype `dtype` (bf16 is held as float32)."""
    try:
        return np.dtype(_NP[dtype])
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}") from None


def from_numpy(dtype) -> str:
    try:
        return _FROM_NP[np.dtype(dtype)]
    except KeyError:
        raise ValueError(f"NumPy dtype {dtype} has no VM dtype") from None


def from_mindspore_name(name: str) -> str:
    """VM dtype from `str(mindspore_dtype)`; raises ValueError for a dtype the VM does not know."""
    try:
        return _FROM_MS[name]
    except KeyError:
        raise ValueError(f"MindSpore dtype {name} has no VM dtype") from None


def to_mindspore_name(dtype: str) -> str:
    return _TO_MS[dtype]


def is_float(dtype: str) -> bool:
    return dtype in FLOATS


def is_int(dtype: str) -> bool:
    return dtype in INTS


# Promotion follows MindSpore (which follows PyTorch): bool < integers < floats < complex; inside a
# kind the wider type wins; i8/u8 promote to i16; f16/bf16 promote to f32.
_RANK = {
    "bool": 0,
    "u8": 1,
    "i8": 1,
    "u16": 2,  # (storage only: MindSpore promotes them with nothing but bool)
    "u32": 3,
    "u64": 4,
    "i16": 2,
    "i32": 3,
    "i64": 4,
    "f16": 5,
    "bf16": 5,
    "f32": 6,
    "f64": 7,
    "c64": 8,
    "c128": 9,
}


def promote(a: str, b: str) -> str:
    """Result dtype of a binary op on two tensors of dtypes `a` and `b`."""
    if a == b:
        return a
    if {a, b} == {"u8", "i8"}:
        return "i16"
    if {a, b} == {"f16", "bf16"}:
        return "f32"
    if {a, b} == {"f64", "c64"}:
        return "c128"
    return a if _RANK[a] >= _RANK[b] else b


def kind(dtype: str) -> int:
    """0 bool, 1 integer, 2 float, 3 complex."""
    if dtype == "bool":
        return 0
    if dtype in INTS or dtype in STORAGE_ONLY:
        return 1
    if dtype in FLOATS:
        return 2
    return 3


def promote_scalar(tensor_dtype: str, scalar) -> str:
    """Result dtype of a binary op between a tensor and a Python scalar: the scalar only matters
    when it is of a higher kind (a float scalar makes an integer tensor float32)."""
    if isinstance(scalar, bool):
        skind = 0
    elif isinstance(scalar, int):
        skind = 1
    elif isinstance(scalar, float):
        skind = 2
    else:
        skind = 3
    if skind <= kind(tensor_dtype):
        return tensor_dtype
    return {0: "bool", 1: "i64", 2: "f32", 3: "c64"}[skind]
