"""Arrow arrays built from buffers (pipelines.decode.arrow), and the import cost they avoid."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines.decode.arrow import numpy_array, repeated_string, string_array

ROOT = Path(__file__).resolve().parents[4]


def test_string_array_and_repeated_string_hold_the_values() -> None:
    values = ["a", None, "", "ü€", "topic-1"]
    arr = string_array(values)
    arr.validate(full=True)
    assert arr.to_pylist() == values and arr.null_count == 1
    assert string_array([]).to_pylist() == []
    rep = repeated_string("bench-none", 5)
    rep.validate(full=True)
    assert rep.to_pylist() == ["bench-none"] * 5
    assert repeated_string(b"x", 0).to_pylist() == []


def test_numpy_array_equals_pa_array() -> None:
    ints = np.array([3, -1, 7], np.int64)
    mask = np.array([False, True, False])
    cases = [
        (numpy_array(ints), pa.array(ints)),
        (numpy_array(ints[::2]), pa.array(ints[::2])),  # a strided view is copied
        (numpy_array(ints, mask=mask), pa.array(ints, mask=mask)),
        (numpy_array(np.array([True, False, True])), pa.array([True, False, True])),
        (numpy_array(np.array([1, 2], np.int16)), pa.array([1, 2], pa.int16())),
        (
            numpy_array(np.array([19675], np.int32), pa.date32()),
            pa.array(np.array([19675], np.int32), pa.date32()),
        ),
        (
            numpy_array(ints * 1000, pa.timestamp("us", tz="UTC")),
            pa.array(ints * 1000, pa.timestamp("us", tz="UTC")),
        ),
    ]
    for got, want in cases:
        got.validate(full=True)
        assert got.equals(want), (got, want)
    with pytest.raises(TypeError, match="cannot hold"):
        numpy_array(np.zeros(2, np.int32), pa.int64())


def test_reading_records_does_not_import_pandas() -> None:
    """pyarrow imports pandas on ``pa.array(<list>)``: ~1 s per Spark Python worker start."""
    code = textwrap.dedent(
        """
        import sys
        import numpy as np
        from logstore.protocol.batch import Codec
        from logstore.protocol.records import build_batch
        from pipelines.decode.batches import scan_batches
        from pipelines.decode.records import decode_records
        import pipelines.sources.read, pipelines.delta.direct

        recs = [(b"k%d" % i, b"v" * i, [("h", b"x")], 1_700_000_000_000 + i) for i in range(9)]
        buf = np.frombuffer(bytes(build_batch(recs, codec=Codec.LZ4)), np.uint8)
        rows = sum(d.records.num_rows for d in decode_records(buf, scan_batches(buf)))
        print(rows, "pandas" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["9", "False"]
