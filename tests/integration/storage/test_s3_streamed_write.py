"""A data file written to S3 (moto) streams up while it is written, row group by row group.

``PartitionedFileWriter`` on an object store flushes a row group every
``REMOTE_ROW_GROUP_BYTES`` of Arrow data (not local disk's 64 MiB): the encoded bytes enter the
upload stream then, and its parts go up while the task is still producing rows. Seen from the
store with boto3: before ``close()`` an unfinished multipart upload of the file already holds
parts and no object exists yet; after it the object is complete, and read back by pyarrow it
holds every row, in several row groups.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from logstore.objectstore import LakeLocation, StorageSettings
from pipelines.delta.files import (
    LOCAL_ROW_GROUP_BYTES,
    REMOTE_ROW_GROUP_BYTES,
    PartitionedFileWriter,
    default_row_group_bytes,
)
from tests.fixtures.broker import wait_for
from tests.fixtures.s3 import S3Bucket

pytestmark = pytest.mark.integration

ROWS = 40_000  # 40k rows of 1 KiB of random bytes: ~41 MiB of Arrow data, incompressible


def _chunk(start: int, n: int) -> pa.Table:
    rng = np.random.default_rng(start)
    values = rng.integers(0, 256, size=n * 1024, dtype=np.uint8).tobytes()
    offsets = pa.array(np.arange(0, (n + 1) * 1024, 1024, dtype=np.int32))
    return pa.table(
        {
            "offset": pa.array(np.arange(start, start + n, dtype=np.int64)),
            "value": pa.BinaryArray.from_buffers(pa.binary(), n, [None, offsets.buffers()[1],
                                                                  pa.py_buffer(values)]),
        }
    )  # fmt: skip


def test_a_file_on_s3_streams_up_row_group_by_row_group(s3: S3Bucket) -> None:
    root = LakeLocation.parse(s3.uri("t"))
    assert default_row_group_bytes(root) == REMOTE_ROW_GROUP_BYTES < LOCAL_ROW_GROUP_BYTES
    assert default_row_group_bytes(LakeLocation.parse("/tmp/lake")) == LOCAL_ROW_GROUP_BYTES
    writer = PartitionedFileWriter(
        root,
        settings=StorageSettings.from_environment(),
        write_id="a" * 32,
        task_id=0,
        attempt=0,
        partition_by=[],
        compression="snappy",
    )
    step = 2_000
    for start in range(0, ROWS - step, step):  # all but the last chunk
        writer.write(_chunk(start, step))

    def parts_uploaded() -> int:
        uploads = s3.client.list_multipart_uploads(Bucket=s3.name).get("Uploads", [])
        return sum(
            len(s3.client.list_parts(Bucket=s3.name, Key=u["Key"], UploadId=u["UploadId"])
                .get("Parts", []))
            for u in uploads if u["Key"].startswith("t/part-00000-")
        )  # fmt: skip

    wait_for(lambda: parts_uploaded() > 0, 60)  # parts went up while rows were still coming
    assert not [k for k in s3.keys("t/") if k.endswith(".parquet")]  # no object yet
    writer.write(_chunk(ROWS - step, step))
    (written,) = writer.close()
    assert written.num_rows == ROWS
    (key,) = [k for k in s3.keys("t/") if k.endswith(".parquet")]
    assert key == f"t/{written.path}"
    data = s3.get(key)
    assert len(data) == written.size
    meta = pq.read_metadata(pa.BufferReader(data))
    assert meta.num_rows == ROWS
    # one row group per REMOTE_ROW_GROUP_BYTES of Arrow data (~41 MiB: 3), not one in all
    assert meta.num_row_groups >= 2
    back = pq.read_table(pa.BufferReader(data))
    assert back.column("offset").to_pylist() == list(range(ROWS))
    assert back.column("value")[ROWS - 1].as_py() == _chunk(ROWS - step, step)["value"][-1].as_py()
