"""The plain reference decoder: one Python object per record, obviously correct, slow.

Frames are walked with ``struct``; each batch is checked by
:func:`logstore.protocol.batch.validate_batch` (magic, codec, CRC, counts) and its records are
decoded by kafka-python's own ``DefaultRecordBatch`` — an implementation independent of the
fast decoder in :mod:`pipelines.decode.records`, which tests and benchmarks compare against.
Output rows use the column names of :data:`pipelines.decode.records.DECODED_SCHEMA`.
"""

from __future__ import annotations

import struct
from typing import Any

from kafka.record.default_records import DefaultRecordBatch

from logstore.errors import LoglakeError
from logstore.protocol.batch import validate_batch
from pipelines.decode.codecs import CODEC_LABELS

__all__ = ["reference_decode"]

_FRAME = struct.Struct(">qi")


def reference_decode(
    buf: bytes | bytearray | memoryview, *, base_position: int = 0
) -> tuple[list[dict[str, Any]], list[tuple[int, str]], int]:
    """Decode every whole batch of ``buf``: ``(rows, errors, control_batches)``.

    ``rows`` are dicts of the decoded columns (key/value ``bytes`` or None, headers a list of
    ``(str, bytes | None)``); ``errors`` are ``(position, reason)`` of batches that failed;
    control batches are counted, not emitted. Stops at the first incomplete frame.
    """
    data = bytes(buf)
    rows: list[dict[str, Any]] = []
    errors: list[tuple[int, str]] = []
    controls = 0
    pos = 0
    while len(data) - pos >= 12:
        _, length = _FRAME.unpack_from(data, pos)
        size = length + 12
        if length < 14 or pos + size > len(data):
            break
        position = base_position + pos
        chunk = data[pos : pos + size]
        pos += size
        try:
            header = validate_batch(chunk, 0)
        except LoglakeError as exc:
            errors.append((position, exc.message))
            continue
        if header.is_control:
            controls += 1
            continue
        try:
            batch_rows = [
                {
                    "offset": r.offset,
                    "timestamp": r.timestamp,
                    "timestamp_type": r.timestamp_type,
                    "key": r.key,
                    "value": r.value,
                    "headers": [(hk, hv) for hk, hv in r.headers],
                    "producer_id": header.producer_id,
                    "producer_epoch": header.producer_epoch,
                    "base_sequence": header.base_sequence,
                    "is_transactional": header.is_transactional,
                    "leader_epoch": header.partition_leader_epoch,
                    "batch_position": position,
                    "codec": CODEC_LABELS[header.codec_id],
                }
                for r in DefaultRecordBatch(bytearray(chunk))
            ]
        except Exception as exc:  # kafka-python raises its own errors and ValueError alike
            errors.append((position, f"{type(exc).__name__}: {exc}"))
            continue
        rows.extend(batch_rows)
    return rows, errors, controls
