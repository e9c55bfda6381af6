"""Request header parsing, the API registry, Deferred and the purgatory."""

from __future__ import annotations

import struct
import threading
import time

import pytest

from logstore.server.apis import (
    API_HANDLERS,
    InvalidRequestError,
    UnsupportedVersionError,
    decode_request,
    encode_response,
    parse_request_header,
)
from logstore.server.context import Deferred
from logstore.server.handlers.api_versions import unsupported_version_response
from logstore.server.purgatory import DelayedOperation, Purgatory


def test_registry_has_the_broker_apis_with_fetch_v4_plus():
    for key in (0, 1, 2, 3, 18, 19, 20, 21, 22, 32, 44):
        assert key in API_HANDLERS, key
    lo, _hi, _ = API_HANDLERS[1]
    assert lo >= 4  # magic 2 only: never advertise Fetch < 4
    # transactional APIs answer (with an error) rather than close the connection
    assert {24, 25, 26, 28} <= API_HANDLERS.keys()


def test_parse_header_v1_and_v2():
    frame = struct.pack(">hhih", 3, 1, 77, 3) + b"cid" + b"\xff\xff\xff\xff"
    h = parse_request_header(frame)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (3, 1, 77, "cid")
    assert h.body_offset == 13
    req = decode_request(frame, h)
    assert req.topics is None  # v1 null = every topic
    # v12 (flexible): tagged fields after client id, null client id
    frame = struct.pack(">hhih", 3, 12, 5, -1) + b"\x01\x07\x02ab" + b"\x00\x01\x00\x00"
    h = parse_request_header(frame)
    assert h.client_id is None and h.body_offset == 15
    assert decode_request(frame, h).allow_auto_topic_creation is True


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\x00\x03\x00",
        struct.pack(">hhih", 3, 1, 1, 50) + b"short",
        struct.pack(">hhih", 3, 1, 1, -7),
        struct.pack(">hhih", 3, 12, 1, -1) + b"\x01\x07\x7fab",  # tagged field past the end
    ],
)
def test_malformed_headers(frame):
    with pytest.raises(InvalidRequestError):
        parse_request_header(frame)


def test_unsupported_versions_and_body_errors():
    with pytest.raises(UnsupportedVersionError) as exc:
        parse_request_header(struct.pack(">hhih", 1, 3, 1, -1))  # Fetch v3
    assert (exc.value.api_key, exc.value.api_version) == (1, 3)
    with pytest.raises(UnsupportedVersionError):
        parse_request_header(struct.pack(">hhih", 12345, 0, 1, -1))
    frame = struct.pack(">hhih", 3, 1, 1, -1) + b"\x00\x00\x00\x05"  # 5 topics, none there
    with pytest.raises(InvalidRequestError):
        decode_request(frame, parse_request_header(frame))


def test_unsupported_api_versions_response_is_v0():
    frame = encode_response(9, unsupported_version_response())
    size, cid, error, n = struct.unpack_from(">iihi", frame, 0)
    assert size == len(frame) - 4
    assert (cid, error, n) == (9, 35, len(API_HANDLERS))


def test_deferred_completes_once_from_any_thread():
    d: Deferred[int] = Deferred()
    seen: list[int] = []
    d.add_done_callback(lambda x: seen.append(x.result()))
    threads = [threading.Thread(target=d.complete, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 1 and d.result() == seen[0]
    assert d.complete(99) is False
    late: list[int] = []
    d.add_done_callback(lambda x: late.append(x.result()))
    assert late == seen
    f: Deferred[int] = Deferred()
    f.fail(ValueError("boom"))
    with pytest.raises(ValueError):
        f.result()
    with pytest.raises(TimeoutError):
        Deferred().result(timeout=0.01)


class _Op(DelayedOperation):
    def __init__(self, deadline_ms: int, flag: list[bool]) -> None:
        super().__init__(deadline_ms)
        self.flag = flag
        self.outcome: list[bool] = []
        self.done = threading.Event()

    def ready(self) -> bool:
        return self.flag[0]

    def complete(self, *, expired: bool) -> None:
        self.outcome.append(expired)
        self.done.set()


def test_purgatory_wakes_on_key_and_expires():
    p = Purgatory("test")
    try:
        now = time.monotonic_ns() // 1_000_000
        flag = [False]
        woken = _Op(now + 60_000, flag)
        assert p.try_complete_else_watch(woken, [("t", 0)]) is False
        flag[0] = True
        assert p.check_and_complete(("t", 1)) == 0
        assert p.check_and_complete(("t", 0)) == 1
        assert woken.outcome == [False]
        expiring = _Op(now + 20, [False])
        p.try_complete_else_watch(expiring, [("t", 2)])
        assert expiring.done.wait(10)
        assert expiring.outcome == [True]
        pending = _Op(now + 600_000, [False])
        p.try_complete_else_watch(pending, [("t", 3)])
    finally:
        p.shutdown()
    assert pending.outcome == [True]  # shutdown answers everything still waiting


def test_null_where_the_schema_forbids_it_is_invalid():
    # ListOffsets v1: replica_id, one topic "a" whose partitions array is null (-1):
    # kio decodes it as None; Kafka rejects the request, so must we (found by the fuzzer)
    body = struct.pack(">ii", -1, 1) + struct.pack(">h", 1) + b"a" + struct.pack(">i", -1)
    frame = struct.pack(">hhih", 2, 1, 1, -1) + body
    with pytest.raises(InvalidRequestError, match="partitions is null"):
        decode_request(frame, parse_request_header(frame))
    # Produce v3 with a null topic name (kio refuses null strings itself)
    frame = struct.pack(">hhih", 0, 3, 1, -1) + struct.pack(">hhii", -1, 1, 1000, 1)
    frame += struct.pack(">h", -1) + struct.pack(">i", 0)
    with pytest.raises(InvalidRequestError):
        decode_request(frame, parse_request_header(frame))
