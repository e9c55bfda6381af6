"""Executor-side file writing of the Delta sink: layout, partition values, stats, cleanup."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from pipelines.delta import files as files_module
from pipelines.delta.commit import commit_files
from pipelines.delta.files import (
    HIVE_NULL,
    RECORDS_PARQUET_OPTIONS,
    PartitionedFileWriter,
    cleanup_write_files,
    escape_path_name,
    parquet_column_paths,
    partition_value_string,
    split_by_partition,
)
from pipelines.sources.schema import RECORDS_ARROW_SCHEMA
from pipelines.typed.job import KAFKA_TYPE, typed_parquet_options
from tests.fixtures.records import records_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_partition_value_strings_follow_delta_serialization() -> None:
    assert partition_value_string(None) is None
    assert partition_value_string("a b") == "a b"
    assert partition_value_string(7) == "7"
    assert partition_value_string(True) == "true"
    assert partition_value_string(dt.date(2024, 2, 29)) == "2024-02-29"
    ts = dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    assert partition_value_string(ts) == "2024-01-02 03:04:05.000006"


def test_escape_path_name_escapes_hive_unsafe_characters() -> None:
    assert escape_path_name("a-b_c.d") == "a-b_c.d"
    assert escape_path_name("a/b=c:d%") == "a%2Fb%3Dc%3Ad%25"


def _table() -> pa.Table:
    return pa.table(
        {
            "offset": pa.array([0, 1, 2, 3, 4], pa.int64()),
            "topic": ["a", "b", "a", None, "a"],
            "ts": pa.array(
                [1_000_001, 2_000, 3_000, 4_000, 5_000_500], pa.timestamp("us", tz="UTC")
            ),
            "key": pa.array([b"k", None, b"x", b"y", b"z"], pa.binary()),
            "s": ["short", "x" * 40, None, "m", "n"],
        }
    )


def test_writer_splits_by_partition_and_reports_stats(tmp_path: Path) -> None:
    w = PartitionedFileWriter(tmp_path, write_id="w1", task_id=3, attempt=0, partition_by=["topic"])
    w.write(_table())
    files = sorted(w.close(), key=lambda f: str(f.partition_values))
    by_topic = {f.partition_values["topic"]: f for f in files}
    assert set(by_topic) == {"a", "b", None}
    a = by_topic["a"]
    assert a.path.startswith("topic=a/part-00003-w1-0-c")
    assert a.num_rows == 3
    on_disk = pq.read_table(tmp_path / a.path)
    assert on_disk.column_names == ["offset", "ts", "key", "s"]  # partition column not stored
    assert on_disk.column("offset").to_pylist() == [0, 2, 4]
    assert a.size == (tmp_path / a.path).stat().st_size
    stats = json.loads(a.stats)
    assert stats["numRecords"] == 3
    assert stats["minValues"]["offset"] == 0 and stats["maxValues"]["offset"] == 4
    # min floored, max ceiled to milliseconds: bounds never tighter than the data
    assert stats["minValues"]["ts"] == "1970-01-01T00:00:00.003Z"
    assert stats["maxValues"]["ts"] == "1970-01-01T00:00:05.001Z"
    assert stats["nullCount"]["key"] == 0 and stats["nullCount"]["s"] == 1
    assert "key" not in stats["minValues"]  # no bounds for binary
    assert by_topic[None].path.startswith(f"topic={HIVE_NULL}/")
    b = json.loads(by_topic["b"].stats)
    assert b["minValues"]["s"] == "x" * 32 and "s" not in b["maxValues"]


def test_timestamp_bounds_in_every_unit_are_never_tighter_than_the_data(tmp_path: Path) -> None:
    """Bounds come from the integer values (no ``as_py``): floored/ceiled to milliseconds,
    before the epoch too, "Z" only for a type with a time zone."""
    cases = {
        "ns": ([-1_500_001, 2_000_000_001], "1969-12-31T23:59:59.998", "1970-01-01T00:00:02.001"),
        "us": ([-1, 999], "1969-12-31T23:59:59.999", "1970-01-01T00:00:00.001"),
        "ms": ([-5, 7], "1969-12-31T23:59:59.995", "1970-01-01T00:00:00.007"),
        "s": ([-2, 3], "1969-12-31T23:59:58.000", "1970-01-01T00:00:03.000"),
    }
    for unit, (values, lo, hi) in cases.items():
        for tz, suffix in ((None, ""), ("UTC", "Z")):
            w = PartitionedFileWriter(
                tmp_path / f"{unit}-{tz}", write_id="w", task_id=0, attempt=0, partition_by=[]
            )
            w.write(pa.table({"ts": pa.array(values, pa.timestamp(unit, tz=tz))}))
            (f,) = w.close()
            stats = json.loads(f.stats)
            assert stats["minValues"]["ts"] == lo + suffix, (unit, tz)
            assert stats["maxValues"]["ts"] == hi + suffix, (unit, tz)


def test_writer_rolls_files_and_abort_removes_them(tmp_path: Path) -> None:
    w = PartitionedFileWriter(
        tmp_path, write_id="w2", task_id=0, attempt=1, partition_by=[], max_rows_per_file=2
    )
    for _ in range(3):
        w.write(_table().slice(0, 2))
    files = w.close()
    assert [f.num_rows for f in files] == [2, 2, 2]
    assert len({f.path for f in files}) == 3
    w2 = PartitionedFileWriter(tmp_path, write_id="w3", task_id=0, attempt=0, partition_by=[])
    w2.write(_table())
    w2.abort()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f.path for f in files)


def test_cleanup_removes_only_this_write_and_keeps_listed(tmp_path: Path) -> None:
    (tmp_path / "_delta_log").mkdir()
    (tmp_path / "_delta_log" / "part-x-w9-0.json").write_text("{}")
    (tmp_path / "p=1").mkdir()
    for name in [
        "part-00000-w9-0-c000.parquet",
        "part-00001-w9-0-c000.parquet",
        "part-00000-other-0-c000.parquet",
    ]:
        (tmp_path / "p=1" / name).write_bytes(b"x")
    removed = cleanup_write_files(tmp_path, "w9", keep={"p=1/part-00001-w9-0-c000.parquet"})
    assert removed == 1
    assert sorted(p.name for p in (tmp_path / "p=1").iterdir()) == [
        "part-00000-other-0-c000.parquet",
        "part-00001-w9-0-c000.parquet",
    ]
    assert (tmp_path / "_delta_log" / "part-x-w9-0.json").exists()
    (tmp_path / "q=2").mkdir()
    assert cleanup_write_files(tmp_path, "w9", prune_dirs=True) == 1
    assert not (tmp_path / "q=2").exists()
    assert (tmp_path / "p=1").exists()


def test_cleanup_limited_to_dirs_lists_only_those(tmp_path: Path) -> None:
    for d in ("p=1", "p=2", "p=3/q=4"):
        (tmp_path / d).mkdir(parents=True)
        for name in ("part-00000-w9-0-c000.parquet", "part-00000-w9-1-c000.parquet"):
            (tmp_path / d / name).write_bytes(b"x")
    keep = {"p=1/part-00000-w9-1-c000.parquet", "p=3/q=4/part-00000-w9-1-c000.parquet"}
    removed = cleanup_write_files(tmp_path, "w9", keep=keep, dirs={"p=1", "p=3/q=4", "gone"})
    assert removed == 2
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.parquet"))
    assert left == sorted(
        [*keep, "p=2/part-00000-w9-0-c000.parquet", "p=2/part-00000-w9-1-c000.parquet"]
    )


def _groups(
    table: pa.Table, partition_by: list[str]
) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """split_by_partition's output as {partition values: rows}, for comparing with a reference."""
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for values, rows in split_by_partition(table, partition_by):
        key = tuple(values[c] for c in partition_by)
        assert key not in out
        assert rows.column_names == [c for c in table.column_names if c not in partition_by]
        out[key] = rows.to_pylist()
    return out


