"""A topic table written without deletion vectors (``[compact.deletion_vectors] <topic> =
false``): its protocol lacks the feature, deltalake's ``to_pyarrow_table`` (which refuses
deletion vectors) reads it, and its rows equal those of the same topic's table with them.

Two topics get the same records in one lake; one run compacts both, so the only difference
between the two tables is the option. Read back with delta-rs and polars (not the job's code).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pipelines.compaction.config import load_compact_config
from pipelines.compaction.model import Rec
from pipelines.compaction.table import run_compact, table_path
from tests.fixtures.compaction import append_records, read_topic_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


def _rows(table: pa.Table) -> list[tuple[int, bytes, int, bytes | None]]:
    return sorted(
        zip(
            table["partition"].to_pylist(),
            table["key"].to_pylist(),
            table["offset"].to_pylist(),
            table["value"].to_pylist(),
            strict=True,
        )
    )


def test_a_table_without_deletion_vectors_is_read_by_to_pyarrow_table(
    spark: SparkSession, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlog_dirs = ["{logs}"]\nlake = "{tmp_path}"\n'
        '[compact]\ntopics = ["dv", "plain"]\nbuckets = 2\n'
        "[compact.deletion_vectors]\nplain = false\n",
        encoding="utf-8",
    )
    config = load_compact_config(conf)
    assert (config.deletion_vectors_for("dv"), config.deletion_vectors_for("plain")) == (
        True,
        False,
    )
    first = [Rec(0, o, 1, b"k%03d" % o, b"v0-%d" % o) for o in range(200)]
    # a few keys updated, one deleted: the DV table marks rows, the other rewrites its files
    second = [
        Rec(0, 200 + i, 1, b"k%03d" % k, b"v1-%d" % k) for i, k in enumerate(range(0, 200, 10))
    ]
    second.append(Rec(0, 220, 1, b"k007", None))
    for recs, progress in ((first, 200), (second, 221)):
        for topic in ("dv", "plain"):
            append_records(tmp_path, topic, recs, {0: progress})
        results = {r.topic: r for r in run_compact(spark, config, log=lambda _: None).topics}
        assert results["dv"].committed and results["plain"].committed
    assert results["dv"].buckets_with_deletion_vectors == 2
    assert (results["plain"].buckets_with_deletion_vectors, results["plain"].buckets_rewritten) == (
        0,
        2,
    )

    with_dv = DeltaTable(table_path(tmp_path, "dv"))
    plain = DeltaTable(table_path(tmp_path, "plain"))
    assert "deletionVectors" in (with_dv.protocol().reader_features or [])
    assert pa.table(with_dv.deletion_vectors()).num_rows > 0  # the comparison means something
    protocol = plain.protocol()
    # what the change data feed needs and no more (README: "Delta protocol of each table")
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 4)
    assert "deletionVectors" not in (protocol.reader_features or [])
    assert "deletionVectors" not in (protocol.writer_features or [])
    assert plain.metadata().configuration.get("delta.enableChangeDataFeed") == "true"
    assert "delta.enableDeletionVectors" not in plain.metadata().configuration
    assert pa.table(plain.deletion_vectors()).num_rows == 0
    with pytest.raises(Exception, match="deletionVectors"):
        with_dv.to_pyarrow_table()  # why the option exists

    rows = _rows(plain.to_pyarrow_table())
    assert len(rows) == 199 and (0, b"k007") not in {(p, k) for p, k, _, _ in rows}
    assert read_topic_table(table_path(tmp_path, "plain")) == read_topic_table(
        table_path(tmp_path, "dv")
    )
    assert {(p, k): (o, v) for p, k, o, v in rows} == {
        pk: (o, v) for pk, (o, v, _) in read_topic_table(table_path(tmp_path, "dv")).items()
    }
