"""The direct path's bucket function equals Spark's ``pmod(xxhash64(key), N)``.

Existing topic tables were bucketed by Spark; a bucket computed differently would put a key's
new record in another bucket than its row, and the table would hold the key twice.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as sf

from pipelines.compaction._hash import buckets_of, xxhash64


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
