"""``decode_column``: rows come back in input order with their schema ids and errors, whether
the batch is decoded in place (one schema id, every row framed: the usual batch) or grouped by
schema id and put back in order (several versions, rows without a header)."""

from __future__ import annotations

import io
import json
import struct
import urllib.request
from typing import Any

import fastavro
import pyarrow as pa

from pipelines.typed.registry import RegistryClient
from pipelines.typed.wire import Decoders, decode_column
from tests.fixtures.typed import registry_url

__all__ = ["registry_url"]

V1 = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}
V2 = {
    "type": "record",
    "name": "R",
    "fields": [
        {"name": "a", "type": "long"},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
        {"name": "b", "type": "string", "default": "x"},
    ],
}


def _register(url: str, schema: dict[str, Any]) -> int:
    req = urllib.request.Request(
        f"{url}/subjects/t-value/versions",
        data=json.dumps({"schema": json.dumps(schema)}).encode(),
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    with urllib.request.urlopen(req) as resp:
        return int(json.load(resp)["id"])


def _framed(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\x00" + struct.pack(">i", schema_id) + out.getvalue()


def test_one_schema_id_decodes_in_place_and_mixed_batches_keep_their_order(
    registry_url: str,
) -> None:
    id1, id2 = _register(registry_url, V1), _register(registry_url, V2)
    client = RegistryClient(registry_url)
    reader = client.latest("t-value")
    assert reader is not None
    rows = [{"a": i, "tags": [f"t{j}" for j in range(i % 3)], "b": f"b{i}"} for i in range(6)]
    newest = pa.array([_framed(id2, V2, r) for r in rows], pa.binary())

    # in place: every row framed with one id, the array sliced (a non-zero offset)
    out = decode_column(newest.slice(1, 4), Decoders(client, reader))
    assert out.values.to_pylist() == rows[1:5]
    assert out.schema_ids.to_pylist() == [id2] * 4
    assert out.errors.null_count == 4

    # grouped: two versions and a row without the magic byte, interleaved
    mixed = pa.array(
        [
            newest[0].as_py(),
            _framed(id1, V1, {"a": 10}),
            b"\x01\x00\x00\x00\x01x",
            newest[3].as_py(),
            _framed(id1, V1, {"a": 11}),
        ],
        pa.binary(),
    )
    out = decode_column(mixed, Decoders(client, reader))
    assert out.values.to_pylist() == [
        rows[0],
        {"a": 10, "tags": [], "b": "x"},
        None,
        rows[3],
        {"a": 11, "tags": [], "b": "x"},
    ]
    assert out.schema_ids.to_pylist() == [id2, id1, None, id2, id1]
    assert out.errors.to_pylist() == [
        None,
        None,
        "no magic byte: first byte is 0x01, not 0x00",
        None,
        None,
    ]
