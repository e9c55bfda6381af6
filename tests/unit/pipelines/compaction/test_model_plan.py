"""The winner rule over Arrow (pipelines.compaction.plan) against the reference model."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.errors import LoglakeError
from pipelines.compaction.model import (
    Rec,
    Strategy,
    compact,
    header_version,
    latest,
    order_key,
    parse_strategy,
    version_of,
)
from pipelines.compaction.plan import header_versions, winners
from pipelines.sources import RECORDS_ARROW_SCHEMA

HEADERS = RECORDS_ARROW_SCHEMA.field("headers").type
STRATEGIES = [Strategy("offset"), Strategy("timestamp"), Strategy("header", "v")]


def _table(recs: list[Rec]) -> pa.Table:
    return pa.table(
        {
            "partition": pa.array([r.partition for r in recs], pa.int32()),
            "key": pa.array([r.key for r in recs], pa.binary()),
            "value": pa.array([r.value for r in recs], pa.binary()),
            "headers": pa.array(
                [[{"key": k, "value": v} for k, v in r.headers] for r in recs], HEADERS
            ),
            "offset": pa.array([r.offset for r in recs], pa.int64()),
            "timestamp": pa.array([r.timestamp * 1000 for r in recs], pa.timestamp("us", "UTC")),
        }
    )


header_values = st.one_of(st.none(), st.binary(max_size=9))
records = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"", b"\x00"])),
        st.one_of(st.none(), st.binary(max_size=3)),
        st.integers(-1, 4),
        st.lists(st.tuples(st.sampled_from(["v", "w"]), header_values), max_size=3),
    ),
    max_size=40,
)


def _recs(raw: list[tuple]) -> list[Rec]:
    next_offset = [0, 0, 0]
    out = []
    for p, key, value, ts, headers in raw:
        out.append(Rec(p, next_offset[p], ts, key, value, tuple(headers)))
        next_offset[p] += 1 + (ts == 4)  # a gap now and then
    return out


@settings(max_examples=300, deadline=None)
@given(records, st.sampled_from(STRATEGIES))
def test_winners_agree_with_the_model(raw: list[tuple], strategy: Strategy) -> None:
    recs = _recs(raw)
    got = winners(_table(recs), strategy).to_pylist()
    want = latest(recs, strategy)
    assert {(r["partition"], r["key"]): r["offset"] for r in got} == {
        pk: rec.offset for pk, rec in want.items()
    }
    for r in got:
        assert r["version"] == version_of(want[(r["partition"], r["key"])], strategy)


@settings(max_examples=200, deadline=None)
@given(records, st.sampled_from(STRATEGIES), st.integers(0, 40))
def test_the_winner_does_not_depend_on_the_split(
    raw: list[tuple], strategy: Strategy, cut: int
) -> None:
    """Merging the winners of a prefix with the rest gives the winners of the whole."""
    recs = _recs(raw)
    first = latest(recs[:cut], strategy)
    again = latest([*first.values(), *recs[cut:]], strategy)
    assert again == latest(recs, strategy)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (b"\x05", 5),
        (b"\xff", -1),
        (struct.pack(">h", -300), -300),
        (struct.pack(">i", 70000), 70000),
        (struct.pack(">q", -(2**63)), -(2**63)),
        (struct.pack(">q", 2**63 - 1), 2**63 - 1),
        (b"\x00\x00\x00\x00\x00\x01", 1),
        (b"", None),
        (None, None),
        (b"123456789", None),
    ],
)
def test_header_versions_are_big_endian_signed(raw: bytes | None, want: int | None) -> None:
    assert header_version(raw) == want
    rows = [[{"key": "x", "value": b"\x09"}, {"key": "v", "value": raw}], [], None]
    got = header_versions(pa.array(rows, HEADERS), "v").to_pylist()
    assert got == [want, None, None]


def test_the_last_header_of_the_name_counts() -> None:
    rec = Rec(0, 0, 0, b"k", b"v", (("v", b"\x01"), ("v", b"\x02")))
    assert version_of(rec, Strategy("header", "v")) == 2
    got = header_versions(_table([rec]).column("headers"), "v").to_pylist()
    assert got == [2]


def test_order_is_total_version_beats_no_version() -> None:
    s = Strategy("header", "v")
    a = Rec(0, 1, 0, b"k", b"a", (("v", b"\x05"),))
    b = Rec(0, 2, 0, b"k", b"b")
    c = Rec(0, 3, 0, b"k", b"c", (("v", b"\x03"),))
    assert order_key(a, s) > order_key(c, s) > order_key(b, s)
    assert compact([a, b, c], s)[(0, b"k")] is a
    # a tombstone with the greatest version deletes the key; a later smaller version loses
    t = Rec(0, 4, 0, b"k", None, (("v", b"\x09"),))
    assert compact([a, b, c, t, Rec(0, 5, 0, b"k", b"late", (("v", b"\x08"),))], s) == {}


def test_parse_strategy() -> None:
    assert parse_strategy("offset") == Strategy("offset")
    assert parse_strategy("timestamp") == Strategy("timestamp")
    assert parse_strategy("header:version") == Strategy("header", "version")
    assert str(parse_strategy("header:version")) == "header:version"
    for bad in ("", "header:", "latest", "Header:x"):
        with pytest.raises(LoglakeError, match="expected offset, timestamp or header"):
            parse_strategy(bad)