def _reference(
    table: pa.Table, partition_by: list[str]
) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in table.to_pylist():
        key = tuple(partition_value_string(row.pop(c)) for c in partition_by)
        out.setdefault(key, []).append(row)
    return out


def _chunked(*chunks: pa.Array) -> pa.ChunkedArray:
    return pa.chunked_array(chunks, type=chunks[0].type)


SAME = pa.array(["topic-a"] * 5)
DAY_1 = pa.array([19_000] * 5, pa.date32())


@pytest.mark.parametrize(
    "topic",
    [
        SAME,
        _chunked(SAME.slice(0, 2), SAME.slice(2)),  # chunks with non-zero offsets
        pa.array(["x", "y", "x", "y", "x"]),  # same width, different bytes
        pa.array(["ab", "abab", "ab", "ab", "ab"]),  # same bytes shifted, different widths
        pa.array(["", "", "", "", ""]),
        pa.array([None] * 5, pa.string()),
        pa.array(["a", None, "a", "a", "a"]),
        _chunked(pa.array(["a", "a"]), pa.array(["b", "b", "b"])),  # each chunk one value
        pa.array(["topic-a"] * 5, pa.large_string()),
        pa.array(["t"] * 5).dictionary_encode(),
        pa.DictionaryArray.from_arrays(pa.array([0, 1, 0, 1, 0], pa.int8()), pa.array(["t", "t"])),
        pa.array([b"\x00k"] * 4 + [b"\x00j"], pa.binary()),
    ],
)
@pytest.mark.parametrize(
    "date",
    [
        DAY_1,
        pa.array([19_000] * 4 + [19_001], pa.date32()),
        _chunked(DAY_1.slice(0, 1), DAY_1.slice(1)),
        pa.array([7] * 5, pa.int16()),
        pa.array([True] * 5),
        pa.array([1.5] * 4 + [float("nan")]),  # no fast path for floats: grouped
    ],
)
def test_split_by_partition_matches_a_row_by_row_grouping(
    topic: pa.Array | pa.ChunkedArray, date: pa.Array | pa.ChunkedArray
) -> None:
    table = pa.table({"topic": topic, "n": np.arange(5), "date": date})
    assert _groups(table, ["topic", "date"]) == _reference(table, ["topic", "date"])


