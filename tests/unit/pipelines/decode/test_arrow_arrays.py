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


def test_an_ingest_task_does_not_import_pandas(tmp_path: Path) -> None:
    """pyarrow imports pandas on ``pa.array(<list>)`` and ``Array.to_numpy()``: ~1.5 s per
    fresh Spark Python worker. An ingest task's whole path (read a segment range, decode,
    write Parquet with the records table's options) must not."""
    code = textwrap.dedent(
        f"""
        import sys
        import pyarrow as pa
        from logstore.protocol.batch import Codec
        from logstore.protocol.records import build_batch
        from pipelines.delta.files import RECORDS_PARQUET_OPTIONS, PartitionedFileWriter
        from pipelines.sources.plan import parse_options, plan_ranges
        from pipelines.sources.read import RangeReport, read_records
        from pipelines.sources.synthetic import write_batches

        recs = [(b"k%d" % i, b"v" * i, [("h", b"x")], 1_700_000_000_000 + i) for i in range(9)]
        logs = {str(tmp_path / "logs")!r}
        write_batches(logs, "t", 0, [build_batch(recs, codec=Codec.LZ4)])
        (rng,) = plan_ranges(parse_options({{"path": logs, "until": "latest"}}))
        out = PartitionedFileWriter(
            {str(tmp_path / "lake")!r}, write_id="w", task_id=0, attempt=0,
            partition_by=["topic", "date"], compression="snappy", **RECORDS_PARQUET_OPTIONS,
        )
        report = RangeReport("t", 0)
        for batch in read_records(rng, min_timestamp=0, max_timestamp=2**62, report=report):
            out.write(pa.Table.from_batches([batch]))
        rows = sum(f.num_rows for f in out.close())
        print(rows, report.next_offset, "pandas" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["9", "9", "False"]
