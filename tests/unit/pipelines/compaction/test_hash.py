"""The direct path's bucket function equals Spark's ``pmod(xxhash64(key), N)``.

Existing topic tables were bucketed by Spark; a bucket computed differently would put a key's
new record in another bucket than its row, and the table would hold the key twice.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as sf

from pipelines.compaction.hashing import buckets_of, latest_indices, xxhash64
from pipelines.compaction.plan import winner_indices


def test_xxhash64_and_buckets_equal_spark(spark: SparkSession) -> None:
    rng = np.random.default_rng(5)
    # every length class of XXH64: <4, 4-7, 8-31, >= 32 (one and two 32-byte stripes), nulls
    keys: list[bytes | None] = [
        bytes(rng.integers(0, 256, int(n), dtype=np.uint8))
        for n in [*range(71), *rng.integers(0, 200, 400)]
    ]
    keys += [None, b"", b"key-1", b"\xff" * 33]
    rows = spark.createDataFrame(list(enumerate(keys)), "i int, k binary").select(
        "i",
        sf.xxhash64("k").alias("h"),
        *(sf.pmod(sf.xxhash64("k"), sf.lit(n)).cast("int").alias(f"b{n}") for n in (1, 7, 16)),
    )
    want = sorted(rows.collect())
    # a sliced array with an offset, as a filtered or concatenated table hands it over
    arr = pa.array([b"pad", *keys], pa.binary()).slice(1)
    hashes = xxhash64(arr)
    assert [int(h) for h in hashes] == [r["h"] for r in want]
    assert hashes.dtype == np.int64
    for n in (1, 7, 16):
        got = buckets_of(pa.chunked_array([arr.slice(0, 100), arr.slice(100)]), n)
        assert got.tolist() == [r[f"b{n}"] for r in want]
    assert len(xxhash64(pa.array([], pa.binary()))) == 0


# keys up to 15 bytes are compared inside the hash table, longer ones by their bytes: a few
# keys on both sides of that line, equal but for their last byte or their length
_KEYS = st.one_of(
    st.none(),
    st.binary(max_size=3),
    st.sampled_from([b"k" * 15, b"k" * 14 + b"j", b"k" * 16, b"k" * 15 + b"j", b"x" * 40]),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),  # partition
            _KEYS,  # few distinct keys, nulls
            st.one_of(st.none(), st.integers(-3, 3)),  # version
        ),
        max_size=60,
    ),
    st.booleans(),
    st.booleans(),
    st.sampled_from([None, 1, 4]),
)
def test_latest_indices_equal_winner_indices(
    rows: list[tuple[int, bytes | None, int | None]],
    colliding: bool,
    large: bool,
    table_bits: int | None,
) -> None:
    """The hash-table winner pass picks plan.winner_indices's rows, also when every key has
    the same hash (then only the key bytes tell keys apart), for binary and large_binary keys,
    and when its table starts small and must grow."""
    n = len(rows)
    offsets = np.random.default_rng(n).permutation(n).astype(np.int64)
    table = pa.table(
        {
            "partition": pa.array([r[0] for r in rows], pa.int32()),
            "key": pa.array([r[1] for r in rows], pa.large_binary() if large else pa.binary()),
            "offset": pa.array(offsets),
        }
    )
    version = pa.array([r[2] for r in rows], pa.int64())
    hashes = np.zeros(n, np.int64) if colliding else xxhash64(table.column("key"))
    got = latest_indices(
        np.array([r[0] for r in rows], np.int32),
        table.column("key"),
        hashes,
        np.array([r[2] is not None for r in rows], bool),
        np.array([r[2] or 0 for r in rows], np.int64),
        offsets,
        table_bits=table_bits,
    )
    assert got.tolist() == sorted(winner_indices(table, version).tolist())