def test_stats_of_a_single_valued_string_column_match_min_max(tmp_path: Path) -> None:
    codec = _chunked(pa.array(["lz4"] * 3), pa.array(["lz4", "lz4"]).slice(1))
    other = pa.array(["none", "zstd", "gzip", "lz4"])
    w = PartitionedFileWriter(tmp_path, write_id="w", task_id=0, attempt=0, partition_by=[])
    w.write(pa.table({"codec": codec}))
    w.write(pa.table({"codec": pa.array(["lz4", "lz4"])}))
    w.close()
    w2 = PartitionedFileWriter(tmp_path, write_id="v", task_id=0, attempt=0, partition_by=[])
    w2.write(pa.table({"codec": codec}))
    w2.write(pa.table({"codec": other}))
    [one] = [json.loads(f.stats) for f in w.close()]
    [two] = [json.loads(f.stats) for f in w2.close()]
    assert (one["minValues"], one["maxValues"], one["numRecords"]) == (
        {"codec": "lz4"},
        {"codec": "lz4"},
        6,
    )
    assert (two["minValues"], two["maxValues"]) == ({"codec": "gzip"}, {"codec": "zstd"})


def test_records_options_name_real_columns_of_the_records_table() -> None:
    stored = pa.schema([f for f in RECORDS_ARROW_SCHEMA if f.name not in ("topic", "date")])
    paths = set(parquet_column_paths(stored))
    for option in ("use_dictionary", "write_statistics", "column_encoding"):
        assert set(RECORDS_PARQUET_OPTIONS[option]) <= paths, option


def test_unknown_column_in_writer_options_is_refused(tmp_path: Path) -> None:
    w = PartitionedFileWriter(
        tmp_path, write_id="w", task_id=0, attempt=0, partition_by=[], use_dictionary=["nope"]
    )
    with pytest.raises(ValueError, match="nope"):
        w.write(_table())
    assert not list(tmp_path.iterdir())


def _write_records(root: Path, table: pa.Table, compression: str) -> list[Any]:
    w = PartitionedFileWriter(
        root,
        write_id="r1",
        task_id=0,
        attempt=0,
        partition_by=["topic", "date"],
        compression=compression,
        max_rows_per_file=600,
        row_group_bytes=32 << 10,
        **RECORDS_PARQUET_OPTIONS,
    )
    for start in range(0, table.num_rows, 700):
        w.write(table.slice(start, 700))
    files = w.close()
    commit_files(root, files, schema=RECORDS_ARROW_SCHEMA, partition_by=["topic", "date"])
    return files


