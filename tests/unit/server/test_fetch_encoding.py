"""The hand-written zero-copy Fetch response encoder against kio's decoder, every version."""

from __future__ import annotations

import os
import tempfile
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_response_schema
from kio.serial import entity_reader

from logstore.server.context import FileRegion
from logstore.server.handlers.fetch import MAX_VERSION, MIN_VERSION, _encode, _PartitionRead

partition = st.builds(
    lambda p, err, hw, start, data, aborted: (p, err, hw, start, data, aborted),
    st.integers(0, 1000),
    st.sampled_from([0, 1, 3, 6, 56]),
    st.integers(-1, 2**40),
    st.integers(-1, 2**40),
    st.one_of(st.none(), st.binary(min_size=1, max_size=300)),
    # aborted transactions: None (read_uncommitted) or (producer_id, first_offset) pairs
    st.one_of(
        st.none(),
        st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 2**62)), max_size=4),
    ),
)
topics = st.lists(
    st.tuples(
        st.text(st.sampled_from("ab.-_9"), min_size=1, max_size=20), st.lists(partition, max_size=4)
    ),
    max_size=3,
)


def _join(parts) -> bytes:
    out = b""
    for p in parts:
        if isinstance(p, FileRegion):
            out += os.pread(p.fd, p.length, p.position)
            p.close()
        else:
            out += p
    return out


@settings(max_examples=60, deadline=None)
@given(version=st.integers(MIN_VERSION, MAX_VERSION), spec=topics)
def test_encoded_fetch_response_decodes_with_kio(version, spec):
    with tempfile.NamedTemporaryFile() as f:
        results = []
        for name, parts in spec:
            reads = []
            for p, err, hw, start, data, aborted in parts:
                r = _PartitionRead(p, err, hw, start, aborted=aborted)
                if data is not None:
                    pos = f.tell() + 3
                    f.write(b"xyz" + data)
                    f.flush()
                    r.path, r.position, r.length = f.name, pos, len(data)
                reads.append(r)
            # v13+ name topics by id (KIP-516)
            results.append((uuid.uuid5(uuid.NAMESPACE_DNS, name) if version >= 13 else name, reads))
        raw = _encode(version, results)
        body = _join(raw.parts)
    assert raw.flexible_header == (version >= 12)
    cls = load_response_schema(1, version)
    resp, size = entity_reader(cls)(body, 0)
    assert size == len(body)
    if version >= 13:
        assert [t.topic_id for t in resp.responses] == [
            uuid.uuid5(uuid.NAMESPACE_DNS, name) for name, _ in spec
        ]
    else:
        assert [t.topic for t in resp.responses] == [name for name, _ in spec]
    for t, (_name, parts) in zip(resp.responses, spec, strict=True):
        for got, (p, err, hw, start, data, aborted) in zip(t.partitions, parts, strict=True):
            assert got.partition_index == p
            assert int(got.error_code) == err
            assert got.high_watermark == hw
            if version >= 5:
                assert got.log_start_offset == start
            assert bytes(got.records or b"") == (data or b"")
            if aborted is None:
                assert got.aborted_transactions is None
            else:
                assert [
                    (int(a.producer_id), int(a.first_offset)) for a in got.aborted_transactions
                ] == aborted
