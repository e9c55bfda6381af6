"""Arrow arrays built straight from buffers, for the decoder and the segment source.

``pa.array`` on a Python list or a numpy array goes through pyarrow's pandas shim, which
imports pandas on first use: about a second for every fresh Spark Python worker, paid at its
first task. Nothing on the read/decode path needs pandas, so these helpers build the arrays
from buffers instead (zero-copy for numpy arrays that are already contiguous); and
:func:`same_bytes` reads them back the same way. Pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

__all__ = [
    "numpy_array",
    "numpy_values",
    "one_array",
    "repeated_string",
    "same_bytes",
    "string_array",
]


def one_array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``column`` as one array: its only chunk as it is (``combine_chunks`` copies even one
    chunk: ~46 ns a row of 85-byte values, ~11 ns of int64, measured), else the chunks
    concatenated. The array may have an offset."""
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column


def numpy_array(
    values: np.ndarray, type_: pa.DataType | None = None, *, mask: np.ndarray | None = None
) -> pa.Array:
    """``pa.array(values, type_, mask=mask)`` for a 1-d numeric or bool numpy array.

    ``type_`` defaults to the array's own type; it must have the same width (``date32`` over
    int32, ``timestamp`` over int64, ...). ``mask``: True where the value is null.
    """
    arr = np.ascontiguousarray(values)
    n = arr.shape[0]
    validity = None
    nulls = 0
    if mask is not None and mask.any():
        nulls = int(mask.sum())
        validity = pa.py_buffer(np.packbits(~mask, bitorder="little"))
    if arr.dtype == np.bool_:
        data = pa.py_buffer(np.packbits(arr, bitorder="little"))
        return pa.Array.from_buffers(type_ or pa.bool_(), n, [validity, data], nulls)
    typ = type_ or pa.from_numpy_dtype(arr.dtype)
    if typ.bit_width != arr.dtype.itemsize * 8:
        raise TypeError(f"{typ} cannot hold {arr.dtype} values")
    return pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(arr)], nulls)


def numpy_values(arr: pa.Array, dtype: type[np.generic]) -> np.ndarray:
    """A read-only numpy view of a fixed-width array's values (no nulls), without a copy.

    What ``arr.to_numpy()`` returns, minus its pandas import (~1.5 s in a fresh worker).
    """
    if arr.null_count:
        raise ValueError("numpy_values: the array has nulls")
    if arr.type.bit_width != np.dtype(dtype).itemsize * 8:
        raise TypeError(f"{arr.type} values are not {np.dtype(dtype)}")
    return np.frombuffer(arr.buffers()[1], dtype, len(arr), arr.offset * np.dtype(dtype).itemsize)


def string_array(values: Sequence[str | None]) -> pa.Array:
    """A ``string`` array of ``values`` (None: null)."""
    raw = [b"" if v is None else v.encode() for v in values]
    offsets = np.zeros(len(raw) + 1, np.int32)
    np.cumsum(np.fromiter(map(len, raw), np.int32, len(raw)), out=offsets[1:])
    mask = np.fromiter((v is None for v in values), np.bool_, len(values))
    validity = None
    if mask.any():
        validity = pa.py_buffer(np.packbits(~mask, bitorder="little"))
    buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(raw))]
    return pa.Array.from_buffers(pa.string(), len(raw), buffers, int(mask.sum()))


def repeated_string(value: str | bytes, n: int) -> pa.Array:
    """``n`` rows of the same string, without a gather (``take`` costs ~4-6 ns a row)."""
    label = value.encode() if isinstance(value, str) else value
    if len(label) * n >= 2**31:  # beyond int32 offsets: let Arrow chunk it
        return string_array([label.decode()]).take(numpy_array(np.zeros(n, np.int32)))
    offsets = np.arange(0, (n + 1) * len(label), len(label), dtype=np.int32)
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(label * n)], 0
    )


def same_bytes(arr: pa.Array) -> bool:
    """Whether every value of a string/binary array without nulls has the same bytes.

    All lengths equal (from the offsets) and the values buffer equal to itself shifted by one
    value's width: two vectorised compares over the buffers, no per-row work.
    """
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    itemsize = 8 if large else 4
    offsets = np.frombuffer(
        arr.buffers()[1], np.int64 if large else np.int32, len(arr) + 1, arr.offset * itemsize
    )
    width = int(offsets[1] - offsets[0])
    if not np.all(np.diff(offsets) == width):
        return False
    if width == 0:
        return True
    start, end = int(offsets[0]), int(offsets[-1])
    data = np.frombuffer(arr.buffers()[2], np.uint8, end - start, start)
    return bool(np.array_equal(data[width:], data[:-width]))