@pytest.mark.parametrize("compression", ["snappy", "none", "lz4", "zstd"])
def test_records_options_files_read_back_with_pyarrow_polars_and_deltalake(
    tmp_path: Path, compression: str
) -> None:
    table = records_table(4_000, ("a", "b"), (19_675, 19_676))
    files = _write_records(tmp_path, table, compression)
    assert len(files) == 8  # 2 topics x 2 days, 1,000 rows each: files of 600 + 400 rows
    expected = table.sort_by("offset").to_pylist()

    md = pq.ParquetFile(tmp_path / files[0].path).metadata
    assert md.num_row_groups > 1
    chunks = {
        md.row_group(0).column(c).path_in_schema: md.row_group(0).column(c)
        for c in range(md.num_columns)
    }
    assert "DELTA_BINARY_PACKED" in chunks["offset"].encodings
    assert "RLE_DICTIONARY" in chunks["codec"].encodings
    assert "RLE_DICTIONARY" not in chunks["value"].encodings
    assert chunks["offset"].is_stats_set and not chunks["value"].is_stats_set

    delta = DeltaTable(str(tmp_path)).to_pyarrow_table().sort_by("offset")
    assert delta.select(table.column_names).to_pylist() == expected
    polars = pl.read_delta(str(tmp_path)).sort("offset").to_arrow()
    assert polars.select(table.column_names).cast(RECORDS_ARROW_SCHEMA).to_pylist() == expected
    one = pq.read_table(tmp_path / files[0].path)
    assert one.num_rows == files[0].num_rows
    stats = json.loads(files[0].stats)
    assert stats["minValues"]["offset"] == min(one.column("offset").to_pylist())


@pytest.mark.integration
def test_records_options_files_read_back_with_spark(spark: SparkSession, tmp_path: Path) -> None:
    table = records_table(3_000, ("a", "b"), (19_675,))
    _write_records(tmp_path, table, "snappy")
    # Spark's vectorized Parquet reader (the default), partition columns from the directories
    assert spark.conf.get("spark.sql.parquet.enableVectorizedReader") == "true"
    got = spark.read.parquet(str(tmp_path)).orderBy("offset").toArrow()
    got = got.select(table.column_names).cast(RECORDS_ARROW_SCHEMA)
    assert got.to_pylist() == table.sort_by("offset").to_pylist()


def test_parquet_writer_switch_picks_the_fast_writer_where_it_can(tmp_path: Path) -> None:
    """``parquet_writer="loglake"`` writes with FastParquetWriter when it supports every column
    and with pyarrow's writer otherwise (a map column here); both read back the same."""
    table = _table()
    with_map = table.append_column(
        "m",
        pa.array(
            [[("a", 1)], None, [], [("b", 2), ("c", None)], [("d", 3)]],
            pa.map_(pa.string(), pa.int64()),
        ),
    )
    for data, engine in ((table, "loglake"), (with_map, "parquet-cpp")):
        root = tmp_path / engine
        w = PartitionedFileWriter(
            root, write_id="w", task_id=0, attempt=0, partition_by=[], parquet_writer="loglake"
        )
        w.write(data)
        (f,) = w.close()
        md = pq.read_metadata(root / f.path)
        assert md.created_by.startswith(engine), md.created_by
        assert pq.read_table(root / f.path).to_pylist() == data.to_pylist()
    with pytest.raises(ValueError, match="parquet_writer"):
        PartitionedFileWriter(tmp_path, write_id="w", task_id=0, attempt=0, partition_by=[],
                              parquet_writer="fast")  # fmt: skip


def _typed_table() -> pa.Table:
    """Rows of the decode job's typed table (the bench schema's kinds of columns and ``_kafka``),
    nulls at every level."""
    schema = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("price", pa.float64()),
            pa.field("discount", pa.float32()),
            pa.field("amount", pa.decimal128(12, 2)),
            pa.field("tags", pa.list_(pa.string())),
            pa.field("address", pa.struct([pa.field("street", pa.string()),
                                           pa.field("zip", pa.string())])),
            pa.field("_kafka", KAFKA_TYPE),
        ]
    )  # fmt: skip
    header = {"key": "h", "value": b"v"}
    kafka: list[dict[str, Any] | None] = [
        {"partition": 0, "offset": 7, "timestamp": 1_000, "timestamp_type": 0, "key": b"k",
         "headers": [header, {"key": "", "value": None}], "key_schema_id": None,
         "value_schema_id": 1},
        None,
        {"partition": 1, "offset": 2, "timestamp": None, "timestamp_type": 1, "key": None,
         "headers": [], "key_schema_id": 3, "value_schema_id": None},
    ]  # fmt: skip
    rows = {
        "id": [1, None, 3],
        "price": [0.5, float("nan"), None],
        "discount": [-0.0, None, 2.5],
        "amount": [decimal.Decimal("-120596.69"), None, decimal.Decimal("0.01")],
        "tags": [["t0", None], None, []],
        "address": [{"street": "Main", "zip": None}, None, {"street": None, "zip": "1"}],
        "_kafka": kafka,
    }
    arrays = [
        pa.array(rows[f.name], f.type)
        if f.name != "_kafka"
        else pa.array(kafka, _kafka_input_type()).cast(KAFKA_TYPE)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _kafka_input_type() -> pa.DataType:
    """KAFKA_TYPE with an integer timestamp (pa.array builds it from Python ints)."""
    return pa.struct([f.with_type(pa.int64()) if f.name == "timestamp" else f for f in KAFKA_TYPE])


def test_the_fast_writer_takes_the_typed_tables_schema_and_options(tmp_path: Path) -> None:
    """The decode job's options (``typed_parquet_options``) with ``store_decimal_as_integer``:
    FastParquetWriter writes the typed table; without that option (decimals as pyarrow's
    default FIXED_LEN_BYTE_ARRAY) pyarrow's writer does. Both files read back the same, and
    their Parquet schemas are pyarrow's for the option."""
    table = _typed_table()
    options = typed_parquet_options(table.schema)
    schemas = {}
    for decimals, engine in ((True, "loglake"), (False, "parquet-cpp")):
        root = tmp_path / engine
        w = PartitionedFileWriter(root, write_id="w", task_id=0, attempt=0, partition_by=[],
                                  parquet_writer="loglake", store_decimal_as_integer=decimals,
                                  **options)  # fmt: skip
        w.write(table)
        (f,) = w.close()
        md = pq.read_metadata(root / f.path)
        assert md.created_by.startswith(engine), md.created_by
        back = pq.read_table(root / f.path)
        assert back.schema.equals(table.schema)
        assert str(back.to_pylist()) == str(table.to_pylist())  # NaN: compared as text
        amount = md.schema.column(md.schema.names.index("amount"))
        assert amount.physical_type == ("INT64" if decimals else "FIXED_LEN_BYTE_ARRAY")
        schemas[engine] = md.schema
        chunks = [md.row_group(0).column(i) for i in range(md.num_columns)]
        offset = next(c for c in chunks if c.path_in_schema == "_kafka.offset")
        assert offset.statistics.min == 2 and offset.statistics.max == 7
        assert "DELTA_BINARY_PACKED" in offset.encodings
    reference = pa.BufferOutputStream()
    pq.write_table(table, reference, store_decimal_as_integer=True, compression="zstd", **options)
    ref_schema = pq.read_metadata(pa.BufferReader(reference.getvalue())).schema
    assert schemas["loglake"].equals(ref_schema)


@pytest.mark.parametrize("parquet_writer", ["pyarrow", "loglake"])
def test_string_bounds_from_the_parquet_footer_equal_the_computed_ones(
    tmp_path: Path, parquet_writer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Either writer computes min/max of the string columns it keeps statistics for: the
    Delta bounds are taken from its footer (over every row group), not computed a second
    time (the computing path refuses to run), and equal what computing them gives (the
    writer without statistics)."""
    rng = np.random.default_rng(7)
    words = ["zeta", "Alpha", "ähre", "éclair", "x" * 40, "", "日本", "b"]
    chunks = [
        pa.table(
            {
                "s": pa.array(
                    [
                        None if rng.random() < 0.2 else words[rng.integers(len(words))]
                        for _ in range(500)
                    ],
                    pa.string(),
                ),
                "n": pa.array([None] * 500, pa.string()),  # never a value: no bounds
                "ascii": pa.array([f"k{i:05d}" for i in rng.integers(0, 10**5, 500)]),
            }
        )
        for _ in range(6)
    ]
    stats = {}
    computing = files_module._single_value

    def refused(column: pa.ChunkedArray) -> tuple[bool, object]:
        raise AssertionError("string bounds computed although the footer has them")

    for name, asked in (("footer", True), ("computed", False)):
        monkeypatch.setattr(files_module, "_single_value", refused if asked else computing)
        w = PartitionedFileWriter(
            tmp_path / name, write_id="w", task_id=0, attempt=0, partition_by=[],
            write_statistics=asked, row_group_bytes=4096, parquet_writer=parquet_writer,
        )  # fmt: skip
        for chunk in chunks:
            w.write(chunk)
        (f,) = w.close()
        created = pq.ParquetFile(tmp_path / name / f.path).metadata.created_by
        assert ("loglake" in created) == (parquet_writer == "loglake"), created
        if asked:  # several row groups, so the bounds were merged over them
            assert pq.ParquetFile(tmp_path / name / f.path).metadata.num_row_groups > 3
        stats[name] = json.loads(f.stats)
    assert stats["footer"] == stats["computed"]
    assert stats["footer"]["minValues"]["s"] == "" and stats["footer"]["maxValues"]["s"] == "日本"
    assert "n" not in stats["footer"]["minValues"] and stats["footer"]["nullCount"]["n"] == 3000
